"""Files compressed on their own (manual.pdf.gz, changelog.gz, notes.txt.xz) are read as the file inside."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import tracemalloc
import zipfile
from pathlib import Path

import pytest

import ingest
from ingest.compressed import decompressing_reader, inner_name
from ingest.limits import IngestLimits
from ingest_fixtures import report_for

SPEC = Path("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf")  # scripts/test.sh installs it


@pytest.mark.skipif(not SPEC.exists(), reason="needs Debian's shared-mime-info PDF")
def test_a_gzipped_pdf_reads_as_the_pdf_page_for_page(tmp_path):
    packed = tmp_path / "shared-mime-info-spec.pdf.gz"
    packed.write_bytes(gzip.compress(SPEC.read_bytes()))
    plain, gzipped = ingest.ingest([SPEC]), ingest.ingest([packed])
    report = gzipped.reports[0]
    assert (report.path, report.status, report.language) == ("shared-mime-info-spec.pdf.gz", "ingested", "pdf")
    assert report.bytes == SPEC.stat().st_size  # what was read: the PDF, decompressed
    assert [(c.text, c.where.page) for c in gzipped.chunks] == [(c.text.replace(SPEC.name, packed.name), c.where.page)
                                                                 for c in plain.chunks]
    assert {c.where.source for c in gzipped.chunks} == {packed.name} and max(c.where.page for c in gzipped.chunks) == 17


@pytest.mark.parametrize("suffix, compress", [(".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress)])
def test_compressed_text_and_code_keep_their_language(tmp_path, suffix, compress):
    source = Path(ingest.__file__).with_name("pipeline.py")  # a long Python module
    packed = tmp_path / f"pipeline.py{suffix}"
    packed.write_bytes(compress(source.read_bytes()))
    corpus = ingest.ingest([packed])
    report = corpus.reports[0]
    assert (report.status, report.language, report.bytes) == ("ingested", "python", source.stat().st_size)
    assert "def list_local" in "".join(c.text for c in corpus.chunks)
    assert corpus.chunks[-1].where.line_end == len(source.read_text().splitlines())


def test_a_compressed_bomb_is_read_no_further_than_the_limit(tmp_path):
    bomb = tmp_path / "zeros.txt.gz"
    bomb.write_bytes(gzip.compress(b"0" * (64 << 20), compresslevel=9))  # 64 MiB in about 64 KiB
    assert bomb.stat().st_size < 200_000
    tracemalloc.start()
    corpus = ingest.ingest([bomb], limits=IngestLimits(max_file_bytes=1 << 20))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20  # the file is decompressed into at most the limit, not all of it
    report = report_for(corpus, "zeros.txt.gz")
    assert (report.status, report.reason) == ("skipped", "file is larger than the 1.0 MB limit")
    assert report.bytes == (1 << 20) + 1  # one byte past the limit, no more
    several = [tmp_path / f"part{i}.txt.gz" for i in range(3)]
    for path in several:
        path.write_bytes(gzip.compress(f"{path.name}\n".encode() * 30_000))  # 390 KB each, a few KB compressed
    total = ingest.ingest(several, limits=IngestLimits(max_total_bytes=1_000_000))
    assert [r.status for r in total.reports] == ["ingested", "ingested", "skipped"]
    assert total.reports[2].reason == "total input limit of 976.6 KB reached"


def test_damaged_compressed_files_are_errors_and_the_others_are_read(tmp_path):
    good = tmp_path / "good.txt.gz"
    good.write_bytes(gzip.compress(b"fine text\n" * 50))
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(gzip.compress(b"some words here\n" * 5000)[:200])
    junk = tmp_path / "junk.txt.xz"
    junk.write_bytes(b"this was never compressed\n")
    corpus = ingest.ingest([cut, junk, good])
    statuses = {r.path: (r.status, r.reason) for r in corpus.reports}
    assert statuses["cut.txt.gz"][0] == statuses["junk.txt.xz"][0] == "error"
    assert all(reason.startswith("cannot read: ") for _, reason in (statuses["cut.txt.gz"], statuses["junk.txt.xz"]))
    assert statuses["good.txt.gz"] == ("ingested", "")


def test_a_repository_archive_compressed_again_is_skipped_with_what_to_upload(tmp_path):
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        archive.writestr("src/main.py", "print('hello')\n")
    doubled = tmp_path / "repo.zip.gz"
    doubled.write_bytes(gzip.compress(packed.getvalue()))
    [report] = ingest.ingest([doubled]).reports
    assert (report.status, report.reason) == ("skipped", "a .zip compressed again; upload the .zip itself")
    [item] = ingest.plan([doubled])
    assert (item.tokens_upper, item.note) == (0, f"skipped: {report.reason}")


def test_which_names_are_single_compressed_files():
    assert inner_name("manual.pdf.gz") == "manual.pdf" and inner_name("NOTES.TXT.XZ") == "NOTES.TXT"
    assert inner_name("changelog.Debian.gz") == "changelog.Debian" and inner_name("log.bz2") == "log"
    assert [inner_name(name) for name in ("repo.tar.gz", "repo.tgz", "src.tar.xz", ".gz", "notes.txt", "a.zip")] \
        == [None] * 6


def test_a_plan_bounds_a_compressed_file_by_the_limit_it_is_read_to(tmp_path):
    """Sizes on disk say nothing of what a compressed file holds: the plan's bound is the read limit."""
    packed = tmp_path / "notes.txt.gz"
    packed.write_bytes(gzip.compress(b"the same line again\n" * 20_000))  # 400 KB of text in 1-2 KB
    limits = IngestLimits(max_file_bytes=1 << 20)
    [item] = ingest.plan([packed], limits=limits)
    assert item.bytes == packed.stat().st_size and item.note == "compressed: bound from the size limit"
    tokens = sum(c.tokens for c in ingest.ingest([packed], limits=limits).chunks)
    assert packed.stat().st_size < tokens <= item.tokens_upper and item.tokens_upper > 1 << 20


def test_a_fifo_put_in_place_of_a_listed_file_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "notes.txt.gz"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        decompressing_reader(str(fifo), fifo.name)(100)
    assert ingest.ingest([fifo]).reports[0].status == "skipped"  # never listed as a file to read
