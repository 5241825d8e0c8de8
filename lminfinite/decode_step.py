"""DecodeStep: what changes from one decode step to the next, held in tensors on the cache's device.

A steady decode step (one token, window full) writes the token's key and value into one ring slot, rotates the
token's key and query into the frame, and places the start keys at distance ``window`` from it (layer.py); after it,
a layer that keeps a middle store moves the window's oldest token there, unrotated. Only the slot and the rotations
depend on the position. The cache loads them here before the step, and every
layer reads them as tensors, not as Python numbers. So every step runs the same kernels on the same buffers,
and a CUDA graph recorded at one step replays any later one (graphed.py).

A filling step (one token before the window is full, every key within it; where the cache asks for fixed window
shapes, on a GPU by default) is made alike: it attends over the ring's window rows, the start keys placed at their
own distances in their own slots, then every token since in its slot: a prefix of the same buffers at every step,
its length counted in ``filled`` (filling.py), so a graph recorded at one filling step replays the next ones too.
An answer read in a short context (the app's quoted answers) decodes so from its first token.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from .filling import FilledRows
from .modes import outside_inference_mode
from .rotary import Rope, half_negated, rotation_dtype


class StepKind(Enum):
    """What a one-token call of a layer is: a steady step (the window full) or a filling one (layer.py)."""

    STEADY = "steady"
    FILLING = "filling"


@dataclass(eq=False)
class DecodeStep:
    """slot (1,) int64: the ring row the token goes to. cos, sin (1, head_dim), keys' dtype: the token's key and
    query into the frame (offset position - frame). start_cos, start_sin, float32 at least: the start keys to
    distance ``window`` from the token (offset position - frame - window), the sine with its first half negated
    (rotary.rotate_into's). recall_cos, recall_sin, float32 at least: the query from its frame rotation to
    ``topk_distance``, where recall scores the unrotated middle keys (offset topk_distance - (position - frame)).
    evict_cos, evict_sin, float32 at least: the window's oldest key out of the frame, unrotated, as it goes into the
    middle store after the step (offset frame - (position - window + 1)), the sine half-negated like start_sin.
    placed_cos, placed_sin (n_starting, head_dim), float32 at least: a filling step's start keys into the frame
    at their own positions (offsets -frame, 1 - frame, ...), the sine half-negated. filled: the window rows of the
    ring a filling step attends to, a prefix. position: the token they were last loaded for (-1: never);
    kind: the step they were loaded for; placed_frame: the frame placed_cos/sin hold (None: none yet)."""

    slot: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    start_cos: torch.Tensor
    start_sin: torch.Tensor
    recall_cos: torch.Tensor
    recall_sin: torch.Tensor
    evict_cos: torch.Tensor
    evict_sin: torch.Tensor
    placed_cos: torch.Tensor
    placed_sin: torch.Tensor
    filled: FilledRows
    position: int = -1
    kind: StepKind | None = None
    placed_frame: int | None = None

    @classmethod
    def allocate(cls, head_dim: int, dtype: torch.dtype, device, n_starting: int, window: int) -> "DecodeStep":
        with outside_inference_mode():  # written in place at every step, whatever the caller's mode
            kinds = (dtype, dtype, *[rotation_dtype(dtype)] * 6)
            rows = [torch.zeros(1, head_dim, dtype=kind, device=device) for kind in kinds]
            placed = [torch.zeros(n_starting, head_dim, dtype=rotation_dtype(dtype), device=device) for _ in range(2)]
            return cls(torch.zeros(1, dtype=torch.long, device=device), *rows, *placed,
                       FilledRows.allocate(window, device))

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.slot, self.cos, self.sin, self.start_cos, self.start_sin, self.recall_cos, self.recall_sin,
                self.evict_cos, self.evict_sin, self.placed_cos, self.placed_sin, *self.filled.tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def fits(self, dtype: torch.dtype, device) -> bool:
        return self.cos.dtype == dtype and self.cos.device == torch.device(device)

    def load(self, rope: Rope, *, position: int, frame: int, slot: int, window: int, recall_distance: int,
             evicts: bool) -> None:
        """Fill in place for the token at ``position``: device copies only, no sync. ``evicts``: whether a middle
        store takes the oldest token after the step (else the eviction's rotation is left as it was)."""
        self.position, self.kind = position, StepKind.STEADY
        self.slot.fill_(slot)
        rope.fill_row(self.cos, self.sin, position - frame)
        rope.fill_row(self.start_cos, self.start_sin, position - frame - window, negate_first_half=True)
        rope.fill_row(self.recall_cos, self.recall_sin, recall_distance - (position - frame))
        if evicts:
            oldest = position - (window - 1)
            rope.fill_row(self.evict_cos, self.evict_sin, frame - oldest, negate_first_half=True)

    def load_filling(self, rope: Rope, *, position: int, frame: int, slot: int, n_starting: int) -> None:
        """Fill in place for a filling step's token at ``position`` (n_starting <= position < window, so every key
        is at its own distance, and position q lies in the ring's row n_starting + q, its window row q): the slot and
        rotation as a steady step's, the start keys' rotations to their own positions, and the rows in use: window
        rows [0, position], the start keys placed in their own slots (which hold nothing else while the ring fills:
        the start keys are kept apart) and the tokens since. The start keys' rotations depend on the frame alone,
        which stays put while the ring fills: made once, not at every token."""
        self.position, self.kind = position, StepKind.FILLING
        self.slot.fill_(slot)
        rope.fill_row(self.cos, self.sin, position - frame)
        if self.placed_frame != frame:
            cos, sin = rope.consecutive(-frame, 1, n_starting, self.placed_cos.dtype, self.placed_cos.device)
            self.placed_cos.copy_(cos)
            self.placed_sin.copy_(half_negated(sin))
            self.placed_frame = frame
        self.filled.fill(position + 1)
