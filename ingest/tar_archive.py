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

from .archive_members import Member, check_totals, list_members, normalise_name, refused, unsafe_name
from .entries import Listing
from .folder_rules import MAX_IGNORE_FILE_BYTES, may_be_read
from .limits import IngestLimits
from .results import ERROR, FileReport
from .units import MiB, human_bytes

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
        self.last_header = b""  # the last read while scanning: the header block tarfile looked at last

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
        data = self.raw.read(n)
        if self.scanning:
            self.last_header = data
        return data

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


def _prefetch_cap(info: tarfile.TarInfo, limits: IngestLimits, prefetch: bool) -> int | None:
    """Most bytes of this member worth reading while scanning, or None to leave it for later.

    Only regular members the repository rules may keep (a guess: no
    .gitignore is known yet) are worth it; prefetch=False keeps .gitignore
    files only.
    """
    name = PurePosixPath(info.name).name
    if not info.isreg() or not (prefetch or name == ".gitignore"):
        return None
    if unsafe_name(info.name) or not may_be_read(normalise_name(info.name)):
        return None
    if name == ".gitignore":
        return MAX_IGNORE_FILE_BYTES
    return limits.file_cap(name)


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


class _Refused(Exception):
    """The whole archive is refused: `reason`, with `size` declared bytes."""

    def __init__(self, reason: str, size: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.size = size


_UNREADABLE = (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError, ValueError)


class _Scan:
    """The members of one tar, counted as the headers go by; refused as soon as a limit is passed."""

    def __init__(self, tf: tarfile.TarFile, reader: _TarReader, limits: IngestLimits) -> None:
        self.tf = tf
        self.reader = reader
        self.limits = limits
        self.members: list[Member] = []
        self.entries = 0
        self.declared = 0

    def run(self, compressed: bool, prefetch: bool) -> str:
        """Scan every header; returns '' or why the archive ended early (damaged after some files)."""
        try:
            while (info := self.tf.next()) is not None:
                self._add(info)
                cap = _prefetch_cap(info, self.limits, prefetch) if compressed else None
                if cap is not None:
                    self.reader.prefetch(info, cap)
        except TarBomb as exc:
            raise _Refused(f"{exc} (tar bomb?)", self.declared) from None
        except _UNREADABLE as exc:
            return self._damage(str(exc))
        if not _end_of_archive(self.reader.stream.last_header):
            return self._damage(f"invalid header at byte {self.tf.offset}")
        return ""

    def _damage(self, what: str) -> str:
        """Why the archive ended early, after the files listed so far; refused when there are none."""
        if not self.members:
            raise _Refused(f"not a readable tar archive: {what}")
        return f"archive is damaged or truncated after {len(self.members)} files: {what}"

    def _add(self, info: tarfile.TarInfo) -> None:
        max_files = self.limits.max_files
        self.entries += 1
        if self.entries > 4 * max_files:
            raise _Refused(f"archive lists more than {4 * max_files} entries")
        if info.isdir():
            return
        self.members.append(Member(name=info.name, size=info.size, read=self.reader.reader(info), kind=_kind(info)))
        if len(self.members) > max_files:
            raise _Refused(f"archive lists more than {max_files} files, the limit")
        if info.isreg():
            self.declared += info.size
        reason = check_totals(0, self.declared, self.limits, "tar")
        if reason:
            raise _Refused(reason, self.declared)


def _end_of_archive(block: bytes) -> bool:
    """True when the header block where tarfile stopped is a real end: a zero block or none at all.

    tarfile.next() returns None, as at the end, for a damaged or cut header
    after the first member too; every file after it would be lost silently.
    """
    return not block or (len(block) == tarfile.BLOCKSIZE and not block.strip(b"\0"))


def _open_tar(stream: _CappedStream) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=stream, mode="r:")
    except TarBomb as exc:
        raise _Refused(f"{exc} (tar bomb?)") from None
    except _UNREADABLE as exc:
        raise _Refused(f"not a readable tar archive: {exc}") from None


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
    try:
        tf = _open_tar(stream)
        listing.cleanups.insert(1, tf.close)
        scan = _Scan(tf, _TarReader(tf, stream), limits)
        damage = scan.run(compressed, prefetch)
    except _Refused as exc:
        listing.close()
        return refused(display, exc.reason, exc.size)
    stream.scanning = False
    listing = list_members(scan.members, limits, display, listing, bomb="tar")
    if damage:
        listing.items.append(FileReport(path=display, status=ERROR, reason=damage))
    return listing
