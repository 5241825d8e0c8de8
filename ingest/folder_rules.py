"""The repository rules, written once for folders on disk, zips and tars.

A folder walk and an archive listing must agree on what a repository's
useful text is: the same folders pruned (version control, dependencies,
build output, .gitignore'd, too deep), the same files skipped (lock files,
secrets, binaries, .gitignore'd) and the same reason shown for each.  Only
how the .gitignore files are read differs, so that is the one thing a
caller passes in.
"""

from __future__ import annotations

from typing import Callable, Iterable

from .filters import VCS_DIRS, dir_skip_reason, file_skip_reason
from .gitignore import GitIgnoreMatcher
from .limits import IngestLimits
from .units import MiB

# A .gitignore larger than this is read only this far (a hostile one cannot fill memory).
MAX_IGNORE_FILE_BYTES = 1 * MiB


def ignore_lines(read: Callable[[int], bytes]) -> list[str] | None:
    """The lines of a .gitignore through `read(n)`, or None when it cannot be read (no patterns)."""
    try:
        return read(MAX_IGNORE_FILE_BYTES).decode("utf-8", errors="replace").splitlines()
    except Exception:  # noqa: BLE001 - a broken .gitignore just means no patterns
        return None


def may_be_read(rel: str) -> bool:
    """Cheap guess, before any .gitignore is known, whether the rules will keep `rel` (or it is a .gitignore)."""
    parts = rel.split("/")
    if any(dir_skip_reason(part) for part in parts[:-1]) or parts[-1] in VCS_DIRS:
        return False
    return parts[-1] == ".gitignore" or file_skip_reason(rel) is None


class FolderRules:
    """Why a repository folder is pruned or a file skipped (None: keep it).

    `read_ignore_file(folder)` returns the lines of `folder/.gitignore`
    ('' is the root) or None; `extra_root_lines` are root patterns from
    elsewhere (.git/info/exclude).  Paths are '/'-separated and relative to
    the repository root.
    """

    def __init__(self, read_ignore_file: Callable[[str], Iterable[str] | None], limits: IngestLimits,
                 extra_root_lines: Iterable[str] = ()) -> None:
        self.gitignore = GitIgnoreMatcher(read_ignore_file, extra_root_lines=extra_root_lines)
        self.max_depth = limits.max_depth
        self._folder_verdicts: dict[str, str | None] = {}

    def folder_reason(self, folder: str) -> str | None:
        """Reason to prune `folder` (its name, .gitignore or depth), else None; asked once per folder."""
        if folder not in self._folder_verdicts:
            reason = dir_skip_reason(folder.rsplit("/", 1)[-1])
            if reason is None and self.gitignore.ignored(folder, is_dir=True):
                reason = "ignored by .gitignore"
            if reason is None and folder.count("/") + 1 > self.max_depth:
                reason = f"nested deeper than {self.max_depth} folders"
            self._folder_verdicts[folder] = reason
        return self._folder_verdicts[folder]

    def pruned_ancestor(self, rel: str) -> tuple[str, str] | None:
        """(folder, reason) for the outermost folder above `rel` that is pruned, else None."""
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            reason = self.folder_reason(folder)
            if reason:
                return folder, reason
        return None

    def file_reason(self, rel: str) -> str | None:
        """Reason to skip the file `rel` (version control, .gitignore, name), else None."""
        if rel.rsplit("/", 1)[-1] in VCS_DIRS:
            return "version-control metadata"
        if self.gitignore.ignored(rel):
            return "ignored by .gitignore"
        return file_skip_reason(rel)
