"""Top-k middle-token recall (paper §4 "Optionally attending to top-k tokens in the middle", App. A.3).

For every query row and head, the k middle tokens with the largest logits, scored at distance
``topk_distance``, join the softmax. The scan runs over the candidates in chunks with a running
top-k, so no (queries × context) float32 matrix is ever held; an offloaded (CPU) middle store is
scanned where it lives, and only the selected rows travel to the queries' device. A long store with a scan
copy is scanned through it where that pays (bounded_scan.py), with the same result. A decode step's scan of a
store on a GPU runs through Triton's kernels where ``fused`` (recall_kernel.py), again with the same result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import recall_kernel
from .bounded_scan import copy_pays, scan_topk
from .key_context import KeyContext
from .head_products import head_products
from .rotary import Rope

# Elements of one (queries × candidates) score chunk; bounds the scan's working memory.
SCAN_BUDGET = 1 << 24


@dataclass
class Recalled:
    """k recalled tokens per query row: logits (float32, -inf where fewer candidates existed), absolute
    positions, and their values on the queries' device. Shapes (B, Hkv, g·nb, k[, D]).

    ``values`` is None where every token came from the middle store through recall_kernel.py's kernels: they are
    the store's rows ``positions - first_row`` of ``store_values``, which recall_kernel.merge_into reads where it
    merges them, and ``gathered_values`` gathers otherwise."""

    logits: torch.Tensor
    positions: torch.Tensor
    values: torch.Tensor | None
    store_values: torch.Tensor | None = None
    first_row: int = 0

    def gathered_values(self) -> torch.Tensor:
        if self.values is None:
            self.values = recall_kernel.gather(self.positions, self.logits, self.store_values, self.first_row)
        return self.values


def recall_topk(
    q_scored: torch.Tensor,
    query_pos: torch.Tensor,
    first_pos: int,
    ctx: KeyContext,
    rope: Rope,
    *,
    k: int,
    n_starting: int,
    window: int,
    scale: float,
    fused: bool = False,
) -> Recalled | None:
    """Select the top-k middle tokens for queries already rotated to ``topk_distance``.

    q_scored: (B, Hkv, g, nb, D); query_pos: (nb,) absolute positions, the first of them ``first_pos`` (a number,
    so the scan's bounds are known without reading the device); None for a decode step's query, whose recent
    tokens all lie inside its window. A token j is "middle" for query i iff
    n_starting <= j and i - j >= window: causal, not a starting token, outside the window. ``fused``: scan the
    store with recall_kernel.py's kernels where one call covers it (then, where the store holds every middle
    token, the values stay there: Recalled.values is None).
    """
    batch, kv_heads, groups, nb, dim = q_scored.shape
    flat_q = q_scored.reshape(batch, kv_heads, groups * nb, dim)
    # Tokens still in `recent` that fall out of the window of some query in this block: [first, last].
    first = max(ctx.recent_start, n_starting)
    last = first_pos + nb - 1 - window  # inclusive: the latest query's newest middle token
    primary = 0 if ctx.middle_k is None else ctx.middle_k.shape[-2]
    fused = fused and primary > 0 and recall_kernel.fits(flat_q, ctx.middle_k, k)
    if fused and not ctx.middle_pages and last < first:  # the store holds every middle token: its values stay there
        logits, positions = _fused_store_topk(flat_q, ctx, k=k, scale=scale, first_row=n_starting)
        return Recalled(logits, positions, None, ctx.middle_v, n_starting)

    best = _RunningTopK(k, flat_q.device)
    chunk = max(256, SCAN_BUDGET // max(1, batch * kv_heads * groups * nb))
    _scan_store(best, flat_q, ctx, n_starting=n_starting, scale=scale, chunk=chunk, fused=fused)
    if last >= first:
        q_pos_rows = query_pos.repeat(groups)[:, None]  # (g·nb, 1), row r is query r % nb
        for lo in range(first, last + 1, chunk):
            hi = min(lo + chunk, last + 1)
            logits = (flat_q @ ctx.raw_recent(lo, hi, rope).transpose(-1, -2)).float() * scale
            is_middle = (q_pos_rows - torch.arange(lo, hi, device=flat_q.device)[None, :]) >= window
            best.merge(*_top(logits.masked_fill(~is_middle, float("-inf")), k, lo))
    if best.logits is None:
        return None
    return Recalled(best.logits, best.positions, _gather_values(ctx, best.positions, n_starting))


class _RunningTopK:
    """The k best logits seen so far per query row, with their absolute positions, on the queries' device."""

    def __init__(self, k: int, device: torch.device):
        self.k, self.device = k, device
        self.logits: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None

    def merge(self, logits: torch.Tensor, positions: torch.Tensor) -> None:
        logits, positions = logits.to(self.device), positions.to(self.device)
        if self.logits is not None:
            logits = torch.cat((self.logits, logits), dim=-1)
            positions = torch.cat((self.positions, positions), dim=-1)
        self.logits, idx = logits.topk(min(self.k, logits.shape[-1]), dim=-1)
        self.positions = positions.gather(-1, idx)


def _top(logits: torch.Tensor, k: int, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, idx = logits.topk(min(k, logits.shape[-1]), dim=-1)
    return values, idx + offset


def _scan_store(best: _RunningTopK, flat_q: torch.Tensor, ctx: KeyContext, *, n_starting: int, scale: float,
                chunk: int, fused: bool) -> None:
    """The evicted middle store into ``best``: every token there is beyond every query's window. Its rows on the
    model's device (or the CPU's, for a CPU model) first, scanned where they live (through recall_kernel.py's
    kernels where ``fused``, else through its scan copy where that pays, else in chunks), then any spilled to CPU
    pages."""
    k, rows = best.k, flat_q.shape[-2]
    primary = 0 if ctx.middle_k is None else ctx.middle_k.shape[-2]
    scanned = None
    if not fused and ctx.middle_scan is not None and copy_pays(rows, primary):
        scanned = scan_topk(flat_q.to(ctx.middle_k.device), ctx.middle_k, ctx.middle_scan,
                            k=min(k, primary), scale=scale, budget=SCAN_BUDGET)
    if fused:
        best.merge(*_fused_store_topk(flat_q, ctx, k=k, scale=scale, first_row=n_starting))
    elif scanned is not None:
        best.merge(scanned[0], scanned[1] + n_starting)
    elif primary:
        q_store = flat_q.to(ctx.middle_k.device)
        for lo in range(0, primary, chunk):
            in_use = None if ctx.middle_live is None else ctx.middle_live - lo
            vals, idx = _store_topk(q_store, ctx.middle_k[..., lo : lo + chunk, :], k, scale, in_use)
            best.merge(vals, idx + (n_starting + lo))
    row = n_starting + primary
    for page_k, _ in ctx.middle_pages:
        vals, idx = _store_topk(flat_q.to(page_k.device), page_k, k, scale)
        best.merge(vals, idx + row)
        row += page_k.shape[-2]


def _fused_store_topk(query: torch.Tensor, ctx: KeyContext, *, k: int, scale: float,
                      first_row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The store's top k through Triton's kernels."""
    return recall_kernel.store_topk(query, ctx.middle_k, ctx.middle_live, k=k, scale=scale, first_row=first_row)


def _store_topk(query: torch.Tensor, keys: torch.Tensor, k: int, scale: float,
                in_use: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The (up to) ``k`` largest float32 logits ``scale``·q·k of each query row (B, Hkv, R, D) over rows of a
    middle store (B, Hkv, n, D), and their indices there. ``in_use``: a count on the keys' device; rows from it on
    are not the store's (spare rows of a fixed-shape view) and score -inf, whatever they hold.

    Selected among the products in their own dtype, and only the winners widened and scaled: with scale > 0,
    widening and scaling keep the order (two different bfloat16 values stay different in float32), and it
    spares a float32 pass over every product. Head by head on the CPU (head_products.py says why); a batched
    product on other devices, and under autograd (``out=`` has no grad)."""
    if keys.device.type != "cpu" or (query.requires_grad and torch.is_grad_enabled()):
        products = query @ keys.transpose(-1, -2)
    else:
        products = head_products(query, keys)
    if in_use is not None:
        spare = torch.arange(keys.shape[-2], device=keys.device) >= in_use
        products = products.masked_fill(spare, float("-inf"))
    vals, idx = products.topk(min(k, products.shape[-1]), dim=-1)
    return vals.float() * scale, idx


def _gather_values(ctx: KeyContext, positions: torch.Tensor, n_starting: int) -> torch.Tensor:
    """Values at absolute ``positions`` (B, Hkv, R, k), from the middle store or from recent."""
    batch, kv_heads, rows, k = positions.shape
    dim = ctx.recent_v.shape[-1]
    flat = positions.reshape(batch, kv_heads, rows * k)
    recent_idx = (flat - ctx.recent_start).clamp(0, ctx.recent_v.shape[-2] - 1)
    out = ctx.recent_v.gather(2, recent_idx[..., None].expand(-1, -1, -1, dim))
    lo = n_starting
    segments = ([(ctx.middle_k, ctx.middle_v)] if ctx.middle_k is not None else []) + list(ctx.middle_pages)
    for i, (_, values) in enumerate(segments):
        hi = lo + values.shape[-2]
        in_use = lo + ctx.middle_live if i == 0 and ctx.middle_live is not None else hi  # spare rows: not gathered
        inside = (flat >= lo) & (flat < in_use)
        index = (flat - lo).clamp(0, values.shape[-2] - 1).to(values.device)
        found = values.gather(2, index[..., None].expand(-1, -1, -1, dim)).to(out.device, non_blocking=True)
        out = torch.where(inside[..., None], found, out)
        lo = hi
    return out.reshape(batch, kv_heads, rows, k, dim)
