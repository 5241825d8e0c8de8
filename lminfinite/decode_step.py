"""DecodeStep: what changes from one steady decode step to the next, held in tensors on the cache's device.

A steady decode step (one token, window full) writes the token's key and value into one ring slot, rotates the
token's key and query into the frame, and places the start keys at distance ``window`` from it (layer.py); after it,
a layer that keeps a middle store moves the window's oldest token there, unrotated. Only the slot and the rotations
depend on the position. The cache loads them here before the step, and every
layer reads them as tensors, not as Python numbers. So every step runs the same kernels on the same buffers,
and a CUDA graph recorded at one step replays any later one (graphed.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .modes import outside_inference_mode
from .rotary import Rope, rotation_dtype


@dataclass(eq=False)
class DecodeStep:
    """slot (1,) int64: the ring row the token goes to. cos, sin (1, head_dim), keys' dtype: the token's key and
    query into the frame (offset position - frame). start_cos, start_sin, float32 at least: the start keys to
    distance ``window`` from the token (offset position - frame - window), the sine with its first half negated
    (rotary.rotate_into's). recall_cos, recall_sin, float32 at least: the query from its frame rotation to
    ``topk_distance``, where recall scores the unrotated middle keys (offset topk_distance - (position - frame)).
    evict_cos, evict_sin, float32 at least: the window's oldest key out of the frame, unrotated, as it goes into the
    middle store after the step (offset frame - (position - window + 1)), the sine half-negated like start_sin.
    position: the token they were last loaded for (-1: never)."""

    slot: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    start_cos: torch.Tensor
    start_sin: torch.Tensor
    recall_cos: torch.Tensor
    recall_sin: torch.Tensor
    evict_cos: torch.Tensor
    evict_sin: torch.Tensor
    position: int = -1

    @classmethod
    def allocate(cls, head_dim: int, dtype: torch.dtype, device) -> "DecodeStep":
        with outside_inference_mode():  # written in place at every step, whatever the caller's mode
            kinds = (dtype, dtype, *[rotation_dtype(dtype)] * 6)
            rows = [torch.zeros(1, head_dim, dtype=kind, device=device) for kind in kinds]
            return cls(torch.zeros(1, dtype=torch.long, device=device), *rows)

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.slot, self.cos, self.sin, self.start_cos, self.start_sin, self.recall_cos, self.recall_sin,
                self.evict_cos, self.evict_sin)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def fits(self, dtype: torch.dtype, device) -> bool:
        return self.cos.dtype == dtype and self.cos.device == torch.device(device)

    def load(self, rope: Rope, *, position: int, frame: int, slot: int, window: int, recall_distance: int,
             evicts: bool) -> None:
        """Fill in place for the token at ``position``: device copies only, no sync. ``evicts``: whether a middle
        store takes the oldest token after the step (else the eviction's rotation is left as it was)."""
        self.position = position
        self.slot.fill_(slot)
        rope.fill_row(self.cos, self.sin, position - frame)
        rope.fill_row(self.start_cos, self.start_sin, position - frame - window, negate_first_half=True)
        rope.fill_row(self.recall_cos, self.recall_sin, recall_distance - (position - frame))
        if evicts:
            oldest = position - (window - 1)
            rope.fill_row(self.evict_cos, self.evict_sin, frame - oldest, negate_first_half=True)
