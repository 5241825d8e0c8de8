"""Resource limits for ingestion.

Every limit exists because a real or hostile upload can otherwise exhaust the
server: one huge file, a zip bomb, a repository with a million files, a PDF
that makes MuPDF spin forever.  Defaults suit a single-user chat app; the app
may tighten them per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from .units import GiB, KiB, MiB


@dataclass(frozen=True)
class IngestLimits:
    """Upper bounds applied while reading sources (all sizes in bytes)."""

    # Text and code files larger than this are skipped (not truncated).
    max_file_bytes: int = 10 * MiB
    # PDFs are bigger per token than text, so they get their own bound.
    max_pdf_bytes: int = 256 * MiB
    # Total bytes read or decompressed across one ingest() call.
    max_total_bytes: int = 1 * GiB
    # Files read across one ingest() call; also the most files an archive may
    # list and the most files listed from one folder.
    max_files: int = 10_000
    # Zip entries expanding more than this (uncompressed / compressed) are
    # treated as bombs, once they are at least zip_ratio_min_bytes large.
    # (Tar members have no per-member compressed size: a compressed tar's
    # decompressed stream is capped at max_total_bytes plus header room.)
    max_zip_ratio: float = 100.0
    zip_ratio_min_bytes: int = 64 * KiB
    # Characters of extracted text across one ingest() call (~4 characters a
    # token): a small hostile PDF can otherwise expand into gigabytes of text.
    max_total_chars: int = 64_000_000
    # Lines longer than this are cut (minified code, base64 blobs, data dumps).
    max_line_chars: int = 10_000
    # Folder walks stop descending below this depth (symlink-free loops, junk).
    max_depth: int = 48
    # PDF extraction runs in a worker process killed after this many seconds.
    pdf_timeout_s: float = 120.0
    # Pages beyond this are not read.
    max_pdf_pages: int = 10_000
    # Address-space cap of the PDF worker process (0 disables the cap).
    pdf_worker_memory_bytes: int = 4 * GiB
    # git clone of an https URL: wall-clock and on-disk bounds.
    clone_timeout_s: float = 60.0
    max_clone_bytes: int = 500 * MiB
    # Host name resolution before cloning; fails fast when offline.
    dns_timeout_s: float = 3.0

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if value < 0:
                raise ValueError(f"IngestLimits.{name} must be >= 0, got {value!r}")
        if self.max_zip_ratio < 1:
            raise ValueError("IngestLimits.max_zip_ratio must be >= 1")

    def file_cap(self, name: str) -> int:
        """The most bytes one file called ``name`` is read to: PDFs have their own, larger bound."""
        return self.max_pdf_bytes if PurePosixPath(name).suffix.lower() == ".pdf" else self.max_file_bytes

