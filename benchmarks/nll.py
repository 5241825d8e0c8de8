"""Negative log-likelihood per token position, far beyond the training length (paper Fig. 3/5, Table 1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.methods import Variants


def heldout_sequences(tokenizer, length: int, count: int) -> torch.Tensor:
    """``count`` rows of ``length`` tokens of held-out standard-library code (never trained on)."""
    from training.evaluate import heldout_windows

    return heldout_windows(tokenizer, length, count)


@torch.no_grad()
def nll_by_position(variants: Variants, method: str, sequences: torch.Tensor) -> torch.Tensor:
    """Mean NLL (nats) of predicting token t+1 at each position t, over the rows of ``sequences``."""
    model = variants.model_for(method)
    device = next(model.parameters()).device
    total = torch.zeros(sequences.shape[1] - 1, dtype=torch.float64)
    for row in sequences:
        ids = row[None].to(device)
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        total += F.cross_entropy(logits, ids[0, 1:], reduction="none").double().cpu()
    return total / len(sequences)


def buckets(length: int, window: int) -> list[tuple[int, int]]:
    """[0, L), [L, 2L), [2L, 4L), ... up to ``length``: doubling spans, like the paper's milestones."""
    spans, lo, hi = [], 0, window
    while lo < length:
        spans.append((lo, min(hi, length)))
        lo, hi = hi, hi * 2
    return spans


def bucket_means(nll: torch.Tensor, spans: list[tuple[int, int]]) -> list[float]:
    return [float(nll[lo:hi].mean()) for lo, hi in spans]
