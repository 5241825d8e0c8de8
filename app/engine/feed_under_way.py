"""A document feed under way, and the context as it will be once the feed ends.

On a CPU a long document is fed for many minutes (the 1.5B reads about 30 tokens a second in float32: a 100-page
manual takes half an hour). A question asked meanwhile need not wait for all of it: its words find the passages to
quote in every chunk planned, fed or not (``ContextEngine.ask_while_feeding``). This is the text those chunks
will have in the context: the same tokens and spans the feed records as it goes.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from .context_records import Piece
from .context_text import ContextText
from .spans import Span, SpanIndex


@dataclass(frozen=True)
class FeedUnderWay:
    """A feed's pieces, and the context's length and span count when it began."""

    start: int
    spans_before: int
    pieces: tuple[Piece, ...]

    @property
    def tokens(self) -> int:
        return sum(len(p.ids) for p in self.pieces)

    def left(self, length: int) -> int:
        """Tokens still to feed when the context holds ``length``."""
        return self.start + self.tokens - length


def planned_text(text: ContextText, feed: FeedUnderWay) -> ContextText:
    """``text`` (the context now) as it will be once ``feed`` is over: what preceded the feed, then every piece
    planned, each with the span the feed records for it."""
    ids = array("l", text.token_ids[:feed.start])
    spans = SpanIndex()
    for span in text.spans[:feed.spans_before]:
        spans.append(span)
    for piece in feed.pieces:
        where = piece.chunk.where if piece.chunk is not None else None
        spans.append(Span(len(ids), len(ids) + len(piece.ids), piece.kind, where))
        ids.extend(piece.ids)
    return ContextText(text.tokenizer, ids, spans)
