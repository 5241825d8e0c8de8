"""A context built again from its history, leaving something out: the conversation, or one document.

The cache only appends, so removing a passage means reading everything else again. That is done in a new
engine while the old one stays as it was: Stop or an error discards the new one (the context is unchanged),
success replaces the old one. What it will cost is known before it starts (``replay_cost``), so the user is
told before choosing to go ahead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from .context import ContextEngine
from .document_choice import covers
from .history import DocumentsFed, Exchange
from .metrics import LiveStats
from .spans import SpanKind


@dataclass(frozen=True)
class Keep:
    """What of the history the new context keeps."""

    chunk: Callable[[object], bool] = lambda chunk: True  # document chunks, by their provenance
    conversation: bool = True
    exchanges: int | None = None  # the conversation's first exchanges kept (None: all of them)

    def entries(self, history: list) -> list:
        kept, asked = [], 0
        for entry in history:
            if isinstance(entry, DocumentsFed):
                chunks = tuple(c for c in entry.chunks if self.chunk(c))
                if chunks:
                    kept.append(DocumentsFed(chunks))
            elif self.conversation:
                asked += isinstance(entry, Exchange)
                if self.exchanges is None or not isinstance(entry, Exchange) or asked <= self.exchanges:
                    kept.append(entry)
        return kept


def without_source(source: str) -> Keep:
    """Everything but one file's chunks (or an archive's files: document_choice.covers)."""
    return Keep(chunk=lambda chunk: not covers(source, chunk.where.source))


DOCUMENTS_ONLY = Keep(conversation=False)


def before_exchange(count: int) -> Keep:
    """The documents and the conversation's first ``count`` exchanges: the context an earlier question was asked
    in, for asking it anew (documents read after it stay, read after those exchanges)."""
    return Keep(exchanges=count)


def replay_cost(engine: ContextEngine, keep: Keep) -> int:
    """About the tokens a rebuild reads: the kept document spans (a span has a chunk's ``where``), the system
    prompt, and the conversation when it is kept."""
    total, asked = 0, 0
    for span in engine.spans:
        asked += span.kind == SpanKind.QUESTION
        if span.kind == SpanKind.DOCUMENT:
            total += span.length if keep.chunk(span) else 0
        elif span.kind == SpanKind.SYSTEM or (keep.conversation and (keep.exchanges is None
                                                                     or asked <= keep.exchanges)):
            total += span.length
    return total


def replay(old: ContextEngine, keep: Keep, cancel=None, stats: LiveStats | None = None) -> Iterator[LiveStats | ContextEngine]:
    """Build a new engine from ``old``'s history as ``keep`` says; yields progress, then the new engine last.

    ``old`` is not touched. On Stop or an error the new engine is closed and the exception propagates.
    """
    new = ContextEngine(old.runtime, system_prompt=old.system_prompt, budget=old.budget, stats=stats or old.stats,
                        with_recall=old.keeps_recall)
    try:
        for entry in keep.entries(old.history):
            if isinstance(entry, Exchange):
                yield from new.append_exchange(entry, cancel)
            else:
                yield from new.feed_documents(entry.chunks, cancel)
    except BaseException:
        new.close()
        raise
    yield new
