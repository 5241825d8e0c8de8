"""Saved workspaces on the server's disk: one folder per user, one file per workspace, names in an index.

A user's folder is named from a hash of the login (never the login itself, so no name can reach outside
the root); without --auth everyone shares one folder. Workspace ids are random 128-bit hex strings: an id is
checked to be one before it becomes a path. Names live in a small index beside the files, so a rename never
rewrites a context of gigabytes; the file keeps the name it was saved with, for export.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from lminfinite.atomic_file import create_whole, replacing, write_text

from .downloads import Downloads
from .text import clean_text
from .workspace_file import Summary, WorkspaceFileError, read_summary

SUFFIX = ".lmiw"
INDEX = "names.json"
INDEX_LOCK = ".names.lock"
LEFTOVER_AGE_S = 15 * 60.0
SECRET = "browser-secret"
_ID = re.compile(r"[0-9a-f]{32}")


MAX_NAME_CHARS = 120  # a name is a line of the list, sent with every refresh: 5 million characters were 15 MB


def clean_name(name: str, limit: int = MAX_NAME_CHARS) -> str:
    """``name`` as the list shows it: on one line, at most ``limit`` characters, and as UTF-8 can hold it (a lone
    surrogate, which JSON from a client or a file can carry, becomes U+FFFD, so writing the index never fails,
    for this name or any saved after it)."""
    return cut_name(name, limit)[0]


def cut_name(name: str, limit: int = MAX_NAME_CHARS) -> tuple[str, bool]:
    """``clean_name``'s name, and whether it had to be cut to ``limit`` characters (to tell the user)."""
    words = clean_text(str(name)).split()
    whole = " ".join(words)
    return whole[:limit].rstrip(), len(whole) > limit


def new_workspace_id() -> str:
    return secrets.token_hex(16)


def is_workspace_id(value) -> bool:
    return isinstance(value, str) and _ID.fullmatch(value) is not None


@dataclass(frozen=True)
class SavedWorkspace:
    """One line of a user's workspace list."""

    id: str
    name: str
    summary: Summary | None  # None: the file could not be read (shown as damaged, can still be deleted)
    size: int
    modified: float
    problem: str = ""


def make_private_folder(folder: Path) -> None:
    """Create ``folder`` (and its parents) readable by this user only: workspaces hold people's documents."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)


class WorkspaceStore:
    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser()
        self._lock = threading.Lock()  # the names index is read-modify-written
        self._summaries: dict[Path, tuple] = {}  # path -> ((mtime_ns, size), summary, problem): see _summary
        self.downloads = Downloads(self.root)

    def folder(self, owner: str | None) -> Path:
        name = "shared" if owner is None else "user-" + hashlib.sha256(owner.encode()).hexdigest()[:24]
        folder = self.root / name
        make_private_folder(folder)
        return folder

    def path(self, owner: str | None, workspace_id: str) -> Path:
        if not is_workspace_id(workspace_id):
            raise WorkspaceFileError("not a workspace id")
        return self.folder(owner) / f"{workspace_id}{SUFFIX}"

    def exists(self, owner: str | None, workspace_id: str) -> bool:
        return is_workspace_id(workspace_id) and self.path(owner, workspace_id).is_file()

    # -- names ---------------------------------------------------------------------------------
    def _names(self, owner: str | None) -> dict[str, str]:
        try:
            names = json.loads((self.folder(owner) / INDEX).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(names, dict):
            return {}
        return {key: clean_name(name) for key, name in names.items() if isinstance(name, str)}

    def name(self, owner: str | None, workspace_id: str, default: str = "") -> str:
        return self._names(owner).get(workspace_id, default)

    def set_name(self, owner: str | None, workspace_id: str, name: str | None) -> None:
        """Record (or with None, forget) a workspace's name."""
        with self._lock, self._index_lock(owner):
            names = self._names(owner)
            if name is None:
                names.pop(workspace_id, None)
            else:
                names[workspace_id] = clean_name(name)
            write_text(json.dumps(names, ensure_ascii=False, indent=1), self.folder(owner) / INDEX)

    @contextlib.contextmanager
    def _index_lock(self, owner: str | None):
        """Held while the names index is read, changed and written: other replicas sharing the folder wait
        (fcntl locks reach across NFS through its lock manager)."""
        with open(self.folder(owner) / INDEX_LOCK, "a") as handle:
            fcntl.lockf(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.lockf(handle, fcntl.LOCK_UN)

    # -- files ---------------------------------------------------------------------------------
    def list(self, owner: str | None) -> list[SavedWorkspace]:
        """The user's saved workspaces, most recently saved first."""
        names = self._names(owner)
        found = []
        for path in self.folder(owner).glob(f"*{SUFFIX}"):
            workspace_id = path.name[: -len(SUFFIX)]
            if not is_workspace_id(workspace_id):
                continue
            try:
                stat = path.stat()
            except OSError:  # deleted meanwhile (another tab's Delete)
                continue
            summary, problem = self._summary(path, stat)
            name = names.get(workspace_id) or clean_name(summary.name if summary else "") or "(unnamed)"
            found.append(SavedWorkspace(workspace_id, name, summary, stat.st_size, stat.st_mtime, problem))
        return sorted(found, key=lambda w: w.modified, reverse=True)

    def used(self, owner: str | None, but: str | None = None) -> int:
        """Bytes the user's saved workspaces take on disk, leaving out ``but`` (a workspace about to be replaced)."""
        total = 0
        for path in self.folder(owner).glob(f"*{SUFFIX}"):
            if path.name == f"{but}{SUFFIX}":
                continue
            try:
                total += path.stat().st_size
            except OSError:  # deleted meanwhile
                continue
        return total

    def _summary(self, path: Path, stat) -> tuple[Summary | None, str]:
        """A file's list line, read once per version of the file: its header holds the whole chat and history,
        and the list is shown again after every model step."""
        version = (stat.st_mtime_ns, stat.st_size)
        known = self._summaries.get(path)
        if known is None or known[0] != version:
            try:
                known = (version, read_summary(path), "")
            except (WorkspaceFileError, OSError) as exc:  # listed as damaged: it can still be deleted
                known = (version, None, str(exc))
            self._summaries[path] = known
        return known[1], known[2]

    def delete(self, owner: str | None, workspace_id: str) -> bool:
        path = self.path(owner, workspace_id)
        existed = path.is_file()
        path.unlink(missing_ok=True)
        self.set_name(owner, workspace_id, None)
        return existed

    def add(self, owner: str | None, source: Path, name: str) -> str:
        """Copy a workspace file in (an import) under a new id; returns the id."""
        workspace_id = new_workspace_id()
        target = self.path(owner, workspace_id)
        with replacing(target) as tmp:
            shutil.copyfile(source, tmp)
        self.set_name(owner, workspace_id, name)
        return workspace_id

    def download_link(self, owner: str | None, workspace_id: str, session_id: str, name: str) -> Path:
        """The saved file under a readable name, linked for the session ``session_id`` to download
        (downloads.py: served as it is, no copy of gigabytes)."""
        safe = "".join(ch if ch.isalnum() or ch in " -_." else "_" for ch in name).strip() or "workspace"
        return self.downloads.link(session_id, self.path(owner, workspace_id), f"{safe[:80]}{SUFFIX}")

    def remove_leftovers(self, older_than_s: float = LEFTOVER_AGE_S) -> int:
        """Temporary files of saves a crash interrupted (the saves themselves are whole: see atomic_file).
        Called at start-up, when no save of this server is under way; another replica sharing the folder may be
        saving, so only files untouched for ``older_than_s`` go (a save under way writes all the time)."""
        removed = 0
        now = time.time()
        for leftover in self.root.glob("*/.*.tmp") if self.root.exists() else []:
            try:
                if now - leftover.stat().st_mtime < older_than_s:
                    continue
            except FileNotFoundError:
                continue
            leftover.unlink(missing_ok=True)
            removed += 1
        return removed

    def browser_secret(self) -> str:
        """The key the browser's copy of the workspace id is encrypted with, kept so a restart can read it."""
        make_private_folder(self.root)
        path = self.root / SECRET
        try:
            return path.read_text(encoding="ascii").strip()
        except OSError:
            pass
        create_whole(path, secrets.token_urlsafe(24), mode=0o600)  # replicas starting together agree on the first
        return path.read_text(encoding="ascii").strip()
