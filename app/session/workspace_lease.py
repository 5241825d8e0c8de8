"""Which replica holds a saved workspace, when several share one workspace folder (NFS, say).

A replica that opens a workspace takes its lease: a small file ``<id>.lease`` beside the workspace, naming the
replica and when the lease ends. It is taken atomically (written beside, then hard-linked to its name, which fails
when the name exists: the classic lock that NFS also keeps), renewed while the workspace is live, and removed when
it is freed (where a file system has no hard links, an exclusive create stands in). A replica that crashed stops
renewing: its leases end after ``ttl_s`` and another replica breaks them (one at a time, through a lock file) and
takes them, reopening the workspace from its last save. A replica restarted under the same name takes its own leases
back at once. Lease times are wall-clock times, compared across machines: keep their clocks in step (NTP) and the time-to-live
well above any skew.

Each lease also remembers the file's version (inode, size, mtime) as this replica last read or wrote it: a save
that finds another version there (another replica saved after a lease was lost) does not replace it
(``SessionRegistry.save_now`` keeps both).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lminfinite.atomic_file import create_whole, write_text

log = logging.getLogger(__name__)

LEASE_SUFFIX = ".lease"
DEFAULT_TTL_S = 30.0
BREAK_SUFFIX = ".breaking"  # beside a lease: the replica removing an ended lease
BREAK_TTL_S = 10.0  # a break takes milliseconds; a lock older than this was left by a replica that died
BREAK_WAIT_S = 2.0  # how long ``take`` waits for another replica's break to finish


class WorkspaceHeld(Exception):
    """Another replica holds the workspace's lease; the message says which, for the user."""

    def __init__(self, replica: str, ends_in_s: float):
        self.replica, self.ends_in_s = replica, ends_in_s
        super().__init__(f"it is open on replica “{replica}” (its lease ends in {max(0.0, ends_in_s):.0f} s unless "
                         "that replica renews it)")


FileVersion = tuple[int, int, int]  # inode, size, mtime in ns: changes whenever a save replaces the file


def file_version(path: Path) -> FileVersion | None:
    """The version of the file at ``path`` (None: there is none)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


@dataclass(frozen=True)
class _Held:
    path: Path  # the lease file
    token: str  # ours: a lease file holding it is this replica's


@dataclass(frozen=True)
class _LeaseFile:
    replica: str
    token: str
    expires: float

    @staticmethod
    def read(path: Path) -> "_LeaseFile | None":
        """The lease at ``path``; None when there is none. A file that cannot be parsed counts as ended."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return _LeaseFile(str(data["replica"]), str(data["token"]), float(data["expires"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return _LeaseFile("?", "", 0.0)

    def text(self) -> str:
        return json.dumps({"replica": self.replica, "token": self.token, "expires": self.expires})


class Leases:
    """The leases this replica holds, by workspace file; renewed on a thread of its own."""

    def __init__(self, replica: str, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.time):
        self.replica = replica
        self.ttl_s = ttl_s
        self.clock = clock
        self._held: dict[Path, _Held] = {}  # by workspace file
        # the workspace file as this replica first found it, then as it last wrote it; kept when a lease is lost,
        # so the next save sees another replica's save in between
        self._versions: dict[Path, FileVersion | None] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @staticmethod
    def lease_path(workspace_file: Path) -> Path:
        return workspace_file.with_suffix(LEASE_SUFFIX)

    # -- taking and giving back ------------------------------------------------------------------
    def take(self, workspace_file: Path) -> None:
        """Hold ``workspace_file``'s lease (already held: renewed). WorkspaceHeld when another replica's is live."""
        with self._lock:
            held = self._held.get(workspace_file)
        if held is not None and self._renew(held):
            return
        path = self.lease_path(workspace_file)
        token = secrets.token_hex(8)
        deadline = time.monotonic() + BREAK_WAIT_S
        while True:  # a lease that ended is broken, then taken; another replica may win either step
            if self._create(path, token):
                with self._lock:
                    self._held[workspace_file] = _Held(path, token)
                    self._versions.setdefault(workspace_file, file_version(workspace_file))
                return
            current = _LeaseFile.read(path)
            if current is not None and current.replica != self.replica and current.expires > self.clock():
                raise WorkspaceHeld(current.replica, current.expires - self.clock())
            if current is not None and not self._break(path) and time.monotonic() >= deadline:
                raise WorkspaceHeld(current.replica, self.ttl_s)  # another replica has been breaking it all along
            # given back meanwhile, broken by us, or being broken by another replica: try to take it again

    def take_waiting(self, workspace_file: Path, wait_s: float, poll_s: float = 0.25) -> None:
        """``take``, trying again for up to ``wait_s`` while another replica holds it (it may be saving and
        letting go, or its lease may be about to end)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self.take(workspace_file)
            except WorkspaceHeld:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(poll_s)

    def release(self, workspace_file: Path) -> None:
        """Give the lease back (the workspace was saved and freed, or deleted)."""
        with self._lock:
            held = self._held.pop(workspace_file, None)
            self._versions.pop(workspace_file, None)
        if held is not None and self._is_ours(held):
            held.path.unlink(missing_ok=True)

    def release_all(self) -> None:
        with self._lock:
            files = list(self._held)
        for workspace_file in files:
            self.release(workspace_file)

    def holds(self, workspace_file: Path) -> bool:
        with self._lock:
            return workspace_file in self._held

    def held_elsewhere(self, workspace_file: Path) -> WorkspaceHeld | None:
        """Why this replica must not touch ``workspace_file`` now (another's live lease), or None."""
        if self.holds(workspace_file):
            return None
        current = _LeaseFile.read(self.lease_path(workspace_file))
        if current is None or current.replica == self.replica or current.expires <= self.clock():
            return None
        return WorkspaceHeld(current.replica, current.expires - self.clock())

    # -- versions --------------------------------------------------------------------------------
    def newer_save(self, workspace_file: Path) -> bool:
        """Whether the file was replaced since this replica last read or wrote it (another replica saved it)."""
        with self._lock:
            known = self._versions.get(workspace_file)
        current = file_version(workspace_file)
        return current is not None and current != known

    def saved(self, workspace_file: Path) -> None:
        """This replica just wrote ``workspace_file``: its version is the one to compare the next save with."""
        with self._lock:
            self._versions[workspace_file] = file_version(workspace_file)

    # -- renewing --------------------------------------------------------------------------------
    def start_renewing(self) -> None:
        """Renew every held lease every third of its time-to-live, until ``stop_renewing``."""
        if self._renewer is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(self.ttl_s / 3):
                self.renew_all()

        self._renewer = threading.Thread(target=loop, name="lease-renew", daemon=True)
        self._renewer.start()

    def stop_renewing(self) -> None:
        renewer, self._renewer = self._renewer, None
        self._stop.set()
        if renewer is not None:
            renewer.join(5)

    def renew_all(self) -> list[Path]:
        """Renew each lease; returns the workspace files whose lease was lost (another replica broke it)."""
        with self._lock:
            held = list(self._held.items())
        lost = []
        for workspace_file, lease in held:
            try:
                if not self._renew(lease):
                    lost.append(workspace_file)
            except OSError as exc:  # the share is away for a moment: the lease holds until it ends
                log.warning("renewing the lease of %s failed: %s", workspace_file, exc)
        for workspace_file in lost:
            log.warning("the lease of %s was taken by another replica; this replica will not replace its saves",
                        workspace_file)
        return lost

    # -- the file --------------------------------------------------------------------------------
    def _lease(self, token: str, ttl_s: float | None = None) -> _LeaseFile:
        return _LeaseFile(self.replica, token, self.clock() + (self.ttl_s if ttl_s is None else ttl_s))

    def _create(self, path: Path, token: str) -> bool:
        """Write our lease at ``path`` unless one is there: whole or not at all, atomically."""
        return create_whole(path, self._lease(token).text())

    def _is_ours(self, held: _Held) -> bool:
        current = _LeaseFile.read(held.path)
        return current is not None and current.token == held.token

    def _renew(self, held: _Held) -> bool:
        """Push our lease's end further; False when it is no longer ours."""
        if not self._is_ours(held):
            with self._lock:
                self._held = {k: v for k, v in self._held.items() if v is not held}
            return False
        write_text(self._lease(held.token).text(), held.path)  # replaced whole (atomic_file)
        return True

    def _break(self, path: Path) -> bool:
        """Remove the lease at ``path`` if it has ended (or is ours, from before a restart); whether this call
        looked. Breakers take turns through a lock file beside it: two replicas that both saw the lease end must
        not both remove a lease, or the second would remove the one the first has just taken in its place (both
        would then think they hold it). A lock left by a replica that died while breaking ends like a lease."""
        lock = path.with_name(path.name + BREAK_SUFFIX)
        if not create_whole(lock, self._lease("break", BREAK_TTL_S).text()):
            stale = _LeaseFile.read(lock)
            if stale is not None and stale.expires <= self.clock():
                lock.unlink(missing_ok=True)
            time.sleep(0.005)
            return False
        try:
            current = _LeaseFile.read(path)  # read again: under the lock, only its owner may change it now
            if current is not None and (current.replica == self.replica or current.expires <= self.clock()):
                path.unlink(missing_ok=True)
        finally:
            lock.unlink(missing_ok=True)
        return True
