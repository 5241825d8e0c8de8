"""How one forward's queries and keys are rotated into its cache's frame: by the model's own rotary embedding.

An InfiniteLayer needs the keys a call stores rotated by R(j - frame), and the attention needs the queries rotated
the same way (layer.py). Every layer would rotate them itself, after the model's rotary embedding had applied an
identity rotation: two passes over every query and key where the plain model makes one (a 4K prefill on an H200
spent a tenth of its time there). Before a forward on an InfiniteCache, the cache plans the rotation
(``InfiniteCache.plan_rotation``): the offsets ``seen - frame`` onwards of a prefill chunk, or the DecodeStep's
row for a steady decode step. The rotary embedding's hook (patch.py) then hands the model exactly those (cos, sin),
so its own ``apply_rotary_pos_emb`` computes the numbers the layers would have, and the layers and the attention
leave them as they are. Where no plan was applied (no InfiniteCache, a DynamicCache, a rotary embedding the
forward never called), the rotation stays the identity and the layers rotate as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .decode_step import DecodeStep
from .rotary import Rope


@dataclass(eq=False)
class ForwardRotation:
    """One forward's plan: its cache, the first offset (position - frame) of its tokens, or the DecodeStep of a
    steady decode step. ``applied``: the rotary embedding's hook handed the model these rotations."""

    cache: object
    first: int
    step: DecodeStep | None = None
    applied: bool = False

    def cos_sin(self, rope: Rope, tokens: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(cos, sin) shaped (1, tokens, head_dim) as HF's rotary embedding returns them, in ``dtype``; None where the
        layers must rotate themselves (a decode step whose rows are kept in another dtype than the model computes)."""
        if self.step is not None:
            if tokens != 1 or self.step.cos.dtype != dtype:
                return None
            return self.step.cos[None], self.step.sin[None]
        cos, sin = rope.span(self.first, self.first + tokens, dtype, device)
        return cos[None], sin[None]
