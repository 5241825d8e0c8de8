"""How many tokens one session's context may hold: a CLI flag, or sized from the memory the middle store uses.

With top-k recall the cache keeps every evicted token once (in GPU memory, or in CPU memory with
``--offload-middle``), so the budget is what that memory can hold, capped at one million tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil
import torch

from ingest import kv_dims_from_config

from .runtime import ModelRuntime

GENEROUS = 1_000_000
HEADROOM = 0.7  # of the free memory; activations, other sessions and the allocator need the rest


@dataclass(frozen=True)
class Budget:
    tokens: int
    why: str
    middle_bytes_per_token: int


def middle_bytes_per_token(runtime: ModelRuntime) -> int:
    """Keys + values one token adds to the middle store (only recall layers keep it)."""
    dims = kv_dims_from_config(runtime.model.config.get_text_config())
    layers = max(0, runtime.num_layers - runtime.lm_config.topk_from_layer)
    dtype_bytes = torch.empty((), dtype=runtime.dtype).element_size()
    return 2 * layers * dims["num_kv_heads"] * dims["head_dim"] * dtype_bytes


def context_budget(runtime: ModelRuntime, requested: int | None) -> Budget:
    per_token = middle_bytes_per_token(runtime)
    if requested is not None:
        return Budget(requested, "set with --context-budget", per_token)
    on_gpu = runtime.device_type == "cuda" and not runtime.offload_middle
    if on_gpu:
        free = sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
        where = "free GPU memory"
    else:
        free = psutil.virtual_memory().available
        where = "available CPU memory"
    fits = int(free * HEADROOM) // max(per_token, 1)
    tokens = max(1, min(GENEROUS, fits))
    capped = "capped at 1M" if tokens == GENEROUS else f"{HEADROOM:.0%} of the {where}"
    return Budget(tokens, f"{capped}; the middle store takes {per_token / 1024:.1f} KiB per token", per_token)
