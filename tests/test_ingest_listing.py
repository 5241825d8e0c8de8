"""Contents and index pages told apart from the pages they point to (ingest/listing.py), on lines laid out as the
development set's manuals lay them out, and carried by a PDF chunk's provenance."""

from __future__ import annotations

import time

import ingest
from ingest.listing import is_listing
from ingest_fixtures import WordTokenizer, make_pdf

CONTENTS = """Valgrind User Manual
4.2. Explanation of error messages from Memcheck ............................................ 61
4.2.1. Illegal read / Illegal write errors ....................................................... 61
4.2.2. Use of uninitialised values ............................................................... 62
4.3. Memcheck Command-Line Options ............................................................ 68"""
INDEX = """Function and Concept Index
A
ABI compatibility . . . . . . . . . . . . . . . . . . 7
AEAD . . . . . . . . . . . . . . . . . . . . . . . . 44
aes_decrypt . . . . . . . . . . . . . . . . . . . 23"""
WRAPPED = """CONTENTS
Pause mouse close
. . . . . . . . . . . . . . . . . . . . . . 102
Axes . . . . . . . . . . . . . . . . . . . . . 103
Binary . . . . . . . . . . . . . . . . . . . . 103
Record
. . . . . . . . . . . . . . . . . . . . . . 104"""
FRONT_MATTER = """Preface . . . . . . . . . . . . ix
Introduction . . . . . . . . . . xiv
Overview . . . . . . . . . . . . . xxi"""
TEXINFO_CONTENTS = """i
Table of Contents
1
Introduction. . . . . . . . . . . . . . . . . . . . 1
7.1.1
Recommended hash functions. . . . . . . . . . . . . 8
7.1.1.1
SHA256. . . . . . . . . . . . . . . . . . . . . . . 8
7.1.1.4
SHA384 and other variants of SHA512 . . . . . . . 10
7.1.1.5"""
CSV_ROWS = """Colour, red, green, blue
red, 255, 0, 0
teal, 0, 128, 128
olive, 128, 128, 0
navy, 0, 0, 128"""
LATEX_INDEX = """Index
abbreviate, 3
abs, 380, 412
aggregate, 12–14
all.equal, 27"""
PROSE = """The tool reads the program once.... Then it runs it 20 to 30 times slower... 30
and reports each error once, with the stack trace of where it happened. Options change
how many entries the trace shows; the default is 12, and the largest number is 500."""
TABLE = """Signal    Number
SIGHUP    1
SIGINT    2
SIGKILL   9"""


def test_contents_and_index_lines_are_a_listing_in_each_layout():
    assert [is_listing(text) for text in (CONTENTS, INDEX, WRAPPED, FRONT_MATTER, LATEX_INDEX, TEXINFO_CONTENTS)] == [True] * 6


def test_prose_with_ellipses_and_tables_of_numbers_are_not():
    assert [is_listing(text) for text in (PROSE, TABLE, CSV_ROWS, "")] == [False] * 4


def test_a_page_with_a_few_leader_lines_among_its_prose_is_not():
    three_leaders = "\n".join(CONTENTS.splitlines()[1:4])
    assert is_listing(three_leaders)
    assert not is_listing(three_leaders + "\n" + PROSE + "\n" + PROSE)  # 3 of 9 lines
    assert not is_listing("\n".join(CONTENTS.splitlines()[1:3]))  # two lines: too few to tell


def test_a_pdf_chunk_from_a_contents_page_is_marked_and_one_from_a_text_file_is_not(tmp_path):
    pdf = make_pdf(tmp_path / "manual.pdf", [CONTENTS, PROSE, INDEX])
    notes = tmp_path / "notes.txt"
    notes.write_text(INDEX, encoding="utf-8")
    corpus = ingest.ingest([pdf, notes], tokenizer=WordTokenizer(), chunk_tokens=400)
    marked = {(c.where.page, c.where.source.endswith(".txt")): c.where.listing for c in corpus.chunks}
    assert marked == {(1, False): True, (2, False): False, (3, False): True, (None, True): False}


def test_a_hostile_line_of_a_million_dots_or_commas_is_judged_in_linear_time():
    started = time.process_time()
    for line in (". " * 500_000 + "q", "1," * 500_000 + "q", "a" + ",1" * 500_000 + "q"):
        assert not is_listing("\n".join([line] * 3))
    assert time.process_time() - started < 5  # quadratic matching took minutes per line
