"""Quoting the top sources: the passages the question's sources rank first are quoted with the question, and the
answer is drawn from them.

Ranking finds the right passage far more often than a small model can use it from the middle of a long context:
on 42 questions about two PDF manuals and a Python module, SmolLM2-135M's first source held the answer for 32, but
it answered 6 right (docs/smollm2.md). Given the cited page with recall off, and asked to answer from it, it
answers 20; with recall still on, the middle tokens recall pulls in distract it from the quote.

So an answer is drawn as follows (``ContextEngine.ask``): the question is read with recall, which with BM25 ranks
the sources (citations.py); the context goes back before it; the first sources' densest parts and the question are
read in a reader of their own (reader.py), without recall, and the answer is sampled there; then the context reads
the question and the answer. The quote helps one answer and leaves nothing behind, so a conversation's history
stays its questions and answers (history.py), and a context rebuilt from it is the same.
"""

from __future__ import annotations

from typing import Mapping

# How many of the first sources are quoted, and how much of each. Qwen2.5-Coder-0.5B (window 2,048) on the
# development set's tune and confirm splits (106 questions, benchmarks/answers.py, docs/answers.md): one passage of
# 768 tokens answered 70, two of 768 answered 73, three of 512 answered 75, four of 512 in the retrieval
# baseline's wording 72; retrieval with the same model answers 75. One passage did best on the tune split alone
# (48 of 58) and worst on the confirm split (22 of 48): the first source is right for nine questions in ten on
# the first, two in three on the second, where the second and third sources hold what the first misses.
QUOTE_TOKENS = 512
QUOTED_PASSAGES = 3


def quote_size(window: int) -> int:
    """Tokens to quote of each quoted source: the quotes together take at most three quarters of the window,
    leaving the question and the answer's start beside them."""
    return min(QUOTE_TOKENS, window * 3 // (4 * QUOTED_PASSAGES))


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
    never gave (docs/answers.md measures both wordings)."""
    if len(excerpts) == 1:
        label, text = excerpts[0]
        return (f'Here is a part of {label}:\n"""\n{text.strip()}\n"""\n\n'
                f"Using the document, answer this question: {question}")
    quoted = "\n\n".join(f'From {label}:\n"""\n{text.strip()}\n"""' for label, text in excerpts)
    return f"Here are parts of the documents.\n\n{quoted}\n\nUsing the documents, answer this question: {question}"
