"""Softmax attention that also returns its log-sum-exp, so separately computed spans can be merged.

On the CPU this is PyTorch's fused flash kernel (the one behind scaled_dot_product_attention, which
returns the log-sum-exp only through its aten op); elsewhere a plain float32 implementation.
"""

from __future__ import annotations

import torch

_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def attend_with_lse(q, k, v, additive_mask, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q (B, Hkv, R, D) over k, v (B, Hkv, m, D); mask (R, m) of 0 / -inf, or None.

    Returns (output float32 (B, Hkv, R, D), log-sum-exp float32 (B, Hkv, R)). Every row must allow a key.
    """
    if _CPU_FLASH is not None and q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16):
        mask = None if additive_mask is None else additive_mask.to(q.dtype)[None, None]
        out, lse = _CPU_FLASH(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
        return out.float(), lse.float()
    logits = (q @ k.transpose(-1, -2)).float() * scale
    if additive_mask is not None:
        logits = logits + additive_mask
    lse = torch.logsumexp(logits, dim=-1)
    probs = torch.exp(logits - lse[..., None])
    return (probs.to(v.dtype) @ v).float(), lse

