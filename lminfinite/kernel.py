"""LM-Infinite attention over a KeyContext, one block of queries at a time (paper §4).

Each query i sees three kinds of keys, scored in one softmax:
  window  j with 0 <= i - j < L, at its true distance i - j           (Λ-mask, ending span)
  start   j < n_starting with i - j >= L, at distance exactly L        (Λ-mask, starting span + distance ceiling)
  middle  the top-k of the rest, at distance topk_distance, if enabled (App. A.3)
Rotations use offsets relative to the block (never absolute positions), so they stay below L + block.
A block of nb queries costs nb × (L + nb + n_starting + k) logits: prefill is O(n · L), never n × n.
"""

from __future__ import annotations

import torch

from .config import LMInfiniteConfig
from .context import KeyContext
from .recall import recall_topk
from .rotary import Rope

# Elements of one block's (queries × keys) float32 logits, summed over batch and heads.
BLOCK_BUDGET = 1 << 25


def lm_infinite_attention(
    query: torch.Tensor,
    ctx: KeyContext,
    *,
    config: LMInfiniteConfig,
    rope: Rope,
    layer_idx: int,
    scaling: float,
    observer=None,
    block_size: int | None = None,
) -> torch.Tensor:
    """Attention output (B, H, c, D) for unrotated queries (B, H, c, D), the last c tokens of ``ctx.recent``."""
    batch, heads, c, dim = query.shape
    kv_heads = ctx.recent_k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
    window = config.window_
    # HF's rotary scale multiplies cos and sin for both q and k, hence appears squared in the logit.
    scale = scaling * rope.attention_scaling**2
    if block_size is None:
        per_query = batch * heads * (window + config.n_starting + config.topk + window)
        block_size = max(1, min(window, BLOCK_BUDGET // per_query))
    first_query = ctx.end - c
    out = torch.empty_like(query)
    for lo in range(0, c, block_size):
        hi = min(c, lo + block_size)
        out[:, :, lo:hi] = _attend_block(
            query[:, :, lo:hi], first_query + lo, ctx, config, rope, layer_idx, scale, observer
        )
    return out


def _attend_block(q, p0, ctx: KeyContext, config, rope: Rope, layer_idx, scale, observer):
    batch, heads, nb, dim = q.shape
    kv_heads = ctx.recent_k.shape[1]
    groups = heads // kv_heads
    window, n_starting = config.window_, config.n_starting
    device = q.device
    # Query head h reads key/value head h // groups, as HF's repeat_kv lays them out.
    qg = q.reshape(batch, kv_heads, groups, nb, dim)
    query_pos = torch.arange(p0, p0 + nb, device=device)

    logits, values = [], []

    # Window span: keys at distances 0..L-1 of some query in the block, rotated relative to `base`.
    lo = max(p0 - window + 1, ctx.recent_start)
    hi = p0 + nb
    base = lo
    key_pos = torch.arange(lo, hi, device=device)
    k_win = rope.rotate(ctx.recent_k[..., lo - ctx.recent_start : hi - ctx.recent_start, :], key_pos - base)
    q_win = rope.rotate(qg, query_pos - base)
    distance = query_pos[:, None] - key_pos[None, :]
    in_window = (distance >= 0) & (distance < window)
    logits.append(_scores(q_win, k_win, scale).masked_fill(~in_window, float("-inf")))
    values.append(ctx.recent_v[..., lo - ctx.recent_start : hi - ctx.recent_start, :])

    # Starting span beyond the window: keys unrotated, queries rotated to exactly L (distance ceiling).
    n_start = min(ctx.start_k.shape[-2], max(0, p0 + nb - window))
    if n_start:
        q_ceiling = rope.rotate(qg, torch.full((nb,), window, device=device))
        start_pos = torch.arange(n_start, device=device)
        beyond = (query_pos[:, None] - start_pos[None, :]) >= window
        logits.append(_scores(q_ceiling, ctx.start_k[..., :n_start, :], scale).masked_fill(~beyond, float("-inf")))
        values.append(ctx.start_v[..., :n_start, :])

    # Middle tokens: the top-k logits at distance topk_distance, per query row and head.
    recalled = None
    if config.uses_topk(layer_idx):
        q_mid = rope.rotate(qg, torch.full((nb,), config.topk_distance, device=device))
        recalled = recall_topk(
            q_mid, query_pos, ctx, k=config.topk, n_starting=n_starting, window=window, scale=scale
        )

    return _softmax_combine(logits, values, recalled, qg.shape, q.dtype, layer_idx, query_pos, observer)


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """float32 logits (B, Hkv, g, nb, m) of grouped queries (B, Hkv, g, nb, D) against keys (B, Hkv, m, D)."""
    batch, kv_heads, groups, nb, dim = q.shape
    flat = q.reshape(batch, kv_heads, groups * nb, dim) @ k.transpose(-1, -2)
    return flat.float().mul_(scale).view(batch, kv_heads, groups, nb, -1)


def _softmax_combine(logits, values, recalled, grouped_shape, dtype, layer_idx, query_pos, observer):
    batch, kv_heads, groups, nb, dim = grouped_shape
    spans = [x.shape[-1] for x in logits]
    if recalled is not None:
        logits.append(recalled.logits.view(batch, kv_heads, groups, nb, -1))
    probs = torch.softmax(torch.cat(logits, dim=-1), dim=-1)
    out = torch.zeros(batch, kv_heads, groups * nb, dim, dtype=torch.float32, device=probs.device)
    offset = 0
    for span, value in zip(spans, values):
        p = probs[..., offset : offset + span].reshape(batch, kv_heads, groups * nb, span)
        out += (p.to(value.dtype) @ value).float()
        offset += span
    if recalled is not None:
        p = probs[..., offset:].reshape(batch, kv_heads, groups * nb, -1)
        out += (p[..., None] * recalled.values.float()).sum(dim=-2)
        if observer is not None:
            observer(layer_idx, query_pos, recalled.positions.view(batch, kv_heads * groups, nb, -1),
                     p.view(batch, kv_heads * groups, nb, -1))
    return out.view(batch, kv_heads * groups, nb, dim).to(dtype)
