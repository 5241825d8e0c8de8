"""PDF ingestion: pages, labels, dehyphenation, passwords, damage, scans, worker safety."""

from __future__ import annotations

import functools
import threading
import time

import pymupdf
import pytest

import ingest
import ingest.pipeline
from ingest.pdf import extract_pdf
from ingest.pdf_worker import dehyphenate
from ingest_fixtures import Flag, make_pdf, page_text, report_for

LIMITS = ingest.IngestLimits()


def _extract(data: bytes, debug: dict | None = None):
    """Direct worker call with default limits (debug options simulate hangs and crashes)."""
    return extract_pdf(data, None, timeout_s=30, memory_limit=LIMITS.pdf_worker_memory_bytes, max_pages=1000,
                       debug=debug)


def test_pages_labels_headers_and_provenance(tmp_path):
    pdf = make_pdf(tmp_path / "book.pdf", [page_text(1), page_text(2), None, page_text(4)],
                   labels=[{"startpage": 0, "prefix": "", "style": "r", "firstpagenum": 1},
                           {"startpage": 2, "prefix": "", "style": "D", "firstpagenum": 1}])
    corpus = ingest.ingest([pdf])
    report = report_for(corpus, "book.pdf")
    assert (report.status, report.reason, report.pages, report.language) == ("ingested", "", 4, "pdf")
    assert report.tokens == corpus.n_tokens > 0
    # blank page 3 produces no chunk; labels follow the PDF's label rules
    assert [(c.page, c.page_label) for c in corpus.chunks] == [(1, "i"), (2, "ii"), (4, "2")]
    assert corpus.text.startswith("### book.pdf\n--- page 1 (i) ---\np1w0 p1w1")
    assert "\n--- page 4 (2) ---\np4w0" in corpus.text
    for page in (1, 2, 4):
        where = corpus.locate(corpus.text.index(f"p{page}w17 "))
        assert (where.source, where.page, where.line) == ("book.pdf", page, None)
    assert corpus.locate(corpus.text.index("p2w3 ")).cite() == "book.pdf p. 2 (ii)"


def test_dehyphenation_joins_words_split_across_lines(tmp_path):
    assert dehyphenate("an exam-\nple of ISO-\n9001 and well-\nKnown") == "an example of ISO-\n9001 and well-\nKnown"
    pdf = make_pdf(tmp_path / "h.pdf", ["This is an exam-\nple of hyphen-\nation in a text."])
    text = ingest.ingest([pdf]).text
    assert "example of hyphenation in a text." in text
    assert "exam-" not in text


def test_encrypted_pdf_needs_the_right_password(tmp_path):
    pdf = make_pdf(tmp_path / "locked.pdf", ["classified launch codes"], user_pw="s3cret")
    no_pw = report_for(ingest.ingest([pdf]), "locked.pdf")
    assert (no_pw.status, no_pw.reason) == ("skipped", "encrypted PDF: a password is needed")
    wrong = report_for(ingest.ingest([pdf], password="guess"), "locked.pdf")
    assert (wrong.status, wrong.reason) == ("skipped", "encrypted PDF: the password is wrong")
    right = ingest.ingest([pdf], password="s3cret")
    assert report_for(right, "locked.pdf").status == "ingested"
    assert "classified launch codes" in right.text
    by_name = ingest.ingest([pdf], password={"locked.pdf": "s3cret"})
    assert "classified launch codes" in by_name.text
    by_given_path = ingest.ingest([str(pdf)], password={str(pdf): "s3cret"})
    assert "classified launch codes" in by_given_path.text


def test_a_copy_that_gave_no_text_does_not_make_the_next_one_a_duplicate(tmp_path):
    locked = make_pdf(tmp_path / "old.pdf", ["quarterly figures: 42"], user_pw="pw").read_bytes()
    for name in ("new.pdf", "copy.pdf"):
        (tmp_path / name).write_bytes(locked)
    corpus = ingest.ingest([tmp_path / n for n in ("old.pdf", "new.pdf", "copy.pdf")], password={"new.pdf": "pw"})
    assert [(r.path, r.status, r.reason) for r in corpus.reports] == [
        ("old.pdf", "skipped", "encrypted PDF: a password is needed"),  # its password is given for new.pdf only
        ("new.pdf", "ingested", ""),
        ("copy.pdf", "skipped", "duplicate of new.pdf")]
    assert corpus.text == "### new.pdf\n--- page 1 ---\nquarterly figures: 42\n"


def test_long_lines_are_cut_within_their_page(tmp_path):
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "first page", fontsize=10)
    long_line = "".join(f"{i:06d}" for i in range(8000))  # 48,000 characters without a space
    doc.new_page().insert_text((1, 100), long_line, fontsize=0.02)  # tiny, so the whole line is on the page
    doc.save(tmp_path / "wide.pdf")
    corpus = ingest.ingest([tmp_path / "wide.pdf"], limits=ingest.IngestLimits(max_line_chars=1000))
    r = report_for(corpus, "wide.pdf")
    assert (r.status, r.reason) == ("partial", "1 line longer than 1000 characters cut")
    assert corpus.text == ("### wide.pdf\n--- page 1 ---\nfirst page\n\n--- page 2 ---\n"
                           f"{long_line[:1000]} [... line cut: 48000 characters]\n")
    assert corpus.locate(corpus.text.index("[... line cut")).page == 2


def test_corrupt_empty_and_truncated_pdfs_do_not_stop_other_files(tmp_path):
    make_pdf(tmp_path / "good.pdf", [page_text(1)])
    (tmp_path / "garbage.pdf").write_bytes(b"%PDF-1.7\nnot really a pdf at all")
    (tmp_path / "empty.pdf").write_bytes(b"")
    full = make_pdf(tmp_path / "full.pdf", [page_text(n) for n in range(1, 11)]).read_bytes()
    cut = full.index(b"endobj", len(full) // 2) + len(b"endobj")  # a download cut off mid-file
    (tmp_path / "truncated.pdf").write_bytes(full[:cut])
    note = tmp_path / "note.txt"
    note.write_text("still here\n")
    sources = [tmp_path / n for n in ("garbage.pdf", "empty.pdf", "truncated.pdf", "good.pdf", "note.txt")]
    corpus = ingest.ingest(sources)

    garbage = report_for(corpus, "garbage.pdf")
    assert garbage.status == "error" and garbage.reason.startswith("not a readable PDF")
    assert (report_for(corpus, "empty.pdf").status, report_for(corpus, "empty.pdf").reason) == ("skipped", "empty file")
    truncated = report_for(corpus, "truncated.pdf")
    assert truncated.status == "partial"
    assert "repaired by MuPDF" in truncated.reason and "pages lost" in truncated.reason
    lost = int(truncated.reason.split("; ")[1].split(" of ")[0])
    kept = {c.page for c in corpus.chunks_of("truncated.pdf")}
    assert truncated.pages == 10 and lost >= 3 and len(kept) <= 10 - lost and 1 in kept
    assert report_for(corpus, "good.pdf").status == "ingested"
    assert report_for(corpus, "note.txt").status == "ingested"
    assert corpus.text.endswith("### note.txt\nstill here\n")


def test_scanned_pages_without_text_layer_are_reported(tmp_path):
    scan = make_pdf(tmp_path / "scan.pdf", [None, None, None], scanned={0, 1, 2})
    mixed = make_pdf(tmp_path / "mixed.pdf", [page_text(1), None], scanned={1})
    corpus = ingest.ingest([scan, mixed])
    r = report_for(corpus, "scan.pdf")
    assert r.status == "skipped" and r.pages == 3
    assert r.reason == "scanned PDF without a text layer (3 pages of images); OCR is not enabled"
    m = report_for(corpus, "mixed.pdf")
    assert m.status == "partial"
    assert m.reason == "1 of 2 pages have no text layer (scanned images; OCR is not enabled)"
    assert [c.page for c in corpus.chunks] == [1]


def test_page_limit_reads_only_the_first_pages(tmp_path):
    pdf = make_pdf(tmp_path / "long.pdf", [page_text(n) for n in range(1, 6)])
    corpus = ingest.ingest([pdf], limits=ingest.IngestLimits(max_pdf_pages=2))
    r = report_for(corpus, "long.pdf")
    assert (r.status, r.pages) == ("partial", 5)
    assert r.reason == "only the first 2 of 5 pages read (page limit)"
    assert sorted({c.page for c in corpus.chunks}) == [1, 2]


def test_hanging_pdf_is_killed_at_the_timeout_and_keeps_pages_read(tmp_path, monkeypatch):
    pdf = make_pdf(tmp_path / "slow.pdf", [page_text(n) for n in range(1, 5)])
    _extract(pdf.read_bytes())  # warm the worker so start-up time does not count
    slow = functools.partial(extract_pdf, debug={"debug_delay_s": 0.6})
    monkeypatch.setattr(ingest.pipeline, "extract_pdf", slow)
    start = time.monotonic()
    corpus = ingest.ingest([pdf], limits=ingest.IngestLimits(pdf_timeout_s=1.5))
    assert time.monotonic() - start < 15
    r = report_for(corpus, "slow.pdf")
    assert r.status == "partial"
    assert "took longer than 1.5 s and was stopped" in r.reason and "of 4 pages not read" in r.reason
    assert {c.page for c in corpus.chunks} in ({1}, {1, 2})
    # the killed worker is replaced transparently
    assert "p3w0" in "".join(p.text for p in _extract(pdf.read_bytes()).pages)


def test_crashing_worker_is_reported_and_replaced(tmp_path):
    data = make_pdf(tmp_path / "c.pdf", [page_text(1), page_text(2), page_text(3)]).read_bytes()
    crashed = _extract(data, debug={"debug_crash_at": 1})
    assert crashed.failure == "crash" and "exit code 70" in crashed.message
    assert [p.index for p in crashed.pages] == [0]
    assert ingest.pipeline.pdf_outcome(crashed, 1000)[0] == "partial"
    again = _extract(data)
    assert again.finished and [p.index for p in again.pages] == [0, 1, 2]


def test_cancel_between_pages_stops_the_worker(tmp_path):
    pdf = make_pdf(tmp_path / "p.pdf", [page_text(n) for n in range(1, 4)])
    with pytest.raises(ingest.IngestCancelled):
        ingest.ingest([pdf], cancel=Flag(after=2))
    assert report_for(ingest.ingest([pdf]), "p.pdf").status == "ingested"


def test_concurrent_ingests_are_serialised_and_correct(tmp_path):
    pdfs = [make_pdf(tmp_path / f"t{i}.pdf", [page_text(10 * i + n) for n in range(3)]) for i in range(3)]
    results: dict[int, ingest.Corpus] = {}

    def work(i: int) -> None:
        results[i] = ingest.ingest([pdfs[i]])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i in range(3):
        assert [c.page for c in results[i].chunks] == [1, 2, 3]
        assert f"p{10 * i + 2}w5 " in results[i].text


def test_multi_hundred_page_pdf_round_trips_every_page(tmp_path):
    pages = [page_text(n, words=24) for n in range(1, 301)]
    pdf = make_pdf(tmp_path / "big.pdf", pages)
    events = []
    corpus = ingest.ingest([pdf], progress=events.append)
    r = report_for(corpus, "big.pdf")
    assert (r.status, r.pages) == ("ingested", 300)
    assert max(e.pages_done for e in events) == 300
    for n in (1, 2, 99, 150, 299, 300):
        where = corpus.locate(corpus.text.index(f" p{n}w9 ") + 1)
        assert (where.source, where.page) == ("big.pdf", n)
    assert [c.page for c in corpus.chunks] == sorted(c.page for c in corpus.chunks)


def test_total_character_limit_stops_a_pdf_and_skips_later_files(tmp_path):
    pdf = make_pdf(tmp_path / "wordy.pdf", [page_text(n, words=60) for n in range(1, 6)])
    later = tmp_path / "later.txt"
    later.write_text("never read\n")
    page_chars = len(page_text(1, words=60))
    corpus = ingest.ingest([pdf, later], limits=ingest.IngestLimits(max_total_chars=2 * page_chars + 10))
    r = report_for(corpus, "wordy.pdf")
    assert r.status == "partial"
    assert r.reason == f"context size limit of {2 * page_chars + 10:,} characters reached; 2 of 5 pages not read"
    assert sorted({c.page for c in corpus.chunks}) == [1, 2, 3]
    skipped = report_for(corpus, "later.txt")
    assert (skipped.status, skipped.reason) == ("skipped", f"context size limit of {2 * page_chars + 10:,} characters reached")
