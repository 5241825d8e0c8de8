"""Query rows times a middle store's keys, one matrix product per head, in the order that reads the keys fastest.

A store's heads sit a whole capacity apart in its buffers, and a batched product over such strided operands
takes a slow path on the CPU (31.7K keys × 3 heads × 64 dims: 11.5 against 0.66 ms in bfloat16, 1.09 against
0.87 ms in float32), so both recall scans (recall.py, bounded_scan.py) multiply head by head.

The order matters too. Keys stored a token per row (the store's own layout) are read 1.6× faster as keys · qᵀ
than as q · keysᵀ for a decode step's few query rows in bfloat16 (25 layers of 31.7K keys, 3 rows per head:
0.92 against 1.55 ms per layer, selection included); with more rows, or in float32, q · keysᵀ is as fast or
faster, because the top-k then runs along the product's strided dimension. Keys stored a dimension per row
(the scan copy, scan_copy.py) are read fastest as q · keysᵀ whatever the rows.
"""

from __future__ import annotations

import torch

KEY_MAJOR_MAX_ROWS = 8  # measured: 3 rows 1.6× faster, 9 rows 1.1×, 27 rows 1.7× slower


def head_products(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """(B, H, R, n) ``query`` (B, H, R, D) times ``keys`` (B, H, n, D) transposed, in the operands' dtype;
    a strided view where the keys' side of the product was written contiguous."""
    batch, heads, rows, _ = query.shape
    n = keys.shape[-2]
    key_major = keys.stride(-1) == 1 and rows <= KEY_MAJOR_MAX_ROWS and keys.dtype == torch.bfloat16
    shape = (batch, heads, n, rows) if key_major else (batch, heads, rows, n)
    out = torch.empty(shape, dtype=query.dtype, device=query.device)
    for b in range(batch):
        for h in range(heads):
            if key_major:
                torch.mm(keys[b, h], query[b, h].T, out=out[b, h])
            else:
                torch.mm(query[b, h], keys[b, h].T, out=out[b, h])
    return out.transpose(-1, -2) if key_major else out
