"""What Remove offers: each file in the context, and each archive read into it as one choice.

A zipped repository is one upload but many rows (one per file); removing it file by file took as many
re-reads. An archive's choice is its display prefix ("repo.zip/"), which ``document_choice.covers`` matches against
every file read from it.
"""

from __future__ import annotations

from ingest.archive import archive_type

from ..engine.document_choice import covers
from .uploads import DocumentRow


def archive_prefix(path: str) -> str | None:
    """"repo.zip/" for "repo.zip/src/app.py" (a file read from an uploaded archive), else None."""
    head, sep, rest = path.partition("/")
    return head + "/" if sep and rest and archive_type(head) else None


def in_context(rows: list[DocumentRow]) -> list[str]:
    return list(dict.fromkeys(r.path for r in rows if r.status.in_context))


def archive_counts(paths: list[str]) -> dict[str, int]:
    """Each archive's prefix ("repo.zip/") among ``paths``, and how many of them were read from it."""
    archives: dict[str, int] = {}
    for path in paths:
        prefix = archive_prefix(path)
        if prefix is not None:
            archives[prefix] = archives.get(prefix, 0) + 1
    return archives


def removal_choices(rows: list[DocumentRow]) -> list[tuple[str, str]]:
    """(label, value) for the Remove list: archives with more than one file in the context first, whole, then
    every file."""
    paths = in_context(rows)
    archives = archive_counts(paths)
    whole = [(f"{prefix[:-1]} (the whole archive, {count} files)", prefix)
             for prefix, count in archives.items() if count > 1]
    return whole + [(path, path) for path in paths]


def removal_label(choice: str, rows: list[DocumentRow]) -> str:
    """How a removal is named in messages: the file, or the archive and how many of its files go."""
    if not choice.endswith("/"):
        return choice
    count = sum(covers(choice, path) for path in in_context(rows))
    return f"{choice[:-1]} ({count} files)"
