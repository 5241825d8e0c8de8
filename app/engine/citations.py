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

**Fused with the passages' words.** With Qwen2.5-Coder-0.5B, recall alone put the right passage first for 42 of the
development set's 58 tune questions and BM25 over the passages (lexical.py) for 50; BM25 plus a quarter of the
recall relevance, each over its best, for 52 (``fuse``, README). Recall breaks BM25's near-ties; words alone rank a
document that lies inside the window, where recall has nothing to pick.

**Chunks, cited by page.** BM25 scores each chunk as ingest cut it, recall each page (or code chunk), and a chunk's
score fuses its own BM25 with its page's recall (``rank_chunks``); pages are cited in the order of their best chunk,
and the best chunks are quoted to the model whole (``choose_quotes``, quoting.py).

**The answer's own passage first.** Once the answer is drawn from the quoted chunks, the one whose words it shares
most is the one it was read from, and its page is cited first (``lead_with_answer_source``): a user checks an answer
against the first source. Recomputed on the answers the 1.5B gave (138 questions), the first source then held the
answer for 123 where the question's ranking alone put it first for 102 (docs/answers.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Callable, Mapping, Sequence

import torch

from ingest import Provenance

from .quoting import QUOTED_CHUNKS, densest_window, smallest_quote
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
    quote_spans: tuple[tuple[int, int], ...] = ()  # context tokens to quote of the first sources (quoting.py), if asked
    quote_sources: tuple[Provenance, ...] = ()  # the passages they are in
    attention_ranking: tuple[Provenance, ...] = ()  # each ranking's first ten passages, before fusion (benchmarks)
    lexical_ranking: tuple[Provenance, ...] = ()
    attention_scores: tuple[float, ...] = ()  # their scores
    lexical_scores: tuple[float, ...] = ()

    @property
    def quote_span(self) -> tuple[int, int] | None:
        return self.quote_spans[0] if self.quote_spans else None

    @property
    def quoted_passages(self) -> int:
        """How many passages the quotes come from: the first that many citations."""
        return passage_count(self.quote_sources)

    @classmethod
    def recall_off(cls) -> "CitationReport":
        return cls((), 0.0, recalled=False, recall_on=False)


def passage_count(places) -> int:
    """How many passages (PDF pages, text chunks) these chunks' places lie in."""
    return len({where.page_only() for where in places})


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

    @classmethod
    def of_totals(cls, positions: torch.Tensor, weights: torch.Tensor) -> "RecallTally":
        """A tally whose ``totals`` are these (distinct positions and their weights: a saved one read back)."""
        tally = cls()
        tally._positions.append(positions.to(torch.int64))
        tally._weights.append(weights.to(torch.float64))
        return tally

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


class Ranking(StrEnum):
    """How sources are ranked: the question's recall (above the neutral question's), BM25 over the passages
    (lexical.py), or both (``fuse``)."""

    ATTENTION = "attention"
    LEXICAL = "lexical"
    HYBRID = "hybrid"


# A passage's hybrid score is its BM25 score over the best one's plus this share of its recall relevance over the
# best one's. On the development set's tune split (58 questions, README), the first source held the answer for 50
# with BM25 alone, 42 with recall alone, 44 fusing their ranks (1 / (10 + rank)) and 53 with this weight (52 at 0.1,
# 52 at 0.5, 43 at 1; docs/answers.md): recall breaks BM25's near-ties, and a passage BM25 ranks low cannot win on recall alone.
ATTENTION_WEIGHT = 0.25
# The last of the quotes is recall's: the best chunk of the passage the question's recall ranks highest among those
# the chunks before it are not of. BM25 cannot find a question asked in words the document does not use, and the
# fusion above lets recall only break BM25's near-ties: on the Bash and Asymptote manuals, recall put the answer's
# page first or second for questions BM25 scored nothing on ("a double-asterisk wildcard that digs down through every
# nested subfolder", globstar), and it was not quoted. None: the fused order alone (docs/answers.md measures both).
RECALL_SLOT: int | None = 3
# A piece's last word is fed with the next piece (chat_format.py holds it back until what follows is known), so a
# passage's tokens end a word early: a quote may take this many tokens more, to end where the passage ends.
CARRIED_TOKENS = 24  # a word in digits or a long identifier takes many (Qwen splits numbers digit by digit)


def fuse(attention: Mapping[Provenance, float], lexical: Mapping[Provenance, float],
         ranking: Ranking = Ranking.HYBRID, *, attention_weight: float = ATTENTION_WEIGHT
         ) -> list[tuple[Provenance, float]]:
    """Passages best first with their scores (each list's positive scores only): one list's own scores when only
    one ranks anything, else each passage's BM25 score over the best one's plus ATTENTION_WEIGHT times its recall
    relevance over the best one's."""
    chosen = {Ranking.ATTENTION: [attention], Ranking.LEXICAL: [lexical], Ranking.HYBRID: [attention, lexical]}
    lists = [{p: s for p, s in scores.items() if s > 0} for scores in chosen[ranking]]
    if len([scores for scores in lists if scores]) < 2:
        only = next((scores for scores in lists if scores), {})
        return sorted(only.items(), key=lambda item: -item[1])
    recalled, worded = lists
    top_recall, top_words = max(recalled.values()), max(worded.values())
    fused = {p: worded.get(p, 0.0) / top_words + attention_weight * recalled.get(p, 0.0) / top_recall
             for p in recalled.keys() | worded.keys()}
    return sorted(fused.items(), key=lambda item: -item[1])


def cite(question: RecallTally, spans: SpanIndex, *, baseline: RecallTally | None = None, limit: int = 5,
         min_share: float = 0.05, snippet: Callable[[int, Span], str] | None = None,
         counts: Callable[[int], bool] | None = None, quote_budget: int = 0, quotes: int = QUOTED_CHUNKS,
         lexical: Mapping[Span, float] | None = None,
         lexical_hits: Callable[[int, int], Mapping[int, float]] | None = None,
         ranking: Ranking = Ranking.HYBRID, may_cite: Callable[[Provenance], bool] | None = None) -> CitationReport:
    """Rank the documents' chunks by their BM25 score ``lexical`` fused with the recall weight their page's content
    tokens received above ``baseline``'s (``ranking``: either alone, or both), and cite pages in the order of
    their best chunk.

    ``counts(position)`` says whether the token there is a content token (None: all count);
    ``snippet(position, span)`` gives the text shown for a passage, around its most relevant token;
    ``quote_budget``: tokens to quote of the best chunks (at most ``quotes`` of them; ``choose_quotes``), 0 for
    none; ``lexical_hits(start, end)``: the positions of the question's words there, to choose a cut chunk's
    part; ``may_cite(where)``: whether a chunk may be cited and quoted (a document the user switched off may not;
    None: all may). A citation's share is its part of the scores of the passages cited or not.
    """
    on_documents = _on_documents(spans, counts)
    recalled, document_share = _recall_share(question, on_documents)
    scores = relevance(question, baseline, on_documents) if recalled else {}
    by_passage, peak = _recall_by_passage(scores, spans)
    allowed, lexical = _citable(spans, lexical or {}, may_cite or (lambda where: True))
    chunks = rank_chunks(allowed, by_passage, lexical, ranking)
    if ranking == Ranking.HYBRID and RECALL_SLOT is not None:
        chunks = with_recall_slot(chunks, by_passage, RECALL_SLOT)
    best_chunk = _best_chunks(chunks)
    if not best_chunk:
        return CitationReport((), document_share, recalled=recalled)
    hits = lexical_hits or (lambda start, end: {})
    quoted = choose_quotes(chunks, spans, scores, hits, quote_budget, quotes) if quote_budget else []
    always = max(1, passage_count(chunk.where for chunk, _ in quoted))  # the passages quoted are always cited

    def shown(key: Provenance) -> tuple[str, Span]:
        return _passage_snippet(snippet, peak.get(key), best_chunk[key][0], spans, hits)

    return CitationReport(_citations(best_chunk, shown, always, limit, min_share), document_share, recalled=recalled,
                          quote_spans=tuple(part for _, part in quoted),
                          quote_sources=tuple(chunk.where for chunk, _ in quoted),
                          **_rankings(by_passage, lexical))


def _on_documents(spans: SpanIndex, counts: Callable[[int], bool] | None) -> Callable[[int], bool]:
    """Whether the token at a position counts for the documents: it is in one, and a content token."""
    def on_documents(position: int) -> bool:
        span = spans.at(position)
        return span is not None and span.kind == SpanKind.DOCUMENT and (counts is None or counts(position))
    return on_documents


def _recall_share(question: RecallTally, on_documents: Callable[[int], bool]) -> tuple[bool, float]:
    """Whether recall picked any token, and the fraction of its weight that landed on documents."""
    positions, weights = question.totals()
    total = sum(weights)
    if total <= 0:
        return False, 0.0
    return True, sum(w for p, w in zip(positions, weights) if on_documents(p)) / total


def _citable(spans: SpanIndex, lexical: Mapping[Span, float], may_cite: Callable[[Provenance], bool]
             ) -> tuple[list[Span], dict[Span, float]]:
    """The document chunks that may be cited, and their BM25 scores."""
    allowed = [s for s in spans.documents() if s.where is not None and may_cite(s.where)]
    return allowed, {chunk: score for chunk, score in lexical.items() if may_cite(chunk.where)}


def _recall_by_passage(scores: Mapping[int, float], spans: SpanIndex
                       ) -> tuple[dict[Provenance, float], dict[Provenance, tuple[float, int, Span]]]:
    """Each passage's summed relevance, and its most relevant token (score, position, span). PDF passages are
    pages, text and code passages their chunks."""
    by_passage: dict[Provenance, float] = {}
    peak: dict[Provenance, tuple[float, int, Span]] = {}
    for position, score in scores.items():
        span = spans.at(position)
        key = span.where.page_only()
        by_passage[key] = by_passage.get(key, 0.0) + score
        if score > peak.get(key, (float("-inf"),))[0]:
            peak[key] = (score, position, span)
    return by_passage, peak


def _best_chunks(ranked: list[tuple[Span, float]]) -> dict[Provenance, tuple[Span, float]]:
    """Each passage's best chunk and its score, the passages in the order of their best chunk."""
    best: dict[Provenance, tuple[Span, float]] = {}
    for chunk, score in ranked:
        best.setdefault(chunk.where.page_only(), (chunk, score))
    return best


def _passage_snippet(snippet: Callable[[int, Span], str] | None, peak: tuple[float, int, Span] | None, chunk: Span,
                     spans: SpanIndex, hits: Callable[[int, int], Mapping[int, float]]) -> tuple[str, Span]:
    """The text shown for a passage and the chunk it is of: around its most relevant token, which may be in
    another of its chunks than its best ``chunk``, else the first of the question's words in ``chunk``; none
    without either (or without ``snippet``), of ``chunk``."""
    if peak is not None and peak[0] > 0:
        where = peak[1:]
    else:
        first = min(hits(chunk.start, chunk.end), default=None)
        where = (first, spans.at(first)) if first is not None else None
    return (snippet(*where), where[1]) if snippet and where else ("", chunk)


def _citations(best_chunk: dict[Provenance, tuple[Span, float]], shown: Callable[[Provenance], tuple[str, Span]],
               always: int, limit: int, min_share: float) -> tuple[Citation, ...]:
    """The first ``always`` passages, then those among the first ``limit`` above ``min_share`` of the scores of the
    passages cited or not; ``shown``: a passage's snippet and the chunk it is of, whose heading the citation
    shows (the section the snippet is in, not the one of another chunk of the page)."""
    mass = sum(score for _, score in best_chunk.values())
    citations = []
    for rank, (key, (_, score)) in enumerate(list(best_chunk.items())[:max(limit, always)]):
        if rank >= always and score / mass < min_share:  # the others above min_share
            continue
        text, chunk = shown(key)
        citations.append(Citation(with_heading_of(key, chunk), score / mass, text))
    return tuple(citations)


def with_heading_of(where: Provenance, chunk: Span) -> Provenance:
    """A cited passage (a page) under the heading of its ``chunk`` whose snippet it shows."""
    return replace(where, heading=chunk.where.heading)


def _rankings(attention: Mapping[Provenance, float], lexical: Mapping[Span, float]) -> dict:
    """Each ranking's first ten passages and their scores, before fusion (CitationReport's, for the benchmarks)."""
    lexical_pages: dict[Provenance, float] = {}
    for chunk, score in sorted(lexical.items(), key=lambda item: -item[1]):
        lexical_pages.setdefault(chunk.where.page_only(), score)
    return {"attention_ranking": _top(attention), "lexical_ranking": _top(lexical_pages),
            "attention_scores": tuple(attention[k] for k in _top(attention)),
            "lexical_scores": tuple(lexical_pages[k] for k in _top(lexical_pages))}


def lead_with_answer_source(report: CitationReport, support: Sequence[float]) -> CitationReport:
    """``report`` with the page of the quoted chunk the answer was drawn from cited first. ``support``: each quoted
    chunk's BM25 score for the answer's words, in quote order (``report.quote_sources``). The first citation stays
    first unless another quoted page's chunk supports the answer strictly better; with no support at all (an
    answer in other words than the quotes', or none quoted) the question's order stands."""
    if not report.citations or not support or max(support) <= 0:
        return report
    best: dict[Provenance, float] = {}
    for where, score in zip(report.quote_sources, support):
        page = where.page_only()
        best[page] = max(score, best.get(page, 0.0))
    lead = max(best, key=best.get)
    first = report.citations[0]
    if lead == first.where or best[lead] <= best.get(first.where, 0.0):
        return report
    moved = next((c for c in report.citations if c.where == lead), None)
    if moved is None:
        return report
    return replace(report, citations=(moved, *(c for c in report.citations if c is not moved)))


def rank_chunks(chunks: list[Span], attention: Mapping[Provenance, float], lexical: Mapping[Span, float],
                ranking: Ranking = Ranking.HYBRID) -> list[tuple[Span, float]]:
    """Chunks best first with their scores (``fuse``): each chunk's BM25 score, and its passage's recall relevance.
    Recall is summed per passage, where the tune split measured it (a chunk's own share is thinner and noisier);
    BM25 tells a page's chunks apart. Chunks of equal score stay in context order. Contents and index lines
    (``Provenance.listing``) come after every other chunk that scored: they name a question's words without
    answering it (ingest/listing.py)."""
    recalled = {chunk: attention.get(chunk.where.page_only(), 0.0) for chunk in chunks}
    return sorted(fuse(recalled, lexical, ranking), key=lambda item: item[0].where.listing)


def with_recall_slot(ranked: list[tuple[Span, float]], attention: Mapping[Provenance, float], slot: int
                     ) -> list[tuple[Span, float]]:
    """``ranked`` with the best chunk of the passage ``attention`` (recall) ranks highest among those the first
    ``slot`` chunks are not of moved up to ``slot`` (RECALL_SLOT); contents and index chunks are not moved. As
    ranked when recall ranked nothing or that chunk is there already."""
    before = {chunk.where.page_only() for chunk, _ in ranked[:slot]}
    for passage, score in sorted(attention.items(), key=lambda item: -item[1]):
        if score <= 0:
            break
        if passage in before:
            continue
        at = next((i for i, (chunk, _) in enumerate(ranked[slot:], slot)
                   if chunk.where.page_only() == passage and not chunk.where.listing), None)
        if at is not None:
            return [*ranked[:slot], ranked[at], *ranked[slot:at], *ranked[at + 1:]]
    return ranked


def choose_quotes(ranked: list[tuple[Span, float]], spans: SpanIndex, attention: Mapping[int, float],
                  lexical_hits: Callable[[int, int], Mapping[int, float]], budget: int,
                  limit: int = QUOTED_CHUNKS) -> list[tuple[Span, tuple[int, int]]]:
    """The best chunks to quote and the tokens of each: whole, best first, while they fit in ``budget`` and at most
    ``limit``; the first that does not fit is cut to its densest part (``_densest_part``) if at least
    ``smallest_quote`` tokens are left, and quoting stops there. Tokens a chosen neighbour quotes already (its
    last word, fed with the next chunk) are not quoted twice."""
    chosen: list[tuple[Span, tuple[int, int]]] = []
    left, smallest = budget, smallest_quote(budget)
    for chunk, _ in ranked:
        if len(chosen) == limit:
            break
        start, end = _quotable(spans, chunk)
        for lo, hi in (part for _, part in chosen):  # neighbours already quoted: their tokens once
            start = hi if lo <= start < hi else start
            end = lo if lo < end <= hi else end
        if end <= start:
            continue
        if end - start <= left:
            part = (start, end)
        elif left >= smallest:
            part = _densest_part(start, end, attention, lexical_hits(start, end), left)
        else:
            break
        chosen.append((chunk, part))
        left -= part[1] - part[0]
    return chosen


def _quotable(spans: SpanIndex, chunk: Span) -> tuple[int, int]:
    """The chunk's tokens and its last word, which was fed with the next chunk (CARRIED_TOKENS)."""
    following = spans.at(chunk.end)
    if following is not None and following.kind == SpanKind.DOCUMENT:
        return chunk.start, min(following.end, chunk.end + CARRIED_TOKENS)
    return chunk.start, chunk.end


def _top(scores: Mapping[Provenance, float], count: int = 10) -> tuple[Provenance, ...]:
    return tuple(sorted((p for p, s in scores.items() if s > 0), key=lambda p: -scores[p])[:count])


def _densest_part(start: int, end: int, attention: Mapping[int, float], lexical: Mapping[int, float],
                  size: int) -> tuple[int, int]:
    """The ``size`` tokens of ``[start, end)`` that hold the most relevance: its recall relevance and the positions
    of the question's words, each normalised over the range so that neither drowns the other."""
    combined: dict[int, float] = {}
    for part in (attention, lexical):
        inside = {p: v for p, v in part.items() if start <= p < end and v > 0}
        total = sum(inside.values())
        for p, v in inside.items():
            combined[p] = combined.get(p, 0.0) + v / total
    return densest_window(combined, start, end, size)
