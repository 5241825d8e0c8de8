"""LM-Infinite attention over a KeyContext (paper §4).

Each query i sees three kinds of keys, scored in one softmax:
  window  j with 0 <= i - j < L, at its true distance i - j           (Λ-mask, ending span)
  start   j < n_starting with i - j >= L, at distance exactly L        (Λ-mask, starting span + distance ceiling)
  middle  the top-k of the rest, at distance topk_distance, if enabled (App. A.3)
The window span runs through a fused kernel that returns its log-sum-exp, in bands of queries or in one
block-sparse call (window.py; kernel_choice.py picks the kernel); the start and middle spans (n_starting + k
keys per query) are scored directly and merged into it exactly, in place, for every query past position L at
once, or a block at a time when top-k scans the middle (queries before L have nothing beyond their window).
Prefill is O(n · L), never n × n. Rotations use offsets from the context's frame, which the cache
keeps within a bounded distance of the queries.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import LMInfiniteConfig
from .key_context import KeyContext
from .fused import attend_with_lse
from .filling import filling_attention
from .kernel_choice import kernels_for
from . import recall_kernel
from .recall import Recalled, recall_topk
from .rotary import Rope, apply_rotation
from .window import window_attention


def default_block_size(window: int) -> int:
    """Queries per top-k block: the scan holds nb × chunk scores, so nb is a fraction of L."""
    return max(16, min(256, window // 4))


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
    """Attention output (B, H, c, D) for queries (B, H, c, D) rotated into ``ctx.frame``: query i holds
    R(i - frame)·q_i. They are the last c tokens of ``ctx.recent``."""
    batch, heads, c, dim = query.shape
    kv_heads = ctx.recent_k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
    groups = heads // kv_heads
    # HF's rotary scale multiplies cos and sin for both q and k, hence appears squared in the logit.
    scale = scaling * rope.attention_scaling**2
    if ctx.decode_keys is not None and ctx.decode_filled is None and not config.uses_topk(layer_idx):
        # A steady decode step without recall: every cached key is visible, so one fused call does it all.
        return F.scaled_dot_product_attention(query, ctx.decode_keys, ctx.decode_values, scale=scale,
                                              enable_gqa=groups > 1)
    kernels = kernels_for(config.window_kernel, query.device, query.dtype, dim)
    if ctx.decode_filled is not None:  # a filling step: nothing beyond its window to recall (filling.py)
        return filling_attention(query, ctx.decode_keys, ctx.decode_values, ctx.decode_filled, scale, kernels.filling)

    first_pos = ctx.end - c
    if ctx.decode_keys is None and ctx.recent_start == 0 and ctx.end <= config.window_ and kernels.window != "float32":
        return within_window(query, ctx, scale, groups)
    # Query head h reads key/value head h // groups, as HF's repeat_kv lays them out.
    q_frame = query.view(batch, kv_heads, groups, c, dim)
    if ctx.decode_keys is not None:  # decoding with top-k: one query, over the decode keys and its recalled tokens
        # Its position as a tensor only for an observer: no recent token lies beyond its window (one launch less
        # per recall layer of every step, which a CUDA graph replays).
        query_pos = torch.arange(first_pos, ctx.end, device=query.device) if observer is not None else None
        block = _attend_block(q_frame, query_pos, first_pos, ctx, config, rope, layer_idx, scale, observer, None,
                              kernels.decode)
        return block.reshape(batch, heads, c, dim).to(query.dtype)  # CUDA's fused kernels may return it strided

    # Prefill: the window span for every query at once (window.py). Queries before position L see nothing
    # beyond it; the others get the start (and middle) spans merged in place.
    query_pos = torch.arange(first_pos, ctx.end, device=query.device)
    win_out, win_lse = window_attention(query, ctx, config.window_, scale, kernels.window)
    out = win_out.view(batch, kv_heads, groups, c, dim)
    lse = win_lse.view(batch, kv_heads, groups, c)
    first_far = min(c, max(0, config.window_ - first_pos))
    # Blocks bound the top-k scan's memory; without it the start span is n_starting keys per query.
    step = (block_size or default_block_size(config.window_)) if config.uses_topk(layer_idx) else c
    for lo in range(first_far, c, step):
        hi = min(c, lo + step)
        target = out[:, :, :, lo:hi]
        block = _attend_block(
            q_frame[:, :, :, lo:hi], query_pos[lo:hi], first_pos + lo, ctx, config, rope, layer_idx, scale, observer,
            (target, lse[:, :, :, lo:hi]),
        )
        if block.data_ptr() != target.data_ptr():  # grouped heads: the rows were merged in a copy
            target.copy_(block.view(batch, kv_heads, groups, hi - lo, dim))
    return out.view(batch, heads, c, dim).to(query.dtype)


def within_window(query: torch.Tensor, ctx: KeyContext, scale: float, groups: int) -> torch.Tensor:
    """A chunk whose every key lies inside every query's window (the context's first L tokens): the Λ-mask is
    plain causal attention there, at true distances, so one fused causal call computes it, in the queries' dtype,
    with no log-sum-exp to merge and no float32 copy. The queries are the last c of the keys: causal aligned at
    the bottom right."""
    c, m = query.shape[-2], ctx.recent_k.shape[-2]
    mask, causal = None, c > 1
    if 1 < c < m:  # a later chunk: query t sees keys up to m - c + t
        mask = torch.ones(c, m, dtype=torch.bool, device=query.device).tril_(m - c)
        causal = False
    return F.scaled_dot_product_attention(query, ctx.recent_k, ctx.recent_v, attn_mask=mask, is_causal=causal,
                                          scale=scale, enable_gqa=groups > 1)


def _attend_block(q_frame, query_pos, p0: int, ctx: KeyContext, config, rope: Rope, layer_idx, scale, observer,
                  window_part, decode_kernel: str | None = None):
    """One block of queries at positions ``query_pos`` (the first, ``p0``, as a number: reading it off the device
    would wait for the GPU): the window span (given, or the decode keys through ``decode_kernel``), then the start
    and middle spans.

    Returns float32 (B, Hkv, g·nb, D); with a given window span of one head per key head, that span's
    own storage, merged in place."""
    batch, kv_heads, groups, nb, dim = q_frame.shape
    rows = groups * nb
    window = config.window_

    if window_part is None:  # decoding with top-k: the start keys are already placed at distance L
        out, lse = attend_with_lse(q_frame.reshape(batch, kv_heads, rows, dim), ctx.decode_keys,
                                   ctx.decode_values, None, scale, decode_kernel)
    else:
        out, lse = window_part[0].reshape(batch, kv_heads, rows, dim), window_part[1].reshape(batch, kv_heads, rows)

    extra_logits, extra_values = [], []
    # Starting span beyond the window: keys unrotated, queries rotated to exactly L (distance ceiling).
    n_start = 0 if ctx.decode_keys is not None else min(ctx.start_k.shape[-2], max(0, p0 + nb - window))
    if n_start:
        q_ceiling = _rotate_to(q_frame, window, p0, ctx.frame, rope).reshape(batch, kv_heads, rows, dim)
        logits = (q_ceiling @ ctx.start_k[..., :n_start, :].transpose(-1, -2)).float() * scale
        if p0 - (n_start - 1) < window:  # some start keys are still inside some queries' windows
            beyond = (query_pos[:, None] - torch.arange(n_start, device=q_frame.device)[None, :]) >= window
            logits = logits.masked_fill(~beyond.repeat(groups, 1), float("-inf"))
        extra_logits.append(logits)
        extra_values.append(ctx.start_v[..., :n_start, :])

    # Middle tokens: the top-k logits at distance topk_distance, per query row and head.
    recalled: Recalled | None = None
    if config.uses_topk(layer_idx):
        store = ctx.middle_k
        fused = store is not None and recall_kernel.scans_store(config.recall_kernel, store.device, store.dtype,
                                                                store.shape)
        if ctx.decode_recall_rotation is not None:  # a decode step: its rotation loaded as tensors (DecodeStep)
            rotate = recall_kernel.rotate if fused else apply_rotation
            q_mid = rotate(q_frame, *ctx.decode_recall_rotation)
        else:
            q_mid = _rotate_to(q_frame, config.topk_distance, p0, ctx.frame, rope)
        recalled = recall_topk(q_mid, query_pos, p0, ctx, rope, k=config.topk, n_starting=config.n_starting,
                               window=window, scale=scale, fused=fused)
        if recalled is not None:
            extra_logits.append(recalled.logits)

    if extra_logits:
        _merge_into(out, lse, extra_logits, extra_values, recalled, layer_idx, query_pos, observer, groups)
    return out


def _rotate_to(q_frame, distance: int, p0: int, frame: int, rope: Rope) -> torch.Tensor:
    """Queries at positions p0, p0 + 1, ... rotated by exactly ``distance`` (for unrotated keys), from their frame
    rotation i - frame."""
    if q_frame.shape[-2] == 1:
        return rope.rotate_uniform(q_frame, distance - (p0 - frame))
    return rope.rotate_range(q_frame, distance - (p0 - frame), -1)


def _merge_into(out, lse, extra_logits, extra_values, recalled, layer_idx, query_pos, observer, groups):
    """Fold directly scored spans into the fused window output, in place: softmax over the union, exactly. Recalled
    tokens still in their store, with nothing else to merge and nobody observing, merge in one kernel."""
    if recalled is not None and recalled.values is None and not extra_values and observer is None:
        recall_kernel.merge_into(out, lse, recalled.logits, recalled.positions, recalled.store_values,
                                 recalled.first_row)
        return
    logits = torch.cat(extra_logits, dim=-1) if len(extra_logits) > 1 else extra_logits[0]
    total = torch.logaddexp(lse, torch.logsumexp(logits, dim=-1))
    probs = torch.exp(logits - total[..., None])  # each extra key's share of the whole softmax
    out.mul_(torch.exp(lse - total)[..., None])
    offset = 0
    for value in extra_values:
        span = value.shape[-2]
        out.add_(probs[..., offset : offset + span].to(value.dtype) @ value)
        offset += span
    if recalled is not None:
        weights = probs[..., offset:]
        out.add_((weights[..., None] * recalled.gathered_values().float()).sum(dim=-2))
        if observer is not None:
            batch, kv_heads, rows, k = weights.shape
            nb = rows // groups
            observer(layer_idx, query_pos, recalled.positions.view(batch, kv_heads * groups, nb, k),
                     weights.view(batch, kv_heads * groups, nb, k))
