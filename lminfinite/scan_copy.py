"""A bfloat16 copy of a float32 middle store's keys, which top-k recall scans instead of the keys themselves.

Why. At long contexts, decoding with recall is bound by reading every middle key of every recall layer for
every token (float32 SmolLM2 at 32K tokens: 24 MB per layer). The copy holds half the bytes, laid out
(head_dim, tokens) per head for the CPU's matrix kernels: at 32K keys a layer's recall takes about half the
time (README's "Speed at 32K tokens" has what that does to decoding).

Exact all the same. A scanned logit differs from the float32 one by at most a bound (below). Every key whose
bound reaches the k-th best is rescored from its float32 key, so the recalled tokens are the float32 top-k and
their logits are float32 logits. For a query q (rounded to bfloat16: q̃) and a key k (k̃), the scan multiplies
in bfloat16 (products exact in float32), sums D of them in float32 and rounds the sum s to bfloat16, with unit
roundoff u = 2^-8:

    |q·k − s| ≤ ‖q‖·‖k − k̃‖ + (‖q − q̃‖ + γ_D·‖q̃‖)·‖k̃‖ + u/(1 − u)·|s|,    γ_D = D·2^-24 / (1 − D·2^-24)

since q·k − q̃·k̃ = q·(k − k̃) + (q − q̃)·k̃ (Cauchy–Schwarz for each). The copy keeps, per head, the largest
‖k − k̃‖ and ‖k̃‖ of its keys; a margin of 25 % covers the float32 rounding of the bound's own arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .modes import outside_inference_mode

# Middle keys from which scanning the copy pays; below, its fixed cost makes it slower than the float32 scan
# (a decode step's recall in one layer on CPU, 3 key heads of 64 dims: 4x slower at 1K keys, even at 8K,
# 1.8x faster at 32K).
COPY_PAYS_FROM = 8192
SAFETY = 1.25
OUTPUT_ROUNDING = SAFETY * 2.0**-8 / (1 - 2.0**-8)  # u / (1 - u), with the margin
FIRST_CANDIDATES = 128  # rescored per query row; fourfold more until every key that could be in the top k is


@dataclass(frozen=True)
class ScanKeys:
    """A store's copy as one attention call reads it: ``keys_t`` (B, Hkv, D, n) bfloat16, and per head
    (B, Hkv) the largest rounding error ‖k − k̃‖ and the largest norm ‖k̃‖ among (at least) those n keys."""

    keys_t: torch.Tensor
    rounding: torch.Tensor
    norm: torch.Tensor


class ScanCopy:
    """The growing copy inside a MiddleStore, which allocates, writes and truncates it with its own rows.

    The per-head maxima only grow: after a rollback they may cover keys no longer held, a looser bound that
    is still a bound, and an earlier view's maxima never change under it."""

    def __init__(self):
        self.keys_t: torch.Tensor | None = None
        self.rounding: torch.Tensor | None = None
        self.norm: torch.Tensor | None = None

    def grown(self, like: torch.Tensor, capacity: int, length: int) -> torch.Tensor:
        """A buffer for ``capacity`` keys shaped like ``like`` (B, Hkv, n, D), holding this copy's first
        ``length``; the store installs it (``install``) once all its buffers are allocated."""
        batch, kv_heads, _, dim = like.shape
        with outside_inference_mode():
            new = torch.empty((batch, kv_heads, dim, capacity), dtype=torch.bfloat16, device=like.device)
        if self.keys_t is not None and length:
            new[..., :length] = self.keys_t[..., :length]
        return new

    def install(self, keys_t: torch.Tensor) -> None:
        self.keys_t = keys_t

    def write(self, at: int, keys: torch.Tensor) -> None:
        """Copy float32 ``keys`` (B, Hkv, n, D) into positions [at, at + n)."""
        low = keys.to(torch.bfloat16)
        self.keys_t[..., at : at + keys.shape[-2]] = low.transpose(-1, -2)
        widened = low.float()
        rounding = (keys - widened).norm(dim=-1).amax(dim=-1)
        norm = widened.norm(dim=-1).amax(dim=-1)
        with outside_inference_mode():
            self.rounding = rounding.clone() if self.rounding is None else torch.maximum(self.rounding, rounding)
            self.norm = norm.clone() if self.norm is None else torch.maximum(self.norm, norm)

    def view(self, length: int) -> ScanKeys:
        return ScanKeys(self.keys_t[..., :length], self.rounding, self.norm)

    @property
    def allocated_bytes(self) -> int:
        if self.keys_t is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (self.keys_t, self.rounding, self.norm))


def scan_topk(query: torch.Tensor, keys: torch.Tensor, scan: ScanKeys, *, k: int, scale: float,
              budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` (<= n) largest float32 logits ``scale``·q·k per query row, and their key indices.

    query: (B, Hkv, R, D) float32; keys: (B, Hkv, n, D) float32, the keys ``scan`` copies. Rows go through in
    groups that keep the scanned (rows × n) logits within ``budget`` elements."""
    rows = max(1, budget // max(1, keys.shape[-2]))
    if query.shape[-2] <= rows:
        return _scan_rows(query, keys, scan, k, scale)
    parts = [_scan_rows(query[..., lo : lo + rows, :], keys, scan, k, scale)
             for lo in range(0, query.shape[-2], rows)]
    return torch.cat([p[0] for p in parts], dim=-2), torch.cat([p[1] for p in parts], dim=-2)


def _scan_rows(query, keys, scan: ScanKeys, k: int, scale: float):
    batch, kv_heads, rows, dim = query.shape
    n = keys.shape[-2]
    low = query.detach().to(torch.bfloat16)
    scanned = torch.empty((batch, kv_heads, rows, n), dtype=torch.bfloat16, device=query.device)
    for b in range(batch):  # one matrix product per head: the copy's heads are strided by its capacity
        for h in range(kv_heads):
            torch.mm(low[b, h], scan.keys_t[b, h], out=scanned[b, h])
    slack = _row_slack(query.detach(), low, scan)
    count = min(n, max(FIRST_CANDIDATES, 4 * k))
    while True:
        top, idx = scanned.topk(count, dim=-1)
        top = top.float()
        if count == n or bool((top[..., -1:] < _cut(top[..., k - 1 : k], slack)).all()):
            break  # every key left out scans below the cut, so it cannot be among the top k
        count = min(n, 4 * count)
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
    slack = size * scan.rounding[..., None] + (error + gamma * low_size) * scan.norm[..., None]
    return (SAFETY * slack)[..., None]


def _cut(kth: torch.Tensor, slack: torch.Tensor) -> torch.Tensor:
    """The scanned value below which a key's float32 logit is surely below the k-th best one.

    Each of the k best scanned keys has a logit >= floor = s_k − r|s_k| − slack (r: OUTPUT_ROUNDING), so the
    k-th best logit is >= floor. A key scanned at s has a logit <= s + r|s| + slack, which is below floor
    exactly when s is below the cut, the value where s + r|s| = floor − slack (s + r|s| grows with s)."""
    floor = kth - OUTPUT_ROUNDING * kth.abs() - slack
    reach = floor - slack
    return torch.where(reach > 0, reach / (1 + OUTPUT_ROUNDING), reach / (1 - OUTPUT_ROUNDING))
