"""List a repository folder on disk: what to read, what to skip and why.

The walk never follows a symlink out of the root, never opens anything but
regular files (a FIFO would block forever, a .gitignore included), prunes
the folders that ingest.folder_rules rejects instead of listing their
contents, and stops listing at limits.max_files.  The skip rules themselves
live in folder_rules, shared with zip and tar listings; this module only
knows the disk: scandir, stat and symlinks.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .entries import FileEntry, Item, Listing, repo_order_key
from .folder_rules import FolderRules, ignore_lines
from .limits import IngestLimits
from .results import ERROR, SKIPPED, FileReport


def open_regular(path: str):
    """``path`` opened for reading in binary, refused unless it is a regular file when opened (a FIFO put in its
    place after it was listed is not waited on)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise OSError("not a regular file")
    return f


def disk_reader(path: str):
    """read(n) for a file on disk; only regular files are opened."""

    def read(n: int) -> bytes:
        with open_regular(path) as f:
            return f.read(n)

    return read


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class _FolderWalk:
    """One depth-first walk: `found` collects (relative path, item) pairs in the order met."""

    def __init__(self, root: str, limits: IngestLimits, prefix: str) -> None:
        self.root = root
        self.prefix = prefix
        self.max_files = limits.max_files
        self.rules = FolderRules(
            lambda rel: ignore_lines(disk_reader(os.path.join(root, rel, ".gitignore"))), limits,
            extra_root_lines=ignore_lines(disk_reader(os.path.join(root, ".git", "info", "exclude"))) or (),
        )
        self.found: list[tuple[str, Item]] = []
        self.files_listed = 0
        self.stopped_early = False

    def skip(self, rel: str, reason: str, size: int = 0, status: str = SKIPPED) -> None:
        self.found.append((rel, FileReport(path=self.prefix + rel, status=status, reason=reason, bytes=size)))

    def run(self) -> None:
        stack = [""]  # last in, first out: subfolders are walked in reverse name order
        while stack and not self.stopped_early:
            stack.extend(self._visit_folder(stack.pop()))

    def _visit_folder(self, rel_dir: str) -> list[str]:
        """List one folder; returns its subfolders to walk, in name order."""
        try:
            with os.scandir(os.path.join(self.root, rel_dir)) as it:
                dir_entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            self.skip(rel_dir + "/", f"cannot list folder: {exc.strerror or exc}", status=ERROR)
            return []
        subfolders = []
        for de in dir_entries:
            rel = f"{rel_dir}/{de.name}" if rel_dir else de.name
            if self._visit_entry(de, rel):
                subfolders.append(rel)
            if self.stopped_early:
                break
        return subfolders

    def _visit_entry(self, de: os.DirEntry, rel: str) -> bool:
        """Record one entry; True when it is a folder to walk."""
        resolved = self._stat(de, rel)
        if resolved is None:
            return False
        st, path = resolved
        if stat.S_ISDIR(st.st_mode):
            reason = self.rules.folder_reason(rel)
            if reason:
                self.skip(rel + "/", reason + " (not read)")
            return reason is None
        if not stat.S_ISREG(st.st_mode):
            self.skip(rel, "not a regular file (device, socket or pipe)")
        elif reason := self.rules.file_reason(rel):
            self.skip(rel, reason, st.st_size)
        elif self.files_listed >= self.max_files:
            self.stopped_early = True
        else:
            self.files_listed += 1
            entry = FileEntry(path=self.prefix + rel, rel=rel, size=st.st_size, read=disk_reader(path))
            self.found.append((rel, entry))
        return False

    def _stat(self, de: os.DirEntry, rel: str) -> tuple[os.stat_result, str] | None:
        """(stat, path to open) with an in-root symlink to a file followed; None once reported."""
        try:
            st = de.stat(follow_symlinks=False)
        except OSError as exc:
            self.skip(rel, f"cannot stat: {exc.strerror or exc}", status=ERROR)
            return None
        if not stat.S_ISLNK(st.st_mode):
            return st, de.path
        target = os.path.realpath(de.path)
        if not _inside(target, self.root):
            self.skip(rel, "symlink points outside the repository (not followed)")
            return None
        try:
            target_st = os.stat(target)
        except OSError:
            self.skip(rel, "broken symlink")
            return None
        if stat.S_ISDIR(target_st.st_mode):
            self.skip(rel + "/", "symlink to a folder (not followed)")
            return None
        return target_st, target


def walk_folder(folder: Path, limits: IngestLimits, prefix: str = "") -> Listing:
    """List `folder` as a repository; display paths are `prefix + relative path`."""
    walk = _FolderWalk(os.path.realpath(folder), limits, prefix)
    walk.run()
    walk.found.sort(key=lambda pair: repo_order_key(pair[0]))
    items = [item for _, item in walk.found]
    if walk.stopped_early:
        items.append(FileReport(path=prefix + "...", status=SKIPPED,
                                reason=f"folder has more than {limits.max_files} files; the rest were not listed"))
    if not items:
        items.append(FileReport(path=prefix or (Path(folder).name + "/"), status=SKIPPED, reason="empty folder"))
    return Listing(items=items)
