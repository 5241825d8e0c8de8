"""Stop between two decoder layers, not only between two forwards.

Stop was checked before each forward of ``prefill_chunk`` tokens, and a forward of 512 tokens took 13-15 s on a 2-core
CPU without bfloat16 units (Qwen2.5-Coder-1.5B in float32): Stop waited that long, and so did every other session
behind it at the model. A pre-hook on each decoder layer (``nn.Module.register_forward_pre_hook``, no change to the
model's classes) ends the forward under way once its cancel flag is set, so Stop lands within one layer (about half
a second there). The caller rolls its cache back as after any stopped operation: ``InfiniteCache.rollback``
restores every layer, whether the forward reached it or not, and the library ends a forward's plan even when it
raised (patch.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


class StoppedMidForward(Exception):
    """Stop was asked for while a forward ran: it ended before one of its decoder layers."""


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder's layers where the model names them as Hugging Face causal LMs do (``get_decoder().layers``);
    none otherwise (Stop then acts between forwards, as before)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    return list(layers) if isinstance(layers, nn.ModuleList) else []


class LayerStop:
    """The cancel flag of the forward under way, checked before each decoder layer. One forward runs at a time (the
    model gate), so one flag serves the model."""

    def __init__(self, model: nn.Module):
        self.flag: threading.Event | None = None
        self.enabled = True  # False: Stop acts between forwards only (benchmarks/stop_latency.py compares the two)
        layers = decoder_layers(model)
        self.handles = [layer.register_forward_pre_hook(self._check) for layer in layers]

    def _check(self, module: nn.Module, args) -> None:
        if self.flag is not None and self.flag.is_set():
            raise StoppedMidForward()

    @contextmanager
    def watching(self, flag: threading.Event | None) -> Iterator[None]:
        """While the block runs a forward, end it before the next layer once ``flag`` is set (None: never)."""
        self.flag = flag if self.enabled else None
        try:
            yield
        finally:
            self.flag = None
