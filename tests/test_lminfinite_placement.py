"""Where the middle store's rows live (primary buffer, then fixed pages beyond a budget) and the fused causal path
for chunks inside the window: both against the float64 reference and against the unbounded, general paths.

On the CPU a budget is given explicitly (``middle_device_bytes``); on a GPU it comes from the free memory, and
test_lminfinite_cuda.py checks the pinned pages there.
"""

from __future__ import annotations

import pytest
import torch

import lminfinite
from lminfinite import kernel, middle_store, persist
from lminfinite.middle_store import MiddleStore
from lminfinite.reference import ReferenceModel
from lminfinite_models import WINDOW, feed_in_chunks, random_ids, tiny_model

CONFIG = lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1)
PAGE = 8  # rows per page in these tests, so that a short context fills several


@pytest.fixture
def small_pages(monkeypatch):
    monkeypatch.setattr(middle_store, "PAGE_ROWS", PAGE)


def _row_bytes(model) -> int:
    config = model.config
    kv_heads, head_dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    return 2 * kv_heads * head_dim * 4


def test_store_beyond_its_budget_pages_rows_in_order(small_pages):
    store = MiddleStore(device_budget=10 * 2 * 2 * 4 * 4, scan_copy=False)  # 10 rows of 2 heads × 4 dims, float32
    generator, appended = torch.Generator().manual_seed(0), []
    for size in (3, 9, 1, 17, 2):
        rows = torch.randn(1, 2, size, 4, generator=generator)
        store.append(rows, -rows)
        appended.append(rows)
    expected = torch.cat(appended, dim=-2)
    primary_k, _, pages = store.attention_view()
    assert store.primary_cap == 10 and primary_k.shape[-2] == 10 and store.keys.shape[-2] == 10  # capacity capped
    assert [k.shape[-2] for k, _ in pages] == [8, 8, 6] and store.length == 32
    keys, values = store.view()
    assert torch.equal(keys, expected) and torch.equal(values, -expected)
    store.truncate(7)  # a rollback into the primary; appends go on from there
    store.append(expected[..., 7:12, :], -expected[..., 7:12, :])
    keys, _ = store.view()
    assert torch.equal(keys, expected[..., :12, :]) and len(store.attention_view()[2]) == 1
    store.restore(expected.double(), -expected.double(), "cpu", torch.float32)  # a saved store, read as saved
    keys, values = store.view()
    assert store.primary_rows == 10 and len(store.pages) == 3 and torch.equal(keys, expected)
    assert torch.equal(values, -expected) and keys.dtype == torch.float32


def test_paged_store_recalls_as_the_reference_and_the_unbounded_store(small_pages):
    model = lminfinite.enable(tiny_model("llama-gqa"), CONFIG)
    ids = random_ids(12 * WINDOW)
    expected = ReferenceModel(model, CONFIG).logits(ids)
    plain = feed_in_chunks(model, ids, 7, lminfinite.InfiniteCache(model))
    cache = lminfinite.InfiniteCache(model, middle_device_bytes=2 * 20 * _row_bytes(model))  # 20 rows per layer
    paged = feed_in_chunks(model, ids, 7, cache)
    layer = cache.layers[1].middle
    assert layer.primary_rows == 20 and len(layer.attention_view()[2]) > 5
    assert (paged.double() - expected).abs().max() < 2e-5
    torch.testing.assert_close(paged, plain, atol=1e-5, rtol=1e-5)


def test_paged_store_rolls_back_saves_and_reopens(small_pages, tmp_path):
    model = lminfinite.enable(tiny_model("qwen2-gqa"), CONFIG)
    ids = random_ids(10 * WINDOW)
    budget = 2 * 12 * _row_bytes(model)
    cache = lminfinite.InfiniteCache(model, middle_device_bytes=budget)
    feed_in_chunks(model, ids[:, : 6 * WINDOW], 5, cache)
    snap = cache.snapshot()
    first = feed_in_chunks(model, ids[:, 6 * WINDOW :], 3, cache)
    cache.rollback(snap)
    assert torch.equal(feed_in_chunks(model, ids[:, 6 * WINDOW :], 3, cache), first)
    persist.save_cache(cache, tmp_path / "paged.safetensors")
    reopened, _ = persist.load_cache(model, tmp_path / "paged.safetensors")  # a CPU model: one unbounded buffer
    assert reopened.layers[1].middle.length == cache.layers[1].middle.length
    nxt = random_ids(2 * WINDOW, seed=5)
    # Pages and one buffer score the middle keys in products of other shapes: bitwise the same on some CPUs'
    # kernels (Intel's), within float32 rounding on others (an AMD EPYC's AVX2 kernels: 1.8e-7 apart).
    torch.testing.assert_close(feed_in_chunks(model, nxt, 4, reopened), feed_in_chunks(model, nxt, 4, cache),
                               atol=1e-6, rtol=1e-5)


def test_offloaded_store_of_a_cpu_model_keeps_one_buffer():
    """Offload means 'pinned CPU pages' for a GPU model; a CPU model's rows already live in CPU memory."""
    model = lminfinite.enable(tiny_model(), CONFIG)
    cache = lminfinite.InfiniteCache(model, offload_middle=True)
    feed_in_chunks(model, random_ids(6 * WINDOW), 9, cache)
    store = cache.layers[1].middle
    assert store.primary_cap is None and not store.pages and store.length > 0


@pytest.mark.parametrize("family", ["llama-mha", "qwen2-gqa"])
def test_chunks_inside_the_window_take_one_causal_call_and_follow_the_reference(family, monkeypatch):
    """The first L tokens: one fused causal call per layer (a first chunk, a later chunk, single tokens), then the
    general path from the first chunk that reaches past L; all of it against the float64 reference."""
    calls = []
    real = kernel.within_window
    monkeypatch.setattr(kernel, "within_window", lambda *a: calls.append(a[0].shape[-2]) or real(*a))
    model = lminfinite.enable(tiny_model(family), CONFIG)
    ids = random_ids(3 * WINDOW)
    expected = ReferenceModel(model, CONFIG).logits(ids)
    cache = lminfinite.InfiniteCache(model)
    pieces = [ids[:, :6], ids[:, 6:9], ids[:, 9:10], ids[:, 10:WINDOW], ids[:, WINDOW:]]
    with torch.no_grad():
        logits = torch.cat([model(input_ids=p, past_key_values=cache).logits for p in pieces], dim=1)
    layers = model.config.num_hidden_layers
    assert calls == [6] * layers + [3] * layers + [1] * layers + [WINDOW - 10] * layers  # not the last piece
    assert (logits.double() - expected).abs().max() < 2e-5


def test_the_float32_window_kernel_keeps_the_general_path(monkeypatch):
    monkeypatch.setattr(kernel, "within_window", lambda *a: pytest.fail("fused path taken"))
    config = lminfinite.LMInfiniteConfig(n_starting=4, window_kernel="float32")
    model = lminfinite.enable(tiny_model(), config)
    feed_in_chunks(model, random_ids(WINDOW), 5, lminfinite.InfiniteCache(model))


def test_middle_device_share_is_validated():
    with pytest.raises(ValueError, match="middle_device_share"):
        lminfinite.LMInfiniteConfig(middle_device_share=1.5)
