"""ingest(): sources -> listings -> per-file extraction -> chunked Corpus.

One pass over every source in the order given.  Each file gets exactly one
FileReport whatever happens to it; a failure in one file never stops the
others.  Limits (files, bytes) are global to the call; identical content is
kept once.  Cancel is checked between files, pages and chunks and raises
IngestCancelled (carrying the reports so far).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Mapping, Union

from .archive import archive_type, list_archive
from .compressed import decompressing_reader, inner_name
from .corpus import Corpus, CorpusBuilder
from .documents import Document, Section, page_header
from .entries import FileEntry, Listing
from .filters import ARCHIVE_EXTENSIONS, BINARY_EXTENSIONS, archive_reason, unsupported_document_reason
from .formats import HTML_EXTENSIONS, NOTEBOOK_EXTENSIONS, html_declared_charset, html_to_text, notebook_to_text
from .git_url import CloneRefused, check_https_url, clone_https, looks_like_url, repo_name
from .languages import language_for, language_from_shebang
from .limits import IngestLimits
from .pdf import PdfExtraction, PdfPage, extract_pdf
from .repo import disk_reader, walk_folder
from .results import ERROR, INGESTED, PARTIAL, SKIPPED, FileReport, IngestCancelled, ProgressEvent
from .sniff import archive_format, content_kind
from .text import cut_lines_note, cut_long_lines, decode_text
from .tokens import TokenCounter
from .units import human_bytes

Source = Union[str, "os.PathLike[str]"]
Passwords = Union[str, Mapping[str, str], None]


class _Run:
    """State of one ingest() call."""

    def __init__(self, *, tokenizer: Any, password: Passwords, limits: IngestLimits,
                 progress: Callable[[ProgressEvent], None] | None, cancel: Any, chunk_tokens: int,
                 allow_urls: bool) -> None:
        self.limits = limits
        self.password = password
        self.progress = progress
        self.cancel = cancel
        self.allow_urls = allow_urls
        self.builder = CorpusBuilder(TokenCounter(tokenizer), chunk_tokens)
        self.reports: list[FileReport] = []
        self.seen: dict[str, str] = {}  # sha256 -> display path of the first copy that gave text
        self.used_paths: set[str] = set()
        self.files_total = self.files_done = self.files_read = 0
        self.pages_done = self.bytes_read = self.chars_total = 0
        self.current = ""
        self._pdf_chars = 0  # characters of the PDF being extracted

    # -- progress and cancel -------------------------------------------------------------
    def check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise IngestCancelled(self.reports)

    def emit(self, stage: str) -> None:
        if self.progress is None:
            return
        self.progress(ProgressEvent(stage=stage, path=self.current, files_done=self.files_done,
                                    files_total=self.files_total, pages_done=self.pages_done,
                                    bytes_done=self.bytes_read, chunks_done=len(self.builder.chunks),
                                    tokens_done=self.builder.tokens))

    # -- sources -------------------------------------------------------------------------
    def list_source(self, source: Source) -> Listing:
        text = os.fspath(source)
        if isinstance(source, str) and looks_like_url(text):
            return self.list_url(text)
        return list_local(text, self.limits)

    def list_url(self, url: str) -> Listing:
        if not self.allow_urls:
            return Listing(items=[FileReport(path=url, status=SKIPPED, reason="URL sources are disabled")])
        try:
            check_https_url(url)
        except CloneRefused as exc:
            return Listing(items=[FileReport(path=url, status=SKIPPED, reason=str(exc))])
        workdir = tempfile.mkdtemp(prefix="ingest-clone-")
        dest = os.path.join(workdir, repo_name(url))
        try:
            clone_https(url, dest, self.limits, cancel=self.cancel)
        except IngestCancelled:
            shutil.rmtree(workdir, ignore_errors=True)
            raise IngestCancelled(self.reports) from None
        except CloneRefused as exc:
            shutil.rmtree(workdir, ignore_errors=True)
            return Listing(items=[FileReport(path=url, status=ERROR, reason=str(exc))])
        listing = walk_folder(Path(dest), self.limits, prefix=f"{repo_name(url)}/")
        listing.cleanups.append(lambda: shutil.rmtree(workdir, ignore_errors=True))
        return listing

    def run(self, sources: list[Source]) -> Corpus:
        for source in sources:
            self.check_cancel()
            self.current = os.fspath(source)
            try:
                listing = self.list_source(source)
            except IngestCancelled:
                raise
            except Exception as exc:  # noqa: BLE001 - an unlistable source is one error report
                listing = Listing(items=[FileReport(path=self.current, status=ERROR,
                                                    reason=f"cannot list: {type(exc).__name__}: {exc}")])
            try:
                self.files_total += len(listing.items)
                self.emit("listing")
                for item in listing.items:
                    self.check_cancel()
                    self.current = item.path
                    report = item if isinstance(item, FileReport) else self.read_entry(item)
                    self.reports.append(report)
                    self.files_done += 1
                    self.emit("file")
            finally:
                listing.close()
        self.emit("done")
        return self.builder.build(self.reports)

    # -- one file ------------------------------------------------------------------------
    def unique_path(self, path: str) -> str:
        candidate, n = path, 1
        while candidate in self.used_paths:
            n += 1
            candidate = f"{path} ({n})"
        self.used_paths.add(candidate)
        return candidate

    def read_entry(self, entry: FileEntry) -> FileReport:
        entry.path = self.unique_path(entry.path)
        language = language_for(entry.rel)
        report = FileReport(path=entry.path, status=SKIPPED, bytes=entry.size, language=language)
        try:
            self.read_into(entry, report)
        except IngestCancelled:
            raise IngestCancelled(self.reports) from None
        except Exception as exc:  # noqa: BLE001 - one bad file must not stop the others
            report.status, report.reason = ERROR, f"unexpected error: {type(exc).__name__}: {exc}"
        return report

    def read_into(self, entry: FileEntry, report: FileReport) -> None:
        suffix = PurePosixPath(entry.rel).suffix.lower()
        cap = self.limits.file_cap(entry.rel)
        if (reason := self.refusal_before_reading(entry, suffix, cap)) is not None:
            report.reason = reason
            return
        data = self.read_bytes(entry, cap, report)
        if data is None:
            return
        if (reason := self.refusal_after_reading(data, cap)) is not None:
            report.reason = reason
            return
        digest = hashlib.sha256(data).hexdigest()
        if digest in self.seen:
            report.reason = f"duplicate of {self.seen[digest]}"
            return
        self.read_content(entry, data, report)
        if report.status in (INGESTED, PARTIAL):  # a copy that gave no text (no password ...) leaves it to the next
            self.seen.setdefault(digest, entry.path)

    def refusal_before_reading(self, entry: FileEntry, suffix: str, cap: int) -> str | None:
        """Why the file is skipped without reading it (its name or size, or a limit already reached), if so."""
        limits = self.limits
        if entry.explicit and suffix in BINARY_EXTENSIONS:
            return unsupported_document_reason(suffix) or f"binary file ({suffix})"
        if entry.explicit and suffix in ARCHIVE_EXTENSIONS:
            return archive_reason(suffix, entry.compressed)
        if self.files_read >= limits.max_files:
            return f"file limit reached ({limits.max_files} files)"
        if entry.size > cap:
            return f"file is {human_bytes(entry.size)}, over the {human_bytes(cap)} limit"
        if self.bytes_read + entry.size > limits.max_total_bytes:
            return f"total input limit of {human_bytes(limits.max_total_bytes)} reached"
        return None

    def read_bytes(self, entry: FileEntry, cap: int, report: FileReport) -> bytes | None:
        """At most cap + 1 bytes (one more tells a file that grew past the cap), counted against the limits;
        None when the read failed (the report says why)."""
        try:
            data = entry.read(cap + 1)
        except Exception as exc:  # noqa: BLE001 - OSError, BadZipFile, zlib.error, ...
            report.status, report.reason = ERROR, f"cannot read: {exc}"
            return None
        self.files_read += 1
        self.bytes_read += len(data)
        report.bytes = len(data)
        return data

    def refusal_after_reading(self, data: bytes, cap: int) -> str | None:
        """Why the bytes read are not used (too many or none), if so."""
        if len(data) > cap:
            return f"file is larger than the {human_bytes(cap)} limit"
        if self.bytes_read > self.limits.max_total_bytes:  # a compressed file's size was known only once read
            return f"total input limit of {human_bytes(self.limits.max_total_bytes)} reached"
        if not data:
            return "empty file"
        return None

    def read_content(self, entry: FileEntry, data: bytes, report: FileReport) -> None:
        """Route the bytes by what they are, whatever the file's name says."""
        kind = content_kind(data, entry.rel)
        if kind == "archive":
            where = "" if entry.explicit else " inside a repository or archive"
            report.reason = f"{archive_format(data)} archive{where} (not opened)"
        elif kind == "binary":
            report.reason = "binary file"
        elif kind == "pdf":
            self.read_pdf(entry, data, report)
        else:
            self.read_text(entry, data, report)

    def chars_limit_reason(self, more: int) -> str | None:
        if self.chars_total + more > self.limits.max_total_chars:
            return f"context size limit of {self.limits.max_total_chars:,} characters reached"
        return None

    def add_document(self, doc: Document, report: FileReport) -> None:
        self.chars_total += doc.chars
        chunks = self.builder.add(doc, cancel=self.cancel)
        report.chars = doc.chars
        report.tokens = sum(c.tokens for c in chunks)
        self.emit("chunks")

    def read_text(self, entry: FileEntry, data: bytes, report: FileReport) -> None:
        suffix = PurePosixPath(entry.rel).suffix.lower()
        if suffix in NOTEBOOK_EXTENSIONS or suffix in HTML_EXTENSIONS:
            self.read_converted(entry, data, report, suffix)
            return
        decoded = decode_text(data, max_line_chars=self.limits.max_line_chars)
        if report.language == "text":
            report.language = language_from_shebang(decoded.text)
        self.add_text(entry, report, decoded.text, report.language, status=PARTIAL if decoded.lossy else INGESTED,
                      notes=decoded.notes)

    def read_converted(self, entry: FileEntry, data: bytes, report: FileReport, suffix: str) -> None:
        """Notebooks and HTML: decode whole (long lines intact for the parser), convert, then cut lines."""
        declared = html_declared_charset(data) if suffix in HTML_EXTENSIONS else None
        decoded = decode_text(data, max_line_chars=0, declared=declared)
        notes = list(decoded.notes)
        if suffix in NOTEBOOK_EXTENSIONS:
            converted = notebook_to_text(decoded.text)
            if converted is None:
                notes.append("not a valid Jupyter notebook; read as plain text")
                text, language = decoded.text, "json"
                report.language = "json"
            else:
                text, language = converted.text, converted.language
                notes.extend(converted.notes)
        else:
            converted = html_to_text(decoded.text)
            text, language = converted.text, converted.language
        text, cut = cut_long_lines(text, self.limits.max_line_chars)
        if cut:
            notes.append(cut_lines_note(cut, self.limits.max_line_chars))
        lossy = decoded.replaced_chars > 0 or decoded.uncertain or cut > 0
        self.add_text(entry, report, text, language, status=PARTIAL if lossy else INGESTED, notes=notes,
                      empty_reason="no text in the file (only markup or empty cells)")

    def add_text(self, entry: FileEntry, report: FileReport, text: str, language: str, *, status: str,
                 notes: list[str], empty_reason: str = "empty file (whitespace only)") -> None:
        if not text.strip():
            report.reason = empty_reason
            return
        text = text if text.endswith("\n") else text + "\n"
        if (reason := self.chars_limit_reason(len(text))) is not None:
            report.reason = reason
            return
        report.status = status
        report.reason = "; ".join(notes)
        self.add_document(Document(entry.path, language, [Section(text=text, line_start=1)]), report)

    # -- PDFs ----------------------------------------------------------------------------
    def password_for(self, entry: FileEntry) -> str | None:
        if self.password is None or isinstance(self.password, str):
            return self.password
        for key in (entry.origin, entry.path, entry.rel, PurePosixPath(entry.rel).name):
            if key and key in self.password:
                return self.password[key]
        return None

    def on_page(self, page: PdfPage) -> str | None:
        self.pages_done += 1
        self._pdf_chars += len(page.text)
        self.emit("page")
        return self.chars_limit_reason(self._pdf_chars)

    def read_pdf(self, entry: FileEntry, data: bytes, report: FileReport) -> None:
        limits = self.limits
        report.language = "pdf"
        self._pdf_chars = 0
        result = extract_pdf(data, self.password_for(entry), timeout_s=limits.pdf_timeout_s,
                             memory_limit=limits.pdf_worker_memory_bytes, max_pages=limits.max_pdf_pages,
                             cancel=self.cancel, on_page=self.on_page)
        report.pages = result.page_count
        status, reason = pdf_outcome(result, limits.max_pdf_pages)
        report.status, report.reason = status, reason
        if status not in (INGESTED, PARTIAL):
            return
        doc, cut = self.pdf_document(entry.path, result.pages)
        doc.outline = result.outline
        if cut:
            report.status = PARTIAL
            report.reason = "; ".join(filter(None, [reason, cut_lines_note(cut, limits.max_line_chars)]))
        self.add_document(doc, report)

    def pdf_document(self, path: str, pages: list[PdfPage]) -> tuple[Document, int]:
        """One section per page with text, in page order, lines over the limit cut within their page (so
        line and page numbers stay true); and how many lines were cut."""
        doc = Document(path, "pdf")
        cut_total = 0
        for page in sorted(pages, key=lambda p: p.index):
            if page.text.strip():
                text, cut = cut_long_lines(page.text, self.limits.max_line_chars)
                cut_total += cut
                number = page.index + 1
                doc.sections.append(Section(text=text.rstrip("\n") + "\n",
                                            header=page_header(number, page.label, first=not doc.sections),
                                            page=number, page_label=page.label or None))
        return doc, cut_total


def list_local(text: str, limits: IngestLimits, prefetch: bool = True) -> Listing:
    """List a local source: a folder or an archive as a repository, any other path as one file (a compressed
    one, manual.pdf.gz, as the file inside: compressed.py).

    Display paths: 'name' for a file, 'folder/<path inside>' for a folder
    and 'archive.zip/<path inside>' for an archive, whatever other sources
    come with it.
    """
    path = Path(text).expanduser()
    name = path.name or path.resolve().name or text
    if not os.path.lexists(path):
        return Listing(items=[FileReport(path=text, status=ERROR, reason="not found")])
    if path.is_dir():
        return walk_folder(path, limits, prefix=f"{name}/")
    if archive_type(path.name) and path.is_file():
        return list_archive(path, limits, display=name, prefetch=prefetch)
    try:
        size = path.stat().st_size
    except OSError as exc:
        return Listing(items=[FileReport(path=name, status=ERROR, reason=f"cannot read: {exc.strerror}")])
    if (inner := inner_name(path.name)) and path.is_file():
        return Listing(items=[FileEntry(path=name, rel=inner, size=size, read=decompressing_reader(str(path), name),
                                        explicit=True, origin=text, compressed=True)])
    return Listing(items=[FileEntry(path=name, rel=name, size=size, read=disk_reader(str(path)),
                                    explicit=True, origin=text)])


# Failures that leave nothing to read: (status, reason template; {message} is the worker's message).
_PDF_REFUSALS = {
    "corrupt": (ERROR, "not a readable PDF ({message})"),
    "needs_password": (SKIPPED, "encrypted PDF: a password is needed"),
    "wrong_password": (SKIPPED, "encrypted PDF: the password is wrong"),
}
_PDF_CUT_SHORT = ("timeout", "crash", "stopped")  # failures after which the pages received are kept


@dataclass(frozen=True)
class _PdfTally:
    """Page counts of one extraction, which decide the PDF's status and notes."""

    total: int  # pages in the document
    target: int  # pages to read (the page limit may cut the document)
    with_text: int
    scanned: int  # pages without text but with images
    unreadable: int
    not_reached: int  # pages never received (timeout, crash, stop)

    @classmethod
    def of(cls, result: PdfExtraction, max_pages: int) -> _PdfTally:
        total = result.page_count
        target = min(total, max_pages)
        unreadable = len(result.page_errors)
        return cls(total=total, target=target,
                   with_text=sum(1 for p in result.pages if p.text.strip()),
                   scanned=sum(1 for p in result.pages if not p.text.strip() and p.has_images),
                   unreadable=unreadable,
                   not_reached=max(0, target - len(result.pages) - unreadable))


def pdf_outcome(result: PdfExtraction, max_pages: int) -> tuple[str, str]:
    """(status, reason) for a PDF from what the worker reported."""
    if result.failure in _PDF_REFUSALS:
        status, template = _PDF_REFUSALS[result.failure]
        return status, template.format(message=result.message)
    tally = _PdfTally.of(result, max_pages)
    notes = _pdf_notes(result, tally)
    if tally.with_text == 0:
        return _textless_pdf_outcome(result, tally, notes)
    return (PARTIAL if _pdf_lossy(result, tally) else INGESTED), "; ".join(notes)


def _pdf_notes(result: PdfExtraction, tally: _PdfTally) -> list[str]:
    """Everything the report should say about pages missed, lost or without text."""
    notes: list[str] = []
    if result.failure in _PDF_CUT_SHORT:
        notes.append(f"{result.message}; {tally.not_reached} of {tally.total} pages not read")
    damage = _pdf_damage_note(result, tally)
    if damage:
        notes.append(damage)
    if tally.total > tally.target:
        notes.append(f"only the first {tally.target} of {tally.total} pages read (page limit)")
    if tally.scanned:
        notes.append(f"{tally.scanned} of {tally.total} pages have no text layer (scanned images; OCR is not enabled)")
    return notes


def _pdf_damage_note(result: PdfExtraction, tally: _PdfTally) -> str | None:
    """A repaired file counts unread and unreached pages as lost; otherwise only unreadable pages are told."""
    if result.repaired:
        if tally.unreadable:
            return (f"damaged file repaired by MuPDF; {tally.unreadable + tally.not_reached} of {tally.total} "
                    "pages lost")
        return "damaged file repaired by MuPDF"
    if tally.unreadable:
        return f"{tally.unreadable} of {tally.total} pages could not be read"
    return None


def _textless_pdf_outcome(result: PdfExtraction, tally: _PdfTally, notes: list[str]) -> tuple[str, str]:
    """(status, reason) for a PDF that gave no text: a failure, a stop, a scan, or simply no text."""
    if result.failure in ("timeout", "crash"):
        return ERROR, "; ".join(notes)
    if result.failure == "stopped":
        return SKIPPED, "; ".join(notes)
    if tally.scanned and tally.scanned == len(result.pages):
        return SKIPPED, f"scanned PDF without a text layer ({tally.scanned} pages of images); OCR is not enabled"
    return SKIPPED, "; ".join(["PDF has no extractable text"] + notes)


def _pdf_lossy(result: PdfExtraction, tally: _PdfTally) -> bool:
    """True when the text is not the whole document (report status 'partial')."""
    return bool(result.failure or tally.unreadable or tally.not_reached or tally.total > tally.target
                or tally.scanned)


def ingest(sources: Iterable[Source] | Source, *, tokenizer: Any = None, password: Passwords = None,
           limits: IngestLimits | None = IngestLimits(), progress: Callable[[ProgressEvent], None] | None = None,
           cancel: Any = None, chunk_tokens: int = 512, allow_urls: bool = True) -> Corpus:
    """Read files, folders, .zip archives and https git URLs into one Corpus (see package docs)."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    run = _Run(tokenizer=tokenizer, password=password, limits=limits or IngestLimits(), progress=progress,
               cancel=cancel, chunk_tokens=chunk_tokens, allow_urls=allow_urls)
    return run.run(list(sources))
