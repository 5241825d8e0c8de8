"""Attention-grounded sources: the pages and line ranges top-k recall attended to while answering.

While the answer is decoded, LM-Infinite reports, per layer and head, which middle tokens it recalled and
with what softmax weight. Summing those weights per token and mapping tokens to their document spans
ranks the passages the model actually looked at, instead of guessing them by text similarity.

Only content tokens count. Measured on SmolLM2 over a 9,700-token specification, half of all recall weight
went to a handful of tokens such as " the", " " and "\n" wherever they stood, whatever the question: attention
sinks beyond the window, as the first tokens are within it. Words, names and numbers carried the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from ingest import Provenance

from .spans import Span, SpanIndex, SpanKind


@dataclass(frozen=True)
class Citation:
    """One cited passage, its share of the recall weight that fell on documents, and the text it peaked on."""

    where: Provenance  # a PDF page, or a text chunk's line range
    share: float
    snippet: str = ""  # the context around the passage's most-recalled token

    def as_dict(self) -> dict:
        return {**self.where.as_dict(), "share": round(self.share, 4), "snippet": self.snippet}


@dataclass(frozen=True)
class CitationReport:
    """citations: best first. document_share: fraction of all recall weight that landed on documents."""

    citations: tuple[Citation, ...]
    document_share: float
    recalled: bool  # False when recall never picked a token (off, or the context fits the window)


class RecallTally:
    """Observer callback for ``lminfinite.observe_topk``: accumulates weight per recalled position."""

    def __init__(self) -> None:
        self._positions: list[torch.Tensor] = []
        self._weights: list[torch.Tensor] = []

    def __call__(self, selection) -> None:
        weights = selection.weights.reshape(-1)
        keep = weights > 0  # weight 0 marks slots with fewer than k candidates
        self._positions.append(selection.positions.reshape(-1)[keep])
        self._weights.append(weights[keep].double())

    def totals(self) -> tuple[list[int], list[float]]:
        """Distinct positions and their summed weights."""
        if not self._positions:
            return [], []
        positions = torch.cat(self._positions)
        if positions.numel() == 0:
            return [], []
        unique, inverse = torch.unique(positions, return_inverse=True)
        sums = torch.zeros(unique.numel(), dtype=torch.float64).scatter_add_(0, inverse, torch.cat(self._weights))
        return unique.tolist(), sums.tolist()


# Function words that collect recall weight as attention sinks; a passage is cited for what it says.
FUNCTION_WORDS = frozenset(
    "a an and are as at be but by for from has have he her his i if in into is it its of on or our she so than "
    "that the their them then there these they this to was we were what when where which who will with you your".split()
)
_WORDLIKE = re.compile(r"[^\W_]", re.UNICODE)


def is_content_token(text: str) -> bool:
    """A token that says something: a letter or digit in it, and not one of the function words."""
    return bool(_WORDLIKE.search(text)) and text.strip().lower() not in FUNCTION_WORDS


def content_token_ids(tokenizer) -> frozenset[int]:
    """Ids of the vocabulary's content tokens (special tokens excluded), computed once per tokenizer."""
    special = set(tokenizer.all_special_ids)
    return frozenset(i for i in range(len(tokenizer))
                     if i not in special and is_content_token(tokenizer.decode([i])))


def cite(tally: RecallTally, spans: SpanIndex, *, limit: int = 5, min_share: float = 0.05,
         snippet: Callable[[int, Span], str] | None = None,
         counts: Callable[[int], bool] | None = None) -> CitationReport:
    """Rank document passages by the recall weight their content tokens received.

    ``counts(position)`` says whether the token there is a content token (None: all count);
    ``snippet(position, span)`` gives the text shown for a passage, around its most-recalled token.
    """
    positions, weights = tally.totals()
    total = sum(weights)
    if total <= 0:
        return CitationReport((), 0.0, recalled=False)
    by_passage: dict[Provenance, float] = {}
    peak: dict[Provenance, tuple[float, int, Span]] = {}  # the passage's most-recalled token
    on_documents = 0.0
    for position, weight in zip(positions, weights):
        span = spans.at(position)
        if span is None or span.kind != SpanKind.DOCUMENT or (counts is not None and not counts(position)):
            continue
        key = span.where.page_only()  # PDF passages are cited per page, text and code per chunk
        by_passage[key] = by_passage.get(key, 0.0) + weight
        if weight > peak.get(key, (-1.0,))[0]:
            peak[key] = (weight, position, span)
        on_documents += weight
    if on_documents <= 0:
        return CitationReport((), 0.0, recalled=True)
    ranked = sorted(by_passage.items(), key=lambda item: -item[1])
    citations = tuple(  # the best passage is always cited; the rest only above min_share
        Citation(key, weight / on_documents, snippet(*peak[key][1:]) if snippet else "")
        for rank, (key, weight) in enumerate(ranked[:limit])
        if rank == 0 or weight / on_documents >= min_share
    )
    return CitationReport(citations, on_documents / total, recalled=True)
