"""Switch a loaded Hugging Face RoPE model to LM-Infinite attention and back, through public hooks only.

- ``AttentionInterface`` / ``AttentionMaskInterface`` supply the attention and a mask function that builds
  nothing (attention.py; the Λ-mask is applied block by block inside the attention).
- LM-Infinite rotates queries and keys by offsets from a frame whose distance from any token is bounded, in
  float64 angles, so position 10^9 behaves exactly like position 10^4. A forward pre-hook on the model (the module
  that runs the rotary embedding and the layers) lets an InfiniteCache plan each forward's rotation, and a forward
  hook on the rotary embedding hands the model that rotation as its (cos, sin): HF's own rotation then computes
  the numbers the layers would have (forward_rotation.py). Without an InfiniteCache the (cos, sin) are the
  identity, (1, 0), and LM-Infinite rotates where the offsets are known (``KeyContext.full_sequence``,
  ``rotate_queries``). The hook also checks the call's position ids: they must step by one, and where they start
  does not matter (RoPE and the Λ-mask see distances only; positions count from the sequence's first token),
  with or without a cache.
- A forward pre-hook on each attention module passes the model's state, and the config this call attends with
  (the model's, with the recall k of the call's InfiniteCache), to the attention through the ``**kwargs`` that
  transformers forwards to it, after checking the call's cache is one LM-Infinite can attend over.
No model class is copied or monkey-patched, and nothing here holds anything of one call for the next.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer

from .attention import ATTENTION_NAME
from .cache import InfiniteCache
from .config import LMInfiniteConfig
from .rotary import Rope, find_rotary_embedding, lookup_rows, rope_from_model
from .model_state import InfiniteState, get_state, set_state


def enable(model: nn.Module, config: LMInfiniteConfig | None = None, *, attention: str = ATTENTION_NAME) -> nn.Module:
    """Make ``model`` compute LM-Infinite attention; weights are untouched. Calling it again changes the config.

    The recall k alone is better changed per cache (``InfiniteCache.topk``): no hooks move, and caches of other
    sessions keep theirs.
    """
    config = config or LMInfiniteConfig()
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    rope = rope_from_model(model)  # refuses non-RoPE models and unsupported scalings with a clear error
    resolved = config.resolved(trained_span(text_config))
    previous = get_state(model)
    rope = _sized_rope(rope, resolved.window_, previous)
    if previous is not None:
        disable(model)
    attention_modules = _attention_modules(model)
    state = InfiniteState(
        config=resolved,
        rope=rope,
        num_layers=text_config.num_hidden_layers,
        previous_attention=model.config._attn_implementation if previous is None else previous.previous_attention,
    )
    if previous is not None:
        state.observers, state.block_size = previous.observers, previous.block_size
        state.dynamic_caches = previous.dynamic_caches
    rotary = find_rotary_embedding(model)
    base = _owner_of(model, rotary)
    state.hooks.append(base.register_forward_pre_hook(partial(_plan_rotation, state), with_kwargs=True))
    state.hooks.append(base.register_forward_hook(partial(_end_rotation, state), always_call=True))
    state.hooks.append(rotary.register_forward_hook(partial(_frame_rotation, state), with_kwargs=True))
    for module in attention_modules:
        state.hooks.append(module.register_forward_pre_hook(partial(_pass_state, state), with_kwargs=True))
    set_state(model, state)
    model.set_attn_implementation(attention)
    return model


def disable(model: nn.Module) -> nn.Module:
    """Undo :func:`enable`: hooks removed, the previous attention implementation restored."""
    state = get_state(model)
    if state is None:
        return model
    for hook in state.hooks:
        hook.remove()
    set_state(model, None)
    model.set_attn_implementation(state.previous_attention)
    return model


def trained_span(text_config) -> int:
    """L: the longest distance the model attended over in training. Its ``sliding_window`` where every layer slides
    (Mistral), else ``max_position_embeddings``."""
    span = int(text_config.max_position_embeddings)
    sliding = getattr(text_config, "sliding_window", None)
    layer_types = getattr(text_config, "layer_types", None)
    if sliding and (layer_types is None or all(kind == "sliding_attention" for kind in layer_types)):
        span = min(span, int(sliding))
    return span


def call_config(state: InfiniteState, cache, layer_idx: int) -> LMInfiniteConfig:
    """The config one layer attends with in a forward given ``cache``; refuses caches it cannot attend over."""
    if isinstance(cache, InfiniteCache):
        return cache.attention_config(state.config, layer_idx)
    if cache is None or layer_idx > 0:  # a DynamicCache is checked once per forward, at its first layer
        return state.config
    if not isinstance(cache, DynamicCache) or not all(type(layer) is DynamicLayer for layer in cache.layers):
        slides = any(getattr(layer, "is_sliding", False) for layer in getattr(cache, "layers", ()))
        raise TypeError(
            "LM-Infinite attention works with no cache, a DynamicCache of full layers or an InfiniteCache, not "
            + (f"a {type(cache).__name__} whose layers slide (the model's sliding_window): they drop the starting "
               "tokens LM-Infinite keeps; pass past_key_values=lminfinite.InfiniteCache(model)" if slides
               else type(cache).__name__))
    if cache not in state.dynamic_caches:  # its keys are kept as projected, not rotated as the plain model's are
        if cache.get_seq_length():
            raise ValueError("this DynamicCache was filled without LM-Infinite (before enable, or by another model): "
                             "its keys are stored rotated; start a new cache")
        state.dynamic_caches.add(cache)
    return state.config


def _pass_state(state: InfiniteState, module, args, kwargs):
    """Before an attention module runs: hand the attention its state and this call's config."""
    kwargs["lminfinite_state"] = state
    kwargs["lminfinite_config"] = call_config(state, kwargs.get("past_key_values"), module.layer_idx)
    return args, kwargs


def _plan_rotation(state: InfiniteState, module, args, kwargs):
    """Before the model's forward on an InfiniteCache: the cache prepares it and plans its rotation."""
    state.rotation = None
    cache = kwargs.get("past_key_values")
    if isinstance(cache, InfiniteCache):
        tokens = _input_length(args, kwargs)
        if tokens:
            state.rotation = cache.plan_rotation(tokens)


def _end_rotation(state: InfiniteState, module, args, output):
    if state.rotation is not None:
        state.rotation.cache.end_forward()
    state.rotation = None


def _frame_rotation(state: InfiniteState, module, args, kwargs, output):
    """Replace (cos, sin) by the rotation into the cache's frame that this forward's plan names
    (forward_rotation.py), or else by (1, 0): HF's apply_rotary_pos_emb then leaves q and k as projected."""
    position_ids = kwargs["position_ids"] if "position_ids" in kwargs else args[1]
    _require_consecutive(position_ids)
    cos, sin = output
    plan = state.rotation
    rows = None if plan is None else plan.cos_sin(state.rope, cos.shape[-2], cos.dtype, cos.device)
    if rows is None:
        return torch.ones_like(cos), torch.zeros_like(sin)
    plan.applied = True
    return rows


def _input_length(args, kwargs) -> int:
    """Tokens in the forward's input (ids or embeddings, by keyword or first)."""
    for name in ("input_ids", "inputs_embeds"):
        if kwargs.get(name) is not None:
            return kwargs[name].shape[1]
    return args[0].shape[1] if args and isinstance(args[0], torch.Tensor) and args[0].ndim >= 2 else 0


def _owner_of(model: nn.Module, child: nn.Module) -> nn.Module:
    """The module that holds ``child`` (the base model that runs the rotary embedding, then the layers)."""
    for module in model.modules():
        if any(c is child for c in module.children()):
            return module
    raise ValueError(f"{type(model).__name__}: the rotary embedding's owner was not found")


def _require_consecutive(position_ids: torch.Tensor) -> None:
    """The Λ-mask and the distance ceiling count tokens: position ids with gaps or resets cannot be honoured."""
    if position_ids.shape[-1] > 1 and not bool((position_ids.diff(dim=-1) == 1).all()):
        raise ValueError(
            "LM-Infinite attention needs position_ids that increase by one per token (one sequence per row, "
            "no packing or padding)"
        )


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    found = [m for _, m in model.named_modules() if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")]
    if not found:
        raise ValueError(f"{type(model).__name__}: no attention modules with a layer_idx found")
    return found


def _sized_rope(rope: Rope, window: int, previous: InfiniteState | None) -> Rope:
    """``rope`` with tables bounded for ``window``; the previous one (and its tables) when it is the same, so
    switching top-k on and off keeps one set of tables, shared with the caches already built."""
    if (
        previous is not None
        and previous.rope.table_rows == lookup_rows(window)
        and previous.rope.attention_scaling == rope.attention_scaling
        and torch.equal(previous.rope.inv_freq, rope.inv_freq)
    ):
        return previous.rope
    return replace(rope, table_rows=lookup_rows(window))
