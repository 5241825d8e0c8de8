"""Plain text and code files: encodings, binaries, empty files, long lines, limits, tokens."""

from __future__ import annotations

import ingest
from ingest.text import decode_text, looks_binary
from ingest.tokens import TokenCounter, estimate_tokens
from ingest_fixtures import WordTokenizer, report_for


def _lines(n: int) -> str:
    return "".join(f"line {i} says something about topic {i % 7}.\n" for i in range(1, n + 1))


def test_line_numbers_survive_chunking_and_crlf(tmp_path):
    text = _lines(120)
    (tmp_path / "notes.txt").write_bytes(text.replace("\n", "\r\n").encode())
    corpus = ingest.ingest([tmp_path / "notes.txt"], chunk_tokens=60)
    assert len(corpus.chunks) > 5
    assert "\r" not in corpus.text
    bodies = [c.text[c.header_chars:] for c in corpus.chunks]
    assert "".join(bodies) == text
    expected_start = 1
    for chunk, body in zip(corpus.chunks, bodies):
        assert chunk.line_start == expected_start
        assert chunk.line_end == chunk.line_start + body.rstrip("\n").count("\n")
        expected_start += body.count("\n")
    for n in (1, 2, 57, 119, 120):
        offset = corpus.text.index(f"line {n} says")
        assert corpus.locate(offset).line == n
        assert corpus.locate(offset).cite() == f"notes.txt:{n}"


def test_windows_1252_is_detected_and_reported(tmp_path):
    content = "Le café était déjà très cher, voilà €5.\n" * 4
    (tmp_path / "fr.txt").write_bytes(content.encode("cp1252"))
    corpus = ingest.ingest([tmp_path / "fr.txt"])
    r = report_for(corpus, "fr.txt")
    assert (r.status, r.reason) == ("ingested", "not UTF-8; decoded as cp1252 (detected)")
    assert content in corpus.text


def test_damaged_utf8_is_decoded_with_replacement_and_marked_partial(tmp_path):
    (tmp_path / "bad.md").write_bytes("naïve café ".encode() * 5 + b"\xff\xfe broken\n")
    corpus = ingest.ingest([tmp_path / "bad.md"])
    r = report_for(corpus, "bad.md")
    assert (r.status, r.reason, r.language) == ("partial", "invalid UTF-8; 2 damaged bytes replaced", "markdown")
    assert "naïve café" in corpus.text and "\ufffd\ufffd broken" in corpus.text


def test_utf16_with_bom_is_text_not_binary(tmp_path):
    data = "hello wide world\nsecond line\n".encode("utf-16")
    assert looks_binary(data) is False
    (tmp_path / "wide.txt").write_bytes(data)
    corpus = ingest.ingest([tmp_path / "wide.txt"])
    assert report_for(corpus, "wide.txt").status == "ingested"
    assert corpus.text == "### wide.txt\nhello wide world\nsecond line\n"


def test_binary_empty_and_whitespace_files_are_skipped_with_reasons(tmp_path):
    (tmp_path / "data.txt").write_bytes(b"\x00\x01\x02binary\x00" * 100)
    (tmp_path / "empty.py").write_bytes(b"")
    (tmp_path / "blank.md").write_text("  \n\n\t\n")
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 50)
    (tmp_path / "ok.py").write_text("print('ok')\n")
    corpus = ingest.ingest([tmp_path / n for n in ("data.txt", "empty.py", "blank.md", "photo.png", "ok.py")])
    reasons = {r.path: (r.status, r.reason) for r in corpus.reports}
    assert reasons == {
        "data.txt": ("skipped", "binary file"),
        "empty.py": ("skipped", "empty file"),
        "blank.md": ("skipped", "empty file (whitespace only)"),
        "photo.png": ("skipped", "binary file (.png)"),
        "ok.py": ("ingested", ""),
    }
    assert corpus.text == "### ok.py (python)\nprint('ok')\n"


def test_huge_lines_are_cut_without_shifting_line_numbers(tmp_path):
    (tmp_path / "bundle.js").write_text("var a = 1;\n" + "x" * 50_000 + "\nvar tail = 2;\n")
    corpus = ingest.ingest([tmp_path / "bundle.js"], limits=ingest.IngestLimits(max_line_chars=1000))
    r = report_for(corpus, "bundle.js")
    assert (r.status, r.reason, r.language) == ("partial", "1 line longer than 1000 characters cut", "js")
    assert "x" * 1000 + " [... line cut: 50000 characters]\n" in corpus.text
    assert "x" * 1001 not in corpus.text
    assert corpus.locate(corpus.text.index("var tail")).line == 3


def test_file_over_the_size_limit_is_skipped_and_others_still_read(tmp_path):
    (tmp_path / "big.log").write_text("z" * 5000)
    (tmp_path / "small.txt").write_text("fits\n")
    corpus = ingest.ingest([tmp_path / "big.log", tmp_path / "small.txt"],
                           limits=ingest.IngestLimits(max_file_bytes=4096))
    big = report_for(corpus, "big.log")
    assert (big.status, big.reason, big.bytes) == ("skipped", "file is 4.9 KB, over the 4.0 KB limit", 5000)
    assert report_for(corpus, "small.txt").status == "ingested"


def test_missing_path_and_duplicate_content(tmp_path):
    (tmp_path / "a.txt").write_text("same words\n")
    (tmp_path / "b.txt").write_text("same words\n")
    corpus = ingest.ingest([tmp_path / "a.txt", tmp_path / "nope.txt", tmp_path / "b.txt"])
    assert [(r.path, r.status, r.reason) for r in corpus.reports] == [
        ("a.txt", "ingested", ""),
        (str(tmp_path / "nope.txt"), "error", "not found"),
        ("b.txt", "skipped", "duplicate of a.txt"),
    ]
    assert corpus.text.count("same words") == 1


def test_same_file_name_from_two_folders_gets_distinct_display_paths(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("first\n")
    (tmp_path / "y" / "notes.txt").write_text("second\n")
    corpus = ingest.ingest([tmp_path / "x" / "notes.txt", tmp_path / "y" / "notes.txt"])
    assert [r.path for r in corpus.reports] == ["notes.txt", "notes.txt (2)"]
    assert corpus.locate(corpus.text.index("second")).source == "notes.txt (2)"


def test_decode_text_notes_and_estimated_tokens():
    assert decode_text(b"a\r\nb\rc\n", max_line_chars=100).text == "a\nb\nc\n"
    assert estimate_tokens("") == 0
    assert estimate_tokens("hello world") == 2  # two short words, the single space is free
    assert estimate_tokens("internationalization") == 5  # 1 + (20 - 4) // 4
    assert estimate_tokens("x = 42\n") == 5  # x, =, 4, 2, newline
    # def, f, return + 1 + ( ) : + one indentation run + two newlines
    assert estimate_tokens("def f():\n    return 1\n") == 10
    counter = TokenCounter(WordTokenizer())
    assert counter.exact and counter("one two, three") == 4
    assert not TokenCounter().exact


def test_cyrillic_single_byte_text_is_not_mistaken_for_cp1252():
    content = "Привет, как дела? Это тестовый файл в кодировке windows-1251.\n" * 5
    decoded = decode_text(content.encode("cp1251"), max_line_chars=1000)
    assert (decoded.encoding, decoded.text) == ("cp1251", content)


def test_scripts_without_extension_get_their_language_from_the_shebang(tmp_path):
    (tmp_path / "run").write_text("#!/usr/bin/env python3\nprint('hi')\n")
    (tmp_path / "notes").write_text("just words\n")
    corpus = ingest.ingest([tmp_path / "run", tmp_path / "notes"])
    assert [(r.path, r.language) for r in corpus.reports] == [("run", "python"), ("notes", "text")]
    assert corpus.text.startswith("### run (python)\n#!/usr/bin/env python3\n")
