"""A document as the user picks it in a list (to remove it, or to switch it off): one file's display path, or an
uploaded archive's prefix ("repo.zip/"), which stands for every file read from that archive."""

from __future__ import annotations


def covers(choice: str, path: str) -> bool:
    """Whether ``choice`` picks the file ``path``: the file itself, or, for an archive's prefix ("repo.zip/"),
    every file read from that archive."""
    return path == choice or (choice.endswith("/") and path.startswith(choice))
