"""The keys one attention call may look at, with their absolute positions made explicit.

A KeyContext is what LM-Infinite attention attends to, so it is what a cache returns: an InfiniteLayer's
``update`` returns it in place of transformers' (keys, values) pair (layer.py says why in both places), and
without an InfiniteCache the attention builds one from the full keys and values (``full_sequence``).
Queries arrive as projected and are rotated into the context's frame by ``rotate_queries``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .filling import FilledRows
from .rotary import Rope, apply_rotation
from .scan_copy import ScanKeys


@dataclass
class KeyContext:
    """Keys/values for one layer and one forward call, shaped (batch, kv_heads, n, head_dim).

    recent: positions ``[recent_start, recent_start + n)``, keys rotated into the ``frame``: key j holds
        R(j - frame)·k_j, so a query rotated by i - frame scores it at distance i - j. The call's queries
        are the last tokens of recent.
    start: unrotated keys at positions ``[0, s)``, s <= n_starting. Either ``recent_start == 0`` (they are
        also in recent), or every one lies beyond every query's window, reachable only at the ceiling.
    middle: evicted tokens at positions ``[n_starting, n_starting + m)``, unrotated, for top-k recall;
        the first ones (middle_k/v) where the store keeps them (the model's device, or the CPU for a CPU model),
        the rest (``middle_pages``) in pinned CPU pages, in position order, where a GPU store spilled beyond its
        budget or was offloaded (middle_store.py). ``middle_scan``: the store's bfloat16 copy of middle_k, which
        recall scans where there is one (scan_copy.py). ``middle_live``, where set (a steady decode step of a store
        with fixed shapes, MiddleStore.fixed_view): middle_k/v are the store's whole buffers, and only their first
        middle_live rows (a count on their device) are in use.
    decode_keys/values: decoding one query: the n_starting start keys rotated to distance ``window`` from it,
        then the last ``window`` keys in the frame, in any order, all valid: a steady step. Or, in a filling
        step (before the window is full), the ring's window rows, whose first ``decode_filled`` rows (a count on
        the device, filling.py) hold the start keys at their own distances and every token since.
    decode_rotation: with them, (cos, sin) of the query's rotation into the frame, as its key got it.
    decode_recall_rotation: with them, (cos, sin) from the query's frame rotation to ``topk_distance``.
    """

    recent_k: torch.Tensor
    recent_v: torch.Tensor
    recent_start: int
    frame: int
    start_k: torch.Tensor
    start_v: torch.Tensor
    middle_k: torch.Tensor | None = None
    middle_v: torch.Tensor | None = None
    middle_scan: ScanKeys | None = None
    middle_pages: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
    middle_live: torch.Tensor | None = None
    decode_keys: torch.Tensor | None = None
    decode_values: torch.Tensor | None = None
    decode_rotation: tuple[torch.Tensor, torch.Tensor] | None = None
    decode_recall_rotation: tuple[torch.Tensor, torch.Tensor] | None = None
    decode_filled: FilledRows | None = None
    queries_rotated: bool = False  # the call's queries arrive rotated into the frame (forward_rotation.py)

    @property
    def end(self) -> int:
        """One past the position of the last query."""
        return self.recent_start + self.recent_k.shape[-2]

    def raw_recent(self, lo: int, hi: int, rope: Rope) -> torch.Tensor:
        """Unrotated keys at positions [lo, hi) of recent (for top-k scoring at a fixed distance)."""
        keys = self.recent_k[..., lo - self.recent_start : hi - self.recent_start, :]
        return rope.rotate_range(keys, self.frame - lo, -1)

    def rotate_queries(self, query: torch.Tensor, rope: Rope) -> torch.Tensor:
        """The call's queries, as projected: the last c tokens of recent, rotated into the frame, R(i - frame)·q_i
        (unless the model's rotary embedding did that already)."""
        if self.queries_rotated:
            return query
        if self.decode_rotation is not None:
            return apply_rotation(query, *self.decode_rotation)
        return rope.rotate_from(query, self.end - query.shape[-2] - self.frame)

    @classmethod
    def full_sequence(cls, keys: torch.Tensor, values: torch.Tensor, n_starting: int, rope: Rope) -> "KeyContext":
        """Keys of every token of the sequence, as projected (no cache, or a DynamicCache), in frame 0.

        Positions count from the sequence's first token, whatever position ids the call was given."""
        recent_k = rope.rotate_from(keys, 0)
        start = recent_k[..., :n_starting, :]  # unrotated back, as an InfiniteLayer does: both paths agree bit for bit
        start_k = rope.rotate_range(start, 0, -1)
        return cls(recent_k, values, 0, 0, start_k, values[..., :n_starting, :])
