"""A dense LM-Infinite (float64 by default), written to be obviously right; for tests and benchmarks only.

Everything is an explicit n × n matrix: distances, the Λ-mask, the distance ceiling and the top-k middle
selection, each line matched to the paper's §4. It also computes the paper's ablations (Fig. 5):
``lambda_only`` (Λ-mask, true distances) and ``ceiling_only`` (all tokens, distances capped at L); the
window-only ablation is ``variant="lminfinite"`` with ``n_starting=0``. O(n²) memory: short sequences only.
Each (variant, dtype) is its own registered attention function, so the patched model's state holds nothing
the reference alone needs.
"""

from __future__ import annotations

import copy
from functools import partial

import torch
from transformers import AttentionInterface

from .config import LMInfiniteConfig
from .key_context import KeyContext
from .patch import enable

REFERENCE_NAME = "lminfinite_reference"
VARIANTS = ("lminfinite", "lambda_only", "ceiling_only")


def _rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE in HF's rotate_half layout: row r of x rotated by angle positions[r] · inv_freq."""
    angle = positions.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
    cos, sin = torch.cat((angle, angle), -1).cos().to(x.dtype), torch.cat((angle, angle), -1).sin().to(x.dtype)
    half = x.shape[-1] // 2
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated_half * sin


def reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                        lminfinite_state=None, lminfinite_config=None, *, variant: str = "lminfinite",
                        dtype: torch.dtype = torch.float64, **kwargs):
    """LM-Infinite attention for a whole sequence (no cache), in ``dtype``: query i and key j are positions i and j."""
    if isinstance(key, KeyContext) or key.shape[-2] != query.shape[-2]:
        raise ValueError("the reference runs whole sequences: call the model with use_cache=False")
    state = lminfinite_state
    cfg, inv_freq, layer = lminfinite_config or state.config, state.rope.inv_freq, module.layer_idx
    L, n_starting = cfg.window, cfg.n_starting
    work = dtype
    q, k, v = query.to(work), key.to(work), value.to(work)
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)  # query head h reads key/value head h // groups
    v = v.repeat_interleave(groups, dim=1)
    scale = (module.head_dim**-0.5 if scaling is None else scaling) * state.rope.attention_scaling**2
    n = q.shape[2]
    positions = torch.arange(n, device=q.device)

    i = positions[:, None]
    j = positions[None, :]
    distance = i - j                                   # d(i, j), the relative distance
    causal = distance >= 0                              # j <= i
    in_window = distance < L                            # §4 ending span: the most recent L tokens (d = 0..L-1)
    is_starting = j < n_starting                        # §4 starting span: the first n_starting tokens
    lambda_mask = causal & (in_window | is_starting)    # §4 Λ-shaped mask

    # RoPE logits at the true distance: <R(i) q_i, R(j) k_j> depends on i - j only.
    true_logits = _rotate(q, positions, inv_freq) @ _rotate(k, positions, inv_freq).transpose(-1, -2) * scale
    # §4 distance ceiling, d' = min(d, L): beyond the window the key stays unrotated, the query rotated to L.
    ceiling_logits = _rotate(q, torch.full_like(positions, L), inv_freq) @ k.transpose(-1, -2) * scale
    capped_logits = torch.where(in_window, true_logits, ceiling_logits)

    if variant == "lminfinite":
        logits, allowed = capped_logits, lambda_mask
    elif variant == "lambda_only":                      # Fig. 5 "Λ": the mask without the ceiling
        logits, allowed = true_logits, lambda_mask
    elif variant == "ceiling_only":                     # Fig. 5 "ceiling": every token, capped distances
        logits, allowed = capped_logits, causal
    else:
        raise ValueError(f"unknown reference variant {variant!r}; choose from {VARIANTS}")
    allowed = allowed.expand_as(logits)

    if cfg.topk > 0 and layer >= cfg.topk_from_layer and variant == "lminfinite":   # App. A.3: layers >= h
        middle = causal & ~lambda_mask                  # neither starting nor in the window
        at_distance = torch.full_like(positions, cfg.topk_distance)
        middle_logits = _rotate(q, at_distance, inv_freq) @ k.transpose(-1, -2) * scale
        candidates = middle_logits.masked_fill(~middle, float("-inf"))
        top_values, top_index = candidates.topk(min(cfg.topk, n), dim=-1)  # per row (every query), per head
        chosen = torch.zeros_like(allowed).scatter(-1, top_index, top_values > float("-inf"))
        logits = torch.where(chosen, middle_logits, logits)                  # recalled at distance topk_distance
        allowed = allowed | chosen

    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    out = weights @ v
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def reference_attention_name(variant: str, dtype: torch.dtype) -> str:
    """The attention-interface name of ``variant`` computed in ``dtype``; registers it (again: the same function)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown reference variant {variant!r}; choose from {VARIANTS}")
    name = f"{REFERENCE_NAME}_{variant}_{str(dtype).removeprefix('torch.')}"
    AttentionInterface.register(name, partial(reference_attention, variant=variant, dtype=dtype))
    return name


AttentionInterface.register(REFERENCE_NAME, reference_attention)  # variant "lminfinite", float64


class ReferenceModel:
    """A copy of ``model`` in ``dtype`` (float64) running the dense reference; ``logits`` and ``greedy``."""

    def __init__(self, model, config: LMInfiniteConfig | None = None, *, variant: str = "lminfinite",
                 dtype: torch.dtype = torch.float64, copy_model: bool = True):
        name = reference_attention_name(variant, dtype)  # refuses unknown variants before copying the model
        self.model = (copy.deepcopy(model) if copy_model else model).to(dtype).eval()
        enable(self.model, config or LMInfiniteConfig(), attention=name)

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits

    @torch.no_grad()
    def greedy(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy continuation by re-running the whole sequence for every new token (no cache anywhere)."""
        ids = input_ids
        for _ in range(max_new_tokens):
            next_id = self.logits(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat((ids, next_id), dim=-1)
        return ids[:, input_ids.shape[1]:]
