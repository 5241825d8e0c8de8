"""The window span of a prefill: every query's last L keys, through the fused kernel, in bands.

Query i sees the window keys j with 0 <= i - j < L. A band of nb queries touches the L + nb keys
[p - L + 1, p + nb) under a mask, so it computes nb · (L + nb) scores for nb · L useful ones: small
bands waste little, and each is one fused call that also returns its log-sum-exp. Causal triangles
(``is_causal``) do not pay on the CPU kernel: it tiles keys 512 at a time, so for L <= 512 a triangle
costs a whole square, and for larger L a band of 256 already wastes under 6%.
"""

from __future__ import annotations

import torch

from .context import KeyContext
from .fused import attend_with_lse


def band_size(window: int) -> int:
    """Queries per band: a small fraction of L (little masked work), not so small that calls dominate."""
    return max(32, min(256, window // 8))


def window_attention(query: torch.Tensor, ctx: KeyContext, window: int, scale: float):
    """Window-span output and log-sum-exp, float32 (B, H, c, D) and (B, H, c).

    ``query`` (B, H, c, D) holds the last c tokens of ``ctx.recent``, rotated into ``ctx.frame``.
    """
    batch, heads, c, dim = query.shape
    kv_heads = ctx.recent_k.shape[1]
    groups = heads // kv_heads
    # Query head h reads key/value head h // groups (HF's repeat_kv): fold groups into rows.
    q = query.view(batch, kv_heads, groups, c, dim)
    first = ctx.end - c
    out = torch.empty(batch, kv_heads, groups, c, dim, dtype=torch.float32, device=query.device)
    lse = torch.empty(batch, kv_heads, groups, c, dtype=torch.float32, device=query.device)
    step = band_size(window)
    for lo in range(0, c, step):
        hi = min(c, lo + step)
        nb = hi - lo
        k_lo, k_hi = max(first + lo - window + 1, ctx.recent_start), first + hi
        keys = ctx.recent_k[..., k_lo - ctx.recent_start : k_hi - ctx.recent_start, :]
        values = ctx.recent_v[..., k_lo - ctx.recent_start : k_hi - ctx.recent_start, :]
        query_pos = torch.arange(first + lo, first + hi, device=query.device)
        mask = band_mask(query_pos, torch.arange(k_lo, k_hi, device=query.device), window, groups)
        rows = q[:, :, :, lo:hi].reshape(batch, kv_heads, groups * nb, dim)
        band_out, band_lse = attend_with_lse(rows, keys, values, mask, scale)
        out[:, :, :, lo:hi] = band_out.view(batch, kv_heads, groups, nb, dim)
        lse[:, :, :, lo:hi] = band_lse.view(batch, kv_heads, groups, nb)
    return out.view(batch, heads, c, dim), lse.view(batch, heads, c)


def band_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int, groups: int) -> torch.Tensor:
    """(groups·nq, nk) additive mask: 0 where 0 <= i - j < window, else -inf; rows ordered (group, query)."""
    distance = query_pos[:, None] - key_pos[None, :]
    allowed = (distance >= 0) & (distance < window)
    mask = torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device).masked_fill_(~allowed, float("-inf"))
    return mask.repeat(groups, 1)
