"""Which documents answers are drawn from: each file, and each uploaded archive as a whole, can be switched off
and on again without reading anything again.

A document switched off stays in the context (the model read it, and recall may still attend to it), but it is
neither cited nor quoted: with quoting on (the default), an answer is drawn in a reader holding only the quotes
of the documents switched on (quoting.py), so it answers from those alone.
"""

from __future__ import annotations

from .uploads import DocumentRow
from .removal import archive_counts, archive_prefix, in_context


def answer_choices(rows: list[DocumentRow]) -> list[tuple[str, str]]:
    """(label, value) for the "Answer from" list: each archive as one choice ("repo.zip/",
    document_choice.covers), then each file read on its own."""
    paths = in_context(rows)
    whole = [(f"{prefix[:-1]} ({count} file{'s' if count != 1 else ''})", prefix)
             for prefix, count in archive_counts(paths).items()]
    return whole + [(path, path) for path in paths if archive_prefix(path) is None]


def still_off(switched_off: set[str], rows: list[DocumentRow]) -> frozenset[str]:
    """The documents switched off that are still in the context (a removed one is forgotten)."""
    return frozenset(value for _, value in answer_choices(rows) if value in switched_off)
