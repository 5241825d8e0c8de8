"""A prefill's whole window span in one call of PyTorch's FlashAttention-2 kernel, through its sliding window.

FlashAttention-2 restricts query row r to the key columns [r + m - c - left, r + m - c + right] (aligned at the
bottom-right when the c queries are the last of the m keys) and skips key tiles outside that band, so
``left = L - 1, right = 0`` is exactly the Λ mask's ending span, with no masked work beyond the band's edge tiles
and no band loop. It reads grouped key heads as they are and returns the log-sum-exp the other spans merge into.
The kernel runs on CUDA in float16 and bfloat16 only; on a build compiled without local attention it raises,
and ``auto`` (kernel_choice.py) then falls back to a band kernel.

``flash_span`` is the same call with no window: a decode step with top-k recall, whose query sees every key it is
given and whose output is merged with the recalled tokens'. For a handful of query rows the kernel splits the keys
among programs (FlashAttention-2's split-KV) where the memory-efficient kernel runs one program per head: 32 heads
of one row each keep 32 of an H200's 132 multiprocessors busy, each reading its head's whole window.
"""

from __future__ import annotations

import torch

FLASH_FORWARD = getattr(torch.ops.aten, "_flash_attention_forward", None)


def flash_supports(device: torch.device, dtype: torch.dtype) -> bool:
    return FLASH_FORWARD is not None and device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)


def flash_window_span(query, keys, values, window: int, scale: float):
    """Output float32 (B, H, c, D) and log-sum-exp float32 (B, H, c) of queries (B, H, c, D) that are the last c
    of the keys and values (B, Hkv, m, D); query head h reads key head h // (H / Hkv)."""
    c, m = query.shape[-2], keys.shape[-2]
    # The kernel's layout is (B, S, H, D) with only the last dimension contiguous: transposes are views.
    q, k, v = (t.transpose(1, 2) if t.stride(-1) == 1 else t.transpose(1, 2).contiguous()
               for t in (query, keys, values))
    out, lse = FLASH_FORWARD(q, k, v, None, None, c, m, 0.0, False, False, scale=scale,
                             window_size_left=window - 1, window_size_right=0)[:2]
    return out.transpose(1, 2).float(), lse.float()


def flash_span(q, k, v, additive_mask, scale: float):
    """Output float32 (B, H, R, D) and log-sum-exp float32 (B, H, R) of query rows q (B, H, R, D) over every one of
    the keys and values (B, H, m, D): fused.py's span signature, for spans with no mask (``additive_mask`` None)."""
    if additive_mask is not None:
        raise ValueError("flash_span attends to every key: it takes no mask")
    rows, m = q.shape[-2], k.shape[-2]
    q, k, v = (t.transpose(1, 2) if t.stride(-1) == 1 else t.transpose(1, 2).contiguous() for t in (q, k, v))
    out, lse = FLASH_FORWARD(q, k, v, None, None, rows, m, 0.0, False, False, scale=scale)[:2]
    return out.transpose(1, 2).float(), lse[..., :rows].float()
