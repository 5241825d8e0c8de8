"""Bytes of keys and values, in one place: the cache reports its memory, the app sizes its context budget and
``ingest`` estimates a corpus's KV memory with the same arithmetic.

No torch here: ``ingest`` imports it before (and without) any model. ``dtype`` is a byte count or anything with
an ``itemsize`` (a torch or numpy dtype).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import LMInfiniteConfig


def row_bytes(num_kv_heads: int, head_dim: int, dtype: Any) -> int:
    """One token's key and value in one layer: the unit every count here multiplies."""
    return 2 * num_kv_heads * head_dim * _itemsize(dtype)


def keeps_scan_copy(wanted: bool, dtype: Any, device_type: str) -> bool:
    """Whether a middle store keeps a bfloat16 copy of its keys for recall's scan (scan_copy.py): for a model
    running in float32 on the CPU, where the copy was measured to pay; a smaller dtype scans as fast as it is."""
    return wanted and device_type == "cpu" and _itemsize(dtype) == 4


def scan_copy_row_bytes(num_kv_heads: int, head_dim: int) -> int:
    """One token's bfloat16 key copy in one layer."""
    return num_kv_heads * head_dim * 2


@dataclass(frozen=True)
class KVShape:
    """What sizes a model's keys and values: layers, key/value heads, head_dim."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, config: Any) -> "KVShape":
        """From a Hugging Face config (a multimodal one's text config)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = text.num_attention_heads
        return cls(
            num_layers=text.num_hidden_layers,
            num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        )

    def token_bytes(self, dtype: Any, layers: int | None = None) -> int:
        """One token's keys and values in ``layers`` layers (default: all, what a vanilla cache adds per token)."""
        return (self.num_layers if layers is None else layers) * row_bytes(self.num_kv_heads, self.head_dim, dtype)


@dataclass(frozen=True)
class SpanBytes:
    """Bytes per token an InfiniteCache holds for each span, over all layers (batch size 1).

    starting: each of the first n_starting tokens, kept twice (unrotated, and placed for the decode step);
    window: each of the window ring slots, preallocated; middle: each evicted token, once, in the layers that
    keep a middle store (those from ``topk_from_layer`` on), 0 without one; middle_scan: its key's bfloat16 copy
    that recall scans in those layers, where one is kept (scan_copy.py).
    """

    starting: int
    window: int
    middle: int
    middle_scan: int = 0

    def bounded(self, config: LMInfiniteConfig) -> int:
        """Bytes of the starting and window spans once the window has filled: the same at any context length."""
        return self.starting * config.n_starting + self.window * config.window_


def span_bytes(shape: KVShape, config: LMInfiniteConfig, dtype: Any, keep_middle: bool | None = None,
               device_type: str = "cpu") -> SpanBytes:
    """What an InfiniteCache of a model with ``shape`` spends per token; ``keep_middle`` as InfiniteCache takes it
    (default: the config's ``topk > 0``); ``device_type``: where the model runs."""
    keep = config.topk > 0 if keep_middle is None else keep_middle
    middle_layers = max(0, shape.num_layers - config.topk_from_layer) if keep else 0
    copy = keeps_scan_copy(config.recall_scan_copy, dtype, device_type)
    return SpanBytes(
        starting=2 * shape.token_bytes(dtype),
        window=shape.token_bytes(dtype),
        middle=shape.token_bytes(dtype, layers=middle_layers),
        middle_scan=(middle_layers * scan_copy_row_bytes(shape.num_kv_heads, shape.head_dim)) if copy else 0,
    )


def _itemsize(dtype: Any) -> int:
    return dtype if isinstance(dtype, int) else int(dtype.itemsize)
