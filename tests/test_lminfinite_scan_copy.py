"""Recall's scan through a bfloat16 copy of the middle keys (lminfinite/bounded_scan.py, scan_copy.py) selects
exactly the float32 top k, on keys built to make bfloat16 misjudge them, and a cache keeps that copy in step
with its keys."""

import pytest
import torch

import lminfinite
from lminfinite.bounded_scan import kernel_rounds_as_assumed, scan_topk
from lminfinite.kv_bytes import keeps_scan_copy
from lminfinite.scan_copy import ScanCopy
from lminfinite_models import WINDOW, feed_in_chunks, random_ids, tiny_model

BUDGET = 1 << 24


def copied(keys: torch.Tensor):
    """The copy of ``keys`` as a store holds it (with spare capacity), read as one attention call reads it."""
    copy = ScanCopy().grown(keys, keys.shape[-2] + 7, 0)
    copy.write(0, keys)
    return copy.view(keys.shape[-2])


def float64_topk(query, keys, k, scale):
    logits = (query.double() @ keys.double().transpose(-1, -2)) * scale
    return logits.topk(k, dim=-1)


def assert_exact_selection(query, keys, k, scale=0.125):
    """The recalled keys are the float64 top k (as sets, per row) and their logits the float32 ones."""
    logits, idx = scan_topk(query, keys, copied(keys), k=k, scale=scale, budget=BUDGET)
    expected, expected_idx = float64_topk(query, keys, k, scale)
    assert torch.equal(idx.sort(dim=-1).values, expected_idx.sort(dim=-1).values)
    torch.testing.assert_close(logits.double().sort(dim=-1).values, expected.sort(dim=-1).values,
                               atol=1e-5, rtol=1e-6)


def keys_with_outlier_channels(n, generator, heads=2, dim=32):
    """Keys as attention layers make them: a few channels a hundred times larger than the rest."""
    keys = torch.randn(1, heads, n, dim, generator=generator)
    keys[..., :3] *= 100.0
    return keys


def test_this_machine_multiplies_and_rounds_as_the_bound_assumes():
    """Otherwise recall never scans the copy here, and the tests below would test nothing."""
    assert kernel_rounds_as_assumed()


@pytest.mark.parametrize("n, k", [(1, 1), (5, 5), (200, 3), (3000, 5), (3000, 40)])
def test_the_scan_selects_the_float32_top_k(n, k):
    generator = torch.Generator().manual_seed(n + k)
    keys = keys_with_outlier_channels(n, generator)
    query = torch.randn(1, 2, 6, 32, generator=generator)
    assert_exact_selection(query, keys, k)


def test_a_key_the_copy_ranks_below_thousands_is_still_recalled():
    """The true best key scans lower than 2,200 others, so only the error bound can bring it back: with no
    bound, the scan would stop at the first 512 candidates and recall one of 200 keys that scan higher.

    q = (1, −1, 0, …). The best key (1 + 2^-8 − 2^-14, 1 + 2^-8 + 2^-14) has logit −2^-13 but rounds to
    (1, 1 + 2^-7) and scans at −2^-7; 200 keys (1 + 2^-8 + 2^-14, 1 + 2^-8 + 2^-12) have logit −3·2^-14 and
    scan at 0; 2,000 keys (1 − 2^-8, 1), exact in bfloat16, have logit and scan −2^-8."""
    dim = 32
    keys = torch.zeros(1, 1, 2201, dim)
    keys[0, 0, :200, :2] = torch.tensor([1 + 2**-8 + 2**-14, 1 + 2**-8 + 2**-12])
    keys[0, 0, 200:2200, :2] = torch.tensor([1 - 2**-8, 1.0])
    keys[0, 0, 2200, :2] = torch.tensor([1 + 2**-8 - 2**-14, 1 + 2**-8 + 2**-14])
    query = torch.zeros(1, 1, 1, dim)
    query[..., 0], query[..., 1] = 1.0, -1.0
    scanned = (query.bfloat16() @ keys.bfloat16().transpose(-1, -2)).float()[0, 0, 0]
    assert scanned[2200] < scanned[200:2200].min() < scanned[:200].min()  # as the docstring says
    logits, idx = scan_topk(query, keys, copied(keys), k=1, scale=1.0, budget=BUDGET)
    assert idx.item() == 2200 and logits.item() == pytest.approx(-(2**-13), rel=1e-4)


def test_numbers_too_small_for_the_kernel_to_keep_are_within_the_bound():
    """A bfloat16 kernel that flushes numbers below 2^-126 to zero (Intel's, with AMX) scans the best key (by the
    31 of the query's 32 components that are that small) below 528 others; only the bound's term for flushed
    numbers brings it back. A kernel that keeps them (an AVX2 CPU's, which widens bfloat16 to float32) scans it
    first: either way the float32 top 1 is recalled."""
    dim = 32
    query = torch.full((1, 1, 1, dim), 2.0**-127)
    query[..., 0] = 2.0**-120
    keys = torch.zeros(1, 1, 1000, dim)
    keys[0, 0, :128, 0] = 1.0078
    keys[0, 0, 128:528, 0] = 0.75
    keys[0, 0, 900] = 2.2
    keys[0, 0, 900, 0] = 0.5
    scanned = (query.bfloat16() @ keys.bfloat16().transpose(-1, -2)).float()[0, 0, 0]
    flushed = bool(scanned[900] < scanned[:528].min())
    assert flushed or scanned[900] > scanned[:528].max()  # flushed as the docstring says, or kept whole
    expected = float64_topk(query, keys, 1, 1.0)[1].item()
    assert expected == 900
    _, idx = scan_topk(query, keys, copied(keys), k=1, scale=1.0, budget=BUDGET)
    assert idx.item() == expected


def test_what_the_budget_cannot_hold_is_left_to_the_float32_scan():
    generator = torch.Generator().manual_seed(5)
    keys = keys_with_outlier_channels(1000, generator)
    query = torch.randn(1, 2, 4, 32, generator=generator)
    assert scan_topk(query, keys, copied(keys), k=3, scale=1.0, budget=2 * 4 * 1000 - 1) is None  # scanned logits
    query[0, 1, 2, 5] = float("inf")  # every key is within reach: more float32 candidates than 8,000 elements
    assert scan_topk(query, keys, copied(keys), k=3, scale=1.0, budget=8000) is None
    logits, idx = scan_topk(query, keys, copied(keys), k=3, scale=1.0, budget=BUDGET)  # all rescored
    expected_idx = float64_topk(query[0, 0], keys[0, 0], 3, 1.0)[1]
    assert torch.equal(idx[0, 0].sort(dim=-1).values, expected_idx.sort(dim=-1).values)


def test_a_cache_keeps_its_copy_in_step_with_its_keys_through_rollback_and_restore():
    config = lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1)
    model = lminfinite.enable(tiny_model("llama-gqa"), config)
    cache = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, random_ids(12 * WINDOW), 5, cache)
    snapshot = cache.snapshot()
    feed_in_chunks(model, random_ids(3 * WINDOW, seed=2), 1, cache)
    cache.rollback(snapshot)
    feed_in_chunks(model, random_ids(2 * WINDOW, seed=3), 7, cache)  # written where the rolled-back rows were

    def assert_in_step(store):
        keys, _ = store.view()
        scan = store.scan_view()
        assert torch.equal(scan.keys_t, keys.bfloat16().transpose(-1, -2))
        assert ((keys - keys.bfloat16().float()).norm(dim=-1).amax(dim=-1) <= scan.rounding).all()
        assert (keys.bfloat16().float().norm(dim=-1).amax(dim=-1) <= scan.norm).all()

    for layer in cache.layers[1:]:
        assert_in_step(layer.middle)
    restored = lminfinite.restore_cache(model, *lminfinite.cache_state(cache))
    for layer in restored.layers[1:]:
        assert_in_step(layer.middle)
    assert restored.layers[1].middle.scan_view().keys_t.shape == cache.layers[1].middle.scan_view().keys_t.shape


def test_only_a_float32_model_on_the_cpu_keeps_a_copy():
    assert keeps_scan_copy(True, torch.float32, "cpu")
    assert not keeps_scan_copy(False, torch.float32, "cpu")
    assert not keeps_scan_copy(True, torch.float32, "cuda")  # even when its middle store is offloaded to the CPU
    assert not keeps_scan_copy(True, torch.bfloat16, "cpu")
    config = lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1)
    model = lminfinite.enable(tiny_model("llama-gqa", dtype=torch.bfloat16), config)
    cache = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, random_ids(4 * WINDOW), WINDOW, cache)
    assert cache.layers[1].middle.length > 0 and cache.layers[1].middle.scan is None
