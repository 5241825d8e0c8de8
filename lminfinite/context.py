"""The keys one attention call may look at, with their absolute positions made explicit."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KeyContext:
    """Keys/values for one layer and one forward call, all unrotated, shaped (batch, kv_heads, n, head_dim).

    recent: positions ``[recent_start, recent_start + n)``; the call's queries are its last tokens.
    start: positions ``[0, s)``, s <= n_starting. Either ``recent_start == 0`` (start is the head of recent),
        or every start token lies beyond every query's window and is only reachable at the distance ceiling.
    middle: evicted tokens at positions ``[n_starting, n_starting + m)``, kept for top-k recall; may live on
        the CPU (offload) while the rest is on the accelerator.
    """

    recent_k: torch.Tensor
    recent_v: torch.Tensor
    recent_start: int
    start_k: torch.Tensor
    start_v: torch.Tensor
    middle_k: torch.Tensor | None = None
    middle_v: torch.Tensor | None = None

    @property
    def end(self) -> int:
        """One past the position of the last query."""
        return self.recent_start + self.recent_k.shape[-2]

    @property
    def middle_len(self) -> int:
        return 0 if self.middle_k is None else self.middle_k.shape[-2]

    @classmethod
    def full_sequence(cls, keys: torch.Tensor, values: torch.Tensor, n_starting: int) -> "KeyContext":
        """Keys of every token from position 0 (no cache, or a DynamicCache): start is a view, nothing is evicted."""
        return cls(keys, values, 0, keys[..., :n_starting, :], values[..., :n_starting, :])
