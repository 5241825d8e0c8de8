"""Extracted documents before chunking: a file split into provenance sections.

A section is the largest run of text with one provenance: a PDF page, or a
whole text file (whose line numbers follow from offsets).  Chunks never span
sections, so every chunk has exactly one file and one page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .languages import PROSE_LANGUAGES
from .outline import OutlineEntry
from .visible import visible


@dataclass
class Section:
    text: str  # content, ends with '\n'
    header: str = ""  # e.g. '\n--- page 12 ---\n', put before the first chunk
    page: int | None = None  # 1-based
    page_label: str | None = None
    line_start: int | None = None  # line number of text[0] (text/code)


@dataclass
class Document:
    path: str  # display path
    language: str
    sections: list[Section] = field(default_factory=list)
    outline: tuple[OutlineEntry, ...] = ()  # a PDF's bookmarks: the headings its chunks fall under (outline.py)

    @property
    def chars(self) -> int:
        return sum(len(s.text) for s in self.sections)


PAGE_MARKER = re.compile(r"--- page \d+(?: \([^)\n]*\))? ---")


def without_page_markers(text: str) -> str:
    """``text`` less the page markers (page_header) the model reads: a snippet shown under a citation, whose
    label names its page already."""
    return PAGE_MARKER.sub(" ", text)


def page_header(page: int, label: str | None, first: bool) -> str:
    """'--- page 12 ---' or '--- page 12 (xii) ---' when the label differs."""
    shown = f" ({visible(label)})" if label and label != str(page) else ""
    return ("" if first else "\n") + f"--- page {page}{shown} ---\n"


def file_header(path: str, language: str, first: bool) -> str:
    """'### src/app.py (python)' for code, '### notes.md' for prose and PDFs;
    separated from the previous document by a blank line.  Control characters
    in the path are escaped so a file name cannot fake a line of the context."""
    tag = "" if language in PROSE_LANGUAGES else f" ({language})"
    return ("" if first else "\n") + f"### {visible(path)}{tag}\n"
