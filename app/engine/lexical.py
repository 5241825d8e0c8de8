"""Keyword ranking of the context's passages: BM25 (the ``bm25s`` package) over the documents' chunks, which
citations group into the passages they name (a PDF's pages, a text or code file's chunks).

Why beside the model's own attention: on the first development set, BM25 put the passage holding the answer
first for 31 of 36 questions where the question's recall did for 26 (issue "Right answers"); each misses
questions the other finds, and recall cannot see the passages still inside the window at all. Citations fuse
the two rankings (citations.py). Words are matched in lower case, identifiers also by their parts
(``max_help_position`` and ``maxHelpPosition`` as max, help, position), and function words are ignored.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

from .spans import Span, SpanKind

_WORD = re.compile(r"[^\W_]+(?:_+[^\W_]+)*", re.UNICODE)  # letters and digits, joined by underscores
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
STOP_WORDS = frozenset(
    "a an and are as at be but by can could did do does for from had has have he her his how i if in into is it "
    "its may me might must my no not of on or our shall she should so some such than that the their them then "
    "there these they this those to was we were what when where which while who whom why will with would you "
    "your about after all also any been before being between both each few more most other over same under until "
    "up very".split()
)


def terms(text: str) -> list[str]:
    """The words BM25 matches: each word in lower case, and the parts of identifiers that have several."""
    found = []
    for match in _WORD.finditer(text):
        word = match.group()
        parts = [p for piece in word.split("_") for p in _CAMEL.findall(piece)] or [word]
        for term in dict.fromkeys([word.lower(), *(p.lower() for p in parts)]):
            if term not in STOP_WORDS:
                found.append(term)
    return found


# The question asked before counts this much beside the question's own words: enough to break a follow-up's near-ties
# toward the passage the conversation is about, too little to pull a question on another topic back. Recomputed on
# the development set's 138 questions (each asked after the one before it, nearly all on their own): the first
# chunk by BM25 held the answer for 107 without it, 108 at 0.1, 103 at 0.2, 92 at 0.5 (docs/answers.md).
EARLIER_WEIGHT = 0.1
# The passage the model writes before searching (guess.py) counts this much: the weight named before it was measured
# on the development set's 306 questions (first four 255, first chunk 194); 0.25 and 1, computed beside it, found
# 250 and 255, 196 and 199 (docs/answers.md).
GUESS_WEIGHT = 0.5


def indexed_text(span: Span, text_of: Callable[[Span], str]) -> str:
    """What BM25 reads for a chunk: its heading in the document's outline, when it has one, then its words. Over
    the development set's 212 questions, BM25's first chunk held the answer's page for 151 with the heading, 148
    without (docs/answers.md)."""
    heading = span.where.heading if span.where is not None else None
    return f"{heading}\n{text_of(span)}" if heading else text_of(span)


class ChunkIndex:
    """BM25 over the context's document chunks (one span each, as ingest cut them), built again only when its
    documents changed (``refresh``). Chunks, not pages: a PDF page often holds more than one quote's worth, and
    the chunk that states the answer is what a quote needs (quoting.py)."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self.chunks: list[Span] = []
        self._retriever = None

    def refresh(self, spans: Sequence[Span], text_of: Callable[[Span], str]) -> None:
        documents = [s for s in spans if s.kind == SpanKind.DOCUMENT and s.where is not None]
        key = (len(documents), documents[-1].end if documents else 0, documents[0].start if documents else 0)
        if key == self._key:
            return
        import bm25s

        self.chunks = documents
        self._retriever = None
        if documents:
            retriever = bm25s.BM25()
            retriever.index([terms(indexed_text(span, text_of)) or ["\u2205"] for span in documents],
                            show_progress=False)
            self._retriever = retriever
        self._key = key

    def scores(self, question: str, earlier: str = "", guess: str = "") -> dict[Span, float]:
        """Each chunk's BM25 score for ``question`` (those above 0), plus EARLIER_WEIGHT times its score for
        ``earlier``, the question asked before it: what a follow-up such as "and what does it return?" is about;
        plus GUESS_WEIGHT times its score for ``guess``, the passage the model wrote before searching (guess.py)."""
        weighted = [(terms(question), 1.0), (terms(earlier), EARLIER_WEIGHT), (terms(guess), GUESS_WEIGHT)]
        weighted = [(query, weight) for query, weight in weighted if query]
        if self._retriever is None or not weighted:
            return {}
        values = sum(weight * self._retriever.get_scores(query) for query, weight in weighted)
        return {span: float(v) for span, v in zip(self.chunks, values) if v > 0}


def token_matches(pieces: Sequence[str], question: str) -> list[bool]:
    """For each token (its decoded text, in order), whether the word it belongs to is one of the question's terms:
    where in a passage the question's words are, to choose the part of it to quote."""
    return [term is not None for term in matched_terms(pieces, set(terms(question)))]


def matched_terms(pieces: Sequence[str], wanted: set[str]) -> list[str | None]:
    """For each token (its decoded text, in order), the first of ``wanted``'s terms that the word it belongs to
    has, or None."""
    text, starts = "", []
    for piece in pieces:
        starts.append(len(text))
        text += piece
    found: list[str | None] = [None] * len(pieces)
    owner = 0
    for match in _WORD.finditer(text):
        term = next((t for t in terms(match.group()) if t in wanted), None)
        if term is None:
            continue
        while owner + 1 < len(starts) and starts[owner + 1] <= match.start():
            owner += 1
        token = owner
        while token < len(pieces) and starts[token] < match.end():
            found[token] = term
            token += 1
    return found
