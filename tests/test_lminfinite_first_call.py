"""A cache's first call inside the window: what a layer launches beyond a plain DynamicCache's, and a ring that
is allocated without being cleared first.

Inside the window LM-Infinite computes what vanilla computes, so on a GPU whose host barely keeps ahead of it (a
4K prefill of the 4-bit 7B: about 115 ms of host work beside 128 ms of GPU work, benchmarks/results/gpu_logs/)
every operator a layer adds shows in the prefill's time. The operators a first call adds per layer are counted
here; the ring, no longer cleared before the call fills it, must hold zeros wherever that call wrote nothing.
"""

from __future__ import annotations

import collections

import pytest
import torch
from transformers import DynamicCache

import lminfinite
from benchmarks.profile_prefill import operators_per_layer
from lminfinite.layer import window_start
from lminfinite_models import WINDOW, feed_in_chunks, random_ids, tiny_model

N_STARTING = 4
CONFIG = lminfinite.LMInfiniteConfig(n_starting=N_STARTING)


def first_call_operators(model, cache, tokens: int) -> collections.Counter:
    """What the attention modules of a first call of ``tokens`` tokens run, views left out (by name)."""
    ids = random_ids(tokens)
    run = lambda: model(input_ids=ids, past_key_values=cache(), use_cache=True, logits_to_keep=1)  # noqa: E731
    with torch.inference_mode():
        run()  # kernels chosen, tables made
        return operators_per_layer(model, run)[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_first_call_inside_the_window_adds_eleven_operators_per_layer_to_vanillas(dtype):
    """Vanilla's layer stores its keys and values (2 cats) and attends. LM-Infinite's allocates its ring (2),
    clears the rows the call leaves empty (2: the start rows and the slots after the call's, one span in the keys
    and one in the values),
    unrotates the start keys (their rows kept by the model's Rope from the first layer that asked: 2 products, a
    roll, a sum, the rounding), keeps them (2 copies), writes the rest into the ring (2) and attends: 11 more. It
    ran 30 more before the ring was written and read by runs of slots instead of index tensors, left uncleared
    where the call fills it, and the start keys' rotation took its rows as a slice of the table instead of
    gathering listed offsets; 16 more before the rows were kept and the rotation rolled instead of widened and
    negated: 608 fewer operators in a 32-layer prefill."""
    model = tiny_model("llama-mha", dtype=dtype)
    vanilla = first_call_operators(model, lambda: DynamicCache(config=model.config), WINDOW)
    lminfinite.enable(model, CONFIG)
    infinite = first_call_operators(model, lambda: lminfinite.InfiniteCache(model), WINDOW)
    layers = model.config.num_hidden_layers
    extra = (sum(infinite.values()) - sum(vanilla.values())) / layers
    assert extra == 11, (infinite - vanilla, vanilla - infinite)
    assert infinite["index_copy_"] == infinite["arange"] == infinite["index"] == 0  # no index tensors


def _ring_rows_kept(tokens: int) -> set[int]:
    """Rows of the ring that a first call of ``tokens`` tokens writes: the slots of [window_start, tokens)."""
    kept_from = max(window_start(tokens, N_STARTING, WINDOW), N_STARTING)
    return {N_STARTING + position % WINDOW for position in range(kept_from, tokens)}


@pytest.mark.parametrize("tokens", [1, N_STARTING, N_STARTING + 5, WINDOW, N_STARTING + WINDOW - 1, 3 * WINDOW + 5])
def test_a_ring_allocated_over_garbage_holds_zeros_wherever_the_first_call_wrote_nothing(tokens, monkeypatch):
    """The allocator's leftovers (NaN here) never stay in a ring: the rows the first call leaves empty are zero
    (a saved ring holds nothing else), and the logits of that call and of later chunks and steady decode steps
    are bit for bit those of a cache allocated over zeros."""
    model = lminfinite.enable(tiny_model("llama-gqa"), CONFIG)
    ids, more = random_ids(tokens), random_ids(2 * WINDOW + 3, seed=2)
    runs = []
    for leftovers in (0.0, float("nan")):
        real_empty = torch.empty
        monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(leftovers))
        cache = lminfinite.InfiniteCache(model)
        first = feed_in_chunks(model, ids, tokens, cache)
        monkeypatch.setattr(torch, "empty", real_empty)
        for layer in cache.layers:
            for ring in (layer.ring_k, layer.ring_v):
                empty_rows = sorted(set(range(ring.shape[-2])) - _ring_rows_kept(tokens))
                assert not ring[..., empty_rows, :].any() and not ring.isnan().any()
        runs.append((first, feed_in_chunks(model, more[:, :WINDOW], 5, cache),
                     feed_in_chunks(model, more[:, WINDOW:], 1, cache)))  # chunks, then steady decode steps
    for clean, dirty in zip(*runs):
        torch.testing.assert_close(dirty, clean, atol=0, rtol=0)
