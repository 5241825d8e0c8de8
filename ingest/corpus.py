"""The ingested context: ordered chunks, their provenance and offset lookups.

Corpus.text is exactly the concatenation of chunk texts (headers included),
so a character offset in the text maps back to one chunk and from there to
file, page and line. (Token positions of a fed context map back through the
app's SpanIndex: the model's context is the one place tokens are placed.)
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .chunking import Splitter
from .documents import Document, file_header
from .kv_memory import estimate_kv_bytes
from .listing import is_listing
from .outline import HeadingTracker
from .results import ERROR, INGESTED, PARTIAL, SKIPPED, FileReport, IngestCancelled, Location, Provenance
from .tokens import TokenCounter


@dataclass
class Chunk:
    """One prefill unit and citation anchor."""

    text: str  # header (if first of its file/page) + content
    where: Provenance  # file, page, line range: what a citation of this chunk says
    char_start: int  # offsets into Corpus.text
    char_end: int
    tokens: int  # tokens of `text` alone: what chunking sized it by
    index: int = 0
    language: str = ""
    header_chars: int = 0  # len of the header prefix of `text`

    # Read-through to the provenance, for callers that ask a chunk directly.
    source = property(lambda self: self.where.source)
    page = property(lambda self: self.where.page)
    page_label = property(lambda self: self.where.page_label)
    line_start = property(lambda self: self.where.line_start)
    line_end = property(lambda self: self.where.line_end)


@dataclass
class Corpus:
    """Result of ingest(): reports for every file, chunks in context order."""

    reports: list[FileReport] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list, repr=False)
    text: str = field(default="", repr=False)
    n_tokens: int = 0
    tokens_exact: bool = False  # True when counted with the model's tokenizer

    def __post_init__(self) -> None:
        self._char_starts = [c.char_start for c in self.chunks]

    def locate(self, char_offset: int) -> Location:
        """File, page and line of the character at `char_offset` of `text`."""
        if not 0 <= char_offset < len(self.text):
            raise IndexError(f"character offset {char_offset} is outside the text (0..{len(self.text) - 1})")
        chunk = self.chunks[bisect.bisect_right(self._char_starts, char_offset) - 1]
        line = None
        if chunk.line_start is not None:
            inner = char_offset - chunk.char_start
            line = chunk.line_start + (chunk.text.count("\n", chunk.header_chars, inner)
                                       if inner > chunk.header_chars else 0)
        return Location(source=chunk.source, page=chunk.page, page_label=chunk.page_label, line=line,
                        chunk=chunk.index)

    def chunks_of(self, source: str) -> list[Chunk]:
        """Chunks of one file, in order."""
        return [c for c in self.chunks if c.source == source]

    def estimate_kv_bytes(self, **model_dims) -> dict:
        """estimate_kv_bytes(self.n_tokens, **model_dims) (see ingest.kv_memory)."""
        return estimate_kv_bytes(self.n_tokens, **model_dims)

    def totals(self) -> dict:
        """Counts for a summary line: files per status, pages, chars, tokens, chunks."""
        by_status = {s: sum(1 for r in self.reports if r.status == s) for s in (INGESTED, PARTIAL, SKIPPED, ERROR)}
        return {
            "files": len(self.reports),
            **by_status,
            "pages": sum(r.pages for r in self.reports if r.status in (INGESTED, PARTIAL)),
            "chars": len(self.text),
            "tokens": self.n_tokens,
            "tokens_exact": self.tokens_exact,
            "chunks": len(self.chunks),
            "bytes": sum(r.bytes for r in self.reports if r.status in (INGESTED, PARTIAL)),
        }


class CorpusBuilder:
    """Appends documents as chunks with running character and token offsets."""

    def __init__(self, counter: TokenCounter, chunk_tokens: int) -> None:
        self.counter = counter
        self.splitter = Splitter(chunk_tokens, counter)
        self.chunks: list[Chunk] = []
        self._parts: list[str] = []
        self._chars = 0
        self._tokens = 0

    @property
    def tokens(self) -> int:
        """Tokens appended so far."""
        return self._tokens

    def add(self, doc: Document, cancel=None) -> list[Chunk]:
        """Chunk `doc` and append it; returns its chunks."""
        added: list[Chunk] = []
        doc_header = file_header(doc.path, doc.language, first=not self.chunks)
        headings = HeadingTracker(doc.outline)
        for s_index, section in enumerate(doc.sections):
            section_header = (doc_header if s_index == 0 else "") + section.header
            headings.enter_page(section.page or 0, section.text)
            for c_index, (a, b) in enumerate(self.splitter.spans(section.text, doc.language)):
                if cancel is not None and cancel.is_set():
                    raise IngestCancelled()
                header = section_header if c_index == 0 else ""
                body = section.text[a:b]
                text = header + body
                line_start = line_end = None
                if section.line_start is not None:
                    line_start = section.line_start + section.text.count("\n", 0, a)
                    line_end = line_start + body.rstrip("\n").count("\n")
                tokens = self.counter(text)
                words_at = b - len(body.lstrip())  # a heading that starts the chunk is the chunk's own
                listing = section.page is not None and is_listing(body)  # contents and index pages, PDFs' only
                where = Provenance(doc.path, section.page, section.page_label, line_start, line_end,
                                   headings.heading_at(words_at), listing=listing)
                chunk = Chunk(text=text, where=where, char_start=self._chars,
                              char_end=self._chars + len(text), tokens=tokens, index=len(self.chunks), language=doc.language,
                              header_chars=len(header))
                self.chunks.append(chunk)
                self._parts.append(text)
                self._chars += len(text)
                self._tokens += tokens
                added.append(chunk)
        return added

    def build(self, reports: list[FileReport]) -> Corpus:
        return Corpus(reports=reports, chunks=self.chunks, text="".join(self._parts), n_tokens=self._tokens,
                      tokens_exact=self.counter.exact)
