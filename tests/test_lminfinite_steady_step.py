"""A steady decode step (one token, the window full): what a layer runs beyond a plain DynamicCache's step.

A CUDA graph replays a step's launches one by one, each a few microseconds however small, so every operator a
layer adds costs that much per token in each of the model's layers (32 for Llama-2-7B).
"""

from __future__ import annotations

import collections

import pytest
import torch
from transformers import DynamicCache

import lminfinite
from benchmarks.profile_prefill import operators_per_layer
from lminfinite_models import WINDOW, feed_in_chunks, random_ids, tiny_model

CONFIG = lminfinite.LMInfiniteConfig(n_starting=4)


def steady_step_operators(model, cache):
    """What the attention modules of one decode step run (views left out, by name) after three windows of
    prompt, the step before it run once (kernels chosen, tables made)."""
    token = feed_in_chunks(model, random_ids(3 * WINDOW), WINDOW, cache)[:, -1:].argmax(-1)
    with torch.inference_mode():
        model(input_ids=token, past_key_values=cache, use_cache=True)
        return operators_per_layer(model, lambda: model(input_ids=token, past_key_values=cache, use_cache=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_steady_step_adds_five_operators_per_layer_to_vanillas(dtype):
    """Vanilla's layer appends its key and value (2 cats) and attends. LM-Infinite's writes them into a ring slot
    (2 index_copy_) and places the start keys at distance ``window`` from the token: their rotation by the step's
    row, written into the ring's first rows as it is computed (2 products, a roll, a sum: rotary.rotate_into),
    and their values copied beside them, 5 more. Placing them ran 9 before (the widening, a negation and a cat for
    rotate_half, 3 for the rotation, the narrowing, 2 copies): 128 launches fewer per token at Llama-2-7B's 32
    layers in bfloat16."""
    model = tiny_model("llama-mha", dtype=dtype)
    per_layer, vanilla = steady_step_operators(model, DynamicCache(config=model.config))
    lminfinite.enable(model, CONFIG)
    infinite_per_layer, infinite = steady_step_operators(model, lminfinite.InfiniteCache(model))
    assert per_layer == 17 and infinite_per_layer - per_layer == 5, (infinite - vanilla, vanilla - infinite)
    layers = model.config.num_hidden_layers
    added = {"index_copy_": 2, "mul": 2, "roll": 1, "add": 1, "copy_": 1}
    assert infinite - vanilla == collections.Counter({name: n * layers for name, n in added.items()})
    assert vanilla - infinite == collections.Counter(cat=2 * layers)
