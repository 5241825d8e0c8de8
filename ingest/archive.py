"""List an uploaded archive (.zip, .tar, .tar.gz ...) as a repository, never extracting it to disk.

Entries are read into memory on demand with hard caps, so archive slip
(`../`, absolute names) cannot write anywhere, and bombs are refused by
entry count, declared total size, per-entry compression ratio (zip) or a
cap on the decompressed stream (tar), and by reading at most the allowed
number of bytes (zipfile checks the CRC of what it reads, so an entry that
lies about its size fails instead of expanding).  Symlinks, hard links and
device/FIFO entries are reported, never followed.

Display paths are `<archive name>/<path inside the archive>`
('repo.zip/demo_repo/README.md') whether the archive came alone or with
other sources.  The repository rules (ingest.folder_rules, the same object
a folder walk uses) and README-first ordering see the path below a single
common top folder ('README.md'), as in a clone; ingest.archive_members adds
only what archives have and folders do not: unsafe or duplicate names, link
and device entries, encryption and compression ratios.  This module reads
zips and sends tars to ingest.tar_archive.
"""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

from .archive_members import Member, check_totals, list_members, refused
from .entries import Listing
from .limits import IngestLimits
from .tar_archive import list_tar

_BLOCK = 64 * 1024

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")
ZIP_SUFFIXES = (".zip",)


def archive_type(name: str) -> str | None:
    """'zip' or 'tar' for an upload name this module reads (by name only), else None."""
    lower = name.lower()
    if lower.endswith(ZIP_SUFFIXES):
        return "zip"
    if lower.endswith(TAR_SUFFIXES):
        return "tar"
    return None


# -- zip ---------------------------------------------------------------------------------------
def _zip_reader(zf: zipfile.ZipFile, info: zipfile.ZipInfo):
    def read(n: int) -> bytes:
        out = bytearray()
        with zf.open(info) as f:
            while len(out) < n:
                block = f.read(min(_BLOCK, n - len(out)))
                if not block:
                    break
                out += block
        return bytes(out)

    return read


def _zip_kind(info: zipfile.ZipInfo) -> str:
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        return "symlink"
    if mode and stat.S_IFMT(mode) and not stat.S_ISREG(mode):
        return "special"
    return "file"


def list_zip(path: Path, limits: IngestLimits, display: str | None = None) -> Listing:
    """List the files of a zip archive; display paths are `display/<name inside>`."""
    display = display or Path(path).name
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return refused(display, f"not a readable zip archive: {exc}")
    infos = [i for i in zf.infolist() if not i.is_dir()]
    declared = sum(i.file_size for i in infos)
    reason = check_totals(len(infos), declared, limits, "zip")
    if reason:
        zf.close()
        return refused(display, reason, declared)
    members = [Member(name=i.filename, size=i.file_size, read=_zip_reader(zf, i), kind=_zip_kind(i),
                      encrypted=bool(i.flag_bits & 0x1), compressed_size=i.compress_size) for i in infos]
    return list_members(members, limits, display, Listing(cleanups=[zf.close]), bomb="zip")


def list_archive(path: Path, limits: IngestLimits, display: str | None = None, prefetch: bool = True) -> Listing:
    """list_zip or list_tar (prefetch: see list_tar), by content when it starts like a zip, else by name."""
    try:
        with open(path, "rb") as f:
            is_zip = f.read(4) in (b"PK\x03\x04", b"PK\x05\x06")
    except OSError:
        is_zip = False
    if not is_zip and archive_type(Path(path).name) == "tar":
        return list_tar(path, limits, display, prefetch=prefetch)
    return list_zip(path, limits, display)
