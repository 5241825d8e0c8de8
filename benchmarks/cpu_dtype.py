"""bfloat16 against float32 on this CPU, side by side in one process: the same model loaded in each dtype as
``--dtype`` loads it (each with the integer decode copies where the model has them, app/engine/decode_weights.py),
the two taking turns round by round, so the load of a noisy machine falls on both.

    python -m benchmarks.cpu_dtype --model qwen2.5-coder-1.5b --rounds 3

Each round and dtype: a fresh cache, a prefill of ``--context`` tokens in the app's 512-token chunks, then
``--decode`` greedy tokens one at a time (benchmarks.decode_weights.run). Reports the rates, their ratios round by
round, which dtype ``--dtype auto`` picks here and why (app/engine/cpu_dtype.py), and how many greedy tokens agree.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks.decode_weights import TEXT, run_arguments, take_turns, write_result

DTYPES = ("float32", "bfloat16")


def parse_args(argv=None):
    return run_arguments(__doc__, context=2048, decode=16).parse_args(argv)


def integer_copies(model) -> str:
    """What a model decodes through: its integer copies by kind (app/engine/decode_weights.py), or not."""
    from app.engine.decode_weights import CopyKind, DecodeLinear

    swapped = [m for m in model.modules() if isinstance(m, DecodeLinear)]
    if not swapped:
        return "its own weights"
    int4, int8 = (sum(m.kind is kind for m in swapped) for kind in (CopyKind.INT4, CopyKind.INT8))
    return f"integer copies ({int4} layers in 4 bits, {int8} in 8)"


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
    ways = {dtype: (lambda runtime=runtime: runtime) for dtype, runtime in runtimes.items()}
    turns = take_turns(ways, ids[:args.context], args.rounds, args.decode)
    auto, why = default_cpu_dtype()
    copies = {dtype: integer_copies(runtime.model) for dtype, runtime in runtimes.items()}
    text = (f"{time.strftime('%Y-%m-%d')}, this CPU, {args.threads} threads; {runtimes['bfloat16'].name}, bfloat16 "
            f"decoding through {copies['bfloat16']}, float32 through {copies['float32']}; a {args.context:,}-token "
            f"prefill then {args.decode} greedy tokens, each dtype in turn. bfloat16 reads "
            f"{turns.prefill_ratio():.2f}× and decodes {turns.decode_ratio():.2f}× as fast (median ratios); the "
            f"greedy tokens agree {turns.greedy_agree()} of {args.decode}. "
            f"`--dtype auto` here: {str(auto).removeprefix('torch.')} ({why}).\n\n{turns.table()}")
    write_result(args.out / f"cpu_dtype_{Path(args.model).name}.md", text)
    return text


if __name__ == "__main__":
    main()
