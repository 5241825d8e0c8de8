"""Quoting the top sources: the passages the question's sources rank first are quoted with the question, and the
answer is drawn from them.

Ranking finds the right passage far more often than a small model can use it from the middle of a long context:
on 42 questions about two PDF manuals and a Python module, SmolLM2-135M's first source held the answer for 32, but
it answered 6 right (docs/smollm2.md). Given the cited page with recall off, and asked to answer from it, it
answers 20; with recall still on, the middle tokens recall pulls in distract it from the quote.

So an answer is drawn as follows (``ContextEngine.ask``): the question is read with recall, which with BM25 ranks
the documents' chunks (citations.py); the context goes back before it; the best chunks and the question are
read in a reader of their own (reader.py), without recall, and the answer is sampled there; then the context reads
the question and the answer. The quote helps one answer and leaves nothing behind, so a conversation's history
stays its questions and answers (history.py), and a context rebuilt from it is the same.
"""

from __future__ import annotations

from typing import Mapping

# How much is quoted: the best chunks (ranked as citations.rank_chunks says), whole, as many as fit in the budget and
# at most QUOTED_CHUNKS; the one that does not fit is cut to its densest part when at least MIN_QUOTE_TOKENS remain.
# Before, the first three *pages* were quoted, 512 tokens of each: a page of a PDF manual often holds more than
# that (49 of icccm's 75 pages), and the part chosen could miss the answer the page held. With Qwen2.5-Coder-1.5B
# on the confirm and holdout splits (80 questions), the best four chunks by the same fusion hold the answer for 75,
# the first three pages for 72, the retrieval baseline's four BM25 chunks for 69 (docs/answers.md).
QUOTED_CHUNKS = 4
MIN_QUOTE_TOKENS = 128


def quote_budget(window: int) -> int:
    """Tokens to quote in all: three quarters of the window, leaving the question and the answer's start beside
    them, all in the reader's window (reader.py)."""
    return window * 3 // 4


def smallest_quote(budget: int) -> int:
    """A chunk cut shorter than this is not quoted: too little to hold an answer's context."""
    return min(MIN_QUOTE_TOKENS, budget // 4)


def densest_window(relevance: Mapping[int, float], start: int, end: int, size: int) -> tuple[int, int]:
    """The ``size`` tokens of ``[start, end)`` that hold the most positive relevance, its relevant tokens in the
    middle: the part of a long passage the question is about. The whole range when it is not longer."""
    if end - start <= size:
        return start, end
    marked = sorted(p for p, score in relevance.items() if start <= p < end and score > 0)
    if not marked:
        return start, start + size
    best, first, last = float("-inf"), marked[0], marked[0]
    total, j = 0.0, 0
    for i, lo in enumerate(marked):  # windows that begin at a relevant token: one of them holds the most
        while j < len(marked) and marked[j] < lo + size:
            total += relevance[marked[j]]
            j += 1
        if total > best:
            best, first, last = total, lo, marked[j - 1]
        total -= relevance[lo]
    lo = first - (size - (last - first + 1)) // 2  # the slack split before and after the relevant tokens
    lo = min(max(lo, start), end - size)
    return lo, lo + size


def quoted_question(excerpts: list[tuple[str, str]], question: str) -> str:
    """The user turn the answer is drawn from: where each quote is from, the quotes, then the question, asked to be
    answered from them. Said so, SmolLM2 answers 20 of the 42 first benchmark questions, 13 when the question
    follows the quote bare, 6 when it comes first (four such wordings scored 17-20; scratch runs).

    The quotes are called parts of the user's documents, which is what they are to the user: called "excerpts",
    one answer in five began "According to the excerpts" or "The above excerpt describes", about excerpts the user
    never gave (docs/answers.md measures both wordings). With nothing to quote (every document switched off),
    the question alone."""
    if not excerpts:
        return question
    if len(excerpts) == 1:
        label, text = excerpts[0]
        return (f'Here is a part of {label}:\n"""\n{text.strip()}\n"""\n\n'
                f"Using the document, answer this question: {question}")
    quoted = "\n\n".join(f'From {label}:\n"""\n{text.strip()}\n"""' for label, text in excerpts)
    return f"Here are parts of the documents.\n\n{quoted}\n\nUsing the documents, answer this question: {question}"
