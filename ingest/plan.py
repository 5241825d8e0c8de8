"""ingest.plan(): what ingest() would read, and at most how many tokens, before reading it.

A budget check that is cheap enough to run before any extraction or
tokenisation: sources are listed with the same rules as ingest() (display
paths, .gitignore, skip rules, archive safety checks, size and count
limits), but no file is read, no PDF is opened and nothing is tokenised.
Sizes come from the file system, from a zip's central directory, and from
tar headers (a compressed tar has no index, so its stream is decompressed
once to read them; member data is not kept).

The bound: every token the model's tokenizer produces covers at least one
byte of UTF-8 text (true for byte-level BPE and for SentencePiece with byte
fallback such as Llama's), and the text ingest() produces from a text,
code, HTML or notebook file is never longer than the file (markup,
JSON and outputs are dropped, long lines are cut).  So a text file of N
bytes adds at most N tokens plus its header line.  Files in legacy
single-byte encodings can exceed this with byte-fallback tokenizers (one
byte may decode to a character that takes 2-3 byte tokens); such files are
rare and the bound is still a fair ceiling.  PDFs have no true bound
(compressed content streams can expand arbitrarily): their figure assumes
at most one token per byte of the file, which holds for ordinary PDFs
(layout operators and fonts outweigh the text) and is noted as a heuristic.
A file compressed on its own (notes.txt.gz) may expand to anything up to
the size limit it is read to, so that limit is its bound.
Files ingest() will certainly skip (by name, size or limits) count 0;
files it may still skip after reading (binary content, duplicates) count
in full.  Git URLs cannot be sized without cloning: tokens_upper is None.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Iterable, NamedTuple, Union

from .documents import file_header
from .entries import FileEntry
from .filters import ARCHIVE_EXTENSIONS, BINARY_EXTENSIONS, archive_reason
from .git_url import looks_like_url
from .languages import language_for
from .limits import IngestLimits
from .pipeline import list_local
from .results import FileReport
from .units import human_bytes

Source = Union[str, "os.PathLike[str]"]


class PlanItem(NamedTuple):
    """One file (or refused source) as ingest() would report it."""

    path: str  # display path, as FileReport.path / Chunk.source will read
    bytes: int  # size on disk, or declared uncompressed size inside an archive
    tokens_upper: int | None  # at most this many tokens in the context; 0 = will be skipped; None = unknown
    note: str = ""  # why 0 or None, or 'PDF: heuristic bound'


def _header_bytes(path: str) -> int:
    return len(file_header(path, language_for(path), first=False).encode("utf-8"))


def plan(sources: Iterable[Source] | Source, *, limits: IngestLimits | None = None,
         allow_urls: bool = True) -> list[PlanItem]:
    """Display path, size and an upper bound of tokens for every file `sources` would give (see module doc)."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    limits = limits or IngestLimits()
    items: list[PlanItem] = []
    used: set[str] = set()
    files = total = 0

    def unique(path: str) -> str:
        candidate, n = path, 1
        while candidate in used:
            n += 1
            candidate = f"{path} ({n})"
        used.add(candidate)
        return candidate

    for source in sources:
        text = os.fspath(source)
        if isinstance(source, str) and looks_like_url(text):
            if allow_urls:
                items.append(PlanItem(text, 0, None, "git URL: size unknown until cloned"))
            else:
                items.append(PlanItem(text, 0, 0, "skipped: URL sources are disabled"))
            continue
        listing = list_local(text, limits, prefetch=False)
        try:
            for item in listing.items:
                if isinstance(item, FileReport):
                    items.append(PlanItem(item.path, item.bytes, 0, f"{item.status}: {item.reason}"))
                    continue
                path = unique(item.path)
                skip = _skip_reason(item, limits, files, total)
                if skip:
                    items.append(PlanItem(path, item.size, 0, f"skipped: {skip}"))
                    continue
                files += 1
                total += item.size
                pdf = PurePosixPath(item.rel).suffix.lower() == ".pdf"
                if item.compressed:  # it may expand to anything up to the limit it is read to
                    items.append(PlanItem(path, item.size, limits.file_cap(item.rel) + _header_bytes(path),
                                          f"{'PDF, ' if pdf else ''}compressed: bound from the size limit"))
                    continue
                bound = item.size + _header_bytes(path)
                items.append(PlanItem(path, item.size, bound,
                                      "PDF: heuristic bound (1 token per byte of the file)" if pdf else ""))
        finally:
            listing.close()
    return items


def _skip_reason(entry: FileEntry, limits: IngestLimits, files: int, total: int) -> str | None:
    """What ingest() would skip this file for before reading it (the same checks, in the same order)."""
    suffix = PurePosixPath(entry.rel).suffix.lower()
    if entry.explicit and suffix in BINARY_EXTENSIONS:
        return f"binary file ({suffix})"
    if entry.explicit and suffix in ARCHIVE_EXTENSIONS:
        return archive_reason(suffix, entry.compressed)
    if files >= limits.max_files:
        return f"file limit reached ({limits.max_files} files)"
    cap = limits.file_cap(entry.rel)
    if entry.size > cap:
        return f"file is {human_bytes(entry.size)}, over the {human_bytes(cap)} limit"
    if total + entry.size > limits.max_total_bytes:
        return f"total input limit of {human_bytes(limits.max_total_bytes)} reached"
    if entry.size == 0:
        return "empty file"
    return None
