"""Contents and index pages: lines of titles led by dots to a page number, or index entries and their pages.

Why: such a page names every section of a long manual in a few hundred tokens, so a question's words often score
higher there than on the page that answers it. On the development set 24 of the 944 chunks BM25 ranked in its first
four were contents or index lines, and 3 first chunks (the Valgrind manual's contents before its quick start,
Nettle's index before its page on RC4), never holding the answer (docs/answers.md). A passage marked as a listing
is still read and still cited when nothing else matches; citations rank it after the passages it points to
(``citations.rank_chunks``).
"""

from __future__ import annotations

import re

# A dot leader ("....", ". . .") ending in a page number, arabic or roman: "4.3. Options ........ 68",
# "aes_encrypt . . . . . 23", ". . . . 104" when the title stands on the line above.
_LEADER_LINE = re.compile(r"(?:\.\s?){4,}\s*(?:\d+|[ivxlcdm]+)\s*$", re.IGNORECASE)
# An index entry as LaTeX's makeindex sets it, a comma before its pages: "abbreviate, 3", "glob, 12, 40-41".
# The pages must not go down ("abs, 380, 412"), which a row of comma-separated values ("red, 255, 0, 0") does.
_INDEX_PAGES = re.compile(r",\s*\d+(?:\s*[,\u2013-]\s*\d+)*$")
_STARTS_WITH_A_WORD = re.compile(r"[^\W\d]")
# A line holding a number alone: a section's number that extraction put on a line of its own before its title
# ("7.1.1.3" then "SHA512 . . . . 9", as texinfo's contents come out), or a page's number. Counted neither way.
_NUMBER_ALONE = re.compile(r"(?:[A-Z]\.)?\d+(?:\.\d+)*\.?|[ivxlcdm]+", re.IGNORECASE)
LEAST_LINES = 3  # a passage with fewer such lines is prose that happens to hold one
TAIL_CHARS = 120  # only a line's end is matched: linear time on a hostile page's one-line megabyte of dots


def _points_to_a_page(line: str) -> bool:
    tail = line[-TAIL_CHARS:]
    if _LEADER_LINE.search(tail):
        return True
    pages = _INDEX_PAGES.search(tail)
    if not (pages and _STARTS_WITH_A_WORD.match(line)):
        return False
    numbers = [int(n) for n in re.findall(r"\d+", pages.group())]
    return numbers == sorted(numbers)


def is_listing(text: str) -> bool:
    """Whether at least half of the text's lines, and at least LEAST_LINES, end in a page number after a dot leader
    or an index entry's comma; blank lines and numbers alone are not counted."""
    lines = [line for line in map(str.strip, text.splitlines()) if line and not _NUMBER_ALONE.fullmatch(line)]
    pointing = sum(_points_to_a_page(line) for line in lines)
    return pointing >= LEAST_LINES and 2 * pointing >= len(lines)
