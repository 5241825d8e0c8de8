"""Where a prefill inside the window spends its time: vanilla against LM-Infinite at one context, side by side.

Inside the window LM-Infinite computes exactly what vanilla does, so any gap is overhead around the attention.
This times both in turn (CUDA-synchronised runs, a fresh cache each; the ratio of each pair), counts the
operators a layer runs beyond vanilla's (its attention module, the cache's update included: what a GPU's host
launches), and prints the profiler's table of time per operator for one run of each, so the gap can be read
operator by operator.

    python -m benchmarks.profile_prefill --model random-7b --device cuda --load-in-4bit --context 4096
    python -m benchmarks.profile_prefill --model random-host --device cpu --window 256 --context 256 --rows 0

``random-host`` has Llama-2-7B's 32 layers at a size where the host's work is nearly all there is: on a CPU it
measures what a GPU's host adds per layer, which shows in a GPU's time wherever the host barely keeps ahead.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

import lminfinite
from benchmarks.measure import _sync
from benchmarks.models import build_model

# Operators that make a view or nothing: no kernel runs for them on a GPU.
VIEWS = {"view", "_unsafe_view", "slice", "select", "t", "transpose", "permute", "unsqueeze", "squeeze", "expand",
         "alias", "detach", "reshape", "as_strided", "split", "unbind", "narrow", "lift_fresh", "detach_",
         "promote_types"}


class OperatorsInAttention(TorchDispatchMode):
    """The operators that run while an attention module does (the cache's update is called from there), by name,
    views left out."""

    def __init__(self, model):
        super().__init__()
        self.calls, self.inside = collections.Counter(), False
        modules = [m for m in model.modules() if type(m).__name__.endswith("Attention")]
        self.hooks = [m.register_forward_pre_hook(lambda *_: setattr(self, "inside", True)) for m in modules]
        self.hooks += [m.register_forward_hook(lambda *_: setattr(self, "inside", False)) for m in modules]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split("::")[1].split(".")[0]
        if self.inside and name not in VIEWS:
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        return super().__exit__(*exc)


def operators_per_layer(model, run) -> tuple[float, collections.Counter]:
    """Operators per attention layer in one ``run()``, and their names with counts (the whole forward's)."""
    with OperatorsInAttention(model) as counted:
        run()
    return sum(counted.calls.values()) / model.config.num_hidden_layers, counted.calls


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random-7b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--load-in-4bit", action="store_true")
    p.add_argument("--window", type=int, default=4096)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rows", type=int, default=22, help="operators listed per method (0: no profiler tables)")
    args = p.parse_args(argv)

    dtype = torch.bfloat16 if args.device == "cuda" or args.model == "random-host" else torch.float32
    model = build_model(args.model, window=args.window, device=args.device, dtype=dtype,
                        load_in_4bit=args.load_in_4bit)
    ids = torch.randint(100, model.config.vocab_size, (1, args.context), device=args.device, generator=None)
    config = lminfinite.LMInfiniteConfig(window=args.window)

    caches = {"vanilla": lambda: DynamicCache(config=model.config),
              "lminfinite": lambda: lminfinite.InfiniteCache(model)}

    def switch(name: str):
        """A prefill of the model hooked for ``name``; hooked here, outside the time measured (enable() re-hooks
        every layer: milliseconds)."""
        if name == "vanilla":
            lminfinite.disable(model)
        else:
            lminfinite.enable(model, config)
        return lambda: model(input_ids=ids, past_key_values=caches[name](), use_cache=True, logits_to_keep=1)

    times = {name: [] for name in caches}
    threads = torch.get_num_threads()
    with torch.inference_mode():
        for _ in range(2):
            for name in caches:
                switch(name)()
        for _ in range(args.rounds):
            for name in caches:
                run = switch(name)
                _sync(args.device)
                start = time.perf_counter()
                run()
                _sync(args.device)
                times[name].append(time.perf_counter() - start)
        print(f"{args.model} on {args.device} ({threads} thread(s)), {args.context:,} tokens, window {args.window:,}")
        for name in caches:
            median = statistics.median(times[name])
            print(f"{name}: {1000 * median:.1f} ms median of {args.rounds} ({args.context / median:,.0f} tok/s)")
        pairs = [mine / theirs for theirs, mine in zip(times["vanilla"], times["lminfinite"])]
        print(f"lminfinite / vanilla time: {statistics.median(pairs):.3f} (median of {args.rounds} pairs)")
        counts = {name: operators_per_layer(model, switch(name)) for name in caches}
        extra = counts["lminfinite"][1] - counts["vanilla"][1]
        print(f"operators per layer: vanilla {counts['vanilla'][0]:.0f}, lminfinite {counts['lminfinite'][0]:.0f} "
              f"(more: {', '.join(f'{name} {n / model.config.num_hidden_layers:g}' for name, n in extra.most_common())})")
        if not args.rows:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if args.device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        sort = "cuda_time_total" if args.device == "cuda" else "cpu_time_total"
        for name in caches:
            run = switch(name)
            with torch.profiler.profile(activities=activities) as prof:
                run()
                _sync(args.device)
            print(f"\n== {name}: operators by {sort} ==")
            print(prof.key_averages().table(sort_by=sort, row_limit=args.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
