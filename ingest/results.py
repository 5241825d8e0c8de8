"""Plain records shared by the ingest modules and the app.

They carry no behaviour beyond small helpers so that the app can serialise
them (dataclasses.asdict) and show them without importing PyMuPDF.
"""

from __future__ import annotations

from dataclasses import dataclass, field

INGESTED = "ingested"  # fully read
PARTIAL = "partial"  # read, but something was lost (pages, lines, bytes)
SKIPPED = "skipped"  # deliberately not read (policy, limit, duplicate, password)
ERROR = "error"  # tried and failed (corrupt, timeout, unreachable)
STATUSES = (INGESTED, PARTIAL, SKIPPED, ERROR)


@dataclass
class FileReport:
    """What happened to one input file (or skipped folder / refused source)."""

    path: str
    status: str
    reason: str = ""
    pages: int = 0
    chars: int = 0
    tokens: int = 0
    bytes: int = 0
    language: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")

    @property
    def ok(self) -> bool:
        """True when at least part of the file is in the context."""
        return self.status in (INGESTED, PARTIAL)


@dataclass(frozen=True)
class Provenance:
    """Where a passage of the context came from: made once here, carried unchanged by ingest's chunks, the app's
    context spans and its citations, and serialised once (``as_dict``)."""

    source: str  # display path
    page: int | None = None  # 1-based PDF page
    page_label: str | None = None  # the page's printed label, when the PDF has one
    line_start: int | None = None  # 1-based line range, text and code
    line_end: int | None = None
    # A PDF chunk's heading from the document's outline ("4. Memcheck › 4.3. Command-line flags"): what the passage
    # is about, not where it is, so two chunks of a page are still the same place (outline.py).
    heading: str | None = field(default=None, compare=False)
    # A contents or index page's lines ("4.3. Options ..... 68"): ranked after the passages they point to (listing.py).
    listing: bool = field(default=False, compare=False)

    def label(self) -> str:
        """'paper.pdf p. 12 (xii)', 'src/app.py:40-88' or just the file name."""
        return citation_label(self.source, self.page, self.page_label, self.line_start, self.line_end)

    def page_only(self) -> "Provenance":
        """The whole page of a PDF passage (citations group a page's chunks); other passages as they are."""
        return Provenance(self.source, self.page, self.page_label) if self.page is not None else self

    def as_dict(self) -> dict:
        return {"source": self.source, "page": self.page, "page_label": self.page_label,
                "line_start": self.line_start, "line_end": self.line_end, "heading": self.heading,
                "label": self.label()}


@dataclass(frozen=True)
class Location:
    """Where one character or token of the context came from: its passage narrowed to a line, and its chunk."""

    source: str
    page: int | None
    page_label: str | None
    line: int | None
    chunk: int

    def cite(self) -> str:
        """Compact citation such as 'paper.pdf p. 12 (xii)' or 'src/app.py:40'."""
        return citation_label(self.source, self.page, self.page_label, self.line)


def citation_label(source: str, page: int | None = None, page_label: str | None = None,
                   line_start: int | None = None, line_end: int | None = None) -> str:
    """'paper.pdf p. 12 (xii)' (the label only when it differs), 'src/app.py:40-88', or the bare source."""
    if page is not None:
        shown = f" ({page_label})" if page_label and page_label != str(page) else ""
        return f"{source} p. {page}{shown}"
    if line_start is not None:
        end = f"-{line_end}" if line_end and line_end != line_start else ""
        return f"{source}:{line_start}{end}"
    return source


@dataclass(frozen=True)
class ProgressEvent:
    """Snapshot passed to the progress callback after each unit of work.

    stage is one of 'listing', 'file', 'page', 'chunks', 'done'.  files_total
    grows while sources are listed (a zip or folder reveals its files late).
    """

    stage: str
    path: str
    files_done: int
    files_total: int
    pages_done: int
    bytes_done: int
    chunks_done: int
    tokens_done: int


class IngestCancelled(Exception):
    """Raised by ingest() when the cancel flag is set.

    `reports` holds the reports of files finished before the cancel, so the
    UI can still say how far it got.
    """

    def __init__(self, reports: list[FileReport] | None = None) -> None:
        super().__init__("ingestion cancelled")
        self.reports = list(reports or [])
