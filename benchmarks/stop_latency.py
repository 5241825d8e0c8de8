"""How long Stop takes to land while a document is fed, with the stop between decoder layers (app/engine/layer_stop.py)
and between forwards only, in turn on the same loaded model.

    python -m benchmarks.stop_latency --model qwen2.5-coder-1.5b

Each round feeds ``--context`` tokens of text in the app's chunks and presses Stop (a timer sets the cancel flag)
at a point inside the second forward, a fraction of one forward's measured time into it; the time from the press to
the engine's Stopped is the latency. Both ways are pressed at the same points. After each Stop the context must be
empty again (the feed rolled back).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.decode_weights import TEXT, write_result
from ingest import Provenance
from ingest.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)  # where in the second forward Stop is pressed


@dataclass(frozen=True)
class Passage:
    text: str
    where: Provenance


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="a bundled model's name, or a model folder")
    p.add_argument("--context", type=int, default=2048, help="tokens fed (more than two forwards)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    return p.parse_args(argv)


def passages(runtime, tokens: int) -> list[Passage]:
    """About ``tokens`` tokens of text, one passage per page of about 256."""
    per_page = max(1, len(runtime.tokenizer.encode(TEXT, add_special_tokens=False)))
    pages = -(-tokens // 256)
    return [Passage(TEXT * max(1, 256 // per_page), Provenance("stop.txt", page + 1)) for page in range(pages)]


def stop_after(runtime, document: list[Passage], delay: float) -> tuple[float | None, int]:
    """Feed ``document`` into a new context, press Stop ``delay`` seconds in; seconds from the press to Stopped (None:
    the feed ended first), and the context's length after."""
    from app.engine.context import ContextEngine
    from app.engine.context_records import Stopped

    engine = ContextEngine(runtime, system_prompt="You are a helpful assistant.", budget=10_000_000)
    cancel = threading.Event()
    pressed: list[float] = []
    timer = threading.Timer(delay, lambda: (pressed.append(time.perf_counter()), cancel.set()))
    timer.start()
    try:
        for _ in engine.feed_documents(document, cancel):
            pass
    except Stopped:
        return time.perf_counter() - pressed[0], engine.length
    finally:
        timer.cancel()
    return None, engine.length


def one_forward_s(runtime) -> float:
    """Seconds one forward of ``prefill_chunk`` tokens takes here, from a fresh cache (the best of two)."""
    ids = runtime.tokenizer.encode(TEXT * 200, add_special_tokens=False)[:runtime.prefill_chunk]
    times = []
    for _ in range(2):
        cache, started = runtime.new_cache(), time.perf_counter()
        runtime.forward(ids, cache, topk=0)
        times.append(time.perf_counter() - started)
    return min(times)


def _summary(waits: list[float]) -> str:
    return f"{statistics.median(waits):.2f} s (the longest {max(waits):.2f} s)" if waits else "– (no Stop landed)"


def main(argv=None) -> str:
    args = parse_args(argv)
    from app.cli import AppConfig
    from app.engine.layer_stop import decoder_layers
    from app.engine.model_loading import load_runtime

    torch.set_num_threads(args.threads)
    runtime = load_runtime(AppConfig(model=args.model, cpu_threads=args.threads))
    document = passages(runtime, args.context)
    forward_s = one_forward_s(runtime)
    rows, waits = [], {True: [], False: []}
    for fraction in FRACTIONS:
        delay = forward_s * (1 + fraction)
        row = [f"{delay:.2f} s ({fraction:.0%} into the second forward)"]
        for between_layers in (True, False):
            runtime.layer_stop.enabled = between_layers
            waited, left = stop_after(runtime, document, delay)
            if waited is None:
                row.append("– (the feed ended first)")
                continue
            waits[between_layers].append(waited)
            row.append(f"{waited:.2f} s" + ("" if left == 0 else f" (context left at {left:,} tokens!)"))
        runtime.layer_stop.enabled = True
        rows.append(row)
    layers = len(decoder_layers(runtime.model))
    text = "\n".join([
        f"Stop while a document is fed: {runtime.name}, {str(runtime.dtype).removeprefix('torch.')}, "
        f"{args.threads} threads, {layers} decoder layers, forwards of {runtime.prefill_chunk} tokens "
        f"({forward_s:.2f} s each here). `python -m benchmarks.stop_latency` ({time.strftime('%Y-%m-%d')}).",
        "",
        markdown_table(["Stop pressed at", "landed after: between layers", "landed after: between forwards only"],
                       rows),
        "",
        f"Median wait: {_summary(waits[True])} between layers, {_summary(waits[False])} between forwards only. "
        "Every Stop left the context empty, as before the feed, unless a row says otherwise.",
    ])
    name = Path(args.model).name if Path(args.model).exists() else args.model
    write_result(args.out / f"stop_latency_{name}.md", text)
    return text


if __name__ == "__main__":
    main()
