"""Top-k recall through a middle store's bfloat16 scan copy (scan_copy.py), selecting the float32 top k.

A scanned logit differs from the float32 one by at most a bound (below). Every key whose bound reaches the
k-th best is rescored from its float32 key, so the recalled tokens are the float32 top k and their logits
float32 logits (up to float32 rounding between near-ties, as between any two float32 matrix kernels).

The bound, for a query q (rounded to bfloat16: q̃) and a key k (k̃). The scan multiplies in bfloat16 (products
exact in float32), sums D of them in float32 and rounds the sum s to bfloat16 (unit roundoff u = 2^-8), so

    |q·k − s| ≤ ‖q‖·‖k − k̃‖ + (‖q − q̃‖ + γ_D·‖q̃‖)·‖k̃‖ + u/(1 − u)·|s| + τ·(√D·(‖q‖ + ‖k̃‖) + 2D + 1)

with γ_D = D·2^-24 / (1 − D·2^-24), since q·k − q̃·k̃ = q·(k − k̃) + (q − q̃)·k̃ (Cauchy–Schwarz for each).
The last term covers a kernel that flushes numbers below τ = 2^-126 (the smallest normal float) to zero, in
its inputs, products, sums or output. The store keeps, per head, the largest ‖k − k̃‖ and ‖k̃‖; a margin of 25 %
covers the float32 rounding of the bound's own arithmetic. Whether this machine's kernel multiplies, sums and
rounds as assumed is checked once (``kernel_rounds_as_assumed``); where it does not, recall scans the float32
keys.
"""

from __future__ import annotations

import functools
import math

import torch

from .head_products import head_products
from .scan_copy import ScanKeys

# Where scanning the copy pays, measured on CPU for a decode step's recall in one layer (3 key heads of 64
# dims): from 8K middle keys (4x slower at 1K keys, even at 8K, 1.8x faster at 32K), for up to 16 query rows
# per key head (a decode step; 12 rows 1.5x faster, 48 rows slower: selecting among rows × n scanned logits
# then costs more than the bytes saved).
COPY_PAYS_FROM = 8192
COPY_MAX_ROWS = 16
SAFETY = 1.25
OUTPUT_ROUNDING = SAFETY * 2.0**-8 / (1 - 2.0**-8)  # u / (1 - u), with the margin
TINY = 2.0**-126
FIRST_CANDIDATES = 128  # rescored per query row; fourfold more until every key that could be in the top k is


def copy_pays(rows: int, keys: int) -> bool:
    """Whether scanning the copy is faster than scanning the float32 keys, for ``rows`` query rows per key head."""
    return keys >= COPY_PAYS_FROM and rows <= COPY_MAX_ROWS


def scan_topk(query: torch.Tensor, keys: torch.Tensor, scan: ScanKeys, *, k: int, scale: float,
              budget: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The ``k`` (<= n) largest float32 logits ``scale``·q·k per query row, and their key indices; None where
    the scan would hold more than ``budget`` elements (scanned logits, or float32 candidates), or the kernel
    does not round as the bound assumes: the float32 scan then does it.

    query: (B, Hkv, R, D) float32; keys: (B, Hkv, n, D) float32, the keys ``scan`` copies."""
    batch, kv_heads, rows, dim = query.shape
    n = keys.shape[-2]
    cells = batch * kv_heads * rows
    if cells * n > budget or not kernel_rounds_as_assumed():
        return None
    most = min(n, max(k, budget // (cells * dim)))  # candidates whose float32 keys fit in the budget
    low = query.detach().to(torch.bfloat16)
    scanned = head_products(low, scan.keys_t.transpose(-1, -2))
    slack = _row_slack(query.detach(), low, scan)
    count = min(most, max(FIRST_CANDIDATES, 4 * k))
    while True:
        top, idx = scanned.topk(count, dim=-1)
        top = top.float()
        if count == n or bool((top[..., -1:] < _cut(top[..., k - 1 : k], slack)).all()):
            break  # every key left out scans below the cut, so it cannot be among the top k
        if count == most:
            return None  # too many keys within reach of the k-th best (or a non-finite query)
        count = min(most, 4 * count)
    chosen = torch.empty((batch, kv_heads, rows * count, dim), dtype=keys.dtype, device=keys.device)
    for b in range(batch):  # whole rows of each head's keys: far faster than a gather along the last dim
        for h in range(kv_heads):
            torch.index_select(keys[b, h], 0, idx[b, h].reshape(-1), out=chosen[b, h])
    exact = (chosen.view(batch, kv_heads, rows, count, dim) @ query.unsqueeze(-1)).squeeze(-1).float() * scale
    logits, pick = exact.topk(k, dim=-1)
    return logits, idx.gather(-1, pick)


def _row_slack(query: torch.Tensor, low: torch.Tensor, scan: ScanKeys) -> torch.Tensor:
    """(B, Hkv, R, 1): the bound's terms that do not depend on the scanned value, with the margin."""
    dim = query.shape[-1]
    gamma = dim * 2.0**-24 / (1 - dim * 2.0**-24)
    widened = low.float()
    size, error, low_size = query.norm(dim=-1), (query - widened).norm(dim=-1), widened.norm(dim=-1)
    key_error, key_size = scan.rounding[..., None], scan.norm[..., None]
    slack = size * key_error + (error + gamma * low_size) * key_size
    slack = slack + TINY * (math.sqrt(dim) * (size + key_size) + 2 * dim + 1)
    return (SAFETY * slack)[..., None]


def _cut(kth: torch.Tensor, slack: torch.Tensor) -> torch.Tensor:
    """The scanned value below which a key's float32 logit is surely below the k-th best one.

    Each of the k best scanned keys has a logit >= floor = s_k − r|s_k| − slack (r: OUTPUT_ROUNDING), so the
    k-th best logit is >= floor. A key scanned at s has a logit <= s + r|s| + slack, which is below floor
    exactly when s is below the cut, the value where s + r|s| = floor − slack (s + r|s| grows with s)."""
    floor = kth - OUTPUT_ROUNDING * kth.abs() - slack
    reach = floor - slack
    return torch.where(reach > 0, reach / (1 + OUTPUT_ROUNDING), reach / (1 - OUTPUT_ROUNDING))


@functools.cache
def kernel_rounds_as_assumed() -> bool:
    """Whether the CPU's bfloat16 matrix product multiplies exactly, sums in float32 and rounds once to nearest,
    as the bound assumes; some builds and CPUs sum in bfloat16 instead. Two sums, through the scan's own call
    on a strided copy-shaped operand, tell them apart:
      256 + 63 × 1 = 319, which rounds to 320; summed in bfloat16, every + 1 is lost and 256 remains;
      (1 + 2^-7)² + 2^-8 = 1 + 2^-6 + 2^-8 + 2^-14, just above the midpoint between two bfloat16 numbers,
      so it rounds up to 1 + 2^-6 + 2^-7; a product rounded to bfloat16 first leaves it on the midpoint, and
      ties go to the even 1 + 2^-6."""
    dim, n = 64, 8192  # shaped as the scans it stands for
    one = 1 + 2.0**-7
    rows = torch.zeros(2, dim, dtype=torch.bfloat16)
    rows[0] = 1
    rows[0, 0] = 256
    rows[1, 0], rows[1, 1] = one, 2.0**-8
    columns = torch.zeros(dim, n + dim, dtype=torch.bfloat16)[:, :n]
    columns[:, 0] = 1
    columns[0, 1], columns[1, 1] = one, 1
    out = torch.empty(2, n, dtype=torch.bfloat16)
    torch.mm(rows, columns, out=out)
    return float(out[0, 0]) == 320.0 and float(out[1, 1]) == 1 + 2.0**-6 + 2.0**-7
