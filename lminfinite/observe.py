"""Watch which middle tokens top-k recall picked, so the app can cite the pages the model looked at."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .model_state import get_state


@dataclass
class TopKSelection:
    """One layer's recall for one block of queries.

    positions / weights: (batch, heads, queries, k) absolute token positions and their softmax weights
    (weight 0 where fewer than k middle tokens existed).
    """

    layer_idx: int
    query_positions: torch.Tensor
    positions: torch.Tensor
    weights: torch.Tensor


class TopKObserver:
    """``with observe_topk(model) as seen: model.generate(...)``; then read ``seen.selections``.

    A callback may be given instead of collecting; tensors are moved to the CPU either way.
    """

    def __init__(self, model, callback=None):
        self._state = get_state(model)
        if self._state is None:
            raise ValueError("observe_topk needs an LM-Infinite model: call lminfinite.enable(model) first")
        self.callback = callback
        self.selections: list[TopKSelection] = []

    def __call__(self, layer_idx, query_pos, positions, weights) -> None:
        selection = TopKSelection(layer_idx, query_pos.cpu(), positions.cpu(), weights.detach().float().cpu())
        if self.callback is not None:
            self.callback(selection)
        else:
            self.selections.append(selection)

    def __enter__(self) -> "TopKObserver":
        self._state.observers.append(self)
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def remove(self) -> None:
        if self in self._state.observers:
            self._state.observers.remove(self)


def observe_topk(model, callback=None) -> TopKObserver:
    return TopKObserver(model, callback)
