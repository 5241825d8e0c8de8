"""LM-Infinite for Hugging Face causal LMs: exact, bounded, streaming; no weight changes.

    import lminfinite
    model = lminfinite.enable(model, lminfinite.LMInfiniteConfig(n_starting=10, topk=5))
    cache = lminfinite.InfiniteCache(model)
    out = model.generate(input_ids, past_key_values=cache, max_new_tokens=64)
    cache.topk = 0  # this cache's next forwards without top-k recall; the model and other caches unchanged
    decoder = lminfinite.GraphedDecoder(model, cache)  # on a GPU: decoder(next_ids) replays one CUDA graph per token

See docs/library.md for the semantics (Λ-mask, distance ceiling, top-k middle recall) and their tests.

The torch-free parts (the config, the KV-memory arithmetic in kv_bytes) load with the package; the rest on
first use (PEP 562), so ``ingest`` sizes a corpus's KV memory with the library's arithmetic without loading torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from .config import LMInfiniteConfig, suggested_topk_from_layer
from .kv_bytes import KVShape, SpanBytes, span_bytes

if TYPE_CHECKING:
    from .cache import CacheSnapshot, InfiniteCache
    from .graphed import GraphedDecoder
    from .observe import TopKObserver, TopKSelection, observe_topk
    from .patch import disable, enable
    from .persist import CacheFileError, CacheMismatch, cache_state, load_cache, restore_cache, save_cache
    from .model_state import get_state

_LAZY = {
    "CacheSnapshot": "cache",
    "InfiniteCache": "cache",
    "GraphedDecoder": "graphed",
    "TopKObserver": "observe",
    "TopKSelection": "observe",
    "observe_topk": "observe",
    "disable": "patch",
    "enable": "patch",
    "CacheFileError": "persist",
    "CacheMismatch": "persist",
    "cache_state": "persist",
    "load_cache": "persist",
    "restore_cache": "persist",
    "save_cache": "persist",
    "get_state": "model_state",
}

__all__ = sorted(["KVShape", "LMInfiniteConfig", "SpanBytes", "span_bytes", "suggested_topk_from_layer", *_LAZY])


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
