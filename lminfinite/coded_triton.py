"""The Triton kernels behind coded_recall.py's operators, and their launches (imported only where they run).

Offsets into a store are 64-bit, as in recall_triton.py."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .recall_triton import FEW_ROWS, INTERPRETED, candidates, padded_rows, summed_products


def scan_codes(query, keys, codes, scales, errors, norms, live, scale: float, first_row: int, keep: int,
               block: int, rounding: float, safety: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, kv_heads, rows, dim = query.shape
    n = keys.shape[-2]
    query = query.contiguous()
    blocks, upper, positions = candidates(query, keys, block, keep)
    left = torch.empty((batch, kv_heads, rows, blocks), dtype=torch.float32, device=query.device)
    _scan_coded_blocks[(batch * kv_heads, blocks)](
        query, keys, codes, scales, errors, norms, query if live is None else live, upper, positions, left,
        kv_heads, rows, n, dim, float(scale), first_row, float(rounding), float(safety),
        *keys.stride(), *codes.stride(), *scales.stride(), *errors.stride(), *norms.stride(),
        HAS_LIVE=live is not None, ROWS=padded_rows(rows), DIM=max(16, triton.next_power_of_2(dim)), BLOCK=block,
        KEEP=keep, IEEE=INTERPRETED, DOT=rows > FEW_ROWS,
    )
    return upper, positions, left


def rescore(query, keys, positions, upper, scale: float, first_row: int) -> torch.Tensor:
    batch, kv_heads, rows, count = positions.shape
    dim = query.shape[-1]
    chunk = min(64, max(16, triton.next_power_of_2(count)))
    out = torch.empty((batch, kv_heads, rows, count), dtype=torch.float32, device=query.device)
    _rescore_rows[(batch * kv_heads * rows, triton.cdiv(count, chunk))](
        query.contiguous(), keys, positions.contiguous(), upper.contiguous(), out,
        kv_heads, rows, count, dim, float(scale), first_row, *keys.stride(),
        CHUNK=chunk, DIM=max(16, triton.next_power_of_2(dim)),
    )
    return out


@triton.jit
def _scan_coded_blocks(q_ptr, k_ptr, c_ptr, s_ptr, e_ptr, m_ptr, live_ptr, out_upper, out_positions, out_left,
                       kv_heads, rows, n, dim, scale, first_row, rounding, safety,
                       k_b, k_h, k_n, k_d, c_b, c_h, c_n, c_d, s_b, s_h, s_n, s_d, e_b, e_h, e_n, m_b, m_h, m_n,
                       HAS_LIVE: tl.constexpr, ROWS: tl.constexpr, DIM: tl.constexpr, BLOCK: tl.constexpr,
                       KEEP: tl.constexpr, IEEE: tl.constexpr, DOT: tl.constexpr):
    """One program: one key head's query rows against one block of its keys. Per row, an upper bound on each key's
    logit: a coded block's scanned logit plus its bound, the block being filled its own logit plus a rounding's
    worth; then the block's KEEP largest bounds (and positions) and the largest bound left out. Tensor cores take
    TF32 inputs (the bound's 2^-10), IEEE float32 only under the interpreter (IEEE)."""
    head = tl.program_id(0)
    block = tl.program_id(1)
    blocks = tl.num_programs(1)
    r = tl.arange(0, ROWS)
    d = tl.arange(0, DIM)
    c = tl.arange(0, BLOCK)
    key_rows = block.to(tl.int64) * BLOCK + c
    if HAS_LIVE:
        in_use = tl.minimum(tl.load(live_ptr), n)
    else:
        in_use = n
    b = (head // kv_heads).to(tl.int64)
    h = (head % kv_heads).to(tl.int64)
    q_at = q_ptr + (head * rows + r[:, None]) * dim
    q = tl.load(q_at + d[None, :], mask=(r[:, None] < rows) & (d[None, :] < dim), other=0.0).to(tl.float32)
    q_norm = tl.sqrt(tl.sum(q * q, axis=1))
    channels = d[None, :] < dim
    codes_at = c_ptr + b * c_b + h * c_h + key_rows[:, None] * c_n
    keys_at = k_ptr + b * k_b + h * k_h + key_rows[:, None] * k_n
    scale_at = s_ptr + b * s_b + h * s_h + block * s_n
    if (block + 1) * BLOCK <= in_use:  # a coded block: scales folded into the query, codes exact in float32
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
    kept = tl.arange(0, KEEP)
    bests = tl.full((ROWS, KEEP), float("-inf"), tl.float32)
    places = tl.zeros((ROWS, KEEP), tl.int64)
    for j in tl.static_range(KEEP):
        best, at = tl.max(upper, axis=1, return_indices=True)
        bests = tl.where(kept[None, :] == j, best[:, None], bests)
        places = tl.where(kept[None, :] == j, at[:, None].to(tl.int64), places)
        upper = tl.where(c[None, :] == at[:, None], float("-inf"), upper)
    out = ((head * rows + r) * (blocks * KEEP) + block * KEEP)[:, None] + kept[None, :]
    tl.store(out_upper + out, bests, mask=(r < rows)[:, None])
    tl.store(out_positions + out, block.to(tl.int64) * BLOCK + places + first_row, mask=(r < rows)[:, None])
    tl.store(out_left + (head * rows + r) * blocks + block, tl.max(upper, axis=1), mask=r < rows)


@triton.jit
def _rescore_rows(q_ptr, k_ptr, positions_ptr, upper_ptr, out_ptr, kv_heads, rows, count, dim, scale, first_row,
                  k_b, k_h, k_n, k_d, CHUNK: tl.constexpr, DIM: tl.constexpr):
    """One program: one query row's chunk of candidates, their logits from the store's own keys in float32 (-inf
    where the candidate is none: its bound is -inf)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    head = row // rows
    b = (head // kv_heads).to(tl.int64)
    h = (head % kv_heads).to(tl.int64)
    j = chunk * CHUNK + tl.arange(0, CHUNK)
    d = tl.arange(0, DIM)
    picked = j < count
    bound = tl.load(upper_ptr + row * count + j, mask=picked, other=float("-inf"))
    found = picked & (bound > float("-inf"))
    key_rows = tl.load(positions_ptr + row * count + j, mask=found, other=first_row) - first_row
    q = tl.load(q_ptr + row * dim + d, mask=d < dim, other=0.0).to(tl.float32)
    keys = tl.load(k_ptr + b * k_b + h * k_h + key_rows[:, None] * k_n + d[None, :] * k_d,
                   mask=found[:, None] & (d[None, :] < dim), other=0.0).to(tl.float32)
    logits = tl.sum(keys * q[None, :], axis=1) * scale
    tl.store(out_ptr + row * count + j, tl.where(found, logits, float("-inf")), mask=picked)
