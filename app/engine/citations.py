"""Attention-grounded sources: the pages and line ranges top-k recall attended to while reading the question.

While the question is prefilled, LM-Infinite reports, per layer and head, which middle tokens it recalled and
with what softmax weight. Summing those weights per token and mapping tokens to their document spans ranks
the passages the model looked at, instead of guessing them by text similarity.

Three choices, each measured on SmolLM2 over 42 questions about two PDF manuals and a Python module
(README, *Quality beyond the training length (SmolLM2-135M-Instruct)*; ``benchmarks/docqa.py``):

- **The question's recall, not the answer's.** A small model's answer drifts; while it reads the question,
  its recall goes to the passage the question is about.
- **Only content tokens count.** Half of all recall weight went to a handful of tokens such as " the", " "
  and "\n" wherever they stood, whatever the question: attention sinks beyond the window.
- **Minus a neutral question's recall.** Every question draws weight to the same few places (a title page,
  a repetitive table); a question's own passage is where its recall exceeds that of a question that asks
  nothing in particular (``NEUTRAL_QUESTION``, fed at the same point and rolled back).

Together these took the questions whose first source holds the answer from 6 of 42 (the answer's recall on
every token) to 32.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from ingest import Provenance

from .quoting import densest_window
from .spans import Span, SpanIndex, SpanKind


@dataclass(frozen=True)
class Citation:
    """One cited passage, its share of the relevance of every passage above the baseline (``cite``; the
    shares of those cited can add up to less than 1), and the text it peaked on."""

    where: Provenance  # a PDF page, or a text chunk's line range
    share: float
    snippet: str = ""  # the context around the passage's most relevant token

    def as_dict(self) -> dict:
        return {**self.where.as_dict(), "share": round(self.share, 4), "snippet": self.snippet}


@dataclass(frozen=True)
class CitationReport:
    """citations: best first. document_share: fraction of all recall weight that landed on documents."""

    citations: tuple[Citation, ...]
    document_share: float
    recalled: bool  # False when recall never picked a token (off, or the context fits the window)
    recall_on: bool = True  # whether the question was read with recall (an answer drawn again keeps its sources)
    quote_span: tuple[int, int] | None = None  # context tokens of the first source to quote (quoting.py), if asked

    @classmethod
    def recall_off(cls) -> "CitationReport":
        return cls((), 0.0, recalled=False, recall_on=False)


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


NEUTRAL_QUESTION = "What does the text say?"  # the baseline's question: asks about nothing in particular


def relevance(question: RecallTally, baseline: RecallTally | None,
              keeps: Callable[[int], bool]) -> dict[int, float]:
    """Per position kept: its share of the question's recall weight on kept positions, minus its share of the
    baseline's (both normalised over kept positions, so the two are comparable whatever their totals)."""
    mine = _shares(question, keeps)
    if baseline is None:
        return mine
    theirs = _shares(baseline, keeps)
    return {p: mine.get(p, 0.0) - theirs.get(p, 0.0) for p in mine.keys() | theirs.keys()}


def _shares(tally: RecallTally, keeps: Callable[[int], bool]) -> dict[int, float]:
    positions, weights = tally.totals()
    kept = {p: w for p, w in zip(positions, weights) if keeps(p)}
    total = sum(kept.values())
    return {p: w / total for p, w in kept.items()} if total > 0 else {}


def cite(question: RecallTally, spans: SpanIndex, *, baseline: RecallTally | None = None, limit: int = 5,
         min_share: float = 0.05, snippet: Callable[[int, Span], str] | None = None,
         counts: Callable[[int], bool] | None = None, quote_tokens: int = 0) -> CitationReport:
    """Rank document passages by the recall weight their content tokens received, above ``baseline``'s.

    ``counts(position)`` says whether the token there is a content token (None: all count);
    ``snippet(position, span)`` gives the text shown for a passage, around its most relevant token;
    ``quote_tokens``: the size of the first passage's part to quote (``densest_window``), 0 for none.
    A citation's share is its part of the summed relevance of the passages that have any.
    """
    positions, weights = question.totals()
    total = sum(weights)
    if total <= 0:
        return CitationReport((), 0.0, recalled=False)

    def on_documents(position: int) -> bool:
        span = spans.at(position)
        return span is not None and span.kind == SpanKind.DOCUMENT and (counts is None or counts(position))

    document_share = sum(w for p, w in zip(positions, weights) if on_documents(p)) / total
    by_passage: dict[Provenance, float] = {}
    peak: dict[Provenance, tuple[float, int, Span]] = {}  # the passage's most relevant token
    scores = relevance(question, baseline, on_documents)
    for position, score in scores.items():
        span = spans.at(position)
        key = span.where.page_only()  # PDF passages are cited per page, text and code per chunk
        by_passage[key] = by_passage.get(key, 0.0) + score
        if score > peak.get(key, (float("-inf"),))[0]:
            peak[key] = (score, position, span)
    ranked = sorted(((key, score) for key, score in by_passage.items() if score > 0), key=lambda item: -item[1])
    mass = sum(score for _, score in ranked)
    citations = tuple(  # the best passage is always cited; the rest only above min_share
        Citation(key, score / mass, snippet(*peak[key][1:]) if snippet else "")
        for rank, (key, score) in enumerate(ranked[:limit])
        if rank == 0 or score / mass >= min_share
    )
    quote_span = None
    if quote_tokens and citations:
        first = citations[0].where
        same_passage = lambda span: span.where is not None and span.where.page_only() == first  # noqa: E731
        start, end = spans.around(peak[first][1], same_passage)
        quote_span = densest_window(scores, start, end, quote_tokens)
    return CitationReport(citations, document_share, recalled=True, quote_span=quote_span)
