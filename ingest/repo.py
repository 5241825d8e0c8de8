"""List a repository folder on disk: what to read, what to skip and why.

The walk never follows a symlink out of the root, never opens anything but
regular files (a FIFO would block forever), prunes ignored folders instead of
listing their contents, and stops listing at limits.max_files.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .entries import FileEntry, Item, Listing, repo_order_key
from .filters import VCS_DIRS, dir_skip_reason, file_skip_reason
from .gitignore import GitIgnoreMatcher
from .limits import IngestLimits
from .results import ERROR, SKIPPED, FileReport

_MAX_IGNORE_FILE_BYTES = 1024 * 1024


def _read_lines(path: Path) -> list[str] | None:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_IGNORE_FILE_BYTES).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None


def disk_reader(path: str):
    """read(n) for a file on disk; only regular files are opened."""

    def read(n: int) -> bytes:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise OSError("not a regular file")
            return f.read(n)

    return read


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def walk_folder(folder: Path, limits: IngestLimits, prefix: str = "") -> Listing:
    """List `folder` as a repository; display paths are `prefix + relative path`."""
    root = os.path.realpath(folder)
    matcher = GitIgnoreMatcher(
        lambda rel: _read_lines(Path(root, rel, ".gitignore")),
        extra_root_lines=_read_lines(Path(root, ".git", "info", "exclude")) or (),
    )
    found: list[tuple[str, Item]] = []
    files_listed = 0
    stopped_early = False

    def skip(rel: str, reason: str, size: int = 0, status: str = SKIPPED) -> None:
        found.append((rel, FileReport(path=prefix + rel, status=status, reason=reason, bytes=size)))

    stack: list[tuple[str, int]] = [("", 0)]
    while stack and not stopped_early:
        rel_dir, depth = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir)) as it:
                dir_entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            skip(rel_dir + "/", f"cannot list folder: {exc.strerror or exc}", status=ERROR)
            continue
        for de in dir_entries:
            rel = f"{rel_dir}/{de.name}" if rel_dir else de.name
            try:
                st = de.stat(follow_symlinks=False)
            except OSError as exc:
                skip(rel, f"cannot stat: {exc.strerror or exc}", status=ERROR)
                continue
            if stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(de.path)
                if not _inside(target, root):
                    skip(rel, "symlink points outside the repository (not followed)")
                    continue
                try:
                    tst = os.stat(target)
                except OSError:
                    skip(rel, "broken symlink")
                    continue
                if stat.S_ISDIR(tst.st_mode):
                    skip(rel + "/", "symlink to a folder (not followed)")
                    continue
                st, path = tst, target
            else:
                path = de.path
            if stat.S_ISDIR(st.st_mode):
                reason = dir_skip_reason(de.name)
                if reason is None and matcher.ignored(rel, is_dir=True):
                    reason = "ignored by .gitignore"
                if reason is None and depth + 1 > limits.max_depth:
                    reason = f"nested deeper than {limits.max_depth} folders"
                if reason:
                    skip(rel + "/", reason + " (not read)")
                else:
                    stack.append((rel, depth + 1))
                continue
            if not stat.S_ISREG(st.st_mode):
                skip(rel, "not a regular file (device, socket or pipe)")
                continue
            if de.name in VCS_DIRS:
                reason = "version-control metadata"
            elif matcher.ignored(rel):
                reason = "ignored by .gitignore"
            else:
                reason = file_skip_reason(rel)
            if reason:
                skip(rel, reason, st.st_size)
                continue
            if files_listed >= limits.max_files:
                stopped_early = True
                break
            files_listed += 1
            found.append((rel, FileEntry(path=prefix + rel, rel=rel, size=st.st_size, read=disk_reader(path))))

    found.sort(key=lambda pair: repo_order_key(pair[0]))
    items = [item for _, item in found]
    if stopped_early:
        items.append(FileReport(path=prefix + "...", status=SKIPPED,
                                reason=f"folder has more than {limits.max_files} files; the rest were not listed"))
    if not items:
        items.append(FileReport(path=prefix or (Path(folder).name + "/"), status=SKIPPED, reason="empty folder"))
    return Listing(items=items)
