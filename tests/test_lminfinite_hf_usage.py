"""The library from a plain transformers script, where it once misbehaved: a model with a sliding window, a cache
filled before enable, autograd left on, cropping, a cache used after disable. Each now works or says why."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, MistralConfig, MistralForCausalLM

import lminfinite
from lminfinite.reference import ReferenceModel
from lminfinite_models import VOCAB, WINDOW, feed_in_chunks, random_ids, tiny_model


def sliding_mistral(sliding_window: int = 8):
    """Mistral-7B-v0.1's shape of config in small: trained on 32 positions, every layer sliding over 8."""
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                           sliding_window=sliding_window, attn_implementation="sdpa")
    return MistralForCausalLM(config).eval()


def test_a_model_that_slides_attends_over_its_sliding_window_and_refuses_its_sliding_cache_clearly():
    ids = random_ids(24)
    with torch.no_grad():
        plain = sliding_mistral()(ids[:, :8]).logits  # within the sliding window
    config = lminfinite.LMInfiniteConfig(n_starting=2)
    model = lminfinite.enable(sliding_mistral(), config)
    assert lminfinite.get_state(model).config.window == 8  # not max_position_embeddings (32)
    with torch.no_grad():
        with pytest.raises(TypeError, match="whose layers slide .* pass past_key_values=lminfinite.InfiniteCache"):
            model(ids)  # transformers' default cache for this model slides
        logits = feed_in_chunks(model, ids, 5, lminfinite.InfiniteCache(model))
    torch.testing.assert_close(logits[:, :8], plain, atol=2e-5, rtol=0)
    expected = ReferenceModel(model, lminfinite.get_state(model).config).logits(ids)
    torch.testing.assert_close(logits.double(), expected, atol=2e-5, rtol=0)


def test_a_dynamic_cache_filled_before_enable_is_refused_not_misread():
    model, ids = tiny_model("llama-gqa"), random_ids(2 * WINDOW)
    cache = DynamicCache()
    with torch.no_grad():
        model(ids[:, :WINDOW], past_key_values=cache)  # the plain model stores its keys rotated
        lminfinite.enable(model, lminfinite.LMInfiniteConfig(n_starting=2))
        with pytest.raises(ValueError, match="filled without LM-Infinite"):
            model(ids[:, WINDOW:], past_key_values=cache)
        fresh = DynamicCache()  # one filled with LM-Infinite goes on, through enable again
        model(ids[:, :WINDOW], past_key_values=fresh)
        lminfinite.enable(model, lminfinite.LMInfiniteConfig(n_starting=2, topk=2, topk_from_layer=1))
        model(ids[:, WINDOW:], past_key_values=fresh)
    assert fresh.get_seq_length() == 2 * WINDOW


def test_a_cache_filled_with_autograd_on_holds_no_graph_and_stays_bounded():
    model = lminfinite.enable(tiny_model("llama-gqa"), lminfinite.LMInfiniteConfig(n_starting=2, topk=2,
                                                                                      topk_from_layer=1))
    cache = lminfinite.InfiniteCache(model)
    ids = random_ids(12 * WINDOW)
    sizes = []
    for lo in range(0, ids.shape[1], WINDOW):  # no torch.no_grad(): as README's loop once read
        logits = model(input_ids=ids[:, lo:lo + WINDOW], past_key_values=cache).logits
        sizes.append(sum(v for k, v in cache.memory().items() if k not in ("middle", "middle_scan", "middle_reserved")))
    assert logits.requires_grad  # the call itself is differentiable
    kept = [t for layer in cache.layers for t in layer.export()[1].values()]  # its tensors and middle rows
    assert not any(t.requires_grad for t in kept)  # nothing chains one chunk's graph to the next
    assert len(set(sizes[2:])) == 1


def test_crop_and_a_cache_after_disable_say_what_to_do_instead():
    model = lminfinite.enable(tiny_model("llama-gqa"), lminfinite.LMInfiniteConfig(n_starting=2))
    cache, ids = lminfinite.InfiniteCache(model), random_ids(2 * WINDOW)
    with torch.no_grad():
        model(ids, past_key_values=cache)
        with pytest.raises(NotImplementedError, match="cannot crop .* snapshot\\(\\) and rollback\\(\\)"):
            cache.crop(WINDOW)  # what assisted and prompt-lookup decoding call
        lminfinite.disable(model)
        with pytest.raises(RuntimeError, match="no longer LM-Infinite"):
            model(ids[:, :1], past_key_values=cache)
