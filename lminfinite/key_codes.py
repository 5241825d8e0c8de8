"""An int8 copy of a middle store's keys on a GPU, which recall's scan reads instead of the keys: half the bytes.

Why. Decoding with recall reads every middle key of every recall layer for each token: 28 GiB a token at 128K tokens
of Llama-2-7B, 6 ms at an H200's full bandwidth against a 7.9 ms step without recall, so no scan of the keys
themselves meets "recall costs at most half a step more". coded_recall.py scans this copy, bounds each scanned
logit's error, and rescores from the store's own keys every key that could be among the top k: the same tokens.

Layout. A block of BLOCK rows (the scan's block) is coded once it is full, with one scale per channel, its rows'
largest |k_d| / 127: a block never rescales as the store grows, and one scale per channel follows the outlier
channels that one scale per key cannot (benchmarks/scan_copy_bound.py: 0.2 % of keys to rescore, against 2 % and
up to 84 % of a row with one scale per key). The block being filled is scanned from the store's keys. Beside the
codes, per key ‖k − k̃‖ (k̃ = code · scale) and per block the largest ‖k̃‖: the terms of the bound.
"""

from __future__ import annotations

import torch

from .kv_bytes import CODED_BLOCK as BLOCK  # keys per block: recall_kernel.BLOCK, the scan's
from .modes import outside_inference_mode

LEVELS = 127  # codes in [-127, 127]
POOL = 1024  # keys (8 blocks) a scan of the codes pools its candidates from, per query row (coded_recall.py)
KEEP = 32  # candidates it keeps per pool


def code_blocks(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Whole blocks of keys (B, H, blocks·BLOCK, D), any float dtype, coded in float32: (codes int8 (B, H, n, D),
    scales float32 (B, H, blocks, D), errors float32 (B, H, n): ‖k − k̃‖, norms float32 (B, H, blocks): the
    largest ‖k̃‖ of each block). A channel that is zero throughout a block gets scale 1 and codes 0: exact."""
    batch, heads, n, dim = keys.shape
    rows = keys.float().reshape(batch, heads, n // BLOCK, BLOCK, dim)
    scales = rows.abs().amax(dim=-2) / LEVELS
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = (rows / scales[..., None, :]).round().clamp(-LEVELS, LEVELS)
    coded = codes * scales[..., None, :]
    errors = (rows - coded).norm(dim=-1)
    norms = coded.norm(dim=-1).amax(dim=-1)
    return codes.to(torch.int8).reshape(batch, heads, n, dim), scales, errors.reshape(batch, heads, n), norms


class KeyCodes:
    """The copy inside a MiddleStore's primary, which grows it with its buffers, codes each block as it fills and
    forgets blocks a truncation reopens. ``blocks``: the blocks coded (every full one of the rows in use); ``keep``:
    the candidates a scan of them keeps per ``pool`` keys and query row (KEEP per POOL; benchmarks/recall_kernel.py
    times others)."""

    def __init__(self, codes: torch.Tensor | None = None, scales: torch.Tensor | None = None,
                 errors: torch.Tensor | None = None, norms: torch.Tensor | None = None, blocks: int = 0,
                 keep: int = KEEP, pool: int = POOL):
        if pool % BLOCK:
            raise ValueError(f"a pool of keys is whole blocks of {BLOCK}, not {pool}")
        self.codes, self.scales, self.errors, self.norms, self.blocks = codes, scales, errors, norms, blocks
        self.keep, self.pool = keep, pool

    def grown(self, like: torch.Tensor, capacity: int) -> "KeyCodes":
        """A copy with room for ``capacity`` rows shaped like ``like`` (B, H, n, D), holding this one's coded
        blocks: the store swaps it in together with its other grown buffers."""
        batch, heads, _, dim = like.shape
        slots = -(-capacity // BLOCK)
        with outside_inference_mode():  # written in place by later calls, whatever their mode
            grown = KeyCodes(
                torch.empty((batch, heads, capacity, dim), dtype=torch.int8, device=like.device),
                torch.ones((batch, heads, slots, dim), dtype=torch.float32, device=like.device),
                torch.zeros((batch, heads, capacity), dtype=torch.float32, device=like.device),
                torch.zeros((batch, heads, slots), dtype=torch.float32, device=like.device),
                keep=self.keep, pool=self.pool,
            )
        if self.codes is not None and self.blocks:
            rows = self.blocks * BLOCK
            grown.codes[..., :rows, :] = self.codes[..., :rows, :]
            grown.errors[..., :rows] = self.errors[..., :rows]
            grown.scales[..., : self.blocks, :] = self.scales[..., : self.blocks, :]
            grown.norms[..., : self.blocks] = self.norms[..., : self.blocks]
            grown.blocks = self.blocks
        return grown

    def code(self, keys: torch.Tensor, length: int) -> None:
        """Code every block that the first ``length`` rows of the store's ``keys`` buffer (B, H, capacity, D) fill
        and that is not coded yet (all at once after a prefill, one every BLOCK tokens while decoding)."""
        full = min(length, keys.shape[-2]) // BLOCK
        if full <= self.blocks:
            return
        lo, hi = self.blocks * BLOCK, full * BLOCK
        codes, scales, errors, norms = code_blocks(keys[..., lo:hi, :])
        self.codes[..., lo:hi, :] = codes
        self.errors[..., lo:hi] = errors
        self.scales[..., self.blocks : full, :] = scales
        self.norms[..., self.blocks : full] = norms
        self.blocks = full

    def truncate(self, length: int) -> None:
        """The store keeps only its first ``length`` rows: a block they no longer fill is coded again when it is."""
        self.blocks = min(self.blocks, length // BLOCK)

    @property
    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.errors, self.norms)
                   if t is not None)
