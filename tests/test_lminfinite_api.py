"""enable/disable, configuration errors, per-cache recall, quantized models, the top-k observer."""

from dataclasses import replace

import pytest
import torch
from transformers import BitsAndBytesConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import lminfinite
from lminfinite_models import WINDOW, feed_in_chunks, random_ids, tiny_model


def test_disable_restores_vanilla_outputs():
    model = tiny_model("llama-gqa")
    ids = random_ids(4 * WINDOW)
    with torch.no_grad():
        vanilla = model(input_ids=ids).logits
        lminfinite.enable(model)
        patched = model(input_ids=ids).logits
        lminfinite.disable(model)
        restored = model(input_ids=ids).logits
    assert (patched - vanilla).abs().max() > 1e-3
    torch.testing.assert_close(restored, vanilla, atol=0, rtol=0)
    assert model.config._attn_implementation == "sdpa" and lminfinite.get_state(model) is None


def test_enable_twice_replaces_the_config():
    model = lminfinite.enable(tiny_model(), lminfinite.LMInfiniteConfig(n_starting=4))
    lminfinite.enable(model, lminfinite.LMInfiniteConfig(n_starting=6, window=8))
    state = lminfinite.get_state(model)
    assert (state.config.n_starting, state.config.window, state.config.topk_distance) == (6, 8, 4)
    assert len(state.hooks) == 3 + model.config.num_hidden_layers  # the model (before, after), its rotary embedding, each attention module
    lminfinite.disable(model)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_starting": -1}, "n_starting must be >= 0"),
        ({"window": 0}, "window must be >= 1"),
        ({"topk": 2.5}, "topk must be an int"),
        ({"window": 8, "topk_distance": 9}, "exceeds window"),
        ({"offload_middle": "yes"}, "offload_middle must be a bool"),
        ({"recall_scan_copy": 1}, "recall_scan_copy must be a bool"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        lminfinite.LMInfiniteConfig(**kwargs)


def test_model_without_rope_is_refused():
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="no rotary position embedding"):
        lminfinite.enable(model)


def test_length_dependent_rope_scaling_is_refused():
    config = LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=16, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    )
    with pytest.raises(ValueError, match="'dynamic'.*not supported"):
        lminfinite.enable(LlamaForCausalLM(config))


def test_padded_batches_are_refused():
    model = lminfinite.enable(tiny_model())
    ids = random_ids(8).repeat(2, 1)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with pytest.raises(ValueError, match="padded batches"):
        model(input_ids=ids, attention_mask=mask)


def test_position_ids_with_gaps_are_refused():
    model = lminfinite.enable(tiny_model())
    with pytest.raises(ValueError, match="increase by one"):
        model(input_ids=random_ids(8), position_ids=2 * torch.arange(8)[None])


def test_reenabling_with_the_same_window_keeps_the_rotation_tables():
    """Switching top-k on and off must not leave the caches already built holding a second set of tables."""
    model = lminfinite.enable(tiny_model(), lminfinite.LMInfiniteConfig(n_starting=4))
    rope = lminfinite.get_state(model).rope
    lminfinite.enable(model, lminfinite.LMInfiniteConfig(n_starting=4, topk=2, topk_from_layer=1))
    assert lminfinite.get_state(model).rope is rope
    lminfinite.enable(model, lminfinite.LMInfiniteConfig(n_starting=4, window=8))
    assert lminfinite.get_state(model).rope.table_rows == 4 * 8


def test_cache_requires_enabled_model():
    with pytest.raises(ValueError, match="enable"):
        lminfinite.InfiniteCache(tiny_model())


def test_cache_without_middle_store_refuses_topk():
    model = lminfinite.enable(tiny_model(), lminfinite.LMInfiniteConfig(n_starting=4))
    cache = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, random_ids(3 * WINDOW), 8, cache)
    lminfinite.enable(model, lminfinite.LMInfiniteConfig(n_starting=4, topk=2, topk_from_layer=0))
    with pytest.raises(ValueError, match="keep_middle=True"):
        feed_in_chunks(model, random_ids(2), 1, cache)


def _hook_ids(model) -> dict:
    return {name: (tuple(m._forward_pre_hooks), tuple(m._forward_hooks)) for name, m in model.named_modules()}


def test_recall_k_is_per_cache_and_moves_no_hooks():
    """Two sessions on one model, recall off in one and k = 3 in the other, their calls interleaved: each gets
    exactly what a model enabled with its own config gives, and no hook is removed or registered."""
    base = lminfinite.LMInfiniteConfig(n_starting=4, topk_from_layer=1)
    prompt, answer = random_ids(6 * WINDOW), random_ids(4, seed=7)
    expected = {}
    for k in (0, 3):
        alone = lminfinite.enable(tiny_model("llama-gqa"), replace(base, topk=k))
        cache = lminfinite.InfiniteCache(alone, keep_middle=True)
        expected[k] = torch.cat((feed_in_chunks(alone, prompt, 7, cache), feed_in_chunks(alone, answer, 1, cache)), 1)

    shared = lminfinite.enable(tiny_model("llama-gqa"), base)
    state, hooks = lminfinite.get_state(shared), _hook_ids(shared)
    caches = {k: lminfinite.InfiniteCache(shared, keep_middle=True, topk=k) for k in (0, 3)}
    got = {0: [], 3: []}
    for ids, chunk in ((prompt, 7), (answer, 1)):
        for lo in range(0, ids.shape[1], chunk):
            for k, cache in caches.items():
                got[k].append(feed_in_chunks(shared, ids[:, lo : lo + chunk], chunk, cache))
    assert (expected[3] - expected[0]).abs().max() > 1e-3  # recall does change these logits
    for k in (0, 3):
        torch.testing.assert_close(torch.cat(got[k], 1), expected[k], atol=0, rtol=0)
    assert lminfinite.get_state(shared) is state and state.config.topk == 0 and _hook_ids(shared) == hooks


def test_cache_topk_follows_the_model_unless_set():
    model = lminfinite.enable(tiny_model(), lminfinite.LMInfiniteConfig(n_starting=4, topk=2, topk_from_layer=1))
    cache = lminfinite.InfiniteCache(model)
    assert cache.topk is None and cache.attention_config(lminfinite.get_state(model).config, 1).topk == 2
    cache.topk = 0
    assert cache.attention_config(lminfinite.get_state(model).config, 1).topk == 0
    with pytest.raises(ValueError, match="topk must be >= 0"):
        cache.topk = -1


def test_observer_reports_middle_positions_and_weights():
    config = lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1)
    model = lminfinite.enable(tiny_model("llama-gqa"), config)
    cache = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, random_ids(10 * WINDOW), 32, cache)
    with lminfinite.observe_topk(model) as seen:
        feed_in_chunks(model, random_ids(1, seed=9), 1, cache)
    assert [s.layer_idx for s in seen.selections] == [1, 2]
    query = 10 * WINDOW
    for selection in seen.selections:
        assert selection.query_positions.tolist() == [query]
        assert selection.positions.shape == (1, 4, 1, 3)
        assert ((selection.positions >= 4) & (selection.positions <= query - WINDOW)).all()
        assert (selection.weights > 0).all() and (selection.weights.sum(-1) < 1).all()
    assert lminfinite.get_state(model).observers == []


def test_four_bit_model_prefills_and_generates(tmp_path):
    tiny_model("llama-gqa").save_pretrained(tmp_path)
    quantized = LlamaForCausalLM.from_pretrained(
        tmp_path, device_map="cpu",
        quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32),
    )
    assert "4bit" in type(quantized.model.layers[0].self_attn.q_proj).__name__
    ids = random_ids(WINDOW)
    with torch.no_grad():
        vanilla = quantized(input_ids=ids).logits
    config = lminfinite.LMInfiniteConfig(n_starting=4, topk=2, topk_from_layer=1)
    lminfinite.enable(quantized, config)
    with torch.no_grad():
        torch.testing.assert_close(quantized(input_ids=ids).logits, vanilla, atol=1e-4, rtol=1e-4)
    cache = lminfinite.InfiniteCache(quantized)
    prompt = random_ids(8 * WINDOW)
    logits = feed_in_chunks(quantized, prompt[:, :-1], 16, cache)
    with torch.no_grad():
        out = quantized.generate(prompt, past_key_values=cache, max_new_tokens=6, do_sample=False)
    assert torch.isfinite(logits).all() and out.shape[1] == prompt.shape[1] + 6
    assert cache.get_seq_length() == prompt.shape[1] + 5
