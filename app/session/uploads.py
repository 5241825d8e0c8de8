"""Uploads to ingested chunks: refuse what must not be read, read the rest with ``ingest``, fit the budget.

Every file ends up as one row of the documents table, ingested or not, with the reason in words:
nothing is dropped silently.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import ingest
from ingest import Corpus, FileReport, IngestLimits
from ingest.git_url import looks_like_url
from ingest.results import ERROR, INGESTED, PARTIAL, SKIPPED
from ingest.units import human_bytes

from ..cli import AppConfig

log = logging.getLogger(__name__)


class RowStatus(StrEnum):
    """Where a file stands: ingest's verdicts, then the app's steps towards (or away from) the context."""

    INGESTED = INGESTED  # in the context
    PARTIAL = PARTIAL  # in the context, with parts ingest could not read
    SKIPPED = SKIPPED
    ERROR = ERROR
    REFUSED = "refused"  # by a limit or a budget, before any model work
    CANCELLED = "cancelled"  # Stop, an API cancel or a closed tab
    READING = "reading"
    QUEUED = "queued"  # read, waiting for the model
    FEEDING = "feeding"  # being fed to the model now
    ROLLED_BACK = "rolled_back"  # the feed failed and was undone

    @property
    def in_context(self) -> bool:
        return self in (RowStatus.INGESTED, RowStatus.PARTIAL)


STATUS_LABELS = {  # symbols every system font has (no emoji): the README screenshot comes from a bare machine
    RowStatus.INGESTED: "✓ in context",
    RowStatus.PARTIAL: "⚠ partly in context",
    RowStatus.SKIPPED: "– skipped",
    RowStatus.ERROR: "✗ error",
    RowStatus.REFUSED: "⊘ refused",
    RowStatus.CANCELLED: "■ cancelled",
    RowStatus.READING: "… reading",
    RowStatus.QUEUED: "… waiting for the model",
    RowStatus.FEEDING: "… being fed to the model",
    RowStatus.ROLLED_BACK: "↩ not added",
}


@dataclass
class DocumentRow:
    """One line of the documents table."""

    path: str
    status: RowStatus
    pages: int = 0
    tokens: int = 0
    reason: str = ""
    outcome: RowStatus | None = None  # what ingest said (ingested or partial) while the row waits for the model

    def __post_init__(self) -> None:
        self.status = RowStatus(self.status)  # a plain string is checked against the known statuses here

    def wait_for_model(self) -> None:
        """Read (all of it, or part): queued for the model, remembering which, for when it is added."""
        if self.status in (RowStatus.INGESTED, RowStatus.PARTIAL):
            self.outcome, self.status = self.status, RowStatus.QUEUED

    def feeding(self) -> None:
        """Its feed started: the panel shows how far it has come."""
        self.status = RowStatus.FEEDING

    def added(self) -> None:
        """Fed to the model: in the context as ingest read it."""
        self.status = self.outcome or RowStatus.INGESTED

    def as_list(self) -> list:
        return [self.path, STATUS_LABELS.get(self.status, self.status), self.pages or "", self.tokens or "",
                self.reason]


def row_from_report(report: FileReport) -> DocumentRow:
    return DocumentRow(report.path, RowStatus(report.status), report.pages, report.tokens if report.ok else 0, report.reason)


def replace_rows(rows: list[DocumentRow], old: list[DocumentRow], new: list[DocumentRow]) -> None:
    """Put ``new`` where ``old`` stood in the table (or at its end); rows are matched by identity."""
    ids = {id(r) for r in old}
    positions = [i for i, r in enumerate(rows) if id(r) in ids]
    at = positions[0] if positions else len(rows)
    rows[:] = [r for r in rows if id(r) not in ids]
    rows[at:at] = new


def upload_paths(files) -> list[str]:
    """Server paths of uploaded files, as Gradio hands them: paths, file objects, or FileData dicts."""
    def path(f):
        if isinstance(f, str):
            return f
        return f.get("path") if isinstance(f, dict) else getattr(f, "name", f)
    return [path(f) for f in files or []]


def screen_uploads(paths: list[str], max_file_size: int,
                   upload_root: str | None) -> tuple[list[str], list[DocumentRow]]:
    """Keep uploaded files under the size limit; refuse the others (and any path outside the upload folder)."""
    accepted, refused = [], []
    root = Path(upload_root).resolve() if upload_root else None
    for path in paths:
        name = os.path.basename(path)
        resolved = Path(path).resolve()
        if root is not None and not resolved.is_relative_to(root):
            refused.append(DocumentRow(name, RowStatus.REFUSED, reason="not an upload: server paths need --allow-local-paths"))
        elif not resolved.is_file():
            refused.append(DocumentRow(name, RowStatus.ERROR, reason="the upload is missing on the server"))
        elif resolved.stat().st_size > max_file_size:
            size = resolved.stat().st_size
            refused.append(DocumentRow(name, RowStatus.REFUSED, reason=f"file is {human_bytes(size)}, over the "
                                       f"{human_bytes(max_file_size)} upload limit (--max-file-size)"))
        else:
            accepted.append(str(resolved))
    return accepted, refused


def limits_for(config: AppConfig) -> IngestLimits:
    """ingest's limits, never looser than the upload limit for a single file."""
    defaults = IngestLimits()
    return IngestLimits(
        max_file_bytes=min(defaults.max_file_bytes, config.max_file_size),
        max_pdf_bytes=min(defaults.max_pdf_bytes, config.max_file_size),
    )


def read_sources(sources: list[str], *, tokenizer, config: AppConfig, cancel, progress) -> Corpus:
    """ingest.ingest with the model's tokenizer, so token counts are exactly what the model is fed."""
    corpus = ingest.ingest(sources, tokenizer=tokenizer, limits=limits_for(config), progress=progress,
                           cancel=cancel, chunk_tokens=512, allow_urls=config.local_paths_enabled)
    hide_network_details(corpus.reports, sources)
    return corpus


CLONE_FAILED = "could not clone this repository; nothing was added"
_NETWORK_REASONS = ("cannot resolve", "git clone failed", "git clone took longer")


def hide_network_details(reports, sources) -> None:
    """One generic reason for every failed clone: whether a host resolves, refuses or stalls is the server's
    network, not the user's business (an open door for probing internal hosts). The details go to the log."""
    urls = {s for s in sources if isinstance(s, str) and looks_like_url(s)}
    for report in reports:
        if report.path in urls and report.status == RowStatus.ERROR and report.reason.startswith(_NETWORK_REASONS):
            log.warning("clone of %s failed: %s", report.path, report.reason)
            report.reason = CLONE_FAILED


@dataclass
class FittedCorpus:
    """The chunks to feed (whole files only), every file's row, the tokens they add (the opening a turn needs
    included), the content digest of each file fed (see ``content_digest``), and the tokens of the files refused
    for the budget."""

    chunks: list
    rows: list[DocumentRow]
    tokens: int
    digests: dict[str, str]
    refused_tokens: int = 0


def content_digest(chunks) -> str:
    """A file's text as the model reads it, without the headers that name it: the same document uploaded
    twice, from the chat box and the Documents panel, or under another name, has the same digest."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk.text[chunk.header_chars:].encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def fit_budget(corpus: Corpus, free_tokens: int, tokens_by_source: dict, fed: dict[str, str] | None = None) -> FittedCorpus:
    """Accept files in order while they fit; refuse a file that would not, before any model work; skip a
    file whose content is already in the context (``fed``: digest -> the file that brought it) or earlier in
    this batch.

    ``tokens_by_source`` is the engine's plan of the whole corpus (ContextEngine.plan_documents): each file's
    tokens exactly as they would be fed, and under None the opening a new turn needs. One count, no margin.
    """
    rows, chunks, used, digests, refused = [], [], tokens_by_source.get(None, 0), {}, 0
    fed = fed or {}
    by_source: dict[str, list] = {}
    for chunk in corpus.chunks:
        by_source.setdefault(chunk.source, []).append(chunk)
    for report in corpus.reports:
        row = row_from_report(report)
        file_chunks = by_source.get(report.path, [])
        if report.ok and file_chunks:
            digest = content_digest(file_chunks)
            needed = row.tokens = tokens_by_source.get(report.path, 0)
            twin = fed.get(digest) or digests.get(digest)
            if twin is not None:
                set_rows([row], RowStatus.SKIPPED, f"same text as {twin}, already in the context: not added again")
            elif used + needed > free_tokens:
                left = max(0, free_tokens - used)
                refused += needed
                set_rows([row], RowStatus.REFUSED, f"needs {needed:,} tokens but only {left:,} of the context budget "
                                           "are left (a new context reads it without recall)")
            else:
                chunks.extend(file_chunks)
                used += needed
                digests[digest] = report.path
                row.wait_for_model()
        rows.append(row)
    return FittedCorpus(chunks, rows, used if chunks else 0, digests, refused)


def progress_line(event) -> str:
    """One line for an ingest.ProgressEvent."""
    parts = [f"{event.files_done}/{event.files_total} files"]
    if event.pages_done:
        parts.append(f"{event.pages_done} pages")
    parts.append(f"{event.tokens_done:,} tokens")
    where = os.path.basename(event.path.rstrip("/")) if event.path else ""
    return (f"Reading {where} · " if where else "Reading · ") + " · ".join(parts)

def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def status_line(row: DocumentRow) -> str:
    """'report.pdf: ✓ in context, 3,456 tokens' style summary used in chat status blocks."""
    extra = f", {row.tokens:,} tokens" if row.tokens else ""
    return f"{STATUS_LABELS.get(row.status, row.status)}{extra}" + (f": {row.reason}" if row.reason else "")


def rows_summary(rows: list[DocumentRow]) -> str:
    """One status line per file, for the chat's status block."""
    return "\n".join(f"{r.path}: {status_line(r)}" for r in rows)


def set_rows(rows: list[DocumentRow], status: RowStatus, reason: str) -> None:
    """Files that did not reach the context (or left it): their status and why; none of their tokens count."""
    for row in rows:
        row.status, row.reason, row.tokens = status, reason, 0
