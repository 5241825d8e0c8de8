"""Which dtype a model runs in on this CPU by default: bfloat16 where the CPU multiplies bfloat16 in hardware.

Two kinds of CPU do: those with bfloat16 matrix units (Intel AMX, since Sapphire Rapids: the ``amx_bf16`` flag)
and those with AVX-512's bfloat16 dot products (``avx512_bf16``: Intel Cooper Lake, AMD Zen 4 and later). On an AMD
EPYC of the second kind (2 threads), a prefill-sized product ran 2.5x faster in bfloat16 than in float32, and
Qwen2.5-Coder-1.5B read 2.3x and decoded 3.2x as fast (bfloat16 with the integer decode copies against float32:
``python -m benchmarks.cpu_dtype``, docs/models.md). Elsewhere bfloat16 is emulated and no faster. The choice is
read from the CPU's flags, so it is the same at every start: it used to be a bfloat16 / float32 speed test at each
start, whose ratio ranged 1.5-8.1 over 40 starts of a loaded machine, so some starts chose float32 and others
bfloat16 (and a workspace saved in one dtype must then be converted to open in the other: context_file.py).

Measured with SmolLM2-135M-Instruct on an AMX CPU (2 threads; README, *Speed at 32K tokens*): bfloat16 reads a
document about twice as fast, decodes as fast, and holds the middle store in half the memory with no scan copy;
on the document QA benchmark it answered as many questions right and cited as many right pages first (6 and 32
of 42) as float32. The development set's tables for the Qwen models were measured in bfloat16 (docs/answers.md).
"""

from __future__ import annotations

import functools

import torch

# The flags, in /proc/cpuinfo, of hardware that multiplies bfloat16: a matrix unit, then AVX-512's dot products
BFLOAT16_UNITS = ("amx_bf16", "avx512_bf16")


@functools.cache
def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (the first processor's); none where there is no such file."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            for line in file:
                name, _, value = line.partition(":")
                if name.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def default_cpu_dtype(flags: frozenset[str] | None = None) -> tuple[torch.dtype, str]:
    """The dtype ``--dtype auto`` runs a model in on the CPU, and why (for the header's notice)."""
    flags = cpu_flags() if flags is None else flags
    for unit in BFLOAT16_UNITS:
        if unit in flags:
            return torch.bfloat16, f"{unit}: this CPU multiplies bfloat16 in hardware"
    return torch.float32, f"this CPU does not multiply bfloat16 in hardware: no {' or '.join(BFLOAT16_UNITS)}"
