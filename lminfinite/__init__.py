"""LM-Infinite for Hugging Face causal LMs: exact, bounded, streaming; no weight changes.

    import lminfinite
    model = lminfinite.enable(model, lminfinite.LMInfiniteConfig(n_starting=10, topk=5))
    cache = lminfinite.InfiniteCache(model)
    out = model.generate(input_ids, past_key_values=cache, max_new_tokens=64)

See README.md for the semantics (Λ-mask, distance ceiling, top-k middle recall) and their tests.
"""

from .cache import CacheSnapshot, InfiniteCache
from .config import LMInfiniteConfig, suggested_topk_from_layer
from .observe import TopKObserver, TopKSelection, observe_topk
from .patch import disable, enable, get_state

__all__ = [
    "CacheSnapshot",
    "InfiniteCache",
    "LMInfiniteConfig",
    "TopKObserver",
    "TopKSelection",
    "disable",
    "enable",
    "get_state",
    "observe_topk",
    "suggested_topk_from_layer",
]
