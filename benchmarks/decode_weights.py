"""Decoding through integer copies of the weights against the model's own weights (bfloat16, or float32 on a CPU
without bfloat16 units), side by side in one process (app/engine/decode_weights.py): the same loaded model, its
linear layers swapped in and out each round.

    python -m benchmarks.decode_weights --model qwen2.5-coder-1.5b --rounds 3

Each round and way: a fresh cache, a prefill of ``--context`` tokens in the app's 512-token chunks, then
``--decode`` greedy tokens one at a time (the forward an answer token makes, without recall). Reports the rates of
each, their ratio round by round, and whether the greedy tokens agree.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ingest.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("The window of attention is bounded, the starting tokens are kept, and the middle is recalled by the "
        "question's own attention. ")


def run_arguments(description: str, *, context: int, decode: int) -> argparse.ArgumentParser:
    """The options of a benchmark that compares two ways of running a model round by round (this one, cpu_dtype)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="a bundled model's name, or a model folder")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--context", type=int, default=context)
    p.add_argument("--decode", type=int, default=decode)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    return p


def parse_args(argv=None):
    return run_arguments(__doc__, context=1024, decode=24).parse_args(argv)


def run(runtime, ids: list[int], decode: int) -> tuple[float, float, list[int]]:
    """Prefill tokens/s, decode tokens/s and the greedy tokens, from a fresh cache."""
    cache = runtime.new_cache()
    started = time.perf_counter()
    for lo in range(0, len(ids), runtime.prefill_chunk):
        logits = runtime.forward(ids[lo:lo + runtime.prefill_chunk], cache, topk=0)
    prefill = len(ids) / (time.perf_counter() - started)
    tokens, started = [], time.perf_counter()
    for _ in range(decode):
        tokens.append(int(logits.argmax()))
        logits = runtime.forward(tokens[-1:], cache, topk=0)
    return prefill, decode / (time.perf_counter() - started), tokens


@dataclass
class Turns:
    """Two ways' (prefill, decode) rates round by round, and each way's greedy tokens of the last round."""

    rates: dict[str, list[tuple[float, float]]]
    tokens: dict[str, list[int]]

    def table(self) -> str:
        (first, second), rows = self.rates, []
        for round_, ((p1, d1), (p2, d2)) in enumerate(zip(*self.rates.values()), start=1):
            rows.append([round_, f"{p1:,.0f} / {p2:,.0f}", f"{p2 / p1:.2f}", f"{d1:.2f} / {d2:.2f}", f"{d2 / d1:.2f}"])
        return markdown_table(["round", f"prefill tok/s: {first} / {second}", "prefill ratio",
                               f"decode tok/s: {first} / {second}", "decode ratio"], rows)

    def prefill_ratio(self) -> float:
        return statistics.median(b[0] / a[0] for a, b in zip(*self.rates.values()))

    def decode_ratio(self) -> float:
        return statistics.median(b[1] / a[1] for a, b in zip(*self.rates.values()))

    def greedy_agree(self) -> int:
        return sum(a == b for a, b in zip(*self.tokens.values()))


def take_turns(ways: dict[str, Callable[[], object]], ids: list[int], rounds: int, decode: int) -> Turns:
    """Two ways of running a model, in turn each round (so a noisy machine's load falls on both): each way's
    callable readies it and returns the runtime to ``run``."""
    turns = Turns({way: [] for way in ways}, {})
    for _ in range(rounds):
        for way, ready in ways.items():
            prefill, decode_rate, turns.tokens[way] = run(ready(), ids, decode)
            turns.rates[way].append((prefill, decode_rate))
    return turns


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from app.cli import AppConfig
    from app.engine import decode_weights
    from app.engine.model_loading import choose_model, load_runtime

    config = AppConfig(model=args.model, decode_weights="auto", cpu_threads=args.threads)
    choice = choose_model(config)
    runtime = load_runtime(config, choice)
    model = runtime.model
    swapped = {name: module for name, module in model.named_modules()
               if isinstance(module, decode_weights.DecodeLinear)}
    if not swapped:
        raise SystemExit(f"{args.model} decodes through its own weights here (decode_weights.py): nothing to compare")
    def swapped_to(modules):
        def ready():
            for name, module in modules.items():
                model.set_submodule(name, module)
            return runtime
        return ready

    dtype = str(model.dtype).removeprefix("torch.")
    ways = {dtype: swapped_to({name: module.dense for name, module in swapped.items()}),
            "integer": swapped_to(swapped)}
    ids = runtime.tokenizer.encode(TEXT * (args.context // 20 + 1), add_special_tokens=False)[:args.context]
    turns = take_turns(ways, ids, args.rounds, args.decode)
    kinds = {kind: sum(m.kind == kind for m in swapped.values()) for kind in ("int4", "int8")}
    table, median, same = turns.table(), turns.decode_ratio(), turns.greedy_agree()
    text = (f"{time.strftime('%Y-%m-%d')}, this CPU, {args.threads} threads; {runtime.name} in {dtype}: "
            f"{kinds['int4']} layers in 4 bits, {kinds['int8']} in 8; a {args.context:,}-token prefill then "
            f"{args.decode} greedy tokens, each way in turn on the same loaded model. Decode {median:.2f}× as fast "
            f"(median ratio); the greedy tokens agree {same} of {args.decode}.\n\n{table}")
    suffix = "" if model.dtype == torch.bfloat16 else f"_{dtype}"  # the bfloat16 file was the first one written
    write_result(args.out / f"decode_weights_{args.model}{suffix}.md", text)


def write_result(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
