"""Softmax attention that also returns its log-sum-exp, so separately computed spans can be merged.

Each span kernel takes q (B, Hkv, R, D) over k, v (B, Hkv, m, D) with an additive (R, m) mask of 0 / -inf (or
None) and returns (output float32 (B, Hkv, R, D), log-sum-exp float32 (B, Hkv, R)); every row must allow a key.

  cpu-flash  PyTorch's fused CPU flash kernel (the one behind scaled_dot_product_attention, which returns the
             log-sum-exp only through its aten op); float32 and bfloat16.
  efficient  PyTorch's memory-efficient CUDA kernel with the mask as an additive bias.
  float32    plain float32 matmul-softmax-matmul: the reference every other kernel is checked against.

``flash`` (flash_window.py) and ``flex`` (flex_window.py) are not band kernels: each does a prefill's whole window
span in one call. ``flash`` also takes a span with no mask (flash_window.flash_span): a decode step with top-k.
"""

from __future__ import annotations

import torch

from .flash_window import flash_span

_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_EFFICIENT = getattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", None)
BIAS_ALIGNMENT = 16  # elements: bias rows start on 16-byte boundaries, as the memory-efficient kernel reads them


def float32_span(q, k, v, additive_mask, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    logits = (q @ k.transpose(-1, -2)).float() * scale
    if additive_mask is not None:
        logits = logits + additive_mask
    lse = torch.logsumexp(logits, dim=-1)
    probs = torch.exp(logits - lse[..., None])
    return (probs.to(v.dtype) @ v).float(), lse


def cpu_flash_span(q, k, v, additive_mask, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    mask = None if additive_mask is None else additive_mask.to(q.dtype)[None, None]
    out, lse = _CPU_FLASH(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
    return out.float(), lse.float()


def efficient_span(q, k, v, additive_mask, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    if not q.dtype == k.dtype == v.dtype:  # the raw op reads keys and values as the query's type, unchecked
        raise ValueError(f"the efficient kernel needs one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    bias = None if additive_mask is None else aligned_bias(additive_mask.to(q.dtype))
    if bias is not None:
        bias = bias.expand(q.shape[0], q.shape[1], *bias.shape)
    out, lse = _EFFICIENT(q, k, v, bias, True, 0.0, False, scale=scale)[:2]
    return out.float(), lse[..., : q.shape[-2]].float()  # the kernel pads its log-sum-exp rows to a tile


def aligned_bias(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` itself when its rows start on aligned addresses, else a copy whose rows do (padded, then sliced)."""
    width = mask.shape[-1]
    element = mask.element_size()
    rows_aligned = mask.stride(-2) % BIAS_ALIGNMENT == 0 and mask.data_ptr() % (BIAS_ALIGNMENT * element) == 0
    if mask.stride(-1) == 1 and rows_aligned:
        return mask
    padded = -(-width // BIAS_ALIGNMENT) * BIAS_ALIGNMENT
    out = torch.empty(*mask.shape[:-1], padded, dtype=mask.dtype, device=mask.device)[..., :width]
    return out.copy_(mask)


SPAN_KERNELS = {"cpu-flash": cpu_flash_span, "efficient": efficient_span, "float32": float32_span}
# Kernels for spans that every query row sees whole (no mask: a decode step with top-k), besides SPAN_KERNELS.
UNMASKED_SPAN_KERNELS = {"flash": flash_span}


def takes_unmasked_spans(name: str) -> bool:
    return name in SPAN_KERNELS or name in UNMASKED_SPAN_KERNELS


def supports(name: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether kernel ``name`` exists in this PyTorch build for tensors on ``device`` of ``dtype``."""
    if name == "float32":
        return True
    if name == "cpu-flash":
        return _CPU_FLASH is not None and device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
    if name == "efficient":
        return _EFFICIENT is not None and device.type == "cuda" and dtype in (torch.float32, torch.float16, torch.bfloat16)
    if name == "flash":
        from .flash_window import flash_supports

        return flash_supports(device, dtype)
    if name == "flex":
        from .flex_window import flex_available

        return flex_available()
    raise ValueError(f"unknown window kernel {name!r}")


def attend_with_lse(q, k, v, additive_mask, scale: float, kernel: str = "float32"):
    """Attention of q over k, v through the named span kernel (see the module docstring)."""
    span = SPAN_KERNELS.get(kernel) or UNMASKED_SPAN_KERNELS[kernel]
    return span(q, k, v, additive_mask, scale)
