"""The Triton kernels behind coded_recall.py's operators, and their launches (imported only where they run).

Offsets into a store are 64-bit, as in recall_triton.py."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .recall_kernel import FEW_ROWS
from .recall_triton import INTERPRETED, candidates, padded_rows, summed_products


def scan_codes(query, keys, codes, scales, errors, norms, live, scale: float, first_row: int, keep: int, pool: int,
               block: int, rounding: float, safety: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, kv_heads, rows, dim = query.shape
    n = keys.shape[-2]
    query = query.contiguous()
    pools, upper, positions = candidates(query, keys, pool, keep)
    left = torch.empty((batch, kv_heads, rows, pools), dtype=torch.float32, device=query.device)
    _scan_coded_pools[(batch * kv_heads, pools)](
        query, keys, codes, scales, errors, norms, query if live is None else live, upper, positions, left,
        kv_heads, rows, n, dim, float(scale), first_row, float(rounding), float(safety),
        *keys.stride(), *codes.stride(), *scales.stride(), *errors.stride(), *norms.stride(),
        HAS_LIVE=live is not None, ROWS=padded_rows(rows), DIM=max(16, triton.next_power_of_2(dim)), BLOCK=block,
        POOL=pool // block, KEEP=keep, IEEE=INTERPRETED, DOT=rows > FEW_ROWS, num_warps=scan_warps(rows),
    )
    return upper, positions, left


def scan_warps(rows: int) -> int:
    """Warps of a coded scan's program: 8 where tensor cores take many query rows, whose float32 tiles and a pool's
    running selection spilled registers over 4 warps (ptxas, sm_90: tests/gpu_compile.py)."""
    return 8 if rows > FEW_ROWS else 4


def certify(query, keys, positions, bounds, pick, left, k: int, count: int, scale: float,
            first_row: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, kv_heads, rows, dim = query.shape
    logits = torch.empty((batch, kv_heads, rows, k), dtype=torch.float32, device=query.device)
    found = torch.empty((batch, kv_heads, rows, k), dtype=torch.long, device=query.device)
    settled = torch.empty((batch, kv_heads, rows), dtype=torch.int32, device=query.device)
    bounds = bounds.contiguous()
    _certify_rows[(batch * kv_heads * rows,)](
        query.contiguous(), keys, positions.contiguous(), bounds, bounds if pick is None else pick.contiguous(),
        left.contiguous(), logits, found, settled,
        kv_heads, rows, count, bounds.shape[-1], positions.shape[-1], left.shape[-1], dim, float(scale), first_row,
        *keys.stride(),
        HAS_PICK=pick is not None, COUNT=triton.next_power_of_2(count), K=k, DIM=max(16, triton.next_power_of_2(dim)),
        LEFT=min(1024, triton.next_power_of_2(left.shape[-1])),
    )
    return logits, found, settled


def settle(logits, positions, settled, cand_logits, cand_positions, first_row: int) -> None:
    k, count = logits.shape[-1], cand_logits.shape[-1]
    _settle_rows[(settled.numel(),)](
        logits, positions, settled.contiguous(), cand_logits.contiguous(), cand_positions.contiguous(), count,
        first_row, K=k, SLOTS=triton.next_power_of_2(k), CHUNK=min(1024, triton.next_power_of_2(count)),
    )


@triton.jit
def _scan_coded_pools(q_ptr, k_ptr, c_ptr, s_ptr, e_ptr, m_ptr, live_ptr, out_upper, out_positions, out_left,
                      kv_heads, rows, n, dim, scale, first_row, rounding, safety,
                      k_b, k_h, k_n, k_d, c_b, c_h, c_n, c_d, s_b, s_h, s_n, s_d, e_b, e_h, e_n, m_b, m_h, m_n,
                      HAS_LIVE: tl.constexpr, ROWS: tl.constexpr, DIM: tl.constexpr, BLOCK: tl.constexpr,
                      POOL: tl.constexpr, KEEP: tl.constexpr, IEEE: tl.constexpr, DOT: tl.constexpr):
    """One program: one key head's query rows against one pool of POOL blocks of its keys, a block at a time
    (``_block_bounds``): its coded blocks, then the block being filled where it lies in the pool; blocks past the
    rows in use are not read. Per row, the pool's KEEP largest bounds (and positions) and the largest bound left
    out (``_take``). The blocks are unrolled, not looped over: in a loop, what the compiler hoists out of it took
    about 50 registers a thread more (ptxas, sm_90)."""
    head = tl.program_id(0)
    pool = tl.program_id(1)
    pools = tl.num_programs(1)
    r = tl.arange(0, ROWS)
    kept = tl.arange(0, KEEP)
    if HAS_LIVE:
        in_use = tl.minimum(tl.load(live_ptr), n)
    else:
        in_use = n
    bests = tl.full((ROWS, KEEP), float("-inf"), tl.float32)
    places = tl.zeros((ROWS, KEEP), tl.int32)  # rows after the pool's first
    left = tl.full((ROWS,), float("-inf"), tl.float32)
    first = pool * POOL
    coded = in_use // BLOCK  # the blocks before the one being filled
    for i in tl.static_range(POOL):
        if first + i < coded:
            upper = _block_bounds(q_ptr, k_ptr, c_ptr, s_ptr, e_ptr, m_ptr, head, first + i, in_use, kv_heads, rows,
                                  dim, scale, rounding, safety, k_b, k_h, k_n, k_d, c_b, c_h, c_n, c_d, s_b, s_h,
                                  s_n, s_d, e_b, e_h, e_n, m_b, m_h, m_n, ROWS, DIM, BLOCK, IEEE, DOT, True)
            bests, places, left = _take(upper, bests, places, left, i * BLOCK, ROWS, BLOCK, KEEP)
    if (first <= coded) & (coded < first + POOL) & (coded * BLOCK < in_use):
        upper = _block_bounds(q_ptr, k_ptr, c_ptr, s_ptr, e_ptr, m_ptr, head, coded, in_use, kv_heads, rows, dim,
                              scale, rounding, safety, k_b, k_h, k_n, k_d, c_b, c_h, c_n, c_d, s_b, s_h, s_n, s_d,
                              e_b, e_h, e_n, m_b, m_h, m_n, ROWS, DIM, BLOCK, IEEE, DOT, False)
        bests, places, left = _take(upper, bests, places, left, (coded - first) * BLOCK, ROWS, BLOCK, KEEP)
    out = ((head * rows + r) * (pools * KEEP) + pool * KEEP)[:, None] + kept[None, :]
    tl.store(out_upper + out, bests, mask=(r < rows)[:, None])
    tl.store(out_positions + out, first.to(tl.int64) * BLOCK + places + first_row, mask=(r < rows)[:, None])
    tl.store(out_left + (head * rows + r) * pools + pool, left, mask=r < rows)


@triton.jit
def _take(upper, bests, places, left, offset, ROWS: tl.constexpr, BLOCK: tl.constexpr, KEEP: tl.constexpr):
    """A running selection of a pool's KEEP largest bounds: a block's ``upper`` bounds (ROWS, BLOCK), best first,
    each take the place of the smallest kept (``bests``, at ``places``: rows after the pool's first) while they
    are larger, and the one displaced is left out (``left``: the largest bound left out); the first that is not
    ends the block and is left out with all below it. So a block costs one pass per bound it brings in, and one
    more. ``offset``: the block's first row after the pool's."""
    c = tl.arange(0, BLOCK)
    kept = tl.arange(0, KEEP)
    best, at = tl.max(upper, axis=1, return_indices=True)
    low, into = tl.min(bests, axis=1, return_indices=True)
    while tl.max((best > low).to(tl.int32), axis=0) != 0:
        enters = best > low
        left = tl.where(enters, tl.maximum(left, low), left)
        replace = enters[:, None] & (kept[None, :] == into[:, None])
        bests = tl.where(replace, best[:, None], bests)
        places = tl.where(replace, (offset + at).to(tl.int32)[:, None], places)
        upper = tl.where(enters[:, None] & (c[None, :] == at[:, None]), float("-inf"), upper)
        best, at = tl.max(upper, axis=1, return_indices=True)
        low, into = tl.min(bests, axis=1, return_indices=True)
    return bests, places, tl.maximum(left, best)


@triton.jit
def _block_bounds(q_ptr, k_ptr, c_ptr, s_ptr, e_ptr, m_ptr, head, block, in_use, kv_heads, rows, dim, scale,
                  rounding, safety, k_b, k_h, k_n, k_d, c_b, c_h, c_n, c_d, s_b, s_h, s_n, s_d, e_b, e_h, e_n,
                  m_b, m_h, m_n, ROWS: tl.constexpr, DIM: tl.constexpr, BLOCK: tl.constexpr, IEEE: tl.constexpr,
                  DOT: tl.constexpr, CODED: tl.constexpr):
    """Per query row, an upper bound on the logit of each key of one ``block``: a CODED block's scanned logit plus
    its bound, the block being filled its own logit plus a rounding's worth; -inf past the rows in use, +inf where
    a key is NaN (it may be anything: never left out). Tensor cores take TF32 inputs (the bound's 2^-10), IEEE
    float32 only under the interpreter (IEEE)."""
    r = tl.arange(0, ROWS)
    d = tl.arange(0, DIM)
    c = tl.arange(0, BLOCK)
    key_rows = block.to(tl.int64) * BLOCK + c
    b = (head // kv_heads).to(tl.int64)
    h = (head % kv_heads).to(tl.int64)
    q_at = q_ptr + (head * rows + r[:, None]) * dim
    q = tl.load(q_at + d[None, :], mask=(r[:, None] < rows) & (d[None, :] < dim), other=0.0).to(tl.float32)
    q_norm = tl.sqrt(tl.sum(q * q, axis=1))
    channels = d[None, :] < dim
    codes_at = c_ptr + b * c_b + h * c_h + key_rows[:, None] * c_n
    keys_at = k_ptr + b * k_b + h * k_h + key_rows[:, None] * k_n
    scale_at = s_ptr + b * s_b + h * s_h + block * s_n
    if CODED:  # scales folded into the query, codes exact in float32
        if DOT:
            chan_scale = tl.load(scale_at + d * s_d, mask=d < dim, other=0.0)
            codes = tl.load(codes_at + d[None, :] * c_d, mask=channels, other=0).to(tl.float32)
            if IEEE:
                scanned = tl.dot(q * chan_scale[None, :], tl.trans(codes), input_precision="ieee")
            else:
                scanned = tl.dot(q * chan_scale[None, :], tl.trans(codes), input_precision="tf32")
        else:
            scanned, _ = summed_products(q_at, r < rows, codes_at, c_d, key_rows >= 0, scale_at, s_d, dim,
                                          ROWS, BLOCK, DIM, True)
        error = tl.load(e_ptr + b * e_b + h * e_h + key_rows * e_n)
        largest = tl.load(m_ptr + b * m_b + h * m_h + block * m_n)
        reach = q_norm[:, None] * (error[None, :] + rounding * largest)
    else:  # the block being filled: the store's own keys
        if DOT:
            keys = tl.load(keys_at + d[None, :] * k_d, mask=(key_rows[:, None] < in_use) & channels, other=0.0)
            wide = keys.to(tl.float32)
            if IEEE:  # the interpreter, whose dot reads half-precision numbers' bits as integers
                scanned = tl.dot(q, tl.trans(wide), input_precision="ieee")
            else:  # exact products of half-precision numbers; float32 ones in TF32, within the bound's rounding
                scanned = tl.dot(q.to(keys.dtype), tl.trans(keys))
            key_norm = tl.sqrt(tl.sum(wide * wide, axis=1))
        else:
            scanned, squares = summed_products(q_at, r < rows, keys_at, k_d, key_rows < in_use, scale_at, s_d, dim,
                                                ROWS, BLOCK, DIM, False)
            key_norm = tl.sqrt(squares)
        reach = q_norm[:, None] * (rounding * key_norm)[None, :]
    upper = scanned * scale + safety * scale * reach
    upper = tl.where(upper != upper, float("inf"), upper)  # a NaN key may be anything: it can never be left out
    upper = tl.where((key_rows < in_use)[None, :], upper, float("-inf"))
    return upper


@triton.jit
def _certify_rows(q_ptr, k_ptr, positions_ptr, bounds_ptr, pick_ptr, left_ptr, out_logits, out_positions,
                  out_settled, kv_heads, rows, count, width, candidates, pools, dim, scale, first_row,
                  k_b, k_h, k_n, k_d, HAS_PICK: tl.constexpr, COUNT: tl.constexpr, K: tl.constexpr,
                  DIM: tl.constexpr, LEFT: tl.constexpr):
    """One program: one query row. Its ``count`` candidates of the largest bounds rescored from the store's own
    keys in float32, their K best kept, best first; and whether these are surely the store's K best: no bound left
    out (the largest each pool left, and the smallest of the count + 1 picked) reaches the K-th, and no rescored
    logit is NaN. The candidates: all the pools' (no ``pick``), or the count + 1 at ``pick`` in any order
    (torch.topk unsorted: no sort launched), of which the smallest bound is left out."""
    row = tl.program_id(0)
    head = row // rows
    b = (head // kv_heads).to(tl.int64)
    h = (head % kv_heads).to(tl.int64)
    j = tl.arange(0, COUNT)
    bound = tl.load(bounds_ptr + row * width + j, mask=j < count, other=float("-inf"))
    if HAS_PICK:  # the last pick takes the place of the smallest of the others where it is larger
        index = tl.load(pick_ptr + row * width + j, mask=j < count, other=0)
        last = tl.load(bounds_ptr + row * width + count)
        low, low_at = tl.min(tl.where(j < count, bound, float("inf")), axis=0, return_indices=True)
        swap = (j == low_at) & (bound < last)
        bound = tl.where(swap, last, bound)
        index = tl.where(swap, tl.load(pick_ptr + row * width + count), index)
        left_out = tl.minimum(low, last)
    else:
        index = j.to(tl.int64)
    found = (j < count) & (bound > float("-inf"))
    position = tl.load(positions_ptr + row.to(tl.int64) * candidates + index, mask=found, other=first_row)
    keys_at = k_ptr + b * k_b + h * k_h + (position - first_row)[:, None] * k_n
    CHUNK: tl.constexpr = 32 if DIM > 32 else DIM
    products = tl.zeros((COUNT,), tl.float32)
    for start in tl.static_range(0, DIM, CHUNK):  # channels a chunk at a time: the keys are never whole in registers
        d = start + tl.arange(0, CHUNK)
        q = tl.load(q_ptr + row * dim + d, mask=d < dim, other=0.0).to(tl.float32)
        tile = tl.load(keys_at + d[None, :] * k_d, mask=found[:, None] & (d[None, :] < dim), other=0.0)
        products += tl.sum(tile.to(tl.float32) * q[None, :], axis=1)
    logits = tl.where(found, products * scale, float("-inf"))
    unsure = tl.max(tl.where(logits != logits, 1, 0), axis=0)  # a NaN logit: nothing about this row is sure
    top = tl.full((LEFT,), float("-inf"), tl.float32)
    start = 0
    while start < pools:  # not range(): Triton 3.6's interpreter cannot bound one by an argument under numpy 2.4
        i = start + tl.arange(0, LEFT)
        top = tl.maximum(top, tl.load(left_ptr + row.to(tl.int64) * pools + i, mask=i < pools, other=float("-inf")))
        start += LEFT
    ceiling = tl.max(top, axis=0)
    if HAS_PICK:
        ceiling = tl.maximum(ceiling, left_out)
    kth = ceiling
    for i in tl.static_range(K):
        kth, at = tl.max(logits, axis=0, return_indices=True)
        tl.store(out_logits + row * K + i, kth)
        tl.store(out_positions + row * K + i, tl.sum(tl.where(j == at, position, 0), axis=0))
        logits = tl.where(j == at, float("-inf"), logits)
    certain = (unsure == 0) & ((ceiling < kth) | (ceiling == float("-inf")))
    tl.store(out_settled + row, certain.to(tl.int32))


@triton.jit
def _settle_rows(logits_ptr, positions_ptr, settled_ptr, cand_logits_ptr, cand_positions_ptr, count, first_row,
                 K: tl.constexpr, SLOTS: tl.constexpr, CHUNK: tl.constexpr):
    """One program: one query row the certificate did not settle (any other returns at once): its K best among the
    full scan's ``count`` candidates, best first, written over the certified ones. A running K best over chunks of
    candidates: each of a chunk's K best replaces the worst kept where it is better."""
    row = tl.program_id(0)
    if tl.load(settled_ptr + row) != 0:
        return
    slot = tl.arange(0, SLOTS)
    kept = tl.where(slot < K, float("-inf"), float("inf"))  # slots past K are never the worst
    places = tl.zeros((SLOTS,), tl.int64) + first_row
    c = tl.arange(0, CHUNK)
    start = 0
    while start < count:  # a while loop, as in _certify_rows
        offsets = row.to(tl.int64) * count + start + c
        chunk = tl.load(cand_logits_ptr + offsets, mask=start + c < count, other=float("-inf"))
        chunk_at = tl.load(cand_positions_ptr + offsets, mask=start + c < count, other=first_row)
        for _ in tl.static_range(K):
            best, at = tl.max(chunk, axis=0, return_indices=True)
            into = tl.argmin(kept, axis=0)
            replace = (slot == into) & (kept < best)
            kept = tl.where(replace, best, kept)
            places = tl.where(replace, tl.sum(tl.where(c == at, chunk_at, 0), axis=0), places)
            chunk = tl.where(c == at, float("-inf"), chunk)
        start += CHUNK
    ranked = tl.where(slot < K, kept, float("-inf"))
    for i in tl.static_range(K):
        best, at = tl.max(ranked, axis=0, return_indices=True)
        tl.store(logits_ptr + row * K + i, best)
        tl.store(positions_ptr + row * K + i, tl.sum(tl.where(slot == at, places, 0), axis=0))
        ranked = tl.where(slot == at, float("-inf"), ranked)
