"""Chunk boundaries: a heading starts the chunk that holds what it heads (prose), and comments and decorators
the chunk of the definition they run into (code)."""

from __future__ import annotations

import re

import ingest
from ingest.chunking import Splitter, heads_start_chunks, split_spans
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


def _moved(text: str, cut: int, prose: bool = True) -> int:
    """Where the boundary at ``cut`` between two chunks of ``text`` ends up."""
    return heads_start_chunks(text, [(0, cut), (cut, len(text))], prose=prose)[0][1]


def test_only_short_lines_that_end_no_sentence_move():
    text = ("First paragraph of the section, long enough.\n\nThe digest size is 28 octets.\n\n"
            "Second paragraph, on two\nlines.\n\nEach element has these attributes:\n\nname, value.\n")
    assert _moved(text, text.index("\n\nname")) == text.index("\n\nEach")  # a lead-in goes with its list
    for kept in ("\n\nThe digest", "\n\nSecond", "\n\nEach"):  # after a sentence, after two lines
        assert _moved(text, text.index(kept)) == text.index(kept)
    heading_only = "Table of Contents\n\n1. Introduction\n"
    assert _moved(heading_only, heading_only.index("\n\n1.")) == heading_only.index("\n\n1.")


def test_a_definitions_signatures_start_the_chunk_of_what_they_define():
    """Octave's manual: "realmin\nrealmin (n)\n..." then a blank line, then "Return a scalar ... smallest": the
    splitter cut after the signatures, so the description's chunk did not name its function."""
    signatures = "\n".join(["realmin", "realmin (n)", "realmin (n, m)", "realmin (. . ., class)"])
    text = f"See also: [realmax], page 583.\n\n{signatures}\n\nReturn the smallest normalized number.\n"
    assert _moved(text, text.index("\n\nReturn")) == text.index("\n\nrealmin")
    seven = "\n".join(f"f (x{i})" for i in range(7))  # more than HEADING_LINES: a block of its own (a table, code)
    table = f"Intro.\n\n{seven}\n\nDescription.\n"
    assert _moved(table, table.index("\n\nDescription")) == table.index("\n\nDescription")
    for block in ("realmin\nIt returns the smallest.", "realmin\n" + "x" * 101):  # a sentence, a long line
        prose = f"Intro.\n\n{block}\n\nDescription.\n"
        assert _moved(prose, prose.index("\n\nDescription")) == prose.index("\n\nDescription")


def test_comments_and_decorators_go_with_the_definition_they_run_into():
    code = "x = 1\n\n# Parses a header.\n@cache\n@wraps(f)\ndef parse(line):\n    return line\n"
    assert _moved(code, code.index("\ndef parse"), prose=False) == code.index("\n# Parses")
    separate = "x = 1\n# a section of its own\n\ndef parse(line):\n    return line\n"
    assert _moved(separate, separate.index("\n\ndef"), prose=False) == separate.index("\n\ndef")
    long_block = "x = 1\n" + "".join(f"// line {i} of a licence\n" for i in range(13)) + "function f() {}\n"
    assert _moved(long_block, long_block.index("\nfunction"), prose=False) == long_block.index("\nfunction")
    only_comments = "// one\n// two\nfunction f() {}\n"
    assert _moved(only_comments, only_comments.index("\nfunction"), prose=False) == only_comments.index("\nfunction")
    assert _moved(code, code.index("\ndef parse")) == code.index("\ndef parse")  # prose rules do not apply to code


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


def test_a_modules_decorators_stay_with_their_classes(tmp_path):
    source = "from dataclasses import dataclass\n\n\n" + "".join(
        f"# Event {n} of the protocol.\n@dataclass(frozen=True)\nclass Event{n}:\n"
        + "".join(f"    field_{n}_{i}: int = {i}\n" for i in range(3 + (n * 5) % 11)) + "\n\n"
        for n in range(30))
    (tmp_path / "events.py").write_text(source)
    tokenizer = WordTokenizer()
    splitter = Splitter(60, lambda s: len(tokenizer.encode(s, add_special_tokens=False)))
    raw = split_spans(source, splitter._for("python").split_text(source))
    assert sum(source[a:b].endswith("@dataclass(frozen=True)") for a, b in raw) >= 3  # the splitter alone orphans
    corpus = ingest.ingest([tmp_path / "events.py"], tokenizer=tokenizer, chunk_tokens=60)
    bodies = [c.text[c.header_chars:] for c in corpus.chunks]
    assert "".join(bodies) == source and len(bodies) < len(raw)  # chunks of a decorator alone join their class
    for chunk, body in zip(corpus.chunks, bodies):
        assert not body.rstrip("\n").endswith(("@dataclass(frozen=True)", "of the protocol."))
        for n in re.findall(r"^class Event(\d+):", body, flags=re.MULTILINE):
            assert f"# Event {n} of the protocol.\n@dataclass(frozen=True)\nclass Event{n}:" in body
        assert chunk.line_start == source.count("\n", 0, source.index(body)) + 1
