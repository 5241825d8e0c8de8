"""bfloat16 against float32 on this CPU, side by side in one process: the same model loaded in each dtype as
``--dtype`` loads it (bfloat16 with the integer decode copies where the model has them, app/engine/decode_weights.py),
the two taking turns round by round, so the load of a noisy machine falls on both.

    python -m benchmarks.cpu_dtype --model qwen2.5-coder-1.5b --rounds 3

Each round and dtype: a fresh cache, a prefill of ``--context`` tokens in the app's 512-token chunks, then
``--decode`` greedy tokens one at a time (benchmarks.decode_weights.run). Reports the rates, their ratios round by
round, which dtype ``--dtype auto`` picks here and why (app/engine/cpu_dtype.py), and how many greedy tokens agree.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.decode_weights import TEXT, run
from ingest.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("float32", "bfloat16")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="a bundled model's name, or a model folder")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--decode", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    return p.parse_args(argv)


def main(argv=None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from app.cli import AppConfig
    from app.engine.cpu_dtype import default_cpu_dtype
    from app.engine.model_loading import choose_model, load_runtime

    runtimes = {}
    for dtype in DTYPES:
        config = AppConfig(model=args.model, dtype=dtype, cpu_threads=args.threads)
        runtimes[dtype] = load_runtime(config, choose_model(config))
    ids = runtimes["float32"].tokenizer.encode(TEXT * (args.context // 20 + 1), add_special_tokens=False)
    ids = ids[:args.context]
    rows, rates, tokens = [], {dtype: [] for dtype in DTYPES}, {}
    for round_ in range(1, args.rounds + 1):
        for dtype, runtime in runtimes.items():
            prefill, decode, tokens[dtype] = run(runtime, ids, args.decode)
            rates[dtype].append((prefill, decode))
        (f32_prefill, f32_decode), (bf16_prefill, bf16_decode) = (rates[d][-1] for d in DTYPES)
        rows.append([round_, f"{f32_prefill:,.0f} / {bf16_prefill:,.0f}", f"{bf16_prefill / f32_prefill:.2f}",
                     f"{f32_decode:.2f} / {bf16_decode:.2f}", f"{bf16_decode / f32_decode:.2f}"])
    same = sum(a == b for a, b in zip(*tokens.values()))
    prefill_ratio = statistics.median(b[0] / f[0] for f, b in zip(*rates.values()))
    decode_ratio = statistics.median(b[1] / f[1] for f, b in zip(*rates.values()))
    auto, why = default_cpu_dtype()
    table = markdown_table(["round", "prefill tok/s: float32 / bfloat16", "prefill ratio",
                            "decode tok/s: float32 / bfloat16", "decode ratio"], rows)
    bf16, marker = runtimes["bfloat16"].notice, "answers decoded from "
    copies = (f"integer copies ({bf16.split(marker, 1)[1].split(';')[0]})" if marker in bf16
              else "its own weights")
    text = (f"{time.strftime('%Y-%m-%d')}, this CPU, {args.threads} threads; {runtimes['bfloat16'].name}, bfloat16 "
            f"decoding through {copies}; a {args.context:,}-token prefill then {args.decode} greedy tokens, each "
            f"dtype in turn. bfloat16 reads {prefill_ratio:.2f}× and decodes {decode_ratio:.2f}× as fast (median "
            f"ratios); the greedy tokens agree {same} of {args.decode}. `--dtype auto` here: "
            f"{str(auto).removeprefix('torch.')} ({why}).\n\n{table}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"cpu_dtype_{Path(args.model).name}.md").write_text(text + "\n")
    print(text)
    return text


if __name__ == "__main__":
    main()
