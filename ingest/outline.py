"""A PDF's outline (its bookmarks) as the heading each chunk falls under.

A chunk cut from the middle of a section often does not say what it is about: the options of one command, the
arguments of one function or the fields of one record read like those of the next. Most manuals carry an outline
(9 of the development set's 11 PDFs), so each chunk is given the outline's heading at its start
(``Provenance.heading``): keyword ranking reads it with the chunk's words, and a source shows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

MAX_OUTLINE_ENTRIES = 50_000  # a 3,700-page function reference has a few thousand; more is hostile
MAX_TITLE_CHARS = 160
HEADING_LEVELS = 2  # a heading names the entry and the one above it: "Options" alone says little
HEADING_JOINER = " › "
# A title found after no more than a running header (the chapter's name, a page number: at most this many lines and
# characters) starts its entry at the page's top: the page's first chunk is the section's, not the one before's.
RUNNING_HEAD_LINES, RUNNING_HEAD_CHARS = 3, 120
# Titles searched for on one page; the entries after them start where the last one searched did. A real page holds a
# few; thousands of entries on one long page are hostile, and each search that fails reads the page to its end.
MAX_SEARCHES_PER_PAGE = 64
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class OutlineEntry:
    level: int  # 1 for the top level
    title: str
    page: int  # 1-based page the entry points to


def clean_title(title: str) -> str:
    """One line of at most MAX_TITLE_CHARS: no control characters, spaces collapsed (no-break spaces too)."""
    text = " ".join(_CONTROL.sub(" ", title).replace("\u00a0", " ").split())
    return text if len(text) <= MAX_TITLE_CHARS else text[:MAX_TITLE_CHARS - 1].rstrip() + "…"


def read_outline(raw: Iterable) -> tuple[OutlineEntry, ...]:
    """The entries the PDF worker sent (``[level, title, page]`` each), those that point nowhere or have no title
    left out, levels never deeper than one below the entry before (as an outline nests)."""
    entries: list[OutlineEntry] = []
    for item in list(raw)[:MAX_OUTLINE_ENTRIES]:
        if not isinstance(item, (list, tuple)) or len(item) < 3:
            continue
        level, title, page = item[:3]
        if not isinstance(level, int) or not isinstance(page, int) or not isinstance(title, str) or page < 1:
            continue
        title = clean_title(title)
        if title:
            deepest = entries[-1].level + 1 if entries else 1
            entries.append(OutlineEntry(max(1, min(level, deepest)), title, page))
    return tuple(entries)


def _title_pattern(title: str) -> re.Pattern:
    """The title's words in order, any run of white space between them (a heading may wrap onto two lines), not
    inside a longer word: "Entry 2" is not the start of "Entry 29"."""
    words = r"\s+".join(re.escape(word) for word in title.split())
    before = r"(?<!\w)" if title[0].isalnum() else ""
    after = r"(?!\w)" if title[-1].isalnum() else ""
    return re.compile(before + words + after, re.IGNORECASE)


def _after_running_head(text: str, offset: int) -> bool:
    """Whether only a running header can stand before ``offset`` on the page."""
    return offset <= RUNNING_HEAD_CHARS and text.count("\n", 0, offset) <= RUNNING_HEAD_LINES


class HeadingTracker:
    """Walks one PDF's outline beside its pages and chunks, in order: ``enter_page`` for each page with text, then
    ``heading_at`` for each chunk's first character on it, in increasing order.

    An entry starts where its title is found on its page, searching on from the entry before, or at the page's top
    when only a running header stands before the title; one whose title is not found there starts where the entry
    before it did (the page's top for the first)."""

    def __init__(self, outline: Sequence[OutlineEntry]) -> None:
        self._entries = sorted(outline, key=lambda entry: entry.page)  # in page order, as the pages come
        self._next = 0  # the first entry not yet applied
        self._path: list[str] = []  # titles from the top level down to the entry that applies
        self._starts: list[int] = []  # where on the current page each of its entries not yet applied starts

    def enter_page(self, page: int, text: str) -> None:
        self._apply_before(page)
        self._starts, found_from = [], 0
        for index in range(self._next, len(self._entries)):  # by index: a copy per page would cost pages × entries
            entry = self._entries[index]
            if entry.page != page:
                break
            searched = index - self._next < MAX_SEARCHES_PER_PAGE
            match = _title_pattern(entry.title).search(text, found_from) if searched else None
            found_from = match.start() if match else found_from
            self._starts.append(0 if _after_running_head(text, found_from) else found_from)

    def heading_at(self, offset: int) -> str | None:
        """The heading in force at ``offset`` of the current page's text: the entry that applies and the one above
        it, or None before the outline's first entry."""
        applied = 0
        while applied < len(self._starts) and self._starts[applied] <= offset:
            self._apply(self._entries[self._next])
            applied += 1
        del self._starts[:applied]
        if not self._path:
            return None
        return HEADING_JOINER.join(self._path[-HEADING_LEVELS:])

    def _apply_before(self, page: int) -> None:
        """Apply the entries of pages before ``page``: those of pages without text, and any not yet reached."""
        while self._next < len(self._entries) and self._entries[self._next].page < page:
            self._apply(self._entries[self._next])

    def _apply(self, entry: OutlineEntry) -> None:
        self._path = self._path[:entry.level - 1] + [entry.title]
        self._next += 1
