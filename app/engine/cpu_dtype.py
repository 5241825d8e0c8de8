"""Which dtype a model runs in on this CPU by default: bfloat16 where the CPU multiplies it much faster.

CPUs with bfloat16 matrix units (Intel AMX, since Sapphire Rapids) multiply a prefill-sized bfloat16 product
about six times faster than float32; elsewhere bfloat16 is emulated and slower. So the choice is measured, once,
on a product shaped like a prefill chunk through a small model's layer, rather than read from CPU flags.

Measured with SmolLM2-135M-Instruct on such a CPU (2 threads; README, *Speed at 32K tokens*): bfloat16 reads a
document about twice as fast, decodes as fast, and holds the middle store in half the memory with no scan copy;
on the document QA benchmark it answered as many questions right and cited as many right pages first (6 and 32
of 42) as float32.
"""

from __future__ import annotations

import functools
import time

import torch

PAYS_FROM = 2.0  # bfloat16 must be at least this many times faster than float32
ROWS, FEATURES, OUTPUTS = 512, 1024, 1024  # a prefill chunk through one projection


@functools.cache
def bfloat16_speedup() -> float:
    """How many times faster this CPU multiplies a prefill-shaped product in bfloat16 than in float32 (best of
    three each, with torch's current threads)."""
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        inputs = torch.ones(ROWS, FEATURES, dtype=dtype)
        weights = torch.ones(OUTPUTS, FEATURES, dtype=dtype)
        torch.nn.functional.linear(inputs, weights)  # the kernel's first call sets it up
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            torch.nn.functional.linear(inputs, weights)
            best = min(best, time.perf_counter() - start)
        seconds[dtype] = best
    return seconds[torch.float32] / max(seconds[torch.bfloat16], 1e-9)


def default_cpu_dtype(speedup: float | None = None) -> tuple[torch.dtype, str]:
    """The dtype ``--dtype auto`` runs a model in on the CPU, and why (for the header's notice)."""
    speedup = bfloat16_speedup() if speedup is None else speedup
    if speedup >= PAYS_FROM:
        return torch.bfloat16, f"this CPU multiplies bfloat16 {speedup:.1f}x faster than float32"
    return torch.float32, f"bfloat16 is not faster on this CPU ({speedup:.1f}x)"
