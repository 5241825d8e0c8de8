"""The window span of a prefill: every query's last L keys, through the fused kernel, in bands.

Query i sees the window keys j with 0 <= i - j < L. A band of nb queries touches the L + nb - 1 keys
[p - L + 1, p + nb) under a mask, so it computes nb · (L + nb - 1) scores for nb · L useful ones: small
bands waste little, and each is one fused call that also returns its log-sum-exp. Every band has the
same mask relative to its first query, so it is built once per call; a band clipped at the oldest
cached key uses its right-hand columns. Causal triangles (``is_causal``) do not pay on the CPU kernel:
it tiles keys 512 at a time, so for L <= 512 a triangle costs a whole square, and for larger L a band
of 256 already wastes under 6%. The whole-span kernels (``flash``, ``flex``) take the span in one call instead.
"""

from __future__ import annotations

import torch

from .key_context import KeyContext
from .flash_window import flash_window_span
from .flex_window import flex_window_span
from .fused import BIAS_ALIGNMENT, attend_with_lse

# Kernels that take a prefill's whole window span in one call: (query, keys, values, window, scale), the
# queries being the last c keys; the band kernels (fused.py) run in bands of queries.
WHOLE_SPAN_KERNELS = {"flash": flash_window_span, "flex": flex_window_span}


def band_size(window: int) -> int:
    """Queries per band: a small fraction of L (little masked work), not so small that calls dominate."""
    return max(32, min(256, window // 8))


def window_attention(query: torch.Tensor, ctx: KeyContext, window: int, scale: float, kernel: str = "float32",
                     band: int | None = None):
    """Window-span output and log-sum-exp, float32 (B, H, c, D) and (B, H, c), through the named kernel
    (fused.py, or one of WHOLE_SPAN_KERNELS), in bands of ``band`` queries (default band_size).

    ``query`` (B, H, c, D) holds the last c tokens of ``ctx.recent``, rotated into ``ctx.frame``.
    """
    batch, heads, c, dim = query.shape
    kv_heads = ctx.recent_k.shape[1]
    groups = heads // kv_heads
    if kernel in WHOLE_SPAN_KERNELS:
        k_lo = max(ctx.end - c - window + 1, ctx.recent_start)  # the first query's oldest visible key
        keys = ctx.recent_k[..., k_lo - ctx.recent_start :, :]
        values = ctx.recent_v[..., k_lo - ctx.recent_start :, :]
        return WHOLE_SPAN_KERNELS[kernel](query, keys, values, window, scale)
    # Query head h reads key/value head h // groups (HF's repeat_kv): fold groups into rows.
    q = query.view(batch, kv_heads, groups, c, dim)
    first = ctx.end - c
    # Laid out (B, c, H, D) in memory, as the attention interface returns it: no transpose copy later.
    out = torch.empty(batch, c, kv_heads, groups, dim, dtype=torch.float32, device=query.device).permute(0, 2, 3, 1, 4)
    lse = torch.empty(batch, kv_heads, groups, c, dtype=torch.float32, device=query.device)
    step = min(band or band_size(window), c)
    mask = band_mask(step, window, groups, query.dtype, query.device)  # (groups, step, window + step - 1)
    for lo in range(0, c, step):
        hi = min(c, lo + step)
        nb = hi - lo
        lowest = first + lo - window + 1  # the band's first query sees keys from here on
        k_lo, k_hi = max(lowest, ctx.recent_start), first + hi
        keys = ctx.recent_k[..., k_lo - ctx.recent_start : k_hi - ctx.recent_start, :]
        values = ctx.recent_v[..., k_lo - ctx.recent_start : k_hi - ctx.recent_start, :]
        band = mask[:, :nb, k_lo - lowest : k_hi - lowest].reshape(groups * nb, k_hi - k_lo)
        rows = q[:, :, :, lo:hi].reshape(batch, kv_heads, groups * nb, dim)
        band_out, band_lse = attend_with_lse(rows, keys, values, band, scale, kernel)
        out[:, :, :, lo:hi] = band_out.view(batch, kv_heads, groups, nb, dim)
        lse[:, :, :, lo:hi] = band_lse.view(batch, kv_heads, groups, nb)
    return out.view(batch, heads, c, dim), lse.view(batch, heads, c)


def band_mask(queries: int, window: int, groups: int, dtype: torch.dtype, device) -> torch.Tensor:
    """(groups, queries, window + queries - 1) additive mask, 0 where 0 <= i - j < window, else -inf:
    query t of a band against the keys from ``window - 1`` before its first query; rows are repeated
    per group of query heads sharing a key head. It is stored whole, rows padded to whole vectors, so a full
    band's (groups · queries, keys) slice is a view fused kernels read as it is, never a copy per band."""
    width = window + queries - 1
    distance = torch.arange(queries, device=device)[:, None] + (window - 1) - torch.arange(width, device=device)
    allowed = (distance >= 0) & (distance < window)
    storage = torch.empty(groups, queries, -(-width // BIAS_ALIGNMENT) * BIAS_ALIGNMENT, dtype=dtype, device=device)
    return storage[..., :width].fill_(0).masked_fill_(~allowed, float("-inf"))
