"""LM-Infinite's entry points in transformers' registries: the attention function and a mask that builds nothing.

transformers calls the attention function with what the cache's ``update`` returned as ``key`` and ``value``:
a KeyContext from an InfiniteCache (layer.py), full key and value tensors from a DynamicCache or with no cache.
Queries arrive as projected (the model's rotation is the identity, see patch.py); the context rotates them into
its frame. The model's state and the call's config come through the ``**kwargs`` transformers forwards, put
there by patch.py's pre-hook on each attention module.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from .config import LMInfiniteConfig
from .key_context import KeyContext
from .kernel import lm_infinite_attention
from .model_state import InfiniteState

ATTENTION_NAME = "lminfinite"


def lminfinite_attention_forward(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0,
    lminfinite_state: InfiniteState | None = None, lminfinite_config: LMInfiniteConfig | None = None, **kwargs,
):
    """transformers attention-interface entry point: returns (B, c, H, D) and no weights."""
    state = lminfinite_state
    if state is None:
        raise RuntimeError("lminfinite attention called without its state: use lminfinite.enable(model)")
    if isinstance(attention_mask, torch.Tensor):
        raise ValueError("LM-Infinite builds its own Λ-mask; custom 4D attention masks are not supported")
    config = lminfinite_config or state.config
    ctx = key if isinstance(key, KeyContext) else KeyContext.full_sequence(key, value, config.n_starting, state.rope)
    out = lm_infinite_attention(
        ctx.rotate_queries(query, state.rope), ctx,
        config=config, rope=state.rope, layer_idx=module.layer_idx,
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
