"""Which documents answers are drawn from: each file, and each uploaded archive as a whole, can be switched off
and on again without reading anything again.

A document switched off stays in the context (the model read it, and recall may still attend to it), but it is
neither cited nor quoted: with quoting on (the default), an answer is drawn in a reader holding only the quotes
of the documents switched on (quoting.py), so it answers from those alone.
"""

from __future__ import annotations

from .documents import DocumentRow
from .removal import archive_prefix, in_context


def answer_choices(rows: list[DocumentRow]) -> list[tuple[str, str]]:
    """(label, value) for the "Answer from" list: each archive as one choice ("repo.zip/",
    document_choice.covers), then each file read on its own."""
    archives: dict[str, int] = {}
    files = []
    for path in in_context(rows):
        prefix = archive_prefix(path)
        if prefix is None:
            files.append((path, path))
        else:
            archives[prefix] = archives.get(prefix, 0) + 1
    whole = [(f"{prefix[:-1]} ({count} file{'s' if count != 1 else ''})", prefix)
             for prefix, count in archives.items()]
    return whole + files


def still_off(switched_off: set[str], rows: list[DocumentRow]) -> frozenset[str]:
    """The documents switched off that are still in the context (a removed one is forgotten)."""
    return frozenset(value for _, value in answer_choices(rows) if value in switched_off)
