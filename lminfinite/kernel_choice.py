"""Which kernels compute the window span on this device (a prefill's, a decode step's with top-k, and a decode
step's before the window is full): the ones the config names, or for ``auto`` the fastest (as
benchmarks/window_span.py measured) that this device and PyTorch build run correctly.

``auto`` checks each fused candidate once per device, dtype and head size against float64 on a small masked
problem, and skips one that raises or disagrees (with a warning), so a GPU or PyTorch build where a
kernel is missing or wrong falls back to a correct one instead of failing or answering wrongly.
"""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple

import torch

from . import filling
from .filling import FilledRows
from .key_context import KeyContext
from .fused import SPAN_KERNELS, attend_with_lse, float32_span, supports, takes_unmasked_spans
from .window import window_attention

# Fastest first, per device type; float32 runs everywhere. A prefill's window span may use a whole-span kernel
# (window.WHOLE_SPAN_KERNELS) or a band kernel (fused.SPAN_KERNELS). A decode step with top-k attends to one
# query's rows over every key it is given, with no mask: FlashAttention-2 splits the keys among programs, where the
# memory-efficient kernel runs one program per head (flash_window.py).
AUTO_WINDOW = {"cuda": ("flash", "efficient", "float32"), "cpu": ("cpu-flash", "float32")}
AUTO_DECODE = {"cuda": ("flash", "efficient", "float32"), "cpu": ("cpu-flash", "float32")}
# A filling step (filling.py), whatever the window kernel asked for: FlashAttention-2 reads the rows in use alone.
AUTO_FILLING = {"cuda": ("flash", "sdpa")}


class Kernels(NamedTuple):
    window: str  # a prefill's window span: a band kernel, or a whole-span one ("flash", "flex")
    decode: str  # a decode step's keys with top-k, through fused.attend_with_lse with no mask
    filling: str  # a decode step's before the window is full (filling.py)


@functools.lru_cache(maxsize=None)
def kernels_for(requested: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> Kernels:
    """Resolved once per request, device, dtype and head size: every layer of every forward asks."""
    filling = _auto_filling(device, dtype, head_dim)
    if requested == "auto":
        return Kernels(_auto(AUTO_WINDOW, device, dtype, head_dim), _auto(AUTO_DECODE, device, dtype, head_dim),
                       filling)
    if not supports(requested, device, dtype):
        raise ValueError(f"window_kernel={requested!r} does not run on {device.type} tensors of {dtype} "
                         f"in this PyTorch build; use 'auto'")
    decode = requested if takes_unmasked_spans(requested) else _auto(AUTO_DECODE, device, dtype, head_dim)
    return Kernels(requested, decode, filling)


def _auto(order: dict, device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    for name in order.get(device.type, ()):
        if name != "float32" and supports(name, device, dtype) and _checked(name, device.type, device.index, dtype,
                                                                            head_dim):
            return name
    return "float32"


def _auto_filling(device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    for name in AUTO_FILLING.get(device.type, ()):
        if name == "sdpa" or (filling.supports(name, device, dtype)
                              and _filling_checked(name, device.type, device.index, dtype, head_dim)):
            return name
    return "sdpa"


@functools.lru_cache(maxsize=None)
def _filling_checked(name: str, device_type: str, index: int | None, dtype: torch.dtype, head_dim: int) -> bool:
    return filling_agrees_with_float64(name, torch.device(device_type, index), dtype, head_dim)


def filling_agrees_with_float64(name: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Filling kernel ``name`` matches float64 on a ring of 300 rows of which 123 are in use, with one query head
    per key head and with four (the variable-length call swaps a group's heads into rows)."""
    generator = torch.Generator().manual_seed(0)
    try:
        error = max(_filling_error(name, device, dtype, head_dim, groups, generator) for groups in (1, 4))
    except RuntimeError as exc:  # a kernel this build or GPU does not run
        warnings.warn(f"lminfinite: the {name!r} filling kernel fails on {device} with {dtype} ({exc}); not using it")
        return False
    if not error < 0.05:
        warnings.warn(f"lminfinite: the {name!r} filling kernel is off by {error:.3g} on {device} with {dtype}; "
                      "not using it")
        return False
    return True


def _filling_error(name: str, device, dtype, head_dim: int, groups: int, generator) -> float:
    rows, used, kv_heads = 300, 123, 2
    query = torch.randn(1, kv_heads * groups, 1, head_dim, generator=generator).to(device, dtype)
    keys, values = (torch.randn(1, kv_heads, rows, head_dim, generator=generator).to(device, dtype) for _ in range(2))
    filled = FilledRows.allocate(rows, device)
    filled.fill(used)
    out = filling.FILLING_KERNELS[name](query, keys, values, filled, head_dim**-0.5)
    k, v = (t[..., :used, :].double().repeat_interleave(groups, dim=1) for t in (keys, values))
    expected = torch.softmax(query.double() @ k.transpose(-1, -2) * head_dim**-0.5, dim=-1) @ v
    return (out.double() - expected).abs().max().item()


@functools.lru_cache(maxsize=None)
def _checked(name: str, device_type: str, index: int | None, dtype: torch.dtype, head_dim: int) -> bool:
    return agrees_with_float64(name, torch.device(device_type, index), dtype, head_dim)


def agrees_with_float64(name: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Kernel ``name`` matches float64 (not the float32 kernel, whose matmuls follow the caller's TF32 setting)
    on a window span whose first band is clipped at the oldest key and whose rows group two query heads per key
    head; a band kernel also on a mask whose rows start unaligned; a kernel of unmasked spans on a decode step's rows.
    Checked once per device, dtype and head size."""
    generator = torch.Generator().manual_seed(0)
    tolerance = 1e-4 if dtype == torch.float32 else 0.05
    try:
        error = _window_error(name, device, dtype, head_dim, generator)
        if name in SPAN_KERNELS:
            error = max(error, _band_error(name, device, dtype, head_dim, generator))
        if takes_unmasked_spans(name):
            error = max(error, _decode_error(name, device, dtype, head_dim, generator))
    except RuntimeError as exc:  # a kernel this build or GPU does not run
        warnings.warn(f"lminfinite: the {name!r} window kernel fails on {device} with {dtype} ({exc}); not using it")
        return False
    if not error < tolerance:
        warnings.warn(f"lminfinite: the {name!r} window kernel is off by {error:.3g} on {device} with {dtype}; "
                      "not using it")
        return False
    return True


def _window_error(name: str, device, dtype, head_dim: int, generator) -> float:
    """The window span of 96 queries after 35 earlier keys, L = 40, four query heads over two key heads."""
    queries, keys, window, scale = 96, 96 + 35, 40, head_dim**-0.5
    query = torch.randn(1, 4, queries, head_dim, generator=generator).to(device, dtype)
    k, v = (torch.randn(1, 2, keys, head_dim, generator=generator).to(device, dtype) for _ in range(2))
    ctx = KeyContext(k, v, recent_start=0, frame=0, start_k=k[..., :0, :], start_v=v[..., :0, :])
    out, lse = window_attention(query, ctx, window, scale, name)
    distance = torch.arange(keys - queries, keys, device=device)[:, None] - torch.arange(keys, device=device)
    mask = torch.zeros(queries, keys, device=device, dtype=torch.float64)
    mask.masked_fill_((distance < 0) | (distance >= window), float("-inf"))
    k, v = (t.double().repeat_interleave(2, dim=1) for t in (k, v))
    expected_out, expected_lse = float32_span(query.double(), k, v, mask, scale)
    return max((out - expected_out).abs().max().item(), (lse - expected_lse).abs().max().item())


def _band_error(name: str, device, dtype, head_dim: int, generator) -> float:
    """One band through attend_with_lse with an unaligned mask (83 columns) over grouped rows."""
    q, k, v = (torch.randn(1, 2, rows, head_dim, generator=generator).to(device, dtype) for rows in (96, 83, 83))
    distance = torch.arange(96, device=device)[:, None] % 48 + 35 - torch.arange(83, device=device)[None, :]
    mask = torch.zeros(96, 83, device=device).masked_fill_((distance < 0) | (distance >= 40), float("-inf"))
    out, lse = SPAN_KERNELS[name](q, k, v, mask, head_dim**-0.5)
    expected_out, expected_lse = float32_span(q.double(), k.double(), v.double(), mask.double(), head_dim**-0.5)
    return max((out - expected_out).abs().max().item(), (lse - expected_lse).abs().max().item())


def _decode_error(name: str, device, dtype, head_dim: int, generator) -> float:
    """A decode step's span through attend_with_lse: four grouped query rows per key head over 107 keys, no mask."""
    q, k, v = (torch.randn(1, 2, rows, head_dim, generator=generator).to(device, dtype) for rows in (4, 107, 107))
    out, lse = attend_with_lse(q, k, v, None, head_dim**-0.5, name)
    expected_out, expected_lse = float32_span(q.double(), k.double(), v.double(), None, head_dim**-0.5)
    return max((out - expected_out).abs().max().item(), (lse - expected_lse).abs().max().item())
