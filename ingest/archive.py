"""List a .zip upload as a repository, without extracting it to disk.

Entries are read into memory on demand with hard caps, so zip slip (`../`,
absolute names) cannot write anywhere, and zip bombs are refused by entry
count, declared total size, per-entry compression ratio, and by reading at
most the allowed number of bytes (zipfile checks the CRC of what it reads,
so an entry that lies about its size fails instead of expanding).
"""

from __future__ import annotations

import re
import stat
import zipfile
from pathlib import Path

from .entries import FileEntry, Item, Listing, repo_order_key
from .filters import VCS_DIRS, dir_skip_reason, file_skip_reason
from .gitignore import GitIgnoreMatcher
from .limits import IngestLimits, human_bytes
from .results import ERROR, SKIPPED, FileReport

_DRIVE = re.compile(r"^[A-Za-z]:")
_BLOCK = 64 * 1024
_MAX_IGNORE_FILE_BYTES = 1024 * 1024


def unsafe_name(name: str) -> bool:
    """True for absolute paths, drive letters, '..' parts or NUL bytes."""
    norm = name.replace("\\", "/")
    return (norm.startswith("/") or bool(_DRIVE.match(norm)) or "\x00" in norm
            or any(part == ".." for part in norm.split("/")))


def _is_symlink(info: zipfile.ZipInfo) -> bool:
    return stat.S_ISLNK(info.external_attr >> 16)


def _entry_reader(zf: zipfile.ZipFile, info: zipfile.ZipInfo):
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


def _common_top_folder(names: list[str]) -> str:
    """'repo-main/' when every entry sits in that one folder (GitHub zips)."""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) == 1 and all("/" in n for n in names):
        return tops.pop() + "/"
    return ""


def list_zip(path: Path, limits: IngestLimits, prefix: str = "", display: str | None = None) -> Listing:
    """List the files of a zip archive; display paths are `prefix + path in repo`."""
    display = display or Path(path).name
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return Listing(items=[FileReport(path=display, status=ERROR, reason=f"not a readable zip archive: {exc}")])
    listing = Listing(cleanups=[zf.close])
    infos = [i for i in zf.infolist() if not i.is_dir()]
    declared = sum(i.file_size for i in infos)

    def refuse(reason: str) -> Listing:
        listing.close()
        return Listing(items=[FileReport(path=display, status=ERROR, reason=reason, bytes=declared)])

    if len(infos) > limits.max_files:
        return refuse(f"archive lists {len(infos)} files, more than the limit of {limits.max_files}")
    if declared > limits.max_total_bytes:
        return refuse(f"archive would expand to {human_bytes(declared)}, "
                      f"over the limit of {human_bytes(limits.max_total_bytes)} (zip bomb?)")

    found: list[tuple[str, Item]] = []

    def skip(rel: str, reason: str, size: int = 0) -> None:
        found.append((rel, FileReport(path=prefix + rel, status=SKIPPED, reason=reason, bytes=size)))

    safe: list[tuple[str, zipfile.ZipInfo]] = []
    seen_names: set[str] = set()
    for info in infos:
        if unsafe_name(info.filename):
            skip(info.filename, "unsafe path in archive (absolute or '..'); refused", info.file_size)
            continue
        name = re.sub(r"/+", "/", info.filename.replace("\\", "/"))
        while name.startswith("./"):
            name = name[2:]
        if name in seen_names:
            skip(name, "duplicate entry name in archive", info.file_size)
            continue
        seen_names.add(name)
        safe.append((name, info))

    top = _common_top_folder([n for n, _ in safe])
    by_rel = {n[len(top):]: info for n, info in safe}

    def read_ignore(folder: str) -> list[str] | None:
        info = by_rel.get(f"{folder}/.gitignore" if folder else ".gitignore")
        if info is None or info.file_size > _MAX_IGNORE_FILE_BYTES or info.flag_bits & 0x1:
            return None
        try:
            return _entry_reader(zf, info)(_MAX_IGNORE_FILE_BYTES).decode("utf-8", errors="replace").splitlines()
        except Exception:  # noqa: BLE001 - a broken .gitignore just means no patterns
            return None

    matcher = GitIgnoreMatcher(read_ignore)
    skipped_dirs: dict[str, list] = {}  # folder -> [reason, file count, bytes]
    dir_verdict: dict[str, str | None] = {}

    def folder_reason(folder: str, depth: int) -> str | None:
        if folder not in dir_verdict:
            reason = dir_skip_reason(folder.rsplit("/", 1)[-1])
            if reason is None and matcher.ignored(folder, is_dir=True):
                reason = "ignored by .gitignore"
            if reason is None and depth > limits.max_depth:
                reason = f"nested deeper than {limits.max_depth} folders"
            dir_verdict[folder] = reason
        return dir_verdict[folder]

    for rel, info in by_rel.items():
        parts = rel.split("/")
        blocked = None
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            reason = folder_reason(folder, depth)
            if reason:
                blocked = (folder, reason)
                break
        if blocked:
            record = skipped_dirs.setdefault(blocked[0], [blocked[1], 0, 0])
            record[1] += 1
            record[2] += info.file_size
            continue
        if _is_symlink(info):
            skip(rel, "symlink entry in archive (not followed)", info.file_size)
        elif info.flag_bits & 0x1:
            skip(rel, "encrypted zip entry", info.file_size)
        elif parts[-1] in VCS_DIRS:
            skip(rel, "version-control metadata", info.file_size)
        elif matcher.ignored(rel):
            skip(rel, "ignored by .gitignore", info.file_size)
        elif (reason := file_skip_reason(rel)) is not None:
            skip(rel, reason, info.file_size)
        elif (info.file_size >= limits.zip_ratio_min_bytes
              and info.file_size > limits.max_zip_ratio * max(info.compress_size, 1)):
            ratio = info.file_size / max(info.compress_size, 1)
            skip(rel, f"compression ratio {ratio:.0f}:1 is over the limit of {limits.max_zip_ratio:.0f}:1 "
                      f"(zip bomb?)", info.file_size)
        else:
            found.append((rel, FileEntry(path=prefix + rel, rel=rel, size=info.file_size,
                                         read=_entry_reader(zf, info))))

    for folder, (reason, count, size) in skipped_dirs.items():
        plural = "s" if count != 1 else ""
        skip(folder + "/", f"{reason} ({count} file{plural} not read)", size)

    # A refused duplicate name sorts after the entry that was kept.
    found.sort(key=lambda pair: (repo_order_key(pair[0]), isinstance(pair[1], FileReport)))
    listing.items = [item for _, item in found]
    if not listing.items:
        listing.items.append(FileReport(path=display, status=SKIPPED, reason="archive contains no files"))
    return listing
