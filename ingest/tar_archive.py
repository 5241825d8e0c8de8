"""Tar archives (.tar, .tar.gz/.tgz, .tar.bz2, .tar.xz) listed like zip archives.

Nothing is extracted to disk: members are read into memory through
tarfile's file objects.  Compressed tars have no index, so listing them
means decompressing the stream once; that stream is capped (the declared
sizes' limit plus room for headers), so a tar bomb stops at the cap instead
of expanding.  Header-sized reads (pax and GNU long-name records) are capped
too, because tarfile reads those into memory whole.

While the headers are scanned, small members that the repository rules may
keep are prefetched into a bounded in-memory cache: reading them later in
README-first/path order would otherwise make the decompressor rewind for
every out-of-order member.  Members that did not fit are read by seeking,
and the decompressed bytes spent on rewinding are bounded too.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from .archive import (MAX_IGNORE_FILE_BYTES, Member, check_totals, list_members, normalise_name, refused,
                      unsafe_name)
from .entries import Listing
from .filters import VCS_DIRS, dir_skip_reason, file_skip_reason
from .limits import IngestLimits, MiB, human_bytes
from .results import ERROR, FileReport

_HEADER_READ_MAX = 1 * MiB  # a pax/long-name record larger than this is hostile
_CACHE_BYTES = 128 * MiB  # prefetched member data kept in memory while the archive is listed
_HEADER_ROOM = 16 * MiB  # decompressed bytes allowed beyond the declared sizes (headers, padding)


class TarBomb(Exception):
    """The decompressed stream went past its cap."""


class _CappedStream:
    """Read/seek/tell view of a decompressed stream that refuses to pass `cap` bytes.

    While `scanning` (reading headers), single reads are capped at
    _HEADER_READ_MAX.  Backward seeks of a compressed stream restart the
    decompressor; the bytes that costs are counted against `rewind_budget`.
    """

    def __init__(self, raw, cap: int, compressed: bool, rewind_budget: int) -> None:
        self.raw = raw
        self.cap = cap
        self.compressed = compressed
        self.rewind_budget = rewind_budget
        self.scanning = True

    def tell(self) -> int:
        return self.raw.tell()

    def read(self, n: int = -1) -> bytes:
        pos = self.raw.tell()
        if n is None or n < 0:
            n = self.cap - pos
        if self.scanning and n > _HEADER_READ_MAX:
            raise TarBomb(f"a header record of {human_bytes(n)} (over {human_bytes(_HEADER_READ_MAX)})")
        if pos + n > self.cap:  # refuse, never return short: tarfile reads a short header as the end
            raise TarBomb(f"the archive expands to more than {human_bytes(self.cap)}")
        return self.raw.read(n)

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 1:
            offset += self.raw.tell()
        elif whence != 0:
            raise OSError("tar streams are only seeked from the start")
        if offset > self.cap:
            raise TarBomb(f"the archive expands to more than {human_bytes(self.cap)}")
        if self.compressed and offset < self.raw.tell():
            self.rewind_budget -= offset
            if self.rewind_budget < 0:
                raise TarBomb("too many out-of-order reads in a large compressed archive")
        return self.raw.seek(offset)

    def close(self) -> None:
        self.raw.close()


def _open_stream(path: Path):
    """(decompressed file object, compressed?) by the magic bytes, not the name."""
    f = open(path, "rb")
    head = f.read(6)
    f.seek(0)
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=f, mode="rb"), True, f
    if head.startswith(b"BZh"):
        return bz2.BZ2File(f, mode="rb"), True, f
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(f, mode="rb"), True, f
    return f, False, f


def _kind(info: tarfile.TarInfo) -> str:
    if info.issym():
        return "symlink"
    if info.islnk():
        return "hardlink"
    if info.isreg():
        return "file"
    return "special"


def _worth_prefetching(name: str) -> bool:
    """Cheap guess whether the repository rules will keep this member (no .gitignore yet)."""
    if unsafe_name(name):
        return False
    parts = normalise_name(name).split("/")
    if any(dir_skip_reason(p) for p in parts[:-1]) or parts[-1] in VCS_DIRS:
        return False
    return parts[-1] == ".gitignore" or file_skip_reason("/".join(parts)) is None


class _TarReader:
    """Member reads for one open tar: from the prefetch cache, else by seeking."""

    def __init__(self, tf: tarfile.TarFile, stream: _CappedStream) -> None:
        self.tf = tf
        self.stream = stream
        self.cache: dict[int, bytes] = {}
        self.cache_left = _CACHE_BYTES

    def prefetch(self, info: tarfile.TarInfo, limit: int) -> None:
        if info.size > min(limit, self.cache_left):
            return
        f = self.tf.extractfile(info)
        if f is None:
            return
        self.stream.scanning = False
        try:
            data = f.read(info.size)
        finally:
            self.stream.scanning = True
        self.cache[info.offset_data] = data
        self.cache_left -= len(data)

    def reader(self, info: tarfile.TarInfo):
        def read(n: int) -> bytes:
            cached = self.cache.get(info.offset_data)
            if cached is not None:
                if PurePosixPath(info.name).name != ".gitignore":  # read once by the pipeline
                    del self.cache[info.offset_data]
                    self.cache_left += len(cached)
                return cached[:n]
            f = self.tf.extractfile(info)
            if f is None:
                raise OSError("not a regular file")
            self.stream.scanning = False
            return f.read(min(n, info.size))

        return read


def list_tar(path: Path, limits: IngestLimits, display: str | None = None, prefetch: bool = True) -> Listing:
    """List the files of a tar archive; display paths are `display/<name inside>`.

    prefetch=False keeps no member data but .gitignore files (sizes only, for ingest.plan).
    """
    display = display or Path(path).name
    try:
        raw, compressed, f = _open_stream(path)
    except OSError as exc:
        return refused(display, f"cannot read: {exc.strerror or exc}")
    cap = limits.max_total_bytes + _HEADER_ROOM
    stream = _CappedStream(raw, cap, compressed, rewind_budget=4 * cap)
    listing = Listing(cleanups=[f.close, stream.close])
    bad = (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError, ValueError)
    try:
        tf = tarfile.open(fileobj=stream, mode="r:")
    except TarBomb as exc:
        listing.close()
        return refused(display, f"{exc} (tar bomb?)")
    except bad as exc:
        listing.close()
        return refused(display, f"not a readable tar archive: {exc}")
    listing.cleanups.insert(1, tf.close)
    reader = _TarReader(tf, stream)
    members: list[Member] = []
    declared = entries = 0
    damage = ""
    try:
        while (info := tf.next()) is not None:
            entries += 1
            if entries > 4 * limits.max_files:
                listing.close()
                return refused(display, f"archive lists more than {4 * limits.max_files} entries")
            if info.isdir():
                continue
            members.append(Member(name=info.name, size=info.size, read=reader.reader(info), kind=_kind(info)))
            if len(members) > limits.max_files:
                listing.close()
                return refused(display, f"archive lists more than {limits.max_files} files, the limit")
            if info.isreg():
                declared += info.size
            reason = check_totals(0, declared, limits, "tar")
            if reason:
                listing.close()
                return refused(display, reason, declared)
            name = PurePosixPath(info.name).name
            if compressed and info.isreg() and (prefetch or name == ".gitignore") and _worth_prefetching(info.name):
                cap_for = (MAX_IGNORE_FILE_BYTES if name == ".gitignore" else
                           limits.max_pdf_bytes if name.lower().endswith(".pdf") else limits.max_file_bytes)
                reader.prefetch(info, cap_for)
    except TarBomb as exc:
        listing.close()
        return refused(display, f"{exc} (tar bomb?)", declared)
    except bad as exc:
        if not members:
            listing.close()
            return refused(display, f"not a readable tar archive: {exc}")
        damage = f"archive is damaged or truncated after {len(members)} files: {exc}"
    stream.scanning = False
    listing = list_members(members, limits, display, listing, bomb="tar")
    if damage:
        listing.items.append(FileReport(path=display, status=ERROR, reason=damage))
    return listing
