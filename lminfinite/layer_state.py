"""What one InfiniteLayer (layer.py) is, as data: the names of its tensors and its counters, in one place.

The layer alone reads and writes these fields: a snapshot (``InfiniteLayer.snapshot``) holds references to its
tensors and a copy of its counters, which ``rollback`` puts back; a saved file (persist.py) holds the counters
as JSON (``LayerCounters.to_dict``) and the tensors by name, which ``InfiniteLayer.load`` puts back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

TENSORS = ("start_k", "start_v", "ring_k", "ring_v")  # the layer's own attributes; None until it is initialized
MIDDLE_TENSORS = ("middle_k", "middle_v")  # the middle store's rows in use, as a saved file names them
POSITIONS = ("seen", "win_start", "frame")  # the counters that are token positions (LayerCounters' fields)


@dataclass(frozen=True)
class LayerCounters:
    """A layer's counters: whether it holds tensors, its positions, and the rows of its middle store (None: it
    keeps none). Every layer of one cache sees every token, so all but ``middle`` are equal across its layers.
    A saved file's per-layer record is this, as JSON."""

    initialized: bool
    seen: int
    win_start: int
    frame: int
    middle: int | None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LayerState:
    """A layer as it was: its counters and its TENSORS' values (references; the layer copies a referenced ring
    before writing it)."""

    counters: LayerCounters
    tensors: tuple
