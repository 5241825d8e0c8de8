"""Where a prefill inside the window spends its time: vanilla against LM-Infinite at one context, side by side.

Inside the window LM-Infinite computes exactly what vanilla does, so any gap is overhead around the attention.
This times both in turn (median of CUDA-synchronised runs, a fresh cache each) and prints the profiler's table
of device time per operator for one run of each, so the gap can be read operator by operator.

    python -m benchmarks.profile_prefill --model random-7b --device cuda --load-in-4bit --context 4096
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

import lminfinite
from benchmarks.measure import _sync
from benchmarks.models import build_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random-7b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--load-in-4bit", action="store_true")
    p.add_argument("--window", type=int, default=4096)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rows", type=int, default=22, help="operators listed per method")
    args = p.parse_args()

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = build_model(args.model, window=args.window, device=args.device, dtype=dtype,
                        load_in_4bit=args.load_in_4bit)
    ids = torch.randint(100, 30000, (1, args.context), device=args.device, generator=None)
    config = lminfinite.LMInfiniteConfig(window=args.window)

    def vanilla():
        lminfinite.disable(model)
        return model(input_ids=ids, past_key_values=DynamicCache(config=model.config), use_cache=True,
                     logits_to_keep=1)

    def infinite():
        lminfinite.enable(model, config)
        return model(input_ids=ids, past_key_values=lminfinite.InfiniteCache(model), use_cache=True,
                     logits_to_keep=1)

    methods = {"vanilla": vanilla, "lminfinite": infinite}
    times = {name: [] for name in methods}
    with torch.inference_mode():
        for _ in range(2):
            for run in methods.values():
                run()
        for _ in range(args.rounds):
            for name, run in methods.items():
                _sync(args.device)
                start = time.perf_counter()
                run()
                _sync(args.device)
                times[name].append(time.perf_counter() - start)
        for name, run in methods.items():
            median = statistics.median(times[name])
            print(f"{name}: {1000 * median:.1f} ms median of {args.rounds} ({args.context / median:,.0f} tok/s)")
        print(f"lminfinite / vanilla time: {statistics.median(times['lminfinite']) / statistics.median(times['vanilla']):.3f}")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if args.device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        sort = "cuda_time_total" if args.device == "cuda" else "cpu_time_total"
        for name, run in methods.items():
            with torch.profiler.profile(activities=activities) as prof:
                run()
                _sync(args.device)
            print(f"\n== {name}: operators by {sort} ==")
            print(prof.key_averages().table(sort_by=sort, row_limit=args.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
