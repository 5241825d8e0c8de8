"""What a patched model carries for LM-Infinite: its config, rotation and hooks. One per model, never per call.

Nothing here is kept from one forward to the next: the frame and positions live in the call's cache
(layer.py), the recall k in the call's cache or else the model's config; ``rotation`` is the plan of the forward
under way (forward_rotation.py), cleared when it ends. Observers are model-wide: while
registered, they see every forward of the model, whoever's cache it runs on.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from torch import nn

from .config import LMInfiniteConfig
from .forward_rotation import ForwardRotation
from .rotary import Rope

_STATE_ATTR = "_lminfinite_state"


@dataclass
class InfiniteState:
    """The model's resolved config and rotary parameters, the hooks that enable() registered, the observers."""

    config: LMInfiniteConfig
    rope: Rope
    num_layers: int
    previous_attention: str
    hooks: list = field(default_factory=list)
    observers: list = field(default_factory=list)
    block_size: int | None = None  # None: kernel.default_block_size(window)
    dynamic_caches: weakref.WeakSet = field(default_factory=weakref.WeakSet)  # DynamicCaches filled by LM-Infinite
    rotation: ForwardRotation | None = None  # the forward under way's, on an InfiniteCache (patch.py)

    def notify(self, layer_idx, query_pos, positions, weights) -> None:
        for observer in list(self.observers):
            observer(layer_idx, query_pos, positions, weights)


def get_state(model: nn.Module) -> InfiniteState | None:
    return getattr(model, _STATE_ATTR, None)


def set_state(model: nn.Module, state: InfiniteState | None) -> None:
    """Attach ``state`` to ``model`` (None: detach it)."""
    if state is None:
        delattr(model, _STATE_ATTR)
    else:
        setattr(model, _STATE_ATTR, state)
