"""Tensors kept across forward calls must be normal tensors, whichever grad mode created them."""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def outside_inference_mode():
    """Allocate here what outlives the call: rings, start keys, the middle store, rotation tables.

    A tensor made under ``torch.inference_mode`` can be neither updated in place nor saved for backward once
    that mode is left, and ``generate`` runs under ``no_grad``: a cache prefilled under inference mode would
    fail on its first decode step. Grad mode stays as it was outside (off under inference mode).
    """
    grad = torch.is_grad_enabled()
    with torch.inference_mode(False), torch.set_grad_enabled(grad):
        yield
