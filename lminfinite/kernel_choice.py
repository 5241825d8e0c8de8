"""Which kernels compute the window span on this device: the ones the config names, or for ``auto`` the fastest
(as benchmarks/window_span.py measured) that this device and PyTorch build run correctly.

``auto`` checks each fused candidate once per device, dtype and head size against float64 on a small masked
problem, and skips one that raises or disagrees (with a warning), so a GPU or PyTorch build where a
kernel is missing or wrong falls back to a correct one instead of failing or answering wrongly.
"""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple

import torch

from .fused import SPAN_KERNELS, float32_span, supports

# Fastest first, per device type; float32 runs everywhere.
AUTO_ORDER = {"cuda": ("efficient", "float32"), "cpu": ("cpu-flash", "float32")}


class Kernels(NamedTuple):
    window: str  # a prefill's window span: a band kernel, or "flex" for the whole span at once
    band: str  # spans attended through fused.attend_with_lse (bands, and decoding with top-k)


def kernels_for(requested: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> Kernels:
    if requested == "auto":
        name = _auto(device.type, device.index, dtype, head_dim)
        return Kernels(name, name)
    if not supports(requested, device, dtype):
        raise ValueError(f"window_kernel={requested!r} does not run on {device.type} tensors of {dtype} "
                         f"in this PyTorch build; use 'auto'")
    band = requested if requested in SPAN_KERNELS else _auto(device.type, device.index, dtype, head_dim)
    return Kernels(requested, band)


@functools.lru_cache(maxsize=None)
def _auto(device_type: str, index: int | None, dtype: torch.dtype, head_dim: int) -> str:
    device = torch.device(device_type, index)
    for name in AUTO_ORDER.get(device_type, ()):
        if name != "float32" and supports(name, device, dtype) and agrees_with_float64(name, device, dtype, head_dim):
            return name
    return "float32"


def agrees_with_float64(name: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Kernel ``name`` on a banded, clipped problem (unaligned mask rows, grouped rows) matches float64 (not the
    float32 kernel, whose matmuls follow the caller's TF32 setting)."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, rows, head_dim, generator=generator).to(device, dtype) for rows in (96, 83, 83))
    distance = torch.arange(96, device=device)[:, None] % 48 + 35 - torch.arange(83, device=device)[None, :]
    mask = torch.zeros(96, 83, device=device).masked_fill_((distance < 0) | (distance >= 40), float("-inf"))
    tolerance = 1e-4 if dtype == torch.float32 else 0.05
    try:
        out, lse = SPAN_KERNELS[name](q, k, v, mask, head_dim**-0.5)
        expected_out, expected_lse = float32_span(q.double(), k.double(), v.double(), mask.double(), head_dim**-0.5)
        error = max((out - expected_out).abs().max().item(), (lse - expected_lse).abs().max().item())
    except RuntimeError as exc:  # a kernel this build or GPU does not run
        warnings.warn(f"lminfinite: the {name!r} window kernel fails on {device} with {dtype} ({exc}); not using it")
        return False
    if not error < tolerance:
        warnings.warn(f"lminfinite: the {name!r} window kernel is off by {error:.3g} on {device} with {dtype}; "
                      "not using it")
        return False
    return True
