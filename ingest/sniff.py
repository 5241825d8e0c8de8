"""What a file really is, from its first bytes (names lie, uploads lie more)."""

from __future__ import annotations

from .text import looks_binary

ARCHIVE_MAGIC = (
    (b"PK\x03\x04", "zip"), (b"PK\x05\x06", "zip"), (b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"), (b"7z\xbc\xaf\x27\x1c", "7z"), (b"Rar!\x1a\x07", "rar"), (b"\x28\xb5\x2f\xfd", "zstd"),
)


def archive_format(data: bytes) -> str | None:
    """'zip', 'gzip', ... when `data` starts like an archive, else None."""
    for magic, name in ARCHIVE_MAGIC:
        if data.startswith(magic):
            return name
    if len(data) > 262 and data[257:262] == b"ustar":
        return "tar"
    return None


def is_pdf(data: bytes, name: str) -> bool:
    """Starts with the PDF header, or has a .pdf name (then MuPDF decides).

    Only the start counts: a script that mentions the header is still text.
    """
    return data[:1024].lstrip(b"\xef\xbb\xbf \t\r\n\x00").startswith(b"%PDF-") or name.lower().endswith(".pdf")


def content_kind(data: bytes, name: str) -> str:
    """'pdf', 'archive', 'binary' or 'text'."""
    if is_pdf(data, name):
        return "pdf"
    if archive_format(data):
        return "archive"
    if looks_binary(data):
        return "binary"
    return "text"
