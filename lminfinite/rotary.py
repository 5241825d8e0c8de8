"""Rotary position embedding at relative, bounded offsets.

LM-Infinite never rotates by an absolute position: queries and keys reach the attention unrotated
and are rotated here by offsets no larger than ``window + block``. Angles are computed in float64,
so position 10^9 behaves exactly like position 10^4 (the official code lost precision near 10^7).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

# RoPE variants whose frequencies do not depend on the sequence length: a fixed inv_freq (and, for
# YaRN, a fixed logit scale) describes them completely.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True, eq=False)
class Rope:
    """The model's own rotary parameters: ``inv_freq`` (head_dim / 2) and HF's ``attention_scaling``."""

    inv_freq: torch.Tensor
    attention_scaling: float = 1.0
    _tables: dict = field(default_factory=dict, repr=False)
    _last_uniform: dict = field(default_factory=dict, repr=False)

    @property
    def head_dim(self) -> int:
        return 2 * self.inv_freq.numel()

    def cos_sin(self, offsets: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of ``offsets × inv_freq`` laid out as HF's ``rotate_half`` expects (n, head_dim).

        Looked up in a table computed once in float64 (grown by doubling); sin is odd, cos even.
        """
        cos_table, sin_table = self._table(int(offsets.abs().max()) + 1 if offsets.numel() else 1, offsets.device, dtype)
        index = offsets.abs()
        sign = torch.where(offsets < 0, -1.0, 1.0).to(dtype)[:, None]
        return cos_table[index], sin_table[index] * sign

    def rotate_uniform(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        """``rotate`` with one offset for every row: a decode step's start keys or query.

        Every layer of a step asks for the same offset, so the last one's cos/sin row is kept.
        """
        work = torch.promote_types(x.dtype, torch.float32)
        key = (offset, x.device, work)
        if self._last_uniform.get("key") != key:
            self._last_uniform.update(key=key, cos_sin=self.cos_sin(torch.tensor([offset], device=x.device), work))
        return _apply(x, *self._last_uniform["cos_sin"])

    def _table(self, size: int, device: torch.device, dtype: torch.dtype):
        key = (device, dtype)
        table = self._tables.get(key)
        if table is None or table[0].shape[0] < size:
            size = max(size, 2 * (0 if table is None else table[0].shape[0]), 1024)
            angles = torch.arange(size, dtype=torch.float64, device=device)[:, None] * self.inv_freq.to(device)[None, :]
            angles = torch.cat((angles, angles), dim=-1)
            table = (angles.cos().to(dtype), angles.sin().to(dtype))
            self._tables[key] = table
        return table

    def rotate(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Rotate the last two dims (n, head_dim) of ``x`` by ``offsets`` (n,), in float32 at least.

        The scalar ``attention_scaling`` is not applied here; callers fold its square into the logit scale.
        """
        return _apply(x, *self.cos_sin(offsets, torch.promote_types(x.dtype, torch.float32)))


def _apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin in the dtype of cos/sin, returned in x's dtype."""
    xw = x.to(cos.dtype)
    return (xw * cos + _rotate_half(xw) * sin).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def find_rotary_embedding(model: nn.Module) -> nn.Module:
    """The one module that turns position ids into (cos, sin); clear errors for models we cannot patch."""
    found = [m for _, m in model.named_modules() if hasattr(m, "inv_freq") and "Rotary" in type(m).__name__]
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no rotary position embedding (no *RotaryEmbedding module with inv_freq): "
            "LM-Infinite here supports RoPE models only (Llama, Mistral, Qwen2 and alike)"
        )
    if len(found) > 1:
        raise ValueError(
            f"{type(model).__name__} has {len(found)} rotary embeddings (e.g. local and global attention); "
            "LM-Infinite supports models with a single rotary embedding"
        )
    return found[0]


def rope_from_model(model: nn.Module) -> Rope:
    """Read the rotary parameters the model itself uses, refusing variants we cannot reproduce exactly."""
    rotary = find_rotary_embedding(model)
    config = model.config
    rope_type = getattr(rotary, "rope_type", None) or (getattr(config, "rope_parameters", None) or {}).get(
        "rope_type", "default"
    )
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"RoPE scaling type {rope_type!r} changes its frequencies with the sequence length and is not supported; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    partial = (getattr(config, "rope_parameters", None) or {}).get("partial_rotary_factor") or getattr(
        config, "partial_rotary_factor", 1.0
    )
    if partial not in (None, 1, 1.0):
        raise ValueError(f"partial rotary embeddings (partial_rotary_factor={partial}) are not supported")
    inv_freq = rotary.inv_freq.detach().to(torch.float64).clone()
    return Rope(inv_freq=inv_freq, attention_scaling=float(getattr(rotary, "attention_scaling", 1.0)))
