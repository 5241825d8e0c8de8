"""InfiniteCache: bounded memory, position invariance, snapshot/rollback, the middle store."""


import pytest
import torch

import lminfinite
from lminfinite.key_context import KeyContext
from lminfinite.kv_bytes import row_bytes
from lminfinite.layer_state import POSITIONS
from lminfinite_models import FAMILIES, WINDOW, feed_in_chunks, held_bytes, random_ids, tiny_model

N_STARTING = 4


@pytest.fixture
def model():
    return lminfinite.enable(tiny_model("llama-gqa"), lminfinite.LMInfiniteConfig(n_starting=N_STARTING))


HEAD_DIM = 64 // 4


def test_memory_is_constant_in_context_length(model):
    short, long = lminfinite.InfiniteCache(model), lminfinite.InfiniteCache(model)
    feed_in_chunks(model, random_ids(2 * WINDOW), 5, short)
    feed_in_chunks(model, random_ids(64 * WINDOW), 37, long)
    assert long.get_seq_length() == 64 * WINDOW
    assert long.memory() == short.memory()
    # A ring of n_starting + window rows per layer, plus the unrotated start keys.
    row_bytes = 2 * 3 * model.config.num_key_value_heads * HEAD_DIM * 4  # k+v, layers, kv heads, head_dim, fp32
    # The model's rotation: cos and sin tables of 4 × window rows of head_dim / 2 (fp32), inv_freq (float64), and
    # the rows that unrotate the start keys of a first call, kept (cos and sin of n_starting rows, fp32).
    rotation_bytes = 2 * 4 * WINDOW * HEAD_DIM // 2 * 4 + HEAD_DIM // 2 * 8 + 2 * N_STARTING * HEAD_DIM * 4
    assert long.memory() == {
        "starting": 2 * N_STARTING * row_bytes, "window": WINDOW * row_bytes, "middle": 0, "middle_scan": 0,
        "middle_reserved": 0, "rotation": rotation_bytes,
    }


def _prefill_and_decode(model, cache, n, chunk, decode=3):
    feed_in_chunks(model, random_ids(n), chunk, cache)
    feed_in_chunks(model, random_ids(decode, seed=2), 1, cache)


def test_bytes_held_do_not_grow_with_context_and_memory_reports_them(model):
    """Every tensor reachable from the cache (its rotation tables included) is counted, and nothing grows."""
    short = lminfinite.InfiniteCache(model)
    _prefill_and_decode(model, short, 2 * WINDOW, 5)
    short_bytes = held_bytes(short)  # measured before the long run: the rotation tables are the model's
    long = lminfinite.InfiniteCache(model)
    _prefill_and_decode(model, long, 64 * WINDOW, 37)
    assert held_bytes(long) == short_bytes
    assert sum(short.memory().values()) == short_bytes
    assert sum(long.memory().values()) == short_bytes


def recall_cache_fed_far_past_the_window():
    """A top-k model (recall from layer 1) and its cache after 20 windows of tokens: (model, cache, tokens fed)."""
    config = lminfinite.LMInfiniteConfig(n_starting=N_STARTING, topk=2, topk_from_layer=1)
    model = lminfinite.enable(tiny_model("llama-gqa"), config)
    cache = lminfinite.InfiniteCache(model)
    n = 20 * WINDOW
    feed_in_chunks(model, random_ids(n), 13, cache)
    return model, cache, n


def test_span_bytes_are_what_the_cache_holds():
    """lminfinite.span_bytes, the arithmetic the app's budget and ingest's estimates use, is what memory() reports."""
    model, cache, n = recall_cache_fed_far_past_the_window()
    resolved = lminfinite.get_state(model).config
    per_token = lminfinite.span_bytes(lminfinite.KVShape.from_config(model.config), resolved, torch.float32)
    memory = cache.memory()
    assert memory["starting"] == per_token.starting * N_STARTING and memory["window"] == per_token.window * WINDOW
    assert memory["starting"] + memory["window"] == per_token.bounded(resolved)
    evicted = n - N_STARTING - (WINDOW - 1)
    assert memory["middle"] == per_token.middle * evicted and memory["middle_scan"] == per_token.middle_scan * evicted
    assert per_token.middle_scan > 0  # a float32 model on the CPU keeps a scan copy (scan_copy.py) ...
    shape = lminfinite.KVShape.from_config(model.config)
    on_gpu = lminfinite.span_bytes(shape, resolved, torch.float32, device_type="cuda")
    assert on_gpu.middle_scan == 0 and on_gpu.middle == per_token.middle  # ... and on a GPU it would not
    recall_layers = per_token.middle // row_bytes(shape.num_kv_heads, shape.head_dim, torch.float32)
    assert per_token.middle_scan == recall_layers * shape.num_kv_heads * shape.head_dim * 2  # bfloat16 keys


def test_update_returns_the_key_context_the_attention_reads(model):
    """transformers hands update's (keys, values) to the attention function: both are the call's KeyContext."""
    cache = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, random_ids(3 * WINDOW), 8, cache)
    new_key, new_value = torch.randn(1, 2, 1, HEAD_DIM), torch.randn(1, 2, 1, HEAD_DIM)
    keys, values = cache.update(new_key, new_value, 0)
    assert isinstance(keys, KeyContext) and values is keys
    assert keys.end == 3 * WINDOW + 1 == cache.layers[0].get_seq_length()
    assert keys.decode_keys.shape[-2] == N_STARTING + WINDOW  # steady decoding: start and window, all visible


@pytest.mark.parametrize("scan_copy", [True, False], ids=["scan-copy", "no-scan-copy"])
def test_memory_counts_the_middle_store_and_its_spare_capacity(scan_copy):
    config = lminfinite.LMInfiniteConfig(n_starting=N_STARTING, topk=2, topk_from_layer=1, recall_scan_copy=scan_copy)
    model = lminfinite.enable(tiny_model("llama-gqa"), config)
    cache = lminfinite.InfiniteCache(model)
    _prefill_and_decode(model, cache, 20 * WINDOW, 13)
    memory = cache.memory()
    evicted = 20 * WINDOW + 3 - N_STARTING - (WINDOW - 1)
    kv_heads = model.config.num_key_value_heads
    assert memory["middle"] == 2 * evicted * 2 * kv_heads * HEAD_DIM * 4  # layers 1 and 2 recall: float32 keys, values
    # a float32 model on the CPU: the keys' bfloat16 copy for recall's scan
    assert memory["middle_scan"] == (2 * evicted * kv_heads * HEAD_DIM * 2 if scan_copy else 0)
    assert [layer.middle.scan is not None for layer in cache.layers[1:]] == [scan_copy, scan_copy]
    assert memory["middle_reserved"] > 0  # the store grows ahead of its rows
    assert sum(memory.values()) == held_bytes(cache)


@pytest.mark.parametrize("offset", [10**5, 10**9])
@pytest.mark.parametrize("cached", [False, True], ids=["no-cache", "infinite-cache"])
def test_position_ids_far_from_zero_give_the_same_logits(model, cached, offset):
    """A sequence said to start at position 10^9 is the same sequence: equal logits, no rotation by 10^9."""
    ids = random_ids(3 * WINDOW)
    positions = torch.arange(ids.shape[1])[None]
    rope = lminfinite.get_state(model).rope

    def logits(start):
        kwargs = {"past_key_values": lminfinite.InfiniteCache(model)} if cached else {"use_cache": False}
        with torch.no_grad():
            return model(input_ids=ids, position_ids=positions + start, **kwargs).logits

    expected = logits(0)
    rotation_bytes = held_bytes(rope)
    torch.testing.assert_close(logits(offset), expected, atol=0, rtol=0)
    assert held_bytes(rope) == rotation_bytes


def test_topk_middle_store_keeps_each_evicted_token_once():
    model, cache, n = recall_cache_fed_far_past_the_window()
    evicted = n - N_STARTING - (WINDOW - 1)
    assert [l.middle is None for l in cache.layers] == [True, False, False]  # layer 0 never recalls
    assert [l.middle.length for l in cache.layers[1:]] == [evicted, evicted]


def _shift_positions(cache, delta):
    """Pretend `delta` more tokens were seen between the start tokens and the window (a 10^9-token context)."""
    assert delta % WINDOW == 0  # ring slots are position % window
    for layer in cache.layers:
        for name in POSITIONS:
            setattr(layer, name, getattr(layer, name) + delta)


@pytest.mark.parametrize("offset", [10**4, 10**9])
def test_same_trailing_content_gives_same_logits_at_any_offset(model, offset):
    prefix, tail = random_ids(3 * WINDOW, seed=5), random_ids(2 * WINDOW, seed=6)
    near = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, prefix, WINDOW, near)
    far = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, prefix, WINDOW, far)
    _shift_positions(far, offset)
    assert far.get_seq_length() == 3 * WINDOW + offset
    expected = feed_in_chunks(model, tail, 3, near)
    shifted = feed_in_chunks(model, tail, 3, far)
    assert torch.isfinite(shifted).all()
    torch.testing.assert_close(shifted, expected, atol=1e-6, rtol=0)


def test_position_invariance_after_a_real_ten_thousand_token_context(model):
    """No shortcut: 10^4 real tokens, then the same trailing tokens as in a short context.

    Each layer looks window - 1 tokens back, so only positions at least layers × (window - 1) into the
    shared tail have identical receptive fields; those are compared.
    """
    start, tail = random_ids(N_STARTING, seed=8), random_ids(4 * WINDOW, seed=9)
    receptive = model.config.num_hidden_layers * (WINDOW - 1)
    long = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, torch.cat((start, random_ids(10**4, seed=10)), 1), 1024, long)
    short = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, torch.cat((start, random_ids(WINDOW, seed=11)), 1), 1024, short)
    far, near = feed_in_chunks(model, tail, 5, long), feed_in_chunks(model, tail, 5, short)
    torch.testing.assert_close(far[:, receptive:], near[:, receptive:], atol=1e-6, rtol=0)
    assert (far[:, :WINDOW] - near[:, :WINDOW]).abs().max() > 1e-3  # different histories do show up early


def test_rollback_restores_exactly(model):
    config = lminfinite.LMInfiniteConfig(n_starting=N_STARTING, topk=2, topk_from_layer=1)
    lminfinite.enable(model, config)
    cache = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, random_ids(5 * WINDOW, seed=1), 9, cache)
    snap, memory = cache.snapshot(), cache.memory()
    continuation = random_ids(3 * WINDOW, seed=2)
    first = feed_in_chunks(model, continuation, 7, cache)
    feed_in_chunks(model, random_ids(4 * WINDOW, seed=3), 11, cache)  # an abandoned branch
    cache.rollback(snap)
    restored = {key: cache.memory()[key] for key in ("starting", "window", "middle")}
    assert cache.get_seq_length() == 5 * WINDOW and restored == {key: memory[key] for key in restored}
    torch.testing.assert_close(feed_in_chunks(model, continuation, 7, cache), first, atol=0, rtol=0)


def test_filling_steps_after_a_rollback_go_on_exactly(model):
    """Steps before the window is full over fixed shapes write the start keys into the ring's own slots and read a
    prefix of it (decode_step.py): a branch of them abandoned by a rollback leaves the ring as the snapshot held it
    (copy on write), and steps on from there, then past a full window, give the logits they gave first."""
    cache = lminfinite.InfiniteCache(model, window_fixed_shapes=True)
    feed_in_chunks(model, random_ids(N_STARTING + 2), 3, cache)
    snap = cache.snapshot()
    continuation = random_ids(2 * WINDOW, seed=2)
    first = feed_in_chunks(model, continuation, 1, cache)
    cache.rollback(snap)
    feed_in_chunks(model, random_ids(2 * WINDOW, seed=3), 1, cache)  # an abandoned branch, past a full window
    cache.rollback(snap)
    torch.testing.assert_close(feed_in_chunks(model, continuation, 1, cache), first, atol=0, rtol=0)
    plain = lminfinite.InfiniteCache(model)  # one-token prefills until the window is full
    feed_in_chunks(model, random_ids(N_STARTING + 2), 3, plain)
    torch.testing.assert_close(feed_in_chunks(model, continuation, 1, plain), first, atol=1e-5, rtol=0)


def test_snapshot_of_an_abandoned_branch_is_refused(model):
    cache = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, random_ids(2 * WINDOW), 8, cache)
    early = cache.snapshot()
    feed_in_chunks(model, random_ids(2 * WINDOW, seed=3), 8, cache)
    late = cache.snapshot()
    cache.rollback(early)
    with pytest.raises(ValueError, match="already rolled back"):
        cache.rollback(late)


def test_rollback_to_empty_cache(model):
    cache = lminfinite.InfiniteCache(model)
    empty = cache.snapshot()
    first = feed_in_chunks(model, random_ids(3 * WINDOW), 8, cache)
    cache.rollback(empty)
    assert cache.get_seq_length() == 0
    torch.testing.assert_close(feed_in_chunks(model, random_ids(3 * WINDOW), 8, cache), first, atol=0, rtol=0)


def test_middle_store_is_unchanged_by_a_failed_growth(monkeypatch):
    from lminfinite.middle_store import MiddleStore

    store = MiddleStore()
    rows = torch.arange(2 * 64 * 4, dtype=torch.float32).view(1, 2, 64, 4)
    store.append(rows, -rows)
    calls = {"n": 0}
    real_empty = torch.empty

    def failing_empty(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the values buffer
            raise torch.OutOfMemoryError("simulated")
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", failing_empty)
    with pytest.raises(torch.OutOfMemoryError):
        store.append(rows[..., :8, :], -rows[..., :8, :])
    monkeypatch.undo()
    assert store.length == 64 and store.keys.shape == store.values.shape  # both buffers of one capacity
    store.append(rows[..., :8, :], -rows[..., :8, :])  # and the store still works
    keys, values = store.view()
    torch.testing.assert_close(keys, torch.cat((rows, rows[..., :8, :]), dim=-2))
    torch.testing.assert_close(values, -keys)


def test_middle_store_spare_capacity_stays_under_an_eighth_of_its_rows_and_a_bounded_count():
    """Appends of any size: the store never holds more than an eighth of its rows spare (64 rows at first) nor
    more than MAX_SPARE_ROWS, and keeps every row it was given."""
    from lminfinite.middle_store import MAX_SPARE_ROWS, MiddleStore

    store, generator, appended = MiddleStore(scan_copy=False), torch.Generator().manual_seed(3), []
    for size in torch.randint(1, 1700, (120,), generator=generator).tolist() + [1] * 300:
        rows = torch.randn(1, 2, size, 4, generator=generator)
        store.append(rows, 2 * rows)
        appended.append(rows)
        spare = store.keys.shape[-2] - store.length
        assert 0 <= spare <= min(max(64, store.length // 8), MAX_SPARE_ROWS), (store.length, spare)
    assert store.length > 9 * MAX_SPARE_ROWS  # long enough for an eighth to pass the bound
    keys, values = store.view()
    assert torch.equal(keys, torch.cat(appended, dim=-2)) and torch.equal(values, 2 * keys)


def test_a_bfloat16_cache_with_recall_holds_less_than_a_full_cache_past_the_window():
    """What the panel compares (issue "What a user sees"): every byte the cache holds, spare and rotation tables
    included, against a full cache of the same tokens; the layers below topk_from_layer keep no middle rows."""
    model_class, make_config = FAMILIES["llama-gqa"]
    shape = make_config()
    shape.num_hidden_layers = 6  # one layer of six without recall: a sixth less than a full cache, as Qwen's 5 of 28
    torch.manual_seed(0)
    config = lminfinite.LMInfiniteConfig(n_starting=N_STARTING, topk=2, topk_from_layer=1)
    model = lminfinite.enable(model_class(shape).eval().to(torch.bfloat16), config)
    cache = lminfinite.InfiniteCache(model, keep_middle=True)
    shape = lminfinite.kv_bytes.KVShape.from_config(model.config)
    for steps in range(1, 21):  # 320 windows of 16 tokens; the first growths' 64 rows weigh less after a few
        feed_in_chunks(model, random_ids(16 * WINDOW, seed=steps), 61, cache)
        if steps >= 4:
            full = steps * 16 * WINDOW * shape.token_bytes(torch.bfloat16)
            assert sum(cache.memory().values()) <= full, steps
    assert cache.memory()["middle_scan"] == 0 and cache.memory()["middle_reserved"] > 0
