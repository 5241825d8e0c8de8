"""Decoding through integer copies of the weights against the model's own bfloat16 weights, side by side in one
process (app/engine/decode_weights.py): the same loaded model, its linear layers swapped in and out each round.

    python -m benchmarks.decode_weights --model qwen2.5-coder-1.5b --rounds 3

Each round and way: a fresh cache, a prefill of ``--context`` tokens in the app's 512-token chunks, then
``--decode`` greedy tokens one at a time (the forward an answer token makes, without recall). Reports the rates of
each, their ratio round by round, and whether the greedy tokens agree.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from ingest.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("The window of attention is bounded, the starting tokens are kept, and the middle is recalled by the "
        "question's own attention. ")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--decode", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    return p.parse_args(argv)


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
    ways = {"bfloat16 weights": {name: module.dense for name, module in swapped.items()}, "integer copies": swapped}
    ids = runtime.tokenizer.encode(TEXT * (args.context // 20 + 1), add_special_tokens=False)[:args.context]
    rows, rates, tokens = [], {way: [] for way in ways}, {}
    for round_ in range(1, args.rounds + 1):
        for way, modules in ways.items():
            for name, module in modules.items():
                model.set_submodule(name, module)
            prefill, decode, tokens[way] = run(runtime, ids, args.decode)
            rates[way].append((prefill, decode))
        (dense_prefill, dense_decode), (int_prefill, int_decode) = (rates[w][-1] for w in ways)
        rows.append([round_, f"{dense_prefill:,.0f} / {int_prefill:,.0f}", f"{int_prefill / dense_prefill:.2f}",
                     f"{dense_decode:.2f} / {int_decode:.2f}", f"{int_decode / dense_decode:.2f}"])
    same = sum(a == b for a, b in zip(*tokens.values()))
    kinds = {kind: sum(m.kind == kind for m in swapped.values()) for kind in ("int4", "int8")}
    table = markdown_table(["round", "prefill tok/s: bfloat16 / integer", "prefill ratio",
                            "decode tok/s: bfloat16 / integer", "decode ratio"], rows)
    median = statistics.median(r[1] / d[1] for d, r in zip(*rates.values()))
    text = (f"{time.strftime('%Y-%m-%d')}, this CPU, {args.threads} threads; {runtime.name}: {kinds['int4']} layers "
            f"in 4 bits, {kinds['int8']} in 8; a {args.context:,}-token prefill then {args.decode} greedy tokens, "
            f"each way in turn on the same loaded model. Decode {median:.2f}× as fast (median ratio); the greedy "
            f"tokens agree {same} of {args.decode}.\n\n{table}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"decode_weights_{args.model}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
