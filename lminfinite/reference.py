"""A dense float64 LM-Infinite, written to be obviously right; for tests and benchmarks only.

Everything is an explicit n × n matrix: distances, the Λ-mask, the distance ceiling and the top-k
middle selection, each line matched to the paper's §4. It is O(L · n²): use it on short sequences.
"""

from __future__ import annotations

import copy

import torch
from transformers import AttentionInterface

from .config import LMInfiniteConfig
from .patch import enable

REFERENCE_NAME = "lminfinite_reference"


def _rotate(x: torch.Tensor, distance: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE rotation by ``distance`` in float64, HF's rotate_half layout: x·cos + rotate_half(x)·sin."""
    angle = distance * inv_freq.to(x.device, torch.float64)
    cos, sin = torch.cat((angle, angle)).cos(), torch.cat((angle, angle)).sin()
    half = x.shape[-1] // 2
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated_half * sin


def reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                        lminfinite_state=None, lminfinite_cache=None, **kwargs):
    """LM-Infinite attention for a whole sequence (no cache): query i and key j are positions i and j."""
    if lminfinite_cache is not None:
        raise ValueError("the reference runs whole sequences: call the model with use_cache=False")
    cfg, rope, layer = lminfinite_state.config, lminfinite_state.rope, module.layer_idx
    L, n_starting = cfg.window, cfg.n_starting
    q, k, v = query.double(), key.double(), value.double()
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)  # query head h reads key/value head h // groups
    v = v.repeat_interleave(groups, dim=1)
    scale = (module.head_dim**-0.5 if scaling is None else scaling) * rope.attention_scaling**2
    n = q.shape[2]

    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    distance = i - j                                   # d(i, j), the relative distance
    causal = distance >= 0                              # j <= i
    in_window = distance < L                            # §4 ending span: the most recent L tokens (d = 0..L-1)
    is_starting = j < n_starting                        # §4 starting span: the first n_starting tokens
    lambda_mask = causal & (in_window | is_starting)    # §4 Λ-shaped mask
    ceiling = distance.clamp(max=L)                     # §4 distance ceiling d' = min(d, L)

    # logit(i, j) = <R(d'(i, j)) q_i, k_j> / sqrt(D): rotating the query by d' equals rotating q_i, k_j
    # by their positions when d' = d, and scores starting tokens beyond the window at distance L exactly.
    logits = torch.zeros(q.shape[0], q.shape[1], n, n, dtype=torch.float64)
    for d in range(0, min(L, n - 1) + 1):
        scores_at_d = _rotate(q, d, rope.inv_freq) @ k.transpose(-1, -2) * scale
        logits = torch.where(ceiling == d, scores_at_d, logits)
    allowed = lambda_mask.expand_as(logits)

    if cfg.topk > 0 and layer >= cfg.topk_from_layer:   # App. A.3: layers >= h only
        middle = causal & ~lambda_mask                  # neither starting nor in the window
        middle_scores = _rotate(q, cfg.topk_distance, rope.inv_freq) @ k.transpose(-1, -2) * scale
        candidates = middle_scores.masked_fill(~middle, float("-inf"))
        top_values, top_index = candidates.topk(min(cfg.topk, n), dim=-1)   # per row (every query), per head
        chosen = torch.zeros_like(allowed).scatter(-1, top_index, top_values > float("-inf"))
        logits = torch.where(chosen, middle_scores, logits)                  # recalled at distance topk_distance
        allowed = allowed | chosen

    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    out = weights @ v
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


AttentionInterface.register(REFERENCE_NAME, reference_attention)


class ReferenceModel:
    """A float64 copy of ``model`` running the dense reference; ``logits`` and ``greedy`` on whole sequences."""

    def __init__(self, model, config: LMInfiniteConfig | None = None):
        self.model = copy.deepcopy(model).to(torch.float64).eval()
        enable(self.model, config or LMInfiniteConfig(), attention=REFERENCE_NAME)

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
