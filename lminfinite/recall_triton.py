"""The Triton kernels behind recall_kernel.py's operators, and their launches (imported only where they run).

Offsets into a store are 64-bit: 32 heads of 128 over a million tokens lie 2^32 elements apart."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .recall_kernel import FEW_ROWS, interpreted

# Read once, as triton.jit reads it when it builds the kernels below: for the interpreter or for the GPU.
INTERPRETED = interpreted()


def padded_rows(rows: int) -> int:
    return triton.next_power_of_2(rows) if rows <= FEW_ROWS else max(16, triton.next_power_of_2(rows))


def scan_warps(rows: int, dtype: torch.dtype) -> int:
    """Warps of a scan's program: a warp per 4 query rows (after padding) where float32 rows are multiplied without
    tensor cores, whose whole product tile took every register of 4 warps and spilled (ptxas, sm_90: 2 KB at 32
    rows, 15 KB at 64; none over 8 and 16 warps); 4 otherwise."""
    return max(4, padded_rows(rows) // 4) if dtype == torch.float32 and rows > FEW_ROWS else 4


def candidates(query: torch.Tensor, n: int, block: int, per_block: int) -> tuple[int, torch.Tensor, torch.Tensor]:
    """A scan's blocks of ``block`` of a store's ``n`` rows and its outputs, ``per_block`` candidates per block and
    query row: float32 logits and int64 positions, (B, Hkv, R, blocks·per_block) each, filled by the kernel."""
    blocks = triton.cdiv(n, block)
    shape = (*query.shape[:3], blocks * per_block)
    return (blocks, torch.empty(shape, dtype=torch.float32, device=query.device),
            torch.empty(shape, dtype=torch.long, device=query.device))


def scan(query: torch.Tensor, keys: torch.Tensor, live: torch.Tensor | None, k: int, scale: float, first_row: int,
         block: int, span: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """k candidates per query row from each block of ``block`` keys, or from each ``span`` blocks (``_scan_spans``:
    recall_kernel._spans says where)."""
    batch, kv_heads, rows, dim = query.shape
    n = keys.shape[-2]
    query = query.contiguous()
    if span > 1:
        return _scan_in_spans(query, keys, live, k, scale, first_row, block, span)
    blocks, cand_logits, cand_positions = candidates(query, n, block, k)
    _scan_blocks[(batch * kv_heads, blocks)](
        query, keys, query if live is None else live, cand_logits, cand_positions,
        kv_heads, rows, n, dim, float(scale), first_row, *keys.stride(),
        HAS_LIVE=live is not None, ROWS=padded_rows(rows),
        DIM=max(16, triton.next_power_of_2(dim)), BLOCK=block, K=k, IEEE=query.dtype == torch.float32 or INTERPRETED,
        DOT=rows > FEW_ROWS, num_warps=scan_warps(rows, query.dtype),
    )
    return cand_logits, cand_positions


def _scan_in_spans(query, keys, live, k, scale, first_row, block, span):
    batch, kv_heads, rows, dim = query.shape
    blocks = triton.cdiv(keys.shape[-2], block)
    programs, cand_logits, cand_positions = candidates(query, keys.shape[-2], block * span, k)
    _scan_spans[(batch * kv_heads, programs)](
        query, keys, query if live is None else live, cand_logits, cand_positions,
        kv_heads, rows, keys.shape[-2], blocks, span, dim, float(scale), first_row, *keys.stride(),
        HAS_LIVE=live is not None, ROWS=padded_rows(rows), DIM=max(16, triton.next_power_of_2(dim)), BLOCK=block,
        K=k, SLOTS=max(2, triton.next_power_of_2(k)),
    )
    return cand_logits, cand_positions


def select(products: torch.Tensor, live: torch.Tensor | None, k: int, scale: float, first_row: int,
           block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k candidates per query row from each block of ``block`` float32 products (B, Hkv, R, n), scaled, and their
    positions, as ``scan`` gives them."""
    batch, kv_heads, rows, n = products.shape
    products = products.contiguous()
    blocks, cand_logits, cand_positions = candidates(products, n, block, k)
    _select_blocks[(batch * kv_heads * rows, blocks)](
        products, products if live is None else live, cand_logits, cand_positions, n, float(scale), first_row,
        HAS_LIVE=live is not None, BLOCK=block, K=k,
    )
    return cand_logits, cand_positions


def rotate(query: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    query = query.contiguous()
    dim = query.shape[-1]
    out = torch.empty_like(query)
    _rotate_rows[(query.numel() // dim,)](query, cos.contiguous(), sin.contiguous(), out, dim, dim // 2,
                                          DIM=max(16, triton.next_power_of_2(dim)))
    return out


def gather(positions: torch.Tensor, logits: torch.Tensor, values: torch.Tensor, first_row: int) -> torch.Tensor:
    batch, kv_heads, query_rows, k = positions.shape
    dim = values.shape[-1]
    out = torch.empty((*positions.shape, dim), dtype=values.dtype, device=values.device)
    _gather_rows[(batch * kv_heads * query_rows,)](
        positions.contiguous(), logits.contiguous(), values, out,
        kv_heads, query_rows, k, dim, first_row, *values.stride(),
        K=max(2, triton.next_power_of_2(k)), DIM=max(16, triton.next_power_of_2(dim)),
    )
    return out


def merge(out: torch.Tensor, lse: torch.Tensor, logits: torch.Tensor, positions: torch.Tensor,
          values: torch.Tensor, first_row: int) -> None:
    batch, kv_heads, rows, k = logits.shape
    dim = values.shape[-1]
    _merge_rows[(batch * kv_heads * rows,)](
        out, lse.contiguous(), logits.contiguous(), positions.contiguous(), values,
        kv_heads, rows, k, dim, first_row, *out.stride(), *values.stride(),
        K=max(2, triton.next_power_of_2(k)), DIM=max(16, triton.next_power_of_2(dim)),
    )


@triton.jit
def _scan_blocks(q_ptr, k_ptr, live_ptr, out_logits, out_positions, kv_heads, rows, n, dim, scale, first_row,
                 stride_b, stride_h, stride_n, stride_d, HAS_LIVE: tl.constexpr, ROWS: tl.constexpr,
                 DIM: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr, IEEE: tl.constexpr, DOT: tl.constexpr):
    """One program: one key head's query rows against one block of its keys; the block's K best per row (logit,
    and position: first_row + the key's row)."""
    head = tl.program_id(0)
    block = tl.program_id(1)
    blocks = tl.num_programs(1)
    r = tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    scores = _block_scores(q_ptr, k_ptr, live_ptr, head, block, kv_heads, rows, n, dim, scale, stride_b, stride_h,
                           stride_n, stride_d, HAS_LIVE, ROWS, DIM, BLOCK, IEEE, DOT)
    out = (head * rows + r) * (blocks * K) + block * K
    for j in tl.static_range(K):
        best, at = tl.max(scores, axis=1, return_indices=True)
        tl.store(out_logits + out + j, best, mask=r < rows)
        tl.store(out_positions + out + j, (block * BLOCK + at + first_row).to(tl.int64), mask=r < rows)
        scores = tl.where(c[None, :] == at[:, None], float("-inf"), scores)


@triton.jit
def _block_scores(q_ptr, k_ptr, live_ptr, head, block, kv_heads, rows, n, dim, scale, stride_b, stride_h, stride_n,
                  stride_d, HAS_LIVE: tl.constexpr, ROWS: tl.constexpr, DIM: tl.constexpr, BLOCK: tl.constexpr,
                  IEEE: tl.constexpr, DOT: tl.constexpr):
    """(ROWS, BLOCK) float32: a key head's query rows against one ``block`` of its keys, scaled; -inf for the
    block's rows not in use."""
    r = tl.arange(0, ROWS)
    d = tl.arange(0, DIM)
    c = tl.arange(0, BLOCK)
    key_rows = block.to(tl.int64) * BLOCK + c  # offsets in a store beyond 2^31 elements
    if HAS_LIVE:
        in_use = tl.minimum(tl.load(live_ptr), n)
    else:
        in_use = n
    q_at = q_ptr + (head * rows + r[:, None]) * dim
    key_base = k_ptr + (head // kv_heads).to(tl.int64) * stride_b + (head % kv_heads).to(tl.int64) * stride_h
    keys_at = key_base + key_rows[:, None] * stride_n
    if DOT:
        q = tl.load(q_at + d[None, :], mask=(r[:, None] < rows) & (d[None, :] < dim), other=0.0)
        keys = tl.load(keys_at + d[None, :] * stride_d,  # spare rows are not read
                       mask=(key_rows[:, None] < in_use) & (d[None, :] < dim), other=0.0)
        if IEEE:  # float32 numbers, or half ones under the interpreter (whose dot reads their bits as integers)
            scores = tl.dot(q.to(tl.float32), tl.trans(keys.to(tl.float32)), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(keys))
    else:
        scores = _summed_products(q_at, r < rows, keys_at, stride_d, key_rows < in_use, dim, ROWS, BLOCK, DIM)
    return tl.where((key_rows < in_use)[None, :], scores * scale, float("-inf"))


@triton.jit
def _scan_spans(q_ptr, k_ptr, live_ptr, out_logits, out_positions, kv_heads, rows, n, blocks, span, dim, scale,
                first_row, stride_b, stride_h, stride_n, stride_d, HAS_LIVE: tl.constexpr, ROWS: tl.constexpr,
                DIM: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr, SLOTS: tl.constexpr):
    """One program: one key head's query rows (FEW_ROWS or fewer: recall_kernel._spans says why) against ``span``
    consecutive blocks of its keys; their K best per row (logit and position), -inf where fewer are in use. A
    running K best (SLOTS: K padded to a power of two, the padding +inf so it is never the smallest) takes a
    block's keys, best first, only while they beat its smallest: once it holds good keys, most blocks cost a
    maximum and a minimum, where ``_scan_block`` makes K passes over every block, and the top-k after the scan
    reads span times fewer candidates."""
    head = tl.program_id(0)
    r = tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    s = tl.arange(0, SLOTS)
    kept = tl.where(s[None, :] < K, float("-inf"), float("inf")) + tl.zeros((ROWS, SLOTS), tl.float32)
    kept_at = tl.zeros((ROWS, SLOTS), tl.int64) + first_row  # a row of the store: never read (its logit: -inf)
    block = tl.program_id(1) * span
    last = tl.minimum(block + span, blocks)
    # A count known only at launch: not range(), which Triton 3.6's interpreter cannot bound by an argument under
    # numpy 2.4.
    while block < last:
        scores = _block_scores(q_ptr, k_ptr, live_ptr, head, block, kv_heads, rows, n, dim, scale, stride_b,
                               stride_h, stride_n, stride_d, HAS_LIVE, ROWS, DIM, BLOCK, False, False)
        top, at = tl.max(scores, axis=1, return_indices=True)
        floor, slot = tl.min(kept, axis=1, return_indices=True)
        enters = (top > floor) & (r < rows)
        while tl.max(enters.to(tl.int32), axis=0) > 0:
            into = (s[None, :] == slot[:, None]) & enters[:, None]
            kept = tl.where(into, top[:, None], kept)
            kept_at = tl.where(into, (block.to(tl.int64) * BLOCK + at + first_row)[:, None], kept_at)
            scores = tl.where((c[None, :] == at[:, None]) & enters[:, None], float("-inf"), scores)
            top, at = tl.max(scores, axis=1, return_indices=True)
            floor, slot = tl.min(kept, axis=1, return_indices=True)
            enters = (top > floor) & (r < rows)
        block += 1
    out = (head * rows + r[:, None]) * (tl.num_programs(1) * K) + tl.program_id(1) * K + s[None, :]
    written = (r[:, None] < rows) & (s[None, :] < K)
    tl.store(out_logits + out, kept, mask=written)
    tl.store(out_positions + out, kept_at, mask=written)


@triton.jit
def _select_blocks(p_ptr, live_ptr, out_logits, out_positions, n, scale, first_row, HAS_LIVE: tl.constexpr,
                   BLOCK: tl.constexpr, K: tl.constexpr):
    """One program: one query row's products with one block of a store's rows (float32, a row of n per query row);
    the block's K best, scaled (logit, and position: first_row + the row), -inf past the rows in use, whose
    products (spare rows of a buffer: any number, NaN too) are not read."""
    row = tl.program_id(0)
    block = tl.program_id(1)
    blocks = tl.num_programs(1)
    c = tl.arange(0, BLOCK)
    store_rows = block.to(tl.int64) * BLOCK + c
    if HAS_LIVE:
        in_use = tl.minimum(tl.load(live_ptr), n)
    else:
        in_use = n
    scores = tl.load(p_ptr + row.to(tl.int64) * n + store_rows, mask=store_rows < in_use, other=float("-inf"))
    out = row * (blocks * K) + block * K
    for j in tl.static_range(K):
        best, at = tl.max(scores, axis=0, return_indices=True)
        tl.store(out_logits + out + j, best * scale)
        tl.store(out_positions + out + j, (block * BLOCK + at + first_row).to(tl.int64))
        scores = tl.where(c == at, float("-inf"), scores)


@triton.jit
def _summed_products(q_at, rows_in, tile_at, tile_d, tile_in, dim, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                    DIM: tl.constexpr):
    """For FEW_ROWS query rows or fewer: their products with a tile's rows as float32 products summed along the
    channels, CHUNK channels at a time (the tile is never whole in registers)."""
    CHUNK: tl.constexpr = 32 if DIM > 32 else DIM
    products = tl.zeros((ROWS, BLOCK), tl.float32)
    for start in tl.static_range(0, DIM, CHUNK):
        d = start + tl.arange(0, CHUNK)
        q = tl.load(q_at + d[None, :], mask=rows_in[:, None] & (d[None, :] < dim), other=0.0).to(tl.float32)
        tile = tl.load(tile_at + d[None, :] * tile_d, mask=tile_in[:, None] & (d[None, :] < dim),
                       other=0.0).to(tl.float32)
        products += tl.sum(q[:, None, :] * tile[None, :, :], axis=2)
    return products


@triton.jit
def _gather_rows(positions_ptr, logits_ptr, v_ptr, out_ptr,
                 kv_heads, query_rows, k, dim, first_row, stride_b, stride_h, stride_n, stride_d,
                 K: tl.constexpr, DIM: tl.constexpr):
    """One program: one query row's k picks' value rows (zeros for -inf picks)."""
    row = tl.program_id(0)
    head = row // query_rows
    j = tl.arange(0, K)
    d = tl.arange(0, DIM)
    picked = j < k
    logits = tl.load(logits_ptr + row * k + j, mask=picked, other=float("-inf"))
    found = picked & (logits > float("-inf"))
    store_rows = tl.load(positions_ptr + row * k + j, mask=found, other=first_row) - first_row
    value_base = v_ptr + (head // kv_heads).to(tl.int64) * stride_b + (head % kv_heads).to(tl.int64) * stride_h
    values = tl.load(value_base + store_rows[:, None] * stride_n + d[None, :] * stride_d,
                     mask=found[:, None] & (d[None, :] < dim), other=0.0)
    tl.store(out_ptr + (row * k + j[:, None]) * dim + d[None, :], values, mask=picked[:, None] & (d[None, :] < dim))


@triton.jit
def _merge_rows(out_ptr, lse_ptr, logits_ptr, positions_ptr, v_ptr,
                kv_heads, query_rows, k, dim, first_row, out_b, out_h, out_r, out_d, stride_b, stride_h, stride_n,
                stride_d, K: tl.constexpr, DIM: tl.constexpr):
    """One program: one query row's window output (weight of its softmax: lse) and its k recalled tokens merged
    into one softmax, in place: out·e^(lse − total) + Σ e^(logit − total)·value, total = log(e^lse + Σ e^logit)."""
    row = tl.program_id(0)
    head = row // query_rows
    b = (head // kv_heads).to(tl.int64)  # a store's head can lie beyond 2^31 elements from its start
    h = (head % kv_heads).to(tl.int64)
    r = row % query_rows
    j = tl.arange(0, K)
    d = tl.arange(0, DIM)
    picked = j < k
    lse = tl.load(lse_ptr + row)
    logits = tl.load(logits_ptr + row * k + j, mask=picked, other=float("-inf"))
    top = tl.maximum(lse, tl.max(logits, axis=0))
    total = top + tl.log(tl.exp(lse - top) + tl.sum(tl.exp(logits - top), axis=0))
    weights = tl.exp(logits - total)
    found = picked & (logits > float("-inf"))
    store_rows = tl.load(positions_ptr + row * k + j, mask=found, other=first_row) - first_row
    value_base = v_ptr + b * stride_b + h * stride_h
    values = tl.load(value_base + store_rows[:, None] * stride_n + d[None, :] * stride_d,
                     mask=found[:, None] & (d[None, :] < dim), other=0.0).to(tl.float32)
    out_row = out_ptr + b * out_b + h * out_h + r * out_r + d * out_d
    merged = tl.load(out_row, mask=d < dim, other=0.0).to(tl.float32) * tl.exp(lse - total)
    merged += tl.sum(weights[:, None] * values, axis=0)
    tl.store(out_row, merged.to(out_ptr.dtype.element_ty), mask=d < dim)


@triton.jit
def _rotate_rows(q_ptr, cos_ptr, sin_ptr, out_ptr, dim, half, DIM: tl.constexpr):
    """One program: one row x, rotated as rotary.apply_rotation does: x·cos + rotate_half(x)·sin in float32."""
    row = tl.program_id(0)
    d = tl.arange(0, DIM)
    inside = d < dim
    first_half = d < half
    x = tl.load(q_ptr + row * dim + d, mask=inside, other=0.0).to(tl.float32)
    partner = tl.load(q_ptr + row * dim + tl.where(first_half, d + half, d - half), mask=inside, other=0.0)
    turned = tl.where(first_half, -partner.to(tl.float32), partner.to(tl.float32))
    cos = tl.load(cos_ptr + d, mask=inside, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + d, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * dim + d, (x * cos + turned * sin).to(out_ptr.dtype.element_ty), mask=inside)
