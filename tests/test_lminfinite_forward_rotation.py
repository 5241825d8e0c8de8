"""The model's own rotary embedding rotates a forward's queries and keys into the cache's frame (forward_rotation.py):
bit for bit what the layers computed when they rotated themselves after an identity rotation, for prefill chunks
inside and beyond the rotation tables, across re-based frames, and for steady decode steps with and without recall."""

from __future__ import annotations

import pytest
import torch

import lminfinite
from lminfinite.forward_rotation import ForwardRotation
from lminfinite_models import WINDOW, feed_in_chunks, random_ids, tiny_model

CONFIG = lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1)


def _run(model, ids, chunks, decode_steps):
    """Logits of a prefill fed in ``chunks`` (sizes, cycled), then of greedy decode steps; and whether the model's
    rotary embedding rotated every forward (the cache's flag after each)."""
    cache, outs, applied, lo, i = lminfinite.InfiniteCache(model), [], [], 0, 0
    with torch.no_grad():
        while lo < ids.shape[1]:
            size = chunks[i % len(chunks)]
            outs.append(model(input_ids=ids[:, lo : lo + size], past_key_values=cache, use_cache=True).logits)
            applied.append(cache._rotated)
            lo, i = lo + size, i + 1
        token = outs[-1][:, -1:].argmax(-1)
        for _ in range(decode_steps):
            outs.append(model(input_ids=token, past_key_values=cache, use_cache=True).logits)
            applied.append(cache._rotated)
            token = outs[-1][:, -1:].argmax(-1)
    return torch.cat(outs, dim=1), applied


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["llama-gqa", "qwen2-gqa"])
def test_the_models_rotation_into_the_frame_is_the_layers_own_bit_for_bit(family, dtype, monkeypatch):
    model = lminfinite.enable(tiny_model(family, dtype=dtype), CONFIG)
    ids = random_ids(14 * WINDOW, seed=4)
    chunks = [WINDOW - 3, 5, 6 * WINDOW, 1, 7]  # inside the window, past it, beyond the tables (4·L), single tokens
    rotated, applied = _run(model, ids, chunks, 3 * WINDOW)
    assert all(applied)
    monkeypatch.setattr(ForwardRotation, "cos_sin", lambda *args: None)  # the identity: the layers rotate
    itself, applied = _run(model, ids, chunks, 3 * WINDOW)
    assert not any(applied)
    torch.testing.assert_close(rotated, itself, atol=0, rtol=0)


def test_without_an_infinite_cache_the_rotation_stays_the_identity():
    """No cache and a DynamicCache keep keys as projected (the attention rotates them from position 0): the same
    logits as the float64 reference follows, and nothing is left planned after a forward."""
    model = lminfinite.enable(tiny_model("llama-gqa"), lminfinite.LMInfiniteConfig(n_starting=4))
    ids = random_ids(3 * WINDOW, seed=5)
    with torch.no_grad():
        whole = model(input_ids=ids).logits
        cached = feed_in_chunks(model, ids, 7, lminfinite.InfiniteCache(model))
    torch.testing.assert_close(cached, whole, atol=2e-5, rtol=2e-5)
    assert lminfinite.get_state(model).rotation is None
