"""The Triton kernels behind recall_kernel.py's two operators, and their launches (imported only where they run)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .recall_kernel import interpreted


def scan(query: torch.Tensor, keys: torch.Tensor, live: torch.Tensor | None, k: int, scale: float,
         block: int) -> tuple[torch.Tensor, torch.Tensor]:
    batch, kv_heads, rows, dim = query.shape
    n = keys.shape[-2]
    blocks = triton.cdiv(n, block)
    query = query.contiguous()
    cand_logits = torch.empty((batch, kv_heads, rows, blocks * k), dtype=torch.float32, device=query.device)
    cand_rows = torch.empty((batch, kv_heads, rows, blocks * k), dtype=torch.long, device=query.device)
    _scan_blocks[(batch * kv_heads, blocks)](
        query, keys, query if live is None else live, cand_logits, cand_rows,
        kv_heads, rows, n, dim, float(scale), *keys.stride(),
        HAS_LIVE=live is not None, ROWS=max(16, triton.next_power_of_2(rows)),
        DIM=max(16, triton.next_power_of_2(dim)), BLOCK=block, K=k, IEEE=query.dtype == torch.float32 or interpreted(),
    )
    return cand_logits, cand_rows


def gather(rows: torch.Tensor, logits: torch.Tensor, values: torch.Tensor,
           first_row: int) -> tuple[torch.Tensor, torch.Tensor]:
    batch, kv_heads, query_rows, k = rows.shape
    dim = values.shape[-1]
    positions = torch.empty(rows.shape, dtype=torch.long, device=rows.device)
    out = torch.empty((*rows.shape, dim), dtype=values.dtype, device=values.device)
    _gather_rows[(batch * kv_heads * query_rows,)](
        rows.contiguous(), logits.contiguous(), values, positions, out,
        kv_heads, query_rows, k, dim, first_row, *values.stride(),
        K=max(2, triton.next_power_of_2(k)), DIM=max(16, triton.next_power_of_2(dim)),
    )
    return positions, out


@triton.jit
def _scan_blocks(q_ptr, k_ptr, live_ptr, out_logits, out_rows,
                 kv_heads, rows, n, dim, scale, stride_b, stride_h, stride_n, stride_d,
                 HAS_LIVE: tl.constexpr, ROWS: tl.constexpr, DIM: tl.constexpr, BLOCK: tl.constexpr,
                 K: tl.constexpr, IEEE: tl.constexpr):
    """One program: one key head's query rows against one block of its keys; the block's K best per row."""
    head = tl.program_id(0)
    block = tl.program_id(1)
    blocks = tl.num_programs(1)
    r = tl.arange(0, ROWS)
    d = tl.arange(0, DIM)
    c = tl.arange(0, BLOCK)
    key_rows = block * BLOCK + c
    if HAS_LIVE:
        in_use = tl.minimum(tl.load(live_ptr), n)
    else:
        in_use = n
    q = tl.load(q_ptr + (head * rows + r[:, None]) * dim + d[None, :],
                mask=(r[:, None] < rows) & (d[None, :] < dim), other=0.0)
    key_base = k_ptr + (head // kv_heads) * stride_b + (head % kv_heads) * stride_h
    keys = tl.load(key_base + key_rows[:, None] * stride_n + d[None, :] * stride_d,  # spare rows are not read
                   mask=(key_rows[:, None] < in_use) & (d[None, :] < dim), other=0.0)
    if IEEE:  # float32 numbers, or half ones under the interpreter (whose dot reads their bits as integers)
        scores = tl.dot(q.to(tl.float32), tl.trans(keys.to(tl.float32)), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(keys))
    scores = tl.where((key_rows < in_use)[None, :], scores * scale, float("-inf"))
    out = (head * rows + r) * (blocks * K) + block * K
    for j in tl.static_range(K):
        best = tl.max(scores, axis=1)
        at = tl.argmax(scores, axis=1)
        tl.store(out_logits + out + j, best, mask=r < rows)
        tl.store(out_rows + out + j, (block * BLOCK + at).to(tl.int64), mask=r < rows)
        scores = tl.where(c[None, :] == at[:, None], float("-inf"), scores)


@triton.jit
def _gather_rows(rows_ptr, logits_ptr, v_ptr, positions_ptr, out_ptr,
                 kv_heads, query_rows, k, dim, first_row, stride_b, stride_h, stride_n, stride_d,
                 K: tl.constexpr, DIM: tl.constexpr):
    """One program: one query row's k picks: their positions, and their value rows (zeros for -inf picks)."""
    row = tl.program_id(0)
    head = row // query_rows
    j = tl.arange(0, K)
    d = tl.arange(0, DIM)
    picked = j < k
    store_rows = tl.load(rows_ptr + row * k + j, mask=picked, other=0)
    logits = tl.load(logits_ptr + row * k + j, mask=picked, other=float("-inf"))
    tl.store(positions_ptr + row * k + j, store_rows + first_row, mask=picked)
    found = picked & (logits > float("-inf"))
    value_base = v_ptr + (head // kv_heads) * stride_b + (head % kv_heads) * stride_h
    values = tl.load(value_base + store_rows[:, None] * stride_n + d[None, :] * stride_d,
                     mask=found[:, None] & (d[None, :] < dim), other=0.0)
    tl.store(out_ptr + (row * k + j[:, None]) * dim + d[None, :], values, mask=picked[:, None] & (d[None, :] < dim))
