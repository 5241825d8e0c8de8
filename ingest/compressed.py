"""One file compressed on its own (manual.pdf.gz, changelog.Debian.gz, notes.txt.xz), read as the file inside.

Debian ships its manuals this way, and the file picker offers .gz, .bz2 and .xz. The decompressor is read
through, never more than the caller's limit, so a small file that would expand to gigabytes costs no more
memory than a plain file at the limit. Tar archives (.tar.gz ...) are repositories, listed elsewhere.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
from typing import Callable

from .archive import archive_type
from .repo import open_regular

DECOMPRESSORS: dict[str, Callable] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def inner_name(name: str) -> str | None:
    """The name of the file inside a single compressed file ('manual.pdf' for 'manual.pdf.gz'), else None."""
    if archive_type(name):
        return None
    lower = name.lower()
    for suffix in DECOMPRESSORS:
        if lower.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return None


def decompressing_reader(path: str, name: str) -> Callable[[int], bytes]:
    """read(n) for the file inside the compressed file ``name`` at ``path``: at most n decompressed bytes."""
    opener = DECOMPRESSORS[name.lower()[name.rfind("."):]]

    def read(n: int) -> bytes:
        with open_regular(path) as raw, opener(raw, "rb") as stream:
            return stream.read(n)

    return read
