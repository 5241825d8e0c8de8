"""A prefill's whole window span in one FlexAttention call, over a block-sparse Λ band.

The band kernels (window.py) make one call per band of queries and spend work on masked scores; FlexAttention
visits only the key blocks each query block can see, and returns the log-sum-exp the other spans merge into.
The block lists are computed from the band's geometry, never by evaluating the mask over all c × m pairs.
On CUDA the call is compiled (Triton); elsewhere it runs PyTorch's dense eager reference, which is there so
the CPU tests check the same block lists and mask, not for speed.
"""

from __future__ import annotations

import functools

import torch

BLOCK = 128  # FlexAttention's default tile, for queries and keys


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=64)
def band_mask_mod(window: int, offset: int):
    """Query row r sees key column j when 0 <= r + offset - j < window; one function per (window, offset), so
    compiled calls find it again rather than recompiling."""

    def visible(batch, head, row, column):
        distance = row + offset - column
        return (distance >= 0) & (distance < window)

    return visible


def block_lists(queries: int, keys: int, offset: int, window: int, device, block: int = BLOCK):
    """(partial, full) block tables (1, 1, query blocks, key blocks) of the band: blocks that some but not all of
    their pairs see, and blocks whose pairs all see each other."""
    row_lo = torch.arange(0, queries, block, device=device)[:, None]
    row_hi = torch.clamp(row_lo + block, max=queries) - 1
    col_lo = torch.arange(0, keys, block, device=device)[None, :]
    col_hi = torch.clamp(col_lo + block, max=keys) - 1
    touches = (row_hi + offset >= col_lo) & (row_lo + offset - window + 1 <= col_hi)
    full = (row_lo + offset - col_hi >= 0) & (row_hi + offset - col_lo < window)
    return (touches & ~full)[None, None], full[None, None]


def _as_indices(table: torch.Tensor):
    """Per query block: how many key blocks it lists, and their indices first (stable order)."""
    counts = table.sum(-1, dtype=torch.int32)
    order = torch.argsort((~table).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts, order


def window_block_mask(queries: int, keys: int, offset: int, window: int, device):
    from torch.nn.attention.flex_attention import BlockMask

    partial, full = block_lists(queries, keys, offset, window, device)
    return BlockMask.from_kv_blocks(
        *_as_indices(partial), *_as_indices(full), BLOCK_SIZE=BLOCK, mask_mod=band_mask_mod(window, offset),
        seq_lengths=(queries, keys),
    )


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


def flex_window_span(query, keys, values, window: int, scale: float):
    """Output float32 (B, H, c, D) and log-sum-exp float32 (B, H, c) of queries (B, H, c, D) that are the last c
    of the keys and values (B, Hkv, m, D); query head h reads key head h // (H / Hkv)."""
    from torch.nn.attention import flex_attention as flex

    c, m = query.shape[-2], keys.shape[-2]
    block_mask = window_block_mask(c, m, m - c, window, query.device)
    attend = _compiled_flex() if query.device.type == "cuda" else flex.flex_attention
    extra = {"return_aux": flex.AuxRequest(lse=True)} if hasattr(flex, "AuxRequest") else {"return_lse": True}
    if query.device.type == "cuda":  # the main kernel: for fewer than 128 queries the decoding one may find no
        extra["kernel_options"] = {"BACKEND": "TRITON"}  # config for small heads (torch 2.11, head_dim 16, GQA)
    out, aux = attend(query, keys, values, block_mask=block_mask, scale=scale,
                      enable_gqa=query.shape[1] != keys.shape[1], **extra)
    lse = aux.lse if hasattr(aux, "lse") else aux
    return out.float(), lse.float()
