"""KV-cache memory needed for a context, before any of it reaches the model.

A vanilla decoder keeps keys and values of every token in every layer.  The
LM-Infinite cache keeps only the first `n_starting` tokens plus a sliding
`window` per layer; with top-k middle-token attention (topk > 0) it also keeps
a middle store of all tokens, so that case saves nothing.  The bytes per token
come from the library (lminfinite.kv_bytes, torch-free); this rough estimate
counts every kept token once in every layer.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from lminfinite.kv_bytes import KVShape


def kv_bytes_per_token(*, num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """Bytes of keys + values one token occupies across all layers."""
    return KVShape(num_layers, num_kv_heads, head_dim).token_bytes(dtype_bytes)


def estimate_kv_bytes(
    n_tokens: int,
    *,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype_bytes: int = 2,
    window: int | None = None,
    n_starting: int = 10,
    topk: int = 0,
) -> dict:
    """Full vs LM-Infinite KV-cache bytes for `n_tokens` of context.

    Returns a dict with bytes_per_token, full_tokens/full_bytes (vanilla),
    bounded_tokens/bounded_bytes (starting + window, capped at n_tokens),
    middle_tokens/middle_bytes (all tokens when topk > 0, else 0) and
    lminfinite_bytes = bounded_bytes + middle_bytes.  window=None means no
    LM-Infinite bound (bounded == full).
    """
    if n_tokens < 0:
        raise ValueError("n_tokens must be >= 0")
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                        ("dtype_bytes", dtype_bytes), ("n_starting", n_starting), ("topk", topk)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0")
    per_token = kv_bytes_per_token(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
                                   dtype_bytes=dtype_bytes)
    bounded_tokens = n_tokens if window is None else min(n_tokens, n_starting + window)
    middle_tokens = n_tokens if topk > 0 else 0
    return {
        "n_tokens": n_tokens,
        "bytes_per_token": per_token,
        "full_tokens": n_tokens,
        "full_bytes": n_tokens * per_token,
        "bounded_tokens": bounded_tokens,
        "bounded_bytes": bounded_tokens * per_token,
        "middle_tokens": middle_tokens,
        "middle_bytes": middle_tokens * per_token,
        "lminfinite_bytes": (bounded_tokens + middle_tokens) * per_token,
    }


def kv_dims_from_config(config: Any) -> dict:
    """num_layers / num_kv_heads / head_dim read from a Hugging Face config."""
    return asdict(KVShape.from_config(config))


# Llama-2-7B, the model the CLI quotes when it prints a memory estimate.
LLAMA2_7B_DIMS = {"num_layers": 32, "num_kv_heads": 32, "head_dim": 128}
