"""Zip uploads: repository layout, zip slip, bombs, nesting, corruption."""

from __future__ import annotations

import io
import struct
import warnings
import zipfile

import ingest
from ingest.archive_members import unsafe_name
from ingest_fixtures import make_pdf, make_zip, page_text, report_for


def _mark_encrypted(raw: bytes, name: bytes) -> bytes:
    """Set the 'encrypted' flag bit of entry `name` (zipfile cannot write encrypted entries)."""
    out = bytearray(raw)
    for signature, flag_at, name_len_at, name_at in ((b"PK\x03\x04", 6, 26, 30), (b"PK\x01\x02", 8, 28, 46)):
        pos = out.find(signature)
        while pos >= 0:
            (length,) = struct.unpack_from("<H", out, pos + name_len_at)
            if out[pos + name_at:pos + name_at + length] == name:
                (flags,) = struct.unpack_from("<H", out, pos + flag_at)
                struct.pack_into("<H", out, pos + flag_at, flags | 0x1)
            pos = out.find(signature, pos + 4)
    return bytes(out)


def test_zip_repository_with_top_folder_gitignore_and_pdf(tmp_path):
    pdf_bytes = make_pdf(tmp_path / "paper.pdf", [page_text(1), page_text(2)]).read_bytes()
    archive = make_zip(tmp_path / "proj-main.zip", {
        "proj-main/src/main.py": "def main():\n    return 0\n",
        "proj-main/README.rst": "Project\n=======\n",
        "proj-main/.gitignore": "*.tmp\n",
        "proj-main/scratch.tmp": "ignored\n",
        "proj-main/docs/paper.pdf": pdf_bytes,
        "proj-main/node_modules/a/index.js": "x\n",
        "proj-main/node_modules/b/index.js": "y\n",
    })
    corpus = ingest.ingest([archive])
    top = "proj-main.zip/proj-main/"  # archive name + path inside, top folder included
    assert [(r.path, r.status, r.reason) for r in corpus.reports] == [
        (top + "README.rst", "ingested", ""),
        (top + ".gitignore", "ingested", ""),
        (top + "docs/paper.pdf", "ingested", ""),
        (top + "node_modules/", "skipped", "dependency/vendored folder (2 files not read)"),
        (top + "scratch.tmp", "skipped", "ignored by .gitignore"),
        (top + "src/main.py", "ingested", ""),
    ]
    where = corpus.locate(corpus.text.index("p2w4 "))
    assert (where.source, where.page) == (top + "docs/paper.pdf", 2)
    assert report_for(corpus, top + "src/main.py").language == "python"


def test_zip_slip_entries_are_refused_and_nothing_is_written(tmp_path):
    upload = tmp_path / "up"
    upload.mkdir()
    archive = make_zip(upload / "evil.zip", {
        "../escaped.py": "print('escaped')\n",
        "/abs/path.py": "print('absolute')\n",
        "ok/../../twice.py": "print('twice')\n",
        "C:/windows.py": "print('drive')\n",
        "fine.py": "print('fine')\n",
    })
    corpus = ingest.ingest([archive])
    refused = [r.path for r in corpus.reports if r.reason == "unsafe path in archive (absolute or '..'); refused"]
    assert sorted(refused) == ["evil.zip/../escaped.py", "evil.zip//abs/path.py", "evil.zip/C:/windows.py",
                               "evil.zip/ok/../../twice.py"]
    assert report_for(corpus, "evil.zip/fine.py").status == "ingested"
    assert "escaped" not in corpus.text and "absolute" not in corpus.text
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["evil.zip", "up"]
    assert unsafe_name("a\\..\\b") and not unsafe_name("a/..b/c")


def test_zip_bomb_limits(tmp_path):
    bomb = make_zip(tmp_path / "bomb.zip", {"zeros.txt": b"0" * 3_000_000, "ok.txt": "fine\n"})
    ratio = ingest.ingest([bomb])
    zeros = report_for(ratio, "bomb.zip/zeros.txt")
    assert zeros.status == "skipped" and zeros.reason.startswith("compression ratio ")
    assert zeros.reason.endswith("is over the limit of 100:1 (zip bomb?)")
    assert report_for(ratio, "bomb.zip/ok.txt").status == "ingested"

    too_big = ingest.ingest([bomb], limits=ingest.IngestLimits(max_total_bytes=1_000_000))
    assert [(r.path, r.status) for r in too_big.reports] == [("bomb.zip", "error")]
    assert "would expand to 2.9 MB" in too_big.reports[0].reason

    many = make_zip(tmp_path / "many.zip", {f"f{i}.txt": f"{i}\n" for i in range(12)})
    crowded = ingest.ingest([many], limits=ingest.IngestLimits(max_files=10))
    assert [(r.path, r.status, r.reason) for r in crowded.reports] == [
        ("many.zip", "error", "archive lists 12 files, more than the limit of 10")]


def test_nested_archives_symlinks_encrypted_and_duplicate_names(tmp_path):
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("deep.txt", "deep\n")
    path = tmp_path / "outer.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("inner.zip", inner.getvalue())
        zf.writestr("disguised.txt", inner.getvalue())
        link = zipfile.ZipInfo("link.txt")
        link.external_attr = 0o120777 << 16
        zf.writestr(link, "/etc/passwd")
        zf.writestr("locked.txt", "ciphertext")
        zf.writestr("same.txt", "stale\n")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # zipfile warns about the duplicate name
            zf.writestr("same.txt", "current\n")
    path.write_bytes(_mark_encrypted(path.read_bytes(), b"locked.txt"))
    corpus = ingest.ingest([path])
    reasons = {r.path.removeprefix("outer.zip/"): (r.status, r.reason) for r in corpus.reports}
    assert reasons["disguised.txt"] == ("skipped", "zip archive inside a repository or archive (not opened)")
    assert reasons["inner.zip"] == ("skipped", "archive inside a repository or archive (not opened)")
    assert reasons["link.txt"] == ("skipped", "symlink entry in archive (not followed)")
    assert reasons["locked.txt"] == ("skipped", "encrypted zip entry")
    same = [r for r in corpus.reports if r.path == "outer.zip/same.txt"]
    # unzip keeps the last entry of a name: so does ingest, and the earlier one is the duplicate
    assert [(r.status, r.reason, r.bytes) for r in same] == [
        ("ingested", "", 8), ("skipped", "duplicate entry name in archive (a later entry replaces it)", 6)]
    assert "current" in corpus.text and "stale" not in corpus.text
    assert "deep" not in corpus.text and "root:" not in corpus.text


def test_corrupt_archives_and_damaged_entries(tmp_path):
    (tmp_path / "junk.zip").write_bytes(b"this is not a zip file at all")
    good_payload = "intact entry\n"
    damaged_payload = "".join(f"line {i} of the damaged entry\n" for i in range(200))
    archive = make_zip(tmp_path / "crc.zip", {"good.txt": good_payload, "damaged.txt": damaged_payload},
                       compression=zipfile.ZIP_STORED)
    raw = bytearray(archive.read_bytes())
    at = raw.index(b"line 100 of")
    raw[at:at + 4] = b"LINE"  # same length: only the CRC notices
    archive.write_bytes(bytes(raw))
    corpus = ingest.ingest([tmp_path / "junk.zip", archive])
    junk = report_for(corpus, "junk.zip")
    assert junk.status == "error" and junk.reason.startswith("not a readable zip archive")
    damaged = report_for(corpus, "crc.zip/damaged.txt")
    assert damaged.status == "error" and "Bad CRC-32" in damaged.reason
    assert report_for(corpus, "crc.zip/good.txt").status == "ingested"
    assert "intact entry" in corpus.text and "damaged entry" not in corpus.text
