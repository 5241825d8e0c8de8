"""A filling step's attention (decode_step.py): one query over the first rows of fixed-shape buffers.

Before the window is full, a decode step's keys are a prefix of the ring: the start keys at their own distances,
then every token since, one row more at each step. The buffers keep their shape and the prefix's length lives on
the device, so a CUDA graph recorded at one step replays the next. Two kernels:

  sdpa   scaled_dot_product_attention over the ring's window rows, those past the prefix masked. On CUDA a mask
         sends it to the memory-efficient kernel, one program per head reading every row.
  flash  FlashAttention-2's variable-length call told the prefix's length by a count on the device (``seqused_k``):
         it reads the prefix alone. CUDA, half precision, one sequence (batch 1; another batch takes ``sdpa``).

``auto`` (kernel_choice.py) takes ``flash`` where it agrees with float64 on this device, else ``sdpa``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .flash_window import FLASH_FORWARD, flash_supports


@dataclass(eq=False)
class FilledRows:
    """The prefix of a filling step's keys, on their device, written in place at every step: ``valid`` (1, rows)
    bool marks it; ``used`` (1,) int32 counts it; ``query_bounds`` [0, 1] and ``key_bounds`` [0, rows] (int32) are
    the variable-length call's sequence offsets, fixed."""

    valid: torch.Tensor
    used: torch.Tensor
    query_bounds: torch.Tensor
    key_bounds: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, device) -> "FilledRows":
        int32 = dict(dtype=torch.int32, device=device)
        return cls(torch.zeros(1, rows, dtype=torch.bool, device=device), torch.zeros(1, **int32),
                   torch.tensor([0, 1], **int32), torch.tensor([0, rows], **int32))

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.valid, self.used, self.query_bounds, self.key_bounds

    def fill(self, count: int) -> None:
        """The first ``count`` rows in use: device writes only, no sync."""
        self.valid[:, :count].fill_(True)
        self.valid[:, count:].fill_(False)
        self.used.fill_(count)


def masked_filling(query, keys, values, rows: FilledRows, scale: float) -> torch.Tensor:
    groups = query.shape[1] // keys.shape[1]
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=rows.valid, scale=scale,
                                          enable_gqa=groups > 1)


def flash_filling(query, keys, values, rows: FilledRows, scale: float) -> torch.Tensor:
    """query (1, H, 1, D) over the prefix of keys and values (1, Hkv, rows, D): (1, H, 1, D) in the query's dtype."""
    if query.shape[0] != 1:
        raise ValueError("flash_filling takes one sequence")
    # The variable-length layout is (tokens, heads, D) with only the last dimension contiguous: transposes are views.
    q, k, v = (t[0].transpose(0, 1) for t in (query, keys, values))
    out = FLASH_FORWARD(q, k, v, rows.query_bounds, rows.key_bounds, 1, k.shape[0], 0.0, False, False,
                        scale=scale, seqused_k=rows.used)[0]
    return out.transpose(0, 1)[None]


FILLING_KERNELS = {"sdpa": masked_filling, "flash": flash_filling}


def supports(name: str, device: torch.device, dtype: torch.dtype) -> bool:
    return name == "sdpa" or (name == "flash" and flash_supports(device, dtype))


def filling_attention(query, keys, values, rows: FilledRows, scale: float, kernel: str) -> torch.Tensor:
    """The step's output (B, H, 1, D) through ``kernel`` (``sdpa`` for a batch of more than one sequence)."""
    if query.shape[0] != 1:
        kernel = "sdpa"
    return FILLING_KERNELS[kernel](query, keys, values, rows, scale)
