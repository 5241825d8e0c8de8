"""Which dtype a model runs in on this CPU by default: bfloat16 where the CPU has a bfloat16 matrix unit.

CPUs with bfloat16 matrix units (Intel AMX, since Sapphire Rapids: the ``amx_bf16`` flag) multiply a
prefill-sized bfloat16 product about six times faster than float32; elsewhere bfloat16 is emulated, or runs on
vector units alone, and is no faster. The choice is read from the CPU's flags, so it is the same at every start:
it used to be a bfloat16 / float32 speed test at each start, whose ratio ranged 1.5-8.1 over 40 starts of a
loaded machine, so some starts chose float32 and others bfloat16 (and a workspace saved in one dtype must then
be converted to open in the other: context_file.py).

Measured with SmolLM2-135M-Instruct on such a CPU (2 threads; README, *Speed at 32K tokens*): bfloat16 reads a
document about twice as fast, decodes as fast, and holds the middle store in half the memory with no scan copy;
on the document QA benchmark it answered as many questions right and cited as many right pages first (6 and 32
of 42) as float32.
"""

from __future__ import annotations

import functools

import torch

MATRIX_UNIT = "amx_bf16"  # the flag of a bfloat16 matrix unit in /proc/cpuinfo


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
    if MATRIX_UNIT in flags:
        return torch.bfloat16, f"this CPU multiplies bfloat16 in a matrix unit ({MATRIX_UNIT})"
    return torch.float32, f"this CPU has no bfloat16 matrix unit ({MATRIX_UNIT})"
