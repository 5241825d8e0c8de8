"""Recall's scan through a bfloat16 copy of the middle keys (lminfinite/scan_copy.py) selects exactly the
float32 top k, on keys built to make bfloat16 misjudge them, and a cache keeps that copy in step with its keys."""

import pytest
import torch

import lminfinite
from lminfinite.scan_copy import FIRST_CANDIDATES, ScanCopy, scan_topk
from lminfinite_models import WINDOW, feed_in_chunks, random_ids, tiny_model

BUDGET = 1 << 24


def copied(keys: torch.Tensor) -> ScanCopy:
    copy = ScanCopy()
    copy.install(copy.grown(keys, keys.shape[-2] + 7, 0))  # spare capacity, as a growing store has
    copy.write(0, keys)
    return copy


def float64_topk(query, keys, k, scale):
    logits = (query.double() @ keys.double().transpose(-1, -2)) * scale
    return logits.topk(k, dim=-1)


def assert_exact_selection(query, keys, k, scale=0.125, budget=BUDGET):
    """The recalled keys are the float64 top k (as sets, per row) and their logits the float32 ones."""
    logits, idx = scan_topk(query, keys, copied(keys).view(keys.shape[-2]), k=k, scale=scale, budget=budget)
    expected, expected_idx = float64_topk(query, keys, k, scale)
    assert torch.equal(idx.sort(dim=-1).values, expected_idx.sort(dim=-1).values)
    torch.testing.assert_close(logits.double().sort(dim=-1).values, expected.sort(dim=-1).values,
                               atol=1e-5, rtol=1e-6)


def keys_with_outlier_channels(n, generator, heads=2, dim=32):
    """Keys as attention layers make them: a few channels a hundred times larger than the rest."""
    keys = torch.randn(1, heads, n, dim, generator=generator)
    keys[..., :3] *= 100.0
    return keys


@pytest.mark.parametrize("n, k", [(1, 1), (5, 5), (FIRST_CANDIDATES, 3), (FIRST_CANDIDATES + 1, 7), (3000, 5)])
def test_the_scan_selects_the_float32_top_k(n, k):
    generator = torch.Generator().manual_seed(n)
    keys = keys_with_outlier_channels(n, generator)
    query = torch.randn(1, 2, 6, 32, generator=generator)
    assert_exact_selection(query, keys, k)


def test_keys_that_bfloat16_cannot_tell_apart_are_told_apart_by_their_float32_keys():
    """500 keys equal once rounded to bfloat16, differing in float32 (by far more than float32 rounding): the
    scan cannot order them, so the candidates must grow past the first ones and be rescored."""
    generator = torch.Generator().manual_seed(3)
    keys = keys_with_outlier_channels(2000, generator)
    base = 100 * torch.randn(32, generator=generator)  # so that the twins are every row's best keys
    twins = base.bfloat16().float() + 1e-4 * torch.rand(500, 32, generator=generator) * base.abs()
    assert torch.equal(twins.bfloat16(), base.bfloat16().expand(500, -1))
    keys[0, 0, 1000:1500] = twins
    query = base.expand(1, 2, 4, 32).clone()
    assert_exact_selection(query, keys, 5)
    logits, idx = scan_topk(query, keys, copied(keys).view(2000), k=5, scale=1.0, budget=BUDGET)
    assert ((idx[0, 0] >= 1000) & (idx[0, 0] < 1500)).all()


def test_rows_beyond_the_budget_go_through_in_groups():
    generator = torch.Generator().manual_seed(5)
    keys = keys_with_outlier_channels(1000, generator)
    query = torch.randn(1, 2, 50, 32, generator=generator)
    assert_exact_selection(query, keys, 4, budget=3000)  # three rows of 1,000 keys at a time


def test_a_non_finite_query_still_gets_the_rows_the_float32_scan_gets():
    generator = torch.Generator().manual_seed(6)
    keys = keys_with_outlier_channels(300, generator)
    query = torch.randn(1, 2, 3, 32, generator=generator)
    query[0, 1, 2, 5] = float("inf")
    logits, idx = scan_topk(query, keys, copied(keys).view(300), k=3, scale=0.5, budget=BUDGET)
    assert idx.shape == (1, 2, 3, 3) and torch.isfinite(logits[0, 0]).all()
    expected, expected_idx = float64_topk(query[0, 0], keys[0, 0], 3, 0.5)
    assert torch.equal(idx[0, 0].sort(dim=-1).values, expected_idx.sort(dim=-1).values)


def test_a_cache_keeps_its_copy_in_step_with_its_keys_through_rollback_and_restore():
    config = lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1)
    model = lminfinite.enable(tiny_model("llama-gqa"), config)
    cache = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, random_ids(12 * WINDOW), 5, cache)
    snapshot = cache.snapshot()
    feed_in_chunks(model, random_ids(3 * WINDOW, seed=2), 1, cache)
    cache.rollback(snapshot)

    def assert_in_step(store):
        keys, _ = store.view()
        scan = store.scan_view()
        assert torch.equal(scan.keys_t, keys.bfloat16().transpose(-1, -2))
        assert ((keys - keys.bfloat16().float()).norm(dim=-1).amax(dim=-1) <= scan.rounding).all()
        assert (keys.bfloat16().float().norm(dim=-1).amax(dim=-1) <= scan.norm).all()

    for layer in cache.layers[1:]:
        assert_in_step(layer.middle)
    tensors, info = lminfinite.cache_state(cache)
    restored = lminfinite.restore_cache(model, tensors, info)
    for layer in restored.layers[1:]:
        assert_in_step(layer.middle)
    assert restored.layers[1].middle.scan_view().keys_t.shape == cache.layers[1].middle.scan_view().keys_t.shape


def test_a_model_in_bfloat16_keeps_no_copy():
    config = lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1)
    model = lminfinite.enable(tiny_model("llama-gqa", dtype=torch.bfloat16), config)
    cache = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, random_ids(4 * WINDOW), WINDOW, cache)
    assert cache.layers[1].middle.length > 0 and cache.layers[1].middle.scan is None
