"""The members of an archive, whatever its format, screened by the repository rules.

zip (ingest.archive) and tar (ingest.tar_archive) both turn their entries
into `Member`s and hand them to `list_members`, which refuses unsafe or
duplicate names, link and device entries, encryption and compression
ratios, and applies the same rules a folder walk uses.  Both formats import
this module; neither imports the other's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from .entries import FileEntry, Item, Listing, repo_order_key
from .folder_rules import MAX_IGNORE_FILE_BYTES, FolderRules, ignore_lines
from .limits import IngestLimits
from .results import ERROR, SKIPPED, FileReport
from .units import human_bytes

_DRIVE = re.compile(r"^[A-Za-z]:")


def unsafe_name(name: str) -> bool:
    """True for absolute paths, drive letters, '..' parts or NUL bytes."""
    norm = name.replace("\\", "/")
    return (norm.startswith("/") or bool(_DRIVE.match(norm)) or "\x00" in norm
            or any(part == ".." for part in norm.split("/")))


@dataclass
class Member:
    """One non-folder entry of an archive, whatever the format."""

    name: str  # as stored
    size: int  # declared uncompressed size
    read: Callable[[int], bytes]  # read(n): at most n bytes of the content
    kind: str = "file"  # 'file' | 'symlink' | 'hardlink' | 'special' (device, FIFO, unknown type)
    encrypted: bool = False
    compressed_size: int | None = None  # None when the format does not say (tar)


_KIND_REASONS = {
    "symlink": "symlink entry in archive (not followed)",
    "hardlink": "hard link entry in archive (not followed)",
    "special": "device, FIFO or unknown entry type in archive (not read)",
}


def _common_top_folder(names: list[str]) -> str:
    """'repo-main/' when every entry sits in that one folder (GitHub zips)."""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) == 1 and all("/" in n for n in names):
        return tops.pop() + "/"
    return ""


def normalise_name(name: str) -> str:
    """'/'-separated, no repeated or leading './' parts (for already-safe names)."""
    name = re.sub(r"/+", "/", name.replace("\\", "/"))
    while name.startswith("./"):
        name = name[2:]
    return name


def refused(display: str, reason: str, size: int = 0) -> Listing:
    """The whole archive as one error report."""
    return Listing(items=[FileReport(path=display, status=ERROR, reason=reason, bytes=size)])


def check_totals(count: int, declared: int, limits: IngestLimits, bomb: str) -> str | None:
    """Reason to refuse a whole archive by its entry count or declared size, else None."""
    if count > limits.max_files:
        return f"archive lists {count} files, more than the limit of {limits.max_files}"
    if declared > limits.max_total_bytes:
        return (f"archive would expand to {human_bytes(declared)}, "
                f"over the limit of {human_bytes(limits.max_total_bytes)} ({bomb} bomb?)")
    return None


def _screen_names(members: list[Member], skip) -> list[tuple[str, Member]]:
    """(normalised name, member) for safe, non-folder names; the others are reported through `skip`.

    Of entries sharing a name the last one is kept: tar and unzip extract
    every entry in order, so an archive updated in place ('tar -rf') means
    its newest copy.
    """
    named: list[tuple[str, Member]] = []
    for member in members:
        if unsafe_name(member.name):
            skip(member.name, member.name, "unsafe path in archive (absolute or '..'); refused", member.size)
            continue
        name = normalise_name(member.name)
        if name and not name.endswith("/"):
            named.append((name, member))
    last = {name: member for name, member in named}
    for name, member in named:
        if last[name] is not member:
            skip(name, name, "duplicate entry name in archive (a later entry replaces it)", member.size)
    return [(name, member) for name, member in named if last[name] is member]


def _ignore_file_reader(by_rel: dict[str, Member]):
    """read_ignore_file(folder) for FolderRules over the members of one archive."""

    def read(folder: str) -> list[str] | None:
        member = by_rel.get(f"{folder}/.gitignore" if folder else ".gitignore")
        if member is None or member.kind != "file" or member.encrypted or member.size > MAX_IGNORE_FILE_BYTES:
            return None
        return ignore_lines(member.read)

    return read


def _member_reason(member: Member, rel: str, rules: FolderRules, limits: IngestLimits, bomb: str) -> str | None:
    """Why a member outside pruned folders is not read (entry kind, encryption, the rules, its ratio), else None."""
    if member.kind != "file":
        return _KIND_REASONS.get(member.kind, _KIND_REASONS["special"])
    if member.encrypted:
        return f"encrypted {bomb} entry"
    reason = rules.file_reason(rel)
    if reason is None and (member.compressed_size is not None and member.size >= limits.zip_ratio_min_bytes
                           and member.size > limits.max_zip_ratio * max(member.compressed_size, 1)):
        ratio = member.size / max(member.compressed_size, 1)
        reason = f"compression ratio {ratio:.0f}:1 is over the limit of {limits.max_zip_ratio:.0f}:1 ({bomb} bomb?)"
    return reason


def list_members(members: list[Member], limits: IngestLimits, display: str, listing: Listing,
                 bomb: str = "zip") -> Listing:
    """Apply the repository rules to archive members; fills and returns `listing`.

    `display` is the archive's own display name; entries are shown as
    `display/<name inside>`.  A pruned folder is one report line with the
    count and bytes of the files it held.
    """
    prefix = display.rstrip("/") + "/"
    found: list[tuple[str, Item]] = []

    def skip(rel: str, shown: str, reason: str, size: int = 0) -> None:
        found.append((rel, FileReport(path=prefix + shown, status=SKIPPED, reason=reason, bytes=size)))

    safe = _screen_names(members, skip)
    top = _common_top_folder([n for n, _ in safe])
    by_rel = {n[len(top):]: m for n, m in safe}
    rules = FolderRules(_ignore_file_reader(by_rel), limits)
    pruned: dict[str, list] = {}  # folder -> [reason, file count, bytes]
    for rel, member in by_rel.items():
        blocked = rules.pruned_ancestor(rel)
        if blocked:
            record = pruned.setdefault(blocked[0], [blocked[1], 0, 0])
            record[1] += 1
            record[2] += member.size
        elif reason := _member_reason(member, rel, rules, limits, bomb):
            skip(rel, top + rel, reason, member.size)
        else:
            found.append((rel, FileEntry(path=prefix + top + rel, rel=rel, size=member.size, read=member.read)))

    for folder, (reason, count, size) in pruned.items():
        plural = "s" if count != 1 else ""
        skip(folder + "/", top + folder + "/", f"{reason} ({count} file{plural} not read)", size)

    # A refused duplicate name sorts after the entry that was kept.
    found.sort(key=lambda pair: (repo_order_key(pair[0]), isinstance(pair[1], FileReport)))
    listing.items = [item for _, item in found] + listing.items
    if not listing.items:
        listing.items.append(FileReport(path=display, status=SKIPPED, reason="archive contains no files"))
    return listing
