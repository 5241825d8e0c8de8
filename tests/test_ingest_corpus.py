"""Corpus contract: exact concatenation, provenance round trips, tokens, progress, cancel, KV."""

from __future__ import annotations

import threading

import pytest

import ingest
from ingest_fixtures import Flag, WordTokenizer, make_pdf, page_text, report_for, write_tree

CODE = "".join(
    f"def function_{i}(value):\n    \"\"\"Function {i}.\"\"\"\n    total = value + {i}\n    return total * 2\n\n\n"
    for i in range(30)
) + "class Widget:\n    def run(self):\n        return 1\n"


@pytest.fixture
def mixed(tmp_path):
    repo = write_tree(tmp_path / "repo", {"README.md": "# Demo\n\nIntro paragraph.\n", "lib/code.py": CODE})
    pdf = make_pdf(tmp_path / "manual.pdf", [page_text(n, words=80) for n in range(1, 6)])
    note = tmp_path / "note.txt"
    note.write_text("".join(f"note line {i}\n" for i in range(1, 41)))
    return [pdf, repo, note]


def test_chunks_tile_the_context_exactly(mixed):
    corpus = ingest.ingest(mixed, chunk_tokens=64)
    assert corpus.text == "".join(c.text for c in corpus.chunks)
    position = 0
    for i, chunk in enumerate(corpus.chunks):
        assert (chunk.index, chunk.char_start, chunk.char_end) == (i, position, position + len(chunk.text))
        position = chunk.char_end
    assert position == len(corpus.text)
    assert corpus.n_tokens == sum(c.tokens for c in corpus.chunks) == sum(r.tokens for r in corpus.reports)
    assert not corpus.tokens_exact
    # sources in the order given; repository paths prefixed because there are several sources
    assert [r.path for r in corpus.reports] == ["manual.pdf", "repo/README.md", "repo/lib/code.py", "note.txt"]
    headers = [c.text.lstrip("\n").split("\n", 1)[0] for c in corpus.chunks if "### " in c.text[:c.header_chars]]
    assert headers == ["### manual.pdf", "### repo/README.md", "### repo/lib/code.py (python)",
                       "### note.txt"]


def test_every_offset_maps_back_to_its_file_page_and_line(mixed):
    corpus = ingest.ingest(mixed, chunk_tokens=64)
    for chunk in corpus.chunks:
        for offset in (chunk.char_start, (chunk.char_start + chunk.char_end) // 2, chunk.char_end - 1):
            where = corpus.locate(offset)
            assert (where.source, where.page, where.chunk) == (chunk.source, chunk.page, chunk.index)
    for page in range(1, 6):
        assert corpus.locate(corpus.text.index(f"p{page}w61 ")).page == page
    code_line = CODE.splitlines().index("    total = value + 17") + 1
    where = corpus.locate(corpus.text.index("total = value + 17"))
    assert (where.source, where.line) == ("repo/lib/code.py", code_line)
    assert corpus.locate(corpus.text.index("note line 33")).cite() == "note.txt:33"
    with pytest.raises(IndexError):
        corpus.locate(len(corpus.text))
    with pytest.raises(IndexError):
        corpus.locate(-1)


def test_code_is_split_at_function_boundaries_within_the_token_budget(tmp_path):
    (tmp_path / "code.py").write_text(CODE)
    tokenizer = WordTokenizer()
    corpus = ingest.ingest([tmp_path / "code.py"], tokenizer=tokenizer, chunk_tokens=80)
    bodies = [c.text[c.header_chars:] for c in corpus.chunks]
    assert len(bodies) > 3
    assert all(b.startswith(("\ndef ", "\nclass ")) for b in bodies[1:])
    assert all(len(tokenizer.encode(b, add_special_tokens=False)) <= 80 for b in bodies)


def test_chunk_tokens_are_the_tokenizers_count_and_sum_to_the_corpus(mixed):
    tokenizer = WordTokenizer()
    corpus = ingest.ingest(mixed, tokenizer=tokenizer, chunk_tokens=64)
    assert corpus.tokens_exact
    for chunk in corpus.chunks:
        assert chunk.tokens == len(tokenizer.encode(chunk.text, add_special_tokens=False))
    assert sum(c.tokens for c in corpus.chunks) == corpus.n_tokens > 0
    with pytest.raises(IndexError):
        corpus.locate(len(corpus.text))


def test_progress_reports_files_pages_bytes_and_chunks(mixed):
    events: list[ingest.ProgressEvent] = []
    corpus = ingest.ingest(mixed, progress=events.append, chunk_tokens=64)
    assert events[-1].stage == "done"
    last = events[-1]
    assert (last.files_done, last.files_total, last.pages_done) == (4, 4, 5)
    assert last.chunks_done == len(corpus.chunks) and last.tokens_done == corpus.n_tokens
    assert last.bytes_done == sum(r.bytes for r in corpus.reports)
    assert {"listing", "page", "file", "chunks", "done"} <= {e.stage for e in events}
    done = [e.files_done for e in events]
    assert done == sorted(done)


def test_cancel_raises_with_the_reports_finished_so_far(mixed):
    stop = threading.Event()

    def on_progress(event: ingest.ProgressEvent) -> None:
        if event.stage == "file" and event.files_done == 2:
            stop.set()

    with pytest.raises(ingest.IngestCancelled) as caught:
        ingest.ingest(mixed, progress=on_progress, cancel=stop)
    assert [r.path for r in caught.value.reports] == ["manual.pdf", "repo/README.md"]

    with pytest.raises(ingest.IngestCancelled) as immediately:
        ingest.ingest(mixed, cancel=Flag(after=0))
    assert immediately.value.reports == []


def test_kv_estimate_full_vs_lm_infinite():
    dims = dict(num_layers=32, num_kv_heads=32, head_dim=128)
    kv = ingest.estimate_kv_bytes(100_000, **dims, window=4096, n_starting=10)
    assert kv["bytes_per_token"] == 2 * 32 * 32 * 128 * 2 == 524_288
    assert kv["full_bytes"] == 100_000 * 524_288
    assert kv["bounded_tokens"] == 4106 and kv["lminfinite_bytes"] == 4106 * 524_288
    with_topk = ingest.estimate_kv_bytes(100_000, **dims, window=4096, n_starting=10, topk=5)
    assert with_topk["middle_bytes"] == kv["full_bytes"]
    assert with_topk["lminfinite_bytes"] == (4106 + 100_000) * 524_288
    short = ingest.estimate_kv_bytes(1000, **dims, window=4096)
    assert short["bounded_bytes"] == short["full_bytes"] == 1000 * 524_288
    gqa = ingest.estimate_kv_bytes(10, num_layers=2, num_kv_heads=4, head_dim=8, dtype_bytes=4)
    assert gqa["full_bytes"] == 10 * 2 * 2 * 4 * 8 * 4
    with pytest.raises(ValueError):
        ingest.estimate_kv_bytes(-1, **dims)


def test_corpus_kv_estimate_uses_its_token_count(tmp_path):
    (tmp_path / "a.txt").write_text("alpha beta gamma\n")
    corpus = ingest.ingest([tmp_path / "a.txt"], tokenizer=WordTokenizer())
    # '### a.txt\n' is #, #, #, a, ., txt, newline; then three words and a newline
    assert report_for(corpus, "a.txt").tokens == corpus.n_tokens == 11
    est = corpus.estimate_kv_bytes(num_layers=1, num_kv_heads=1, head_dim=1)
    assert est["full_bytes"] == 11 * 2 * 2


def test_limits_reject_nonsense_values():
    with pytest.raises(ValueError, match="max_files"):
        ingest.IngestLimits(max_files=-1)
    with pytest.raises(ValueError, match="max_zip_ratio"):
        ingest.IngestLimits(max_zip_ratio=0.5)
    with pytest.raises(ValueError, match="chunk_tokens"):
        ingest.ingest([], chunk_tokens=0)
    assert ingest.ingest([]).text == ""
