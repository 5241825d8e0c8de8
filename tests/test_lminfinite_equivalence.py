"""Every attention path against the dense float64 reference (lminfinite.reference)."""

import pytest
import torch
from transformers import DynamicCache

import lminfinite
from lminfinite import bounded_scan
from lminfinite.reference import ReferenceModel
from lminfinite_models import WINDOW, feed_in_chunks, random_ids, tiny_model

N_LONG = 40 * WINDOW
FP32_ATOL = 2e-5

CONFIGS = {
    "lambda": lminfinite.LMInfiniteConfig(n_starting=4),
    "topk": lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1),
    # recall scans the float32 middle keys themselves instead of their bfloat16 copy (scan_copy.py)
    "topk-no-copy": lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1, recall_scan_copy=False),
}


@pytest.fixture(scope="module", autouse=True)
def recall_scans_the_copy_at_any_length():
    """These contexts are far shorter than where the scan copy starts to pay; scan it anyway, so both of
    recall's scans are checked against the reference ("topk" through the copy, "topk-no-copy" without)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bounded_scan, "COPY_PAYS_FROM", 0)
        patch.setattr(bounded_scan, "COPY_MAX_ROWS", 10**6)  # prefill blocks too
        yield


@pytest.fixture(scope="module")
def references():
    """(family, config name) -> (patched fp32 model, float64 reference logits over N_LONG tokens)."""
    built = {}

    def get(family, config_name):
        if (family, config_name) not in built:
            model = lminfinite.enable(tiny_model(family), CONFIGS[config_name])
            ref = ReferenceModel(model, CONFIGS[config_name])
            built[family, config_name] = (model, ref, ref.logits(random_ids(N_LONG)))
        return built[family, config_name]

    return get


@pytest.mark.parametrize("family", ["llama-mha", "llama-gqa", "mistral-gqa", "qwen2-gqa"])
def test_within_window_equals_unpatched_model(family):
    model = tiny_model(family)
    ids = random_ids(WINDOW)
    with torch.no_grad():
        vanilla = model(input_ids=ids).logits
        lminfinite.enable(model, lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=0))
        patched = model(input_ids=ids).logits
    torch.testing.assert_close(patched, vanilla, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("config_name", ["lambda", "topk"])
@pytest.mark.parametrize("family", ["llama-mha", "llama-gqa", "qwen2-gqa"])
def test_full_sequence_forward_equals_reference(references, family, config_name):
    model, _, expected = references(family, config_name)
    with torch.no_grad():
        logits = model(input_ids=random_ids(N_LONG), use_cache=False).logits
    torch.testing.assert_close(logits.double(), expected, atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize("chunk", [1, 7, WINDOW, 3 * WINDOW])
@pytest.mark.parametrize("config_name", ["lambda", "topk", "topk-no-copy"])
@pytest.mark.parametrize("family", ["llama-mha", "llama-gqa"])
def test_chunked_prefill_equals_reference(references, family, config_name, chunk):
    model, _, expected = references(family, config_name)
    cache = lminfinite.InfiniteCache(model)
    logits = feed_in_chunks(model, random_ids(N_LONG), chunk, cache)
    torch.testing.assert_close(logits.double(), expected, atol=FP32_ATOL, rtol=0)
    assert cache.get_seq_length() == N_LONG


@pytest.mark.parametrize("fixed_window", [True, None])
@pytest.mark.parametrize("config_name", ["lambda", "topk"])
@pytest.mark.parametrize("family", ["llama-mha", "llama-gqa"])
def test_one_token_steps_before_and_after_the_window_fills_equal_reference(references, family, config_name,
                                                                           fixed_window, monkeypatch):
    """Token by token from the first: with fixed window shapes (a GPU's default, decode_step.py) the steps from
    n_starting to the window's length attend over the whole ring, the slots not yet filled masked; without (the
    CPU's default) they are one-token prefills, as before."""
    from lminfinite.layer import InfiniteLayer

    filling, step = [], InfiniteLayer._filling_step
    monkeypatch.setattr(InfiniteLayer, "_filling_step", lambda *args: filling.append(1) or step(*args))
    model, _, expected = references(family, config_name)
    cache = lminfinite.InfiniteCache(model, window_fixed_shapes=fixed_window)
    tokens = 3 * WINDOW
    logits = feed_in_chunks(model, random_ids(N_LONG)[:, :tokens], 1, cache)
    torch.testing.assert_close(logits.double(), expected[:, :tokens], atol=FP32_ATOL, rtol=0)
    n_starting, layers = CONFIGS[config_name].n_starting, len(cache.layers)
    assert len(filling) == (layers * (WINDOW - n_starting) if fixed_window else 0)


@pytest.mark.parametrize("config_name", ["lambda", "topk"])
def test_dynamic_cache_prefill_equals_reference(references, config_name):
    """Without an InfiniteCache (transformers' default DynamicCache) the attention is still LM-Infinite."""
    model, _, expected = references("llama-gqa", config_name)
    with torch.no_grad():
        first = model(input_ids=random_ids(N_LONG)[:, :300], use_cache=True)
        rest = model(input_ids=random_ids(N_LONG)[:, 300:], past_key_values=first.past_key_values).logits
    torch.testing.assert_close(torch.cat((first.logits, rest), 1).double(), expected, atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize("config_name", ["lambda", "topk", "topk-no-copy"])
@pytest.mark.parametrize("family", ["llama-mha", "qwen2-gqa"])
def test_generate_with_infinite_cache_equals_reference_greedy(references, family, config_name):
    model, ref, _ = references(family, config_name)
    prompt = random_ids(10 * WINDOW, seed=7)
    with torch.no_grad():
        out = model.generate(
            prompt, past_key_values=lminfinite.InfiniteCache(model), max_new_tokens=12, do_sample=False,
        )
    assert out[:, prompt.shape[1] :].tolist() == ref.greedy(prompt, 12).tolist()


def test_prefill_generate_append_generate_equals_reference(references):
    """The app's loop: a document in chunks, an answer, a question appended, a second answer."""
    model, ref, _ = references("llama-gqa", "topk")
    cache = lminfinite.InfiniteCache(model)
    document, question = random_ids(12 * WINDOW, seed=3), random_ids(9, seed=4)
    feed_in_chunks(model, document[:, :-1], 5, cache)
    with torch.no_grad():
        first = model.generate(document, past_key_values=cache, max_new_tokens=6, do_sample=False)
        history = torch.cat((first, question), dim=1)
        second = model.generate(history, past_key_values=cache, max_new_tokens=6, do_sample=False)
    assert first[:, document.shape[1] :].tolist() == ref.greedy(document, 6).tolist()
    assert second[:, history.shape[1] :].tolist() == ref.greedy(history, 6).tolist()


@pytest.mark.parametrize("config_name", ["lambda", "topk"])
def test_generate_without_a_cache_equals_reference_greedy(references, config_name):
    """No past_key_values: generate uses transformers' DynamicCache, which keeps every token (its memory grows
    with the context); the attention over it is still exactly LM-Infinite."""
    model, ref, _ = references("llama-mha", config_name)
    prompt = random_ids(10 * WINDOW, seed=7)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=12, do_sample=False, return_dict_in_generate=True)
    assert type(out.past_key_values) is DynamicCache
    assert out.past_key_values.get_seq_length() == prompt.shape[1] + 11
    assert out.sequences[:, prompt.shape[1] :].tolist() == ref.greedy(prompt, 12).tolist()


@pytest.mark.parametrize("prefill_mode, generate_mode", [
    (torch.inference_mode, torch.no_grad), (torch.no_grad, torch.inference_mode),
], ids=["inference-then-no_grad", "no_grad-then-inference"])
def test_cache_moves_between_inference_mode_and_no_grad(references, prefill_mode, generate_mode):
    """Prefill (with re-bases, a middle store, a rollback) in one mode, generate in the other: every tensor the
    cache keeps and updates in place must be a normal tensor. The snapshot is taken when a re-base is due, so the
    abandoned branch re-bases a ring the snapshot holds, into a new ring, in the prefill's mode."""
    model, ref, _ = references("llama-gqa", "topk")
    prompt = random_ids(10 * WINDOW, seed=7)
    cache = lminfinite.InfiniteCache(model)
    with prefill_mode():
        feed_in_chunks(model, prompt[:, : -6 - 3 * WINDOW], 7, cache)
        feed_in_chunks(model, prompt[:, -6 - 3 * WINDOW : -6], 3 * WINDOW, cache)
        assert cache.layers[0].seen - cache.layers[0].frame > 2 * WINDOW  # layer.rebase_interval: due
        snap = cache.snapshot()
        feed_in_chunks(model, random_ids(5, seed=8), 1, cache)  # an abandoned branch
        cache.rollback(snap)
        feed_in_chunks(model, prompt[:, -6:-1], 5, cache)  # copies the shared ring, in this mode
    with generate_mode():
        out = model.generate(prompt, past_key_values=cache, max_new_tokens=8, do_sample=False)
    assert out[:, prompt.shape[1] :].tolist() == ref.greedy(prompt, 8).tolist()


@pytest.mark.parametrize("config_name", ["lambda", "topk"])
def test_batch_rows_equal_each_row_alone(references, config_name):
    """Equal-length rows, with and without an InfiniteCache: each row as if alone, and as the reference."""
    model, ref, _ = references("llama-gqa", config_name)
    rows = torch.cat([random_ids(6 * WINDOW, seed=seed) for seed in (11, 12, 13)])
    expected = ref.logits(rows)
    with torch.no_grad():
        whole = model(input_ids=rows, use_cache=False).logits
        alone = torch.cat([model(input_ids=row[None], use_cache=False).logits for row in rows])
    torch.testing.assert_close(whole, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(whole.double(), expected, atol=FP32_ATOL, rtol=0)
    chunked = feed_in_chunks(model, rows, 7, lminfinite.InfiniteCache(model))
    torch.testing.assert_close(chunked.double(), expected, atol=FP32_ATOL, rtol=0)
    with torch.no_grad():
        out = model.generate(rows, past_key_values=lminfinite.InfiniteCache(model), max_new_tokens=6, do_sample=False)
    assert out[:, rows.shape[1] :].tolist() == ref.greedy(rows, 6).tolist()


def test_bf16_topk_generate_follows_the_reference_where_margins_are_clear():
    """bf16 with top-k through generate(): logits within 0.03 of the float64 reference of the same weights (the
    tiny model's logits spread about 0.16; 0.015 is typical), so every greedy token whose reference top-2 margin
    exceeds twice that is the reference's."""
    config = CONFIGS["topk"]
    model = lminfinite.enable(tiny_model("llama-gqa", dtype=torch.bfloat16), config)
    prompt, steps = random_ids(10 * WINDOW, seed=7), 12
    with torch.no_grad():
        out = model.generate(prompt, past_key_values=lminfinite.InfiniteCache(model), max_new_tokens=steps,
                             do_sample=False, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[:, prompt.shape[1] :]
    logits = torch.stack(out.logits, dim=1).double()
    expected = ReferenceModel(model, config).logits(out.sequences[:, :-1])[:, prompt.shape[1] - 1 :]
    assert (logits - expected).abs().max() < 0.03
    top2 = expected.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * 0.03
    assert clear.sum() >= steps // 3
    assert (tokens == expected.argmax(-1))[clear].all()


@pytest.mark.parametrize("config_name", ["lambda", "topk"])
def test_bf16_stays_close_to_reference(config_name):
    model = lminfinite.enable(tiny_model("llama-gqa", dtype=torch.bfloat16), CONFIGS[config_name])
    ids = random_ids(N_LONG)
    expected = ReferenceModel(model, CONFIGS[config_name]).logits(ids)
    logits = feed_in_chunks(model, ids, 7, lminfinite.InfiniteCache(model)).double()
    error = (logits - expected).abs()
    assert error.max() < 0.1 and error.mean() < 0.005
    assert (logits.argmax(-1) == expected.argmax(-1)).float().mean() > 0.95


def test_offloaded_middle_store_gives_identical_logits(references):
    model, _, expected = references("llama-gqa", "topk")
    cache = lminfinite.InfiniteCache(model, offload_middle=True)
    logits = feed_in_chunks(model, random_ids(N_LONG), WINDOW, cache)
    assert all(l.middle.device.type == "cpu" for l in cache.layers if l.middle is not None)
    torch.testing.assert_close(logits.double(), expected, atol=FP32_ATOL, rtol=0)


def test_reference_differs_from_vanilla_beyond_window():
    """Guards the guard: the reference must not collapse to plain causal attention."""
    model = tiny_model("llama-mha")
    ids = random_ids(4 * WINDOW)
    with torch.no_grad():
        vanilla = model(input_ids=ids).logits.double()
    expected = ReferenceModel(lminfinite.enable(model), lminfinite.LMInfiniteConfig(n_starting=4)).logits(ids)
    assert (vanilla[:, :WINDOW] - expected[:, :WINDOW]).abs().max() < 1e-4
    assert (vanilla[:, 2 * WINDOW :] - expected[:, 2 * WINDOW :]).abs().max() > 1e-2


def test_ablations_differ_where_the_paper_says():
    """Λ-only keeps true (unseen) distances to the start; ceiling-only keeps every token: both differ from LM-Infinite."""
    model = tiny_model("llama-mha")
    config = lminfinite.LMInfiniteConfig(n_starting=4)
    ids = random_ids(4 * WINDOW)
    full = ReferenceModel(model, config).logits(ids)
    for variant in ("lambda_only", "ceiling_only"):
        ablated = ReferenceModel(model, config, variant=variant).logits(ids)
        assert (ablated[:, :WINDOW] - full[:, :WINDOW]).abs().max() < 1e-9  # identical inside the window
        assert (ablated[:, 2 * WINDOW :] - full[:, 2 * WINDOW :]).abs().max() > 1e-3
