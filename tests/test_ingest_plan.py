"""ingest.plan(): display paths, sizes and token upper bounds before anything is read."""

from __future__ import annotations

import tarfile
import zipfile

import pytest

import ingest
import ingest.pipeline
from ingest.__main__ import main
from ingest_fixtures import WordTokenizer, make_pdf, make_zip, page_text, write_tree

CODE = "".join(f"def f{i}(x):\n    return x + {i}  # comment {i}\n" for i in range(50))


@pytest.fixture
def sources(tmp_path):
    repo = write_tree(tmp_path / "proj", {
        "README.md": "# Proj\n\nSome words, numbers 1234 and punctuation!?\n",
        "src/code.py": CODE,
        "src/wide.txt": "ünïcödé ☃ 日本語のテキスト — “quotes”\n" * 20,
        ".gitignore": "*.tmp\n",
        "junk.tmp": "ignored\n",
        "node_modules/m.js": "x\n",
        "logo.png": b"\x89PNG\r\n\x1a\n" + bytes(100),
    })
    archive = make_zip(tmp_path / "repo.zip", {"demo/README.md": "zip readme\n", "demo/lib.py": CODE,
                                                "demo/.gitignore": "secret.txt\n", "demo/secret.txt": "s\n"})
    pdf = make_pdf(tmp_path / "paper.pdf", [page_text(n, words=120) for n in range(1, 4)])
    note = tmp_path / "note.txt"
    note.write_text("a short note\n")
    return [repo, archive, pdf, note]


def test_plan_matches_ingest_paths_and_bounds_its_token_counts(sources):
    items = ingest.plan(sources)
    for tokenizer in (None, WordTokenizer()):
        corpus = ingest.ingest(sources, tokenizer=tokenizer)
        assert [i.path for i in items] == [r.path for r in corpus.reports]
        for item, report in zip(items, corpus.reports):
            assert item.tokens_upper is not None and report.tokens <= item.tokens_upper, (item, report)
            if report.status in ("ingested", "partial"):
                assert item.bytes == report.bytes and item.tokens_upper > 0
    by_path = {i.path: i for i in items}
    assert by_path["proj/junk.tmp"].tokens_upper == 0 and "ignored by .gitignore" in by_path["proj/junk.tmp"].note
    assert by_path["proj/node_modules/"].tokens_upper == 0
    assert by_path["repo.zip/demo/secret.txt"].tokens_upper == 0
    assert by_path["paper.pdf"].note.startswith("PDF: heuristic bound")
    # an ordinary PDF stays far below one token per byte
    assert ingest.ingest(sources[2]).n_tokens < by_path["paper.pdf"].tokens_upper / 4
    assert sum(i.tokens_upper for i in items) >= ingest.ingest(sources).n_tokens


def test_plan_reads_nothing_but_gitignore_files(sources, monkeypatch):
    opened = []
    real_open = zipfile.ZipFile.open

    def spy(self, name, *args, **kwargs):
        opened.append(getattr(name, "filename", name))
        return real_open(self, name, *args, **kwargs)

    def no_pdf(*args, **kwargs):
        raise AssertionError("plan must not open PDFs")

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    monkeypatch.setattr(ingest.pipeline, "extract_pdf", no_pdf)
    items = ingest.plan(sources)
    assert opened == ["demo/.gitignore"]
    assert {i.path for i in items} >= {"repo.zip/demo/lib.py", "paper.pdf", "proj/src/code.py"}


def test_plan_sizes_from_tar_headers_limits_and_urls(tmp_path):
    big = tmp_path / "big.log"
    big.write_text("z" * 5000)
    src = write_tree(tmp_path / "t", {"pkg/a.py": CODE, "pkg/b.md": "# B\n"})
    with tarfile.open(tmp_path / "pkg.tgz", "w:gz") as tf:
        tf.add(src / "pkg", arcname="pkg")
    items = ingest.plan([tmp_path / "pkg.tgz", big, "https://github.com/example/repo",
                         tmp_path / "missing.txt"], limits=ingest.IngestLimits(max_file_bytes=4096))
    rows = [(i.path, i.bytes, i.tokens_upper is not None and i.tokens_upper > 0, i.note) for i in items]
    assert rows[:3] == [("pkg.tgz/pkg/a.py", len(CODE), True, ""), ("pkg.tgz/pkg/b.md", 4, True, ""),
                        ("big.log", 5000, False, "skipped: file is 4.9 KB, over the 4.0 KB limit")]
    assert items[3] == ("https://github.com/example/repo", 0, None, "git URL: size unknown until cloned")
    assert items[4].tokens_upper == 0 and items[4].note == "error: not found"
    assert ingest.plan(["https://github.com/example/repo"], allow_urls=False)[0].tokens_upper == 0
    path, size, upper, note = items[0]  # a NamedTuple
    assert upper >= size


def test_cli_plan(sources, capsys):
    assert main(["--plan", *map(str, sources)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["BYTES", "TOKENS", "(max)", "PATH", "NOTE"]
    assert "repo.zip/demo/lib.py" in out and "PDF: heuristic bound" in out
    assert "an upper bound from sizes, nothing was read" in out
