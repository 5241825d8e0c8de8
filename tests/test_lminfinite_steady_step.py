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
from test_lminfinite_recall_kernel import CountOps

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


RECALL = lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1)


def cache_before_a_replay(dtype, **cache_options):
    """A cache after three windows of prompt and one steady step with recall, its next step prepared as a replayer
    prepares it (graphed.py): what ``advance`` after a replay finds."""
    model = lminfinite.enable(tiny_model("llama-gqa", dtype=dtype), RECALL)
    cache = lminfinite.InfiniteCache(model, **cache_options)
    token = feed_in_chunks(model, random_ids(3 * WINDOW, seed=5), 7, cache)[:, -1:].argmax(-1)
    with torch.no_grad():
        model(input_ids=token, past_key_values=cache, use_cache=True)
    cache.prepare_forward(1)
    return cache


def test_after_a_replayed_step_a_recall_layer_moves_its_oldest_key_into_the_store_in_six_operators():
    """After every replay, every recall layer unrotates the window's oldest key into its middle store (27 layers
    of Llama-2-7B per token, launched one by one outside the graph). Unrotated by the step's row as the store
    writes it: 2 products, a roll and a sum, the value's copy, the store's count on the device. By a table row and
    then copied, it ran 13 (2 cats and a negation to make the row, the widening, a negation and a cat for
    rotate_half, 3 for the rotation, the narrowing, 2 copies, the count)."""
    cache = cache_before_a_replay(torch.bfloat16, recall_fixed_shapes=True)
    kernels = kernels_run(lambda: cache.layers[1].advance(cache._step))
    assert kernels == collections.Counter(mul=2, roll=1, add=1, copy_=1, fill_=1)


def kernels_run(run) -> collections.Counter:
    """The operators ``run()`` runs, by name, views left out."""
    with torch.no_grad(), CountOps() as counted:
        run()
    return counted.kernels


@pytest.mark.parametrize("keep_middle", [False, True])
def test_a_step_is_prepared_in_two_launches_per_rotation_row(keep_middle):
    """Before every step, on the host's way to the GPU, the cache loads the step's slot and rotation rows:
    the token's, the start keys', recall's and, where a store takes the evicted key, its. Each row is a half row of
    the table copied into both halves and a half sine times a sign per half: 7 launches, 9 with the eviction's row,
    where making each row (2 cats, a negation below zero, another negation and cat to half-negate it) and copying
    it ran 16 and 23."""
    model = lminfinite.enable(tiny_model("llama-gqa", dtype=torch.bfloat16), RECALL)
    cache = lminfinite.InfiniteCache(model, keep_middle=keep_middle, topk=None if keep_middle else 0)
    token = feed_in_chunks(model, random_ids(3 * WINDOW, seed=5), 7, cache)[:, -1:].argmax(-1)
    with torch.no_grad():
        model(input_ids=token, past_key_values=cache, use_cache=True)
    rows = 4 if keep_middle else 3
    assert kernels_run(lambda: cache.prepare_forward(1)) == collections.Counter(fill_=1, copy_=rows, mul=rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("middle_device_bytes", [None, 4096])  # 4 KiB: the store's rows go to pages
def test_the_key_moved_with_the_steps_row_is_the_key_unrotated_by_a_table_row_bit_for_bit(dtype, middle_device_bytes):
    with_step, by_table = (cache_before_a_replay(dtype, middle_device_bytes=middle_device_bytes) for _ in range(2))
    for layer in range(1, len(with_step.layers)):
        with_step.layers[layer].advance(with_step._step)
        table = by_table.layers[layer]  # what advance did before: a rotation by the table's row, then the append
        oldest = table.win_start
        slot = table.config.n_starting + oldest % table.config.window_
        table.middle.append(table.rope.rotate_by(table.ring_k[..., slot : slot + 1, :], table.frame - oldest),
                            table.ring_v[..., slot : slot + 1, :])
        assert bool(with_step.layers[layer].middle.pages) == (middle_device_bytes is not None)
        keys, values = with_step.layers[layer].middle.view()
        expected_keys, expected_values = by_table.layers[layer].middle.view()
        assert keys.shape[-2] == expected_keys.shape[-2] > 0
        assert torch.equal(keys.view(torch.int8 if dtype == torch.bfloat16 else torch.int32),
                           expected_keys.view(torch.int8 if dtype == torch.bfloat16 else torch.int32))
        assert torch.equal(values, expected_values)

