"""Switch a loaded Hugging Face RoPE model to LM-Infinite attention and back, through public hooks only.

- ``AttentionInterface.register("lminfinite", ...)`` supplies the attention; ``AttentionMaskInterface`` a
  mask function that builds nothing (the Λ-mask is applied block by block inside the attention).
- A forward hook on the model's rotary embedding replaces its (cos, sin) by ours for ``position - frame``,
  computed in float64: HF's own rotation then puts queries and keys into the cache's *frame*, whose offset
  from any token is bounded, so position 10^9 behaves exactly like position 10^4. A forward pre-hook on the
  module that owns the rotary embedding reads the call's cache and moves its frame forward when due.
  Positions count tokens from the sequence's first one: a call's position ids must step by one, and where
  they start does not matter (RoPE and the Λ-mask see distances only), with or without a cache.
- A forward pre-hook on each attention module passes the call's cache and our state to the attention
  function through the ``**kwargs`` that transformers forwards to it.
No model class is copied or monkey-patched.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
from transformers.masking_utils import AttentionMaskInterface

from .config import LMInfiniteConfig
from .context import KeyContext
from .kernel import lm_infinite_attention
from .rotary import Rope, find_rotary_embedding, lookup_rows, rope_from_model

ATTENTION_NAME = "lminfinite"
_STATE_ATTR = "_lminfinite_state"


@dataclass
class InfiniteState:
    """What the attention needs besides q, k, v; one per patched model."""

    config: LMInfiniteConfig
    rope: Rope
    num_layers: int
    previous_attention: str
    hooks: list = field(default_factory=list)
    observers: list = field(default_factory=list)
    block_size: int | None = None  # None: kernel.default_block_size(window)
    frame: int = 0  # the current forward's rotation frame, set before the rotary embedding runs
    past: int = 0  # tokens of the sequence cached before the current forward: its first query's position
    reference_variant: str = "lminfinite"  # read by lminfinite.reference only
    reference_dtype: torch.dtype = torch.float64

    def notify(self, layer_idx, query_pos, positions, weights) -> None:
        for observer in list(self.observers):
            observer(layer_idx, query_pos, positions, weights)


def get_state(model: nn.Module) -> InfiniteState | None:
    return getattr(model, _STATE_ATTR, None)


def enable(model: nn.Module, config: LMInfiniteConfig | None = None, *, attention: str = ATTENTION_NAME) -> nn.Module:
    """Make ``model`` compute LM-Infinite attention; weights are untouched. Calling it again changes the config."""
    config = config or LMInfiniteConfig()
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    rope = rope_from_model(model)  # refuses non-RoPE models and unsupported scalings with a clear error
    resolved = config.resolved(text_config.max_position_embeddings)
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
    rotary = find_rotary_embedding(model)
    if attention == ATTENTION_NAME:
        owner = _owner_of(model, rotary)
        state.hooks.append(owner.register_forward_pre_hook(partial(_begin_forward, state), with_kwargs=True))
        state.hooks.append(rotary.register_forward_hook(partial(_rotate_into_frame, state), with_kwargs=True))
    else:  # the dense reference rotates explicitly and wants q, k as projected
        state.hooks.append(rotary.register_forward_hook(_unrotated))

    def inject(module, args, kwargs):
        kwargs["lminfinite_state"] = state
        kwargs["lminfinite_cache"] = kwargs.get("past_key_values")
        return args, kwargs

    for module in attention_modules:
        state.hooks.append(module.register_forward_pre_hook(inject, with_kwargs=True))
    setattr(model, _STATE_ATTR, state)
    model.set_attn_implementation(attention)
    return model


def disable(model: nn.Module) -> nn.Module:
    """Undo :func:`enable`: hooks removed, the previous attention implementation restored."""
    state = get_state(model)
    if state is None:
        return model
    for hook in state.hooks:
        hook.remove()
    delattr(model, _STATE_ATTR)
    model.set_attn_implementation(state.previous_attention)
    return model


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


def _owner_of(model: nn.Module, child: nn.Module) -> nn.Module:
    for module in model.modules():
        if any(c is child for c in module.children()):
            return module
    raise ValueError("could not find the module that runs the rotary embedding")


def _begin_forward(state: InfiniteState, module, args, kwargs):
    """Before the decoder runs: fix this call's frame (re-basing an InfiniteCache when it is due) and the
    position of its first token, counted from the sequence's first token (no cache, a DynamicCache: frame 0)."""
    from .cache import InfiniteCache

    cache = kwargs.get("past_key_values")
    state.frame = cache.begin_forward() if isinstance(cache, InfiniteCache) else 0
    state.past = cache.get_seq_length() if isinstance(cache, Cache) else 0
    return None


def _rotate_into_frame(state: InfiniteState, module, args, kwargs, output):
    """(cos, sin) for ``position - frame``: HF's apply_rotary_pos_emb then rotates q and k into the frame.

    The call's tokens are at positions past, past + 1, ... of the sequence, whatever its position ids say:
    an offset p only says where the sequence starts, which no distance depends on, and using it would make
    rotations (and tables) as large as p.
    """
    cos, _ = output
    position_ids = kwargs["position_ids"] if "position_ids" in kwargs else args[1]
    _require_consecutive(position_ids)
    first = state.past - state.frame
    frame_cos, frame_sin = state.rope.span(first, first + position_ids.shape[-1], cos.dtype, cos.device)
    shape = (cos.shape[0], *frame_cos.shape)
    return frame_cos[None].expand(shape), frame_sin[None].expand(shape)


def _require_consecutive(position_ids: torch.Tensor) -> None:
    """The Λ-mask and the distance ceiling count tokens: position ids with gaps or resets cannot be honoured."""
    if position_ids.shape[-1] > 1 and not bool((position_ids.diff(dim=-1) == 1).all()):
        raise ValueError(
            "LM-Infinite attention needs position_ids that increase by one per token (one sequence per row, "
            "no packing or padding)"
        )


def _unrotated(module, args, output):
    """Replace (cos, sin) by (1, 0): HF's apply_rotary_pos_emb then leaves q and k as they are."""
    cos, sin = output
    return torch.ones_like(cos), torch.zeros_like(sin)


def key_context(state: InfiniteState, layer_idx: int, key, value, cache) -> KeyContext:
    """The KeyContext for this call: from an InfiniteCache, or from full keys (no cache / DynamicCache)."""
    from .cache import InfiniteCache

    if isinstance(cache, InfiniteCache):
        if (cache.config.window, cache.config.n_starting) != (state.config.window, state.config.n_starting):
            raise ValueError(
                "this InfiniteCache was built for window/n_starting "
                f"{cache.config.window}/{cache.config.n_starting}, the model now uses "
                f"{state.config.window}/{state.config.n_starting}: start a new cache"
            )
        layer = cache.layers[layer_idx]
        ctx, layer.context = layer.context, None
        if state.config.uses_topk(layer_idx) and layer.middle is None and layer.win_start > state.config.n_starting:
            raise ValueError(
                "top-k recall is on but this InfiniteCache keeps no middle tokens: create it with "
                "InfiniteCache(model, keep_middle=True)"
            )
        return ctx
    if cache is not None and not (
        isinstance(cache, DynamicCache) and all(type(l) is DynamicLayer for l in cache.layers)
    ):
        raise TypeError(
            f"LM-Infinite attention works with no cache, a DynamicCache or an InfiniteCache, not {type(cache).__name__}"
        )
    return KeyContext.full_sequence(key, value, state.config.n_starting, state.rope)


def lminfinite_attention_forward(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0,
    lminfinite_state: InfiniteState | None = None, lminfinite_cache=None, **kwargs,
):
    """transformers attention-interface entry point: returns (B, c, H, D) and no weights."""
    state = lminfinite_state
    if state is None:
        raise RuntimeError("lminfinite attention called without its state: use lminfinite.enable(model)")
    if isinstance(attention_mask, torch.Tensor):
        raise ValueError("LM-Infinite builds its own Λ-mask; custom 4D attention masks are not supported")
    ctx = key_context(state, module.layer_idx, key, value, lminfinite_cache)
    out = lm_infinite_attention(
        query, ctx,
        config=state.config, rope=state.rope, layer_idx=module.layer_idx,
        scaling=module.head_dim**-0.5 if scaling is None else scaling,
        observer=state.notify if state.observers else None,
        block_size=state.block_size,
    )
    return out.transpose(1, 2).contiguous(), None


def no_dense_mask(batch_size, q_length, kv_length, *args, attention_mask=None, **kwargs):
    """Mask-interface entry point: LM-Infinite never materialises a (q × kv) mask. Padding is refused."""
    if attention_mask is not None and attention_mask.ndim == 2 and not bool(attention_mask.all()):
        raise ValueError(
            "LM-Infinite attention does not support padded batches: pass one sequence per call, or equal-length rows"
        )
    return None


AttentionInterface.register(ATTENTION_NAME, lminfinite_attention_forward)
AttentionMaskInterface.register(ATTENTION_NAME, no_dense_mask)
