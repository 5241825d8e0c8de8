"""Chunk boundaries in prose: a heading starts the chunk that holds what it heads."""

from __future__ import annotations

import re

import ingest
from ingest.chunking import Splitter, headings_start_chunks, split_spans
from ingest_fixtures import WordTokenizer

OPTION = re.compile(r"--option-(\d+)=<yes\|no> \[default: no\]")


def _options_manual(count: int) -> str:
    """A manual's option list as a PDF's text reads: each option's name on a line, a blank line, then what it does,
    in paragraphs of varied lengths so that the splitter cuts after some names."""
    paragraphs = []
    for n in range(count):
        words = " ".join(f"word{n}x{i}" for i in range(5 + (n * 7) % 23))
        paragraphs.append(f"--option-{n}=<yes|no> [default: no]\n\nControls feature {n}: {words}.")
    return "\n\n".join(paragraphs) + "\n"


def _ends_with_heading(body: str) -> bool:
    return bool(OPTION.fullmatch(body.rstrip().rsplit("\n\n", 1)[-1].strip()))


def test_no_prose_chunk_ends_with_the_name_of_the_option_the_next_one_explains():
    text = _options_manual(40)
    splitter = Splitter(60, lambda s: len(s.split()))
    raw = split_spans(text, splitter._for("pdf").split_text(text))
    assert sum(_ends_with_heading(text[a:b]) for a, b in raw) >= 3  # the splitter alone orphans names
    spans = splitter.spans(text, "pdf")
    assert len(spans) == len(raw)
    assert "".join(text[a:b] for a, b in spans) == text  # chunks still tile the text exactly
    assert all(b1 == a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))
    for a, b in spans:
        body = text[a:b]
        assert not _ends_with_heading(body)
        for n in re.findall(r"Controls feature (\d+):", body):  # each explanation is with its option's name
            assert f"--option-{n}=" in body


def test_only_one_short_line_that_does_not_end_a_sentence_moves():
    text = ("First paragraph of the section, long enough.\n\nThe digest size is 28 octets.\n\n"
            "Second paragraph, on two\nlines.\n\nEach element has these attributes:\n\nname, value.\n")
    first, second, third = text.index("\n\nThe digest"), text.index("\n\nSecond"), text.index("\n\nname")
    assert headings_start_chunks(text, [(0, second), (second, len(text))]) == [(0, second), (second, len(text))]
    assert headings_start_chunks(text, [(0, third), (third, len(text))]) == [(0, text.index("\n\nEach")),
                                                                             (text.index("\n\nEach"), len(text))]
    two_lines = text.index("\n\nEach")
    assert headings_start_chunks(text, [(0, two_lines), (two_lines, len(text))]) == [(0, two_lines),
                                                                                     (two_lines, len(text))]
    heading_only = "Table of Contents\n\n1. Introduction\n"
    cut = heading_only.index("\n\n1.")
    assert headings_start_chunks(heading_only, [(0, cut), (cut, len(heading_only))]) == [(0, cut),
                                                                                        (cut, len(heading_only))]
    assert headings_start_chunks(text, [(0, first), (first, len(text))]) == [(0, first), (first, len(text))]


def test_ingest_keeps_a_text_files_headings_with_their_paragraphs_and_leaves_code_as_split(tmp_path):
    text = _options_manual(40)
    (tmp_path / "options.txt").write_text(text)
    (tmp_path / "options.py").write_text(text + "# the same words as code\n")  # not skipped as a duplicate
    tokenizer = WordTokenizer()
    corpus = ingest.ingest([tmp_path / "options.txt", tmp_path / "options.py"], tokenizer=tokenizer, chunk_tokens=60)
    prose = [c.text[c.header_chars:] for c in corpus.chunks if c.where.source == "options.txt"]
    code = [c.text[c.header_chars:] for c in corpus.chunks if c.where.source == "options.py"]
    assert "".join(prose) == text and "".join(code).startswith(text)
    assert not any(_ends_with_heading(body) for body in prose)
    assert any(_ends_with_heading(body) for body in code)  # code is split at its language's boundaries only
    for chunk in corpus.chunks:
        assert chunk.line_end == chunk.line_start + chunk.text[chunk.header_chars:].rstrip("\n").count("\n")
