"""Token ranges of the context and where they came from, so a token position maps back to a page or line."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from enum import StrEnum
from typing import Callable

from ingest import Provenance


class SpanKind(StrEnum):
    SYSTEM = "system"
    DOCUMENT = "document"
    QUESTION = "question"
    ANSWER = "answer"
    FORMAT = "format"  # chat markers between the others


@dataclass(frozen=True)
class Span:
    """Tokens ``[start, end)`` of the context.

    Documents carry their chunk's provenance (file, PDF page and its printed label, or line range) unchanged.
    """

    start: int
    end: int
    kind: SpanKind
    where: Provenance | None = None

    @property
    def length(self) -> int:
        return self.end - self.start


class SpanIndex:
    """Append-only, contiguous spans with O(log n) position lookup and O(1) truncation for rollback."""

    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._starts: list[int] = []

    def __len__(self) -> int:
        return len(self._spans)

    def __iter__(self):
        return iter(self._spans)

    def __getitem__(self, index):
        return self._spans[index]

    @property
    def end(self) -> int:
        return self._spans[-1].end if self._spans else 0

    def append(self, span: Span) -> None:
        if span.start != self.end or span.end < span.start:
            raise ValueError(f"span [{span.start}, {span.end}) does not continue the context at {self.end}")
        if span.end > span.start:
            self._spans.append(span)
            self._starts.append(span.start)

    def truncate(self, count: int) -> None:
        del self._spans[count:]
        del self._starts[count:]

    def at(self, position: int) -> Span | None:
        """The span holding token ``position``, or None outside the context."""
        if not 0 <= position < self.end:
            return None
        return self._spans[bisect.bisect_right(self._starts, position) - 1]

    def around(self, position: int, same: Callable[[Span], bool]) -> tuple[int, int]:
        """``[start, end)`` of the run of neighbouring spans around ``position`` that ``same`` accepts (the
        chunks of one PDF page)."""
        first = last = bisect.bisect_right(self._starts, position) - 1
        while first > 0 and same(self._spans[first - 1]):
            first -= 1
        while last + 1 < len(self._spans) and same(self._spans[last + 1]):
            last += 1
        return self._spans[first].start, self._spans[last].end

    def documents(self) -> list[Span]:
        return [s for s in self._spans if s.kind == SpanKind.DOCUMENT]
