"""A bfloat16 copy of a float32 middle store's keys, which top-k recall scans instead of the keys themselves.

Why. At long contexts, decoding with recall is bound by reading every middle key of every recall layer for
every token (float32 SmolLM2 at 32K tokens: 24 MB per layer). The copy holds half the bytes, laid out
(head_dim, tokens) per head for the CPU's matrix kernels. bounded_scan.py scans it and still recalls the
float32 top k; the copy also keeps what its error bound needs of the keys: per head, the largest rounding
error ‖k − k̃‖ and the largest norm ‖k̃‖ (k̃: the key rounded to bfloat16).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .modes import outside_inference_mode


@dataclass(frozen=True)
class ScanKeys:
    """A store's copy as one attention call reads it: ``keys_t`` (B, Hkv, D, n) bfloat16, and per head
    (B, Hkv) the largest ‖k − k̃‖ and ‖k̃‖ among (at least) those n keys."""

    keys_t: torch.Tensor
    rounding: torch.Tensor
    norm: torch.Tensor


class ScanCopy:
    """The copy inside a MiddleStore, which grows it, writes it and cuts it (by its length) with its own rows.

    The per-head maxima only grow: after a rollback they may cover keys no longer held, a looser bound that
    is still a bound, and an earlier view's maxima never change under it."""

    def __init__(self, keys_t: torch.Tensor | None = None, rounding: torch.Tensor | None = None,
                 norm: torch.Tensor | None = None):
        self.keys_t, self.rounding, self.norm = keys_t, rounding, norm

    def grown(self, like: torch.Tensor, capacity: int, length: int) -> "ScanCopy":
        """A copy with room for ``capacity`` keys shaped like ``like`` (B, Hkv, n, D), holding this one's first
        ``length``: the store swaps it in together with its other grown buffers."""
        batch, kv_heads, _, dim = like.shape
        with outside_inference_mode():
            keys_t = torch.empty((batch, kv_heads, dim, capacity), dtype=torch.bfloat16, device=like.device)
        if self.keys_t is not None and length:
            keys_t[..., :length] = self.keys_t[..., :length]
        return ScanCopy(keys_t, self.rounding, self.norm)

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
        return sum(t.numel() * t.element_size() for t in (self.keys_t, self.rounding, self.norm) if t is not None)
