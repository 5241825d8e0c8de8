"""Tar uploads (.tar, .tar.gz/.tgz, .tar.bz2, .tar.xz): read like zip archives, with the same safety."""

from __future__ import annotations

import gzip
import io
import tarfile
import time
from pathlib import Path

import pytest

import ingest
import ingest.tar_archive
from ingest_fixtures import make_pdf, page_text, report_for


def make_tar(path: Path, entries: list, mode: str = "w:gz") -> Path:
    """entries: (name, bytes) for files, or ready TarInfo objects (links, devices, ...)."""
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tf:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                tf.addfile(entry)
                continue
            name, data = entry
            data = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = int(time.time())
            tf.addfile(info, io.BytesIO(data))
    return path


def _special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


@pytest.mark.parametrize("name,mode", [("r.tar.gz", "w:gz"), ("r.tgz", "w:gz"), ("r.tar", "w"),
                                       ("r.tar.bz2", "w:bz2"), ("r.tar.xz", "w:xz")])
def test_tar_repository_like_a_zip(tmp_path, name, mode):
    pdf = make_pdf(tmp_path / "p.pdf", [page_text(1), page_text(2)]).read_bytes()
    archive = make_tar(tmp_path / name, [
        ("proj/src/main.py", "def main():\n    return 0\n"),
        ("proj/.gitignore", "*.tmp\n"),
        ("proj/scratch.tmp", "ignored\n"),
        ("proj/docs/paper.pdf", pdf),
        ("proj/node_modules/a/index.js", "x\n"),
        ("proj/README.md", "# Project\n"),  # stored last, listed first
    ], mode)
    corpus = ingest.ingest([archive])
    top = f"{name}/proj/"
    assert [(r.path, r.status, r.reason) for r in corpus.reports] == [
        (top + "README.md", "ingested", ""),
        (top + ".gitignore", "ingested", ""),
        (top + "docs/paper.pdf", "ingested", ""),
        (top + "node_modules/", "skipped", "dependency/vendored folder (1 file not read)"),
        (top + "scratch.tmp", "skipped", "ignored by .gitignore"),
        (top + "src/main.py", "ingested", ""),
    ]
    assert corpus.locate(corpus.text.index("p2w3 ")).cite() == f"{top}docs/paper.pdf p. 2"
    assert report_for(corpus, top + "src/main.py").language == "python"


def test_traversal_links_and_devices_are_refused_and_nothing_is_written(tmp_path):
    upload = tmp_path / "up"
    upload.mkdir()
    archive = make_tar(upload / "evil.tgz", [
        ("../escaped.py", "print('escaped')\n"),
        ("/abs/path.py", "print('absolute')\n"),
        ("ok/../../twice.py", "print('twice')\n"),
        ("real.txt", "real content\n"),
        _special("link.txt", tarfile.SYMTYPE, "/etc/passwd"),
        _special("hard.txt", tarfile.LNKTYPE, "real.txt"),
        _special("dev", tarfile.CHRTYPE),
        _special("pipe", tarfile.FIFOTYPE),
    ])
    before = sorted(p.name for p in tmp_path.rglob("*"))
    corpus = ingest.ingest([archive])
    reasons = {r.path.removeprefix("evil.tgz/"): (r.status, r.reason) for r in corpus.reports}
    unsafe = ("skipped", "unsafe path in archive (absolute or '..'); refused")
    assert reasons["../escaped.py"] == reasons["/abs/path.py"] == reasons["ok/../../twice.py"] == unsafe
    assert reasons["link.txt"] == ("skipped", "symlink entry in archive (not followed)")
    assert reasons["hard.txt"] == ("skipped", "hard link entry in archive (not followed)")
    assert reasons["dev"] == reasons["pipe"] == ("skipped", "device, FIFO or unknown entry type in archive (not read)")
    assert reasons["real.txt"] == ("ingested", "")
    assert corpus.text.count("real content") == 1
    assert "escaped" not in corpus.text and "root:" not in corpus.text
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_tar_bombs_and_oversized_archives_are_refused(tmp_path, monkeypatch):
    zeros = make_tar(tmp_path / "zeros.tar.gz", [("zeros.txt", b"0" * 3_000_000), ("ok.txt", "fine\n")])
    small = ingest.IngestLimits(max_total_bytes=1_000_000)
    [report] = ingest.ingest([zeros], limits=small).reports
    assert (report.path, report.status) == ("zeros.tar.gz", "error")
    assert report.reason == "archive would expand to 2.9 MB, over the limit of 976.6 KB (tar bomb?)"

    many = make_tar(tmp_path / "many.tar", [(f"f{i}.txt", f"{i}\n") for i in range(12)], "w")
    [crowded] = ingest.ingest([many], limits=ingest.IngestLimits(max_files=10)).reports
    assert (crowded.status, crowded.reason) == ("error", "archive lists more than 10 files, the limit")

    # tarfile reads pax records into memory whole: a huge one is refused, not read
    huge_pax = tarfile.TarInfo("a.txt")
    huge_pax.pax_headers = {"comment": "x" * 2_000_000}
    with tarfile.open(tmp_path / "pax.tar.gz", "w:gz", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(huge_pax, io.BytesIO(b""))
    [pax] = ingest.ingest([tmp_path / "pax.tar.gz"]).reports
    assert pax.status == "error" and pax.reason.startswith("a header record of ") and "(tar bomb?)" in pax.reason

    # the decompressed stream is capped even when the declared sizes fit (headers count too)
    monkeypatch.setattr(ingest.tar_archive, "_HEADER_ROOM", 0)
    headers = make_tar(tmp_path / "headers.tar.gz", [(f"d/f{i}.txt", "x" * 600) for i in range(150)])
    [capped] = ingest.ingest([headers], limits=ingest.IngestLimits(max_total_bytes=100_000)).reports
    assert capped.status == "error"
    assert capped.reason == "the archive expands to more than 97.7 KB (tar bomb?)"


def test_damaged_and_non_tar_files(tmp_path):
    data = make_tar(tmp_path / "full.tar.gz", [(f"f{i:02}.txt", f"file {i} words\n" * 2000)
                                               for i in range(20)]).read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(data[:len(data) // 2])
    (tmp_path / "junk.tgz").write_bytes(b"this is not a tar archive at all" * 40)
    corpus = ingest.ingest([tmp_path / "cut.tar.gz", tmp_path / "junk.tgz"])
    junk = report_for(corpus, "junk.tgz")
    assert junk.status == "error" and junk.reason.startswith("not a readable tar archive")
    damage = report_for(corpus, "cut.tar.gz")
    assert damage.status == "error" and damage.reason.startswith("archive is damaged or truncated after ")
    read = [r for r in corpus.reports if r.path.startswith("cut.tar.gz/") and r.status == "ingested"]
    assert read and "file 0 words\nfile 0 words\n" in corpus.text


def test_a_damaged_header_mid_archive_is_reported_not_taken_for_the_end(tmp_path):
    full = make_tar(tmp_path / "full.tar", [(f"proj/f{i}.txt", f"file {i}\n") for i in range(6)], "w")
    with tarfile.open(full) as tf:
        at = tf.getmember("proj/f2.txt").offset
    raw = bytearray(full.read_bytes())
    raw[at + 10] ^= 0x55  # a byte of f2's name: its header checksum no longer matches
    (tmp_path / "bad.tar").write_bytes(raw)
    (tmp_path / "bad.tgz").write_bytes(gzip.compress(bytes(raw)))
    for name in ("bad.tar", "bad.tgz"):
        corpus = ingest.ingest([tmp_path / name])
        assert [(r.path, r.status, r.reason) for r in corpus.reports] == [
            (f"{name}/proj/f0.txt", "ingested", ""), (f"{name}/proj/f1.txt", "ingested", ""),
            (name, "error", f"archive is damaged or truncated after 2 files: invalid header at byte {at}")]
    assert all(r.status == "ingested" for r in ingest.ingest([full]).reports)  # a clean end stays clean


def test_the_last_entry_of_a_name_is_read_as_tar_extracts_it(tmp_path):
    # 'tar -rf' appends a new copy of a file: extraction overwrites the old one with it
    archive = make_tar(tmp_path / "upd.tar", [("config.py", "VERSION = 1  # old\n"),
                                              ("config.py", "VERSION = 2  # current\n")], "w")
    corpus = ingest.ingest([archive])
    assert [(r.path, r.status, r.reason, r.bytes) for r in corpus.reports] == [
        ("upd.tar/config.py", "ingested", "", 23),
        ("upd.tar/config.py", "skipped", "duplicate entry name in archive (a later entry replaces it)", 19)]
    assert corpus.text == "### upd.tar/config.py (python)\nVERSION = 2  # current\n"


def test_out_of_order_reads_without_the_prefetch_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(ingest.tar_archive, "_CACHE_BYTES", 0)  # every member read by seeking back
    names = [f"pkg/m{i:02}.py" for i in range(30, 0, -1)] + ["README.md"]
    archive = make_tar(tmp_path / "rev.tgz", [(n, f"VALUE_{n} = {len(n)}\n") for n in names])
    corpus = ingest.ingest([archive])
    assert [r.path for r in corpus.reports] == ["rev.tgz/README.md"] + [f"rev.tgz/{n}" for n in sorted(names[:-1])]
    assert all(r.status == "ingested" for r in corpus.reports)
    assert all(f"VALUE_{n} =" in corpus.text for n in names)


def test_unsupported_archive_formats_name_the_supported_ones(tmp_path):
    (tmp_path / "data.7z").write_bytes(b"7z\xbc\xaf\x27\x1c" + bytes(40))
    [r] = ingest.ingest([tmp_path / "data.7z"]).reports
    assert r.status == "skipped" and ".tar.gz" in r.reason and ".zip" in r.reason
