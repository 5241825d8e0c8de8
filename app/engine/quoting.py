"""Quoting the top source: the passage the question's sources rank first is quoted with the question, and the
answer is drawn from it.

Ranking finds the right passage far more often than a small model can use it from the middle of a long context:
on 42 questions about two PDF manuals and a Python module, SmolLM2-135M's first source held the answer for 32, but
it answered 6 right (docs/smollm2.md). Given the cited page with recall off, and asked to answer from it, it
answers 20; with recall still on, the middle tokens recall pulls in distract it from the quote.

So an answer is drawn as follows (``ContextEngine.ask``): the question is read with recall, which with BM25 ranks
the sources (citations.py); the context goes back before it; the first source's densest part and the question are
read in a reader of their own (reader.py), without recall, and the answer is sampled there; then the context reads
the question and the answer. The quote helps one answer and leaves nothing behind, so a conversation's history
stays its questions and answers (history.py), and a context rebuilt from it is the same.
"""

from __future__ import annotations

from typing import Mapping

# Of the top source, at most half the window. SmolLM2 (window 1,024) quotes 512: 768 answered no more there
# (benchmarks/docqa.py). Qwen2.5-Coder-0.5B (window 2,048) answered 49 of the tune split's 58 questions quoting 768,
# 48 quoting 512 (benchmarks/answers.py).
QUOTE_TOKENS = 768
# How many of the first sources are quoted: one. Three (512 tokens each, as many as a retrieval script pastes)
# answered 36 of the 58 where one answered 40 (both with the earlier source ranking): a small model reads one
# passage better than three, and the first source is right for nine questions in ten.
QUOTED_PASSAGES = 1


def quote_size(window: int) -> int:
    """Tokens of the top source to quote: at most half the window, leaving the question and the answer's start
    beside it."""
    return min(QUOTE_TOKENS, window // 2)


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
    follows the quote bare, 6 when it comes first (four such wordings scored 17-20; scratch runs)."""
    if len(excerpts) == 1:
        label, text = excerpts[0]
        return (f'Here is an excerpt from {label}:\n"""\n{text.strip()}\n"""\n\n'
                f"Using the excerpt, answer this question: {question}")
    quoted = "\n\n".join(f'From {label}:\n"""\n{text.strip()}\n"""' for label, text in excerpts)
    return f"Here are excerpts from the documents.\n\n{quoted}\n\nUsing the excerpts, answer this question: {question}"
