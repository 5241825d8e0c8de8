"""A source, once listed: files to read (lazily) and paths already refused.

Folders, zip archives and clones all list into the same shape so that one
pipeline applies the same limits, dedup and decoding to every file, and the
zip reader never writes an entry to disk (no zip-slip by construction).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

from .languages import is_readme
from .results import FileReport


@dataclass
class FileEntry:
    """One file to read. `read(n)` returns at most n bytes of its content."""

    path: str  # display path (report, headers, citations)
    rel: str  # path inside its source, '/'-separated (filters, language)
    size: int  # size known before reading (stat or zip header)
    read: Callable[[int], bytes]
    explicit: bool = False  # picked by the user, not found inside a repository
    origin: str = ""  # the source string the user gave (explicit files), for password lookup
    compressed: bool = False  # read through a decompressor (compressed.py): size is the compressed size


Item = Union[FileEntry, FileReport]


@dataclass
class Listing:
    """Ordered items of one source plus what to release once it is read."""

    items: list[Item] = field(default_factory=list)
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        while self.cleanups:
            try:
                self.cleanups.pop()()
            except Exception:  # noqa: BLE001 - releasing must not mask the real outcome
                pass


def repo_order_key(rel: str) -> tuple:
    """README files at the root first (README.md before others), then by path."""
    parts = rel.rstrip("/").split("/")
    if len(parts) == 1 and is_readme(parts[0]):
        return (0, parts[0].lower() != "readme.md", parts[0].lower())
    return (1, tuple((p.lower(), p) for p in parts))
