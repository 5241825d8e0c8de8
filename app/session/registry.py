"""Which workspaces are live, which browser tab shows which, and when they are saved and freed.

A browser tab (Gradio's session hash) is attached to one workspace (a Session). A page load attaches the
workspace the browser remembers (its id is kept in the browser, see web/ui.py), so a reload shows the same
context: still live if the tab came back within a grace period, otherwise reopened from its save. A tab that
leaves stops its work; its workspace, once no tab shows it, is saved (if anything changed) and freed after
the grace period, or after the idle time-out. API clients that never load the page get a workspace of
their own, freed (not saved) when idle.

With --auth a workspace belongs to the user who made it: another user's request for it is refused, and the
saved files of each user are in a folder of their own (workspace_store.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import torch

from ..cli import AppConfig
from ..engine.budget import Budget
from ..engine.runtime import ModelRuntime
from .state import KeptInMemory, Session
from .workspace_file import WorkspaceFileError, read_workspace, write_workspace
from .workspace_lease import Leases, WorkspaceHeld
from .workspace_quota import check_quota, save_size
from .workspace_size import reopened_bytes
from .workspace_store import SUFFIX, WorkspaceStore, is_workspace_id, new_workspace_id

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 5.0  # how often the registry's own thread looks for idle sessions, with or without traffic
EXPIRED_KEPT = 10_000  # freed tabs remembered, to tell their late requests what happened
LEASE_WAIT_S = 10.0  # longest a reopen waits for another replica to let a workspace go (a page load waits with it)
DETACHED_GRACE_S = 30.0  # a workspace no tab shows stays live this long: a reload finds it without reopening
MIDDLE_DTYPES = {"exact": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


class SessionDenied(Exception):
    """The request's user is not the user the session belongs to (with --auth)."""


class SessionExpired(Exception):
    """The session was freed after its idle time-out; a request for it must not silently start an empty one."""


class SessionRegistry:
    """All live sessions of one server, by tab and by workspace id."""

    def __init__(self, runtime: ModelRuntime, config: AppConfig, budget: Budget, store: WorkspaceStore | None = None,
                 *, clock: Callable[[], float] = time.monotonic):
        self.runtime = runtime
        self._clock = clock  # idle time-outs and the grace period; sessions stamp last_active with time.monotonic
        self.config = config
        self.budget = budget
        self.store = store or WorkspaceStore(config.workspace_root)
        self.leases = Leases(config.replica_name, config.lease_s)  # which saved workspaces this replica holds
        self.grace_s = DETACHED_GRACE_S
        self._tabs: dict[str, Session] = {}
        self._live: dict[str, Session] = {}  # by workspace id, with or without a tab
        self._expired: OrderedDict[str, float] = OrderedDict()  # tabs whose session the sweep freed, newest last
        self._lock = threading.Lock()
        self._reopening: dict[str, threading.Lock] = {}  # per workspace id, see _workspace_lock
        self._sweeper: threading.Thread | None = None  # start_sweeping's thread
        self._stop_sweeping = threading.Event()

    def __len__(self) -> int:
        return len(self._live)

    def _new(self, owner: str | None, workspace_id: str | None = None, name: str = "") -> Session:
        return Session(workspace_id or new_workspace_id(), self.runtime, self.config, self.budget, owner=owner,
                       name=name)

    def _bind(self, session_hash: str, session: Session) -> None:
        """Under the lock: the tab shows ``session``."""
        self._tabs[session_hash] = session
        self._live[session.workspace_id] = session
        session.lifecycle.tabs.add(session_hash)
        session.lifecycle.detached_at = None

    # -- tabs ------------------------------------------------------------------------------------
    def get(self, session_hash: str, *, touch: bool = True, owner: str | None = None) -> Session:
        """The session ``session_hash`` shows; ``touch=False`` (the panel timer) does not count as activity.

        A tab with none (an API client, or a request before the page load attached one) gets a new one.
        ``owner`` is the request's logged-in user: a session answers no other user (SessionDenied). A tab whose
        session the idle sweep freed raises SessionExpired (once per new request stream, see ``forget_expired``).
        """
        self.sweep()
        with self._lock:
            session = self._tabs.get(session_hash)
            if session is None:
                if session_hash in self._expired:
                    raise SessionExpired(session_hash)
                session = self._new(owner)
                self._bind(session_hash, session)
        if not self._is_owner(session, owner):
            raise SessionDenied(session_hash)
        if touch:
            session.touch()
        return session

    def peek(self, session_hash: str) -> Session | None:
        return self._tabs.get(session_hash)

    def attach(self, session_hash: str, workspace_id: str | None, owner: str | None, *,
               fallback_new: bool = True, page_load: bool = False) -> tuple[Session | None, str]:
        """Show the workspace ``workspace_id``, live or reopened from disk, else a new one.

        Returns the session and a note for the user ("" when nothing needs saying). With ``fallback_new=False``
        (the user chose to open that workspace) a workspace that cannot be opened gives (None, why) and the tab
        keeps what it shows, its queued work included. A ``page_load`` that finds no workspace to show keeps
        what the tab's first requests did before it landed: a file dropped at once is not lost.
        A tab that shows another user's session is not theirs to switch (SessionDenied): its session hash
        leaked, and the switch would stop that user's work.
        """
        self._check_tab_owner(session_hash, owner)
        while True:
            with self._workspace_lock(workspace_id):  # one reopen per workspace; other page loads go on
                session, note = self._found_or_new(session_hash, workspace_id, owner, fallback_new, page_load)
                if session is None:
                    return None, note
                with self._lock:
                    if self._going(session):  # the sweep took it meanwhile: find it again (saved)
                        continue
                    previous = self._tabs.get(session_hash)
                    denied = previous is not None and not self._is_owner(previous, owner)  # bound meanwhile
                    if denied:
                        break
                    self._expired.pop(session_hash, None)
                    session.touch()  # before it is bound, so the sweep never sees it shown and idle
                    session.lifecycle.in_browser = True
                    self._bind(session_hash, session)
                    break
        if denied:
            if not session.lifecycle.tabs and not self.is_open(session.workspace_id):  # found for nobody: free it
                session.close()
            raise SessionDenied(session_hash)
        if previous is not None and previous is not session:  # what the tab showed before is left
            self._left(previous, session_hash)
        return session, note

    def _found_or_new(self, session_hash: str, workspace_id: str | None, owner: str | None, fallback_new: bool,
                      page_load: bool) -> tuple[Session | None, str]:
        """``attach``'s workspace: found (live or reopened), else with ``fallback_new`` a new one (a page load's
        early one when there is one), else (None, why)."""
        session, note = self._find(workspace_id, owner)
        if session is not None or not fallback_new:
            return session, note
        early = self._before_page_load(session_hash, owner) if page_load else None
        session = early if early is not None else self._new(owner)
        return session, f"{note} A new one was started." if note else ""

    @staticmethod
    def _going(session: Session) -> bool:
        """Closed, or being saved and freed (``retiring``): no tab is to be given it."""
        return session.closed or session.lifecycle.retiring

    @staticmethod
    def _is_owner(session: Session, owner: str | None) -> bool:
        """``owner`` may use ``session`` (without --auth sessions have no owner, and anyone may)."""
        return session.owner is None or session.owner == owner

    def _check_tab_owner(self, session_hash: str, owner: str | None) -> None:
        """SessionDenied when the tab shows a session of another user."""
        with self._lock:
            shown = self._tabs.get(session_hash)
        if shown is not None and not self._is_owner(shown, owner):
            raise SessionDenied(session_hash)

    def _before_page_load(self, session_hash: str, owner: str | None) -> Session | None:
        """The session a tab's requests got before its page load attached one (never shown in a browser)."""
        with self._lock:
            session = self._tabs.get(session_hash)
        if session is None or session.lifecycle.in_browser or session.owner != owner or self._going(session):
            return None
        return session

    def _workspace_lock(self, workspace_id):
        """Held from looking a workspace up to binding it: two tabs never reopen the same file twice."""
        if not is_workspace_id(workspace_id):
            return contextlib.nullcontext()
        with self._lock:
            return self._reopening.setdefault(workspace_id, threading.Lock())

    def _find(self, workspace_id: str | None, owner: str | None) -> tuple[Session | None, str]:
        """The workspace live, or reopened from its file; (None, why) when there is no file or it cannot be
        opened ("" when there is none)."""
        if not is_workspace_id(workspace_id):
            return None, ""
        with self._lock:
            live = self._live.get(workspace_id)
        if live is not None and not self._going(live) and live.owner == owner:
            return live, ""
        if live is not None and self._going(live) and self._kept_after_save(live, owner):
            return live, ""  # its save failed: the workspace was kept live (_keep)
        if not self.store.exists(owner, workspace_id):  # never saved, or deleted: nothing to say on a page load
            return None, ""
        return self.reopen(workspace_id, owner)

    @staticmethod
    def _kept_after_save(live: Session, owner: str | None) -> bool:
        """Wait for a workspace being saved and freed (then its file is complete); whether it was kept live instead,
        its save having failed."""
        deadline = time.monotonic() + 600
        while SessionRegistry._going(live) and not live.released.wait(0.05) and time.monotonic() < deadline:
            pass
        return not (SessionRegistry._going(live) or live.released.is_set()) and live.owner == owner

    def will_reopen(self, workspace_id, owner: str | None) -> bool:
        """Whether showing ``workspace_id`` reads it back from disk: saved, and not live (or live but being saved
        and freed). A tab shows that it is reopening meanwhile: it can take a minute."""
        if not is_workspace_id(workspace_id) or not self.store.exists(owner, workspace_id):
            return False
        with self._lock:
            live = self._live.get(workspace_id)
        return live is None or self._going(live)

    def reopen(self, workspace_id: str, owner: str | None) -> tuple[Session | None, str]:
        """A saved workspace as a new live session; (None, why) when its file cannot be opened. The user knows it
        by its name, not its id."""
        name = self.store.name(owner, workspace_id)
        saved = f"“{name}”" if name else "The saved workspace"
        path = self.store.path(owner, workspace_id)
        try:  # another replica sharing the folder may hold it: wait a little for it to save and let go
            self.leases.take_waiting(path, min(self.leases.ttl_s + 1, LEASE_WAIT_S))
        except WorkspaceHeld as exc:
            return None, f"{saved} was not opened here: {exc}. Reload this page to try again."
        except OSError as exc:  # the shared folder is away or read-only: the file stays as it is
            log.warning("could not take the lease of workspace %s: %s", workspace_id, exc)
            return None, f"{saved} could not be opened: its folder cannot be written ({type(exc).__name__})."
        session = self._new(owner, workspace_id, name)
        started = time.perf_counter()
        try:
            needed = reopened_bytes(path, self.runtime.dtype, self.budget.middle_bytes_per_token)  # not its summary
            refusal = self.budget.bytes_refusal(self.cache_bytes(), needed, "its cache's tensors")
            if refusal is not None:  # it stays saved, in the list, to open when memory is free
                session.close()
                self.leases.release(path)
                return None, f"{saved} was not reopened: {refusal}."
            read_workspace(self.store.path(owner, workspace_id), session)
        except (WorkspaceFileError, OSError) as exc:
            log.warning("could not reopen workspace %s: %s", workspace_id, exc)
            session.close()
            self.leases.release(path)
            why = str(exc).replace(f"{workspace_id}{SUFFIX}", "its file")  # the file's name is the id, not the name
            return None, f"{saved} could not be opened: {why}."
        except Exception as exc:  # noqa: BLE001 - a file no check foresaw must not break the page load
            log.exception("reopening workspace %s failed", workspace_id)
            session.close()
            self.leases.release(path)
            return None, f"{saved} could not be opened ({type(exc).__name__}); it is kept as it is."
        session.name = self.store.name(owner, workspace_id) or session.name
        seconds = time.perf_counter() - started
        log.info("Reopened workspace %s: %s tokens in %.1f s", workspace_id, f"{session.context_tokens:,}", seconds)
        return session, f"Reopened “{session.name}”: {session.context_tokens:,} tokens in {seconds:.1f} s."

    def open_elsewhere(self, owner: str | None, workspace_id: str) -> WorkspaceHeld | None:
        """Why another replica sharing the folder has ``workspace_id`` open (a live lease), or None."""
        return self.leases.held_elsewhere(self.store.path(owner, workspace_id))

    def is_open(self, workspace_id: str) -> bool:
        """Live in this server (shown by a tab, or left within the grace period)."""
        with self._lock:
            return workspace_id in self._live

    def other_tabs(self, session_hash: str) -> int:
        """How many other browser tabs are connected (what a restart would interrupt besides ``session_hash``)."""
        with self._lock:
            return sum(1 for tab, session in self._tabs.items() if tab != session_hash and session.lifecycle.in_browser)

    def forget_expired(self, session_hash: str) -> None:
        """The user was told the session expired: the tab may start a new session now."""
        with self._lock:
            self._expired.pop(session_hash, None)

    def close(self, session_hash: str, *, owner: str | None = None, as_user: bool = False) -> bool:
        """The tab left (``as_user``: only when ``owner`` is the session's owner)."""
        with self._lock:
            session = self._tabs.get(session_hash)
            if session is None or (as_user and not self._is_owner(session, owner)):
                return False
            del self._tabs[session_hash]
        self._left(session, session_hash)
        return True

    def _left(self, session: Session, session_hash: str) -> None:
        """A tab no longer shows ``session``. When no tab does, its work stops, and it is saved and freed after
        the grace period (at once when it was never in a browser: an API client's, or what a tab did before its
        page load reopened the workspace its browser remembers)."""
        with self._lock:
            session.lifecycle.tabs.discard(session_hash)
            if session.lifecycle.tabs:
                return
            session.stop()
            session.lifecycle.detached_at = self._clock()
            retire_now = not session.lifecycle.in_browser or self.grace_s <= 0
            session.lifecycle.retiring = retire_now
        if retire_now:
            self._retire(session)
        else:
            timer = threading.Timer(self.grace_s + 0.1, self.sweep)
            timer.daemon = True
            timer.start()

    # -- memory and time-outs --------------------------------------------------------------------
    def cache_bytes(self) -> int:
        """Bytes every live session's cache holds now: what the memory budget (--memory-budget) measures."""
        with self._lock:
            engines = [s.engine for s in self._live.values() if s.engine is not None]
        return sum(sum(engine.memory().values()) for engine in engines if engine.cache is not None)

    def _save_target(self, session: Session) -> Path:
        """The file to write ``session`` to, its lease held. When another replica saved the workspace since this one
        read it (this replica's lease was lost: a long pause, a clock out of step), neither save is dropped: this
        one becomes a copy, a new workspace of its own beside the other."""
        path = self.store.path(session.owner, session.workspace_id)
        try:
            self.leases.take(path)
            if not self.leases.newer_save(path):
                return path
        except WorkspaceHeld:
            pass
        copy_id = new_workspace_id()
        log.warning("workspace %s was saved by another replica meanwhile; this replica's copy is saved as %s",
                    session.workspace_id, copy_id)
        self.leases.release(path)  # forgets the version it compared with; the file is the other replica's
        with self._lock:
            if self._live.get(session.workspace_id) is session:
                del self._live[session.workspace_id]
            session.workspace_id = copy_id
            session.name = f"{session.name or 'Workspace'} (copy: saved elsewhere meanwhile)"
            self._live[copy_id] = session
        path = self.store.path(session.owner, copy_id)
        self.leases.take(path)
        return path

    def start_sweeping(self, every_s: float = SWEEP_EVERY_S) -> None:
        """Sweep every ``every_s`` on a thread of the registry's own: idle sessions are saved and freed on time
        even when no request comes (a request also sweeps). ``stop_sweeping`` (or ``save_all``) ends it."""
        if self._sweeper is not None:
            return
        self._stop_sweeping.clear()

        def loop() -> None:
            while not self._stop_sweeping.wait(every_s):
                try:
                    self.sweep()
                except Exception:  # noqa: BLE001 - one failed sweep must not end the sweeping
                    log.exception("sweeping idle sessions failed")

        self._sweeper = threading.Thread(target=loop, name="idle-sweep", daemon=True)
        self._sweeper.start()
        self.leases.start_renewing()

    def stop_sweeping(self, wait_s: float = 10.0) -> None:
        """End the sweeping thread (the server is stopping), waiting for a sweep under way to finish."""
        sweeper, self._sweeper = self._sweeper, None
        self._stop_sweeping.set()
        if sweeper is not None:
            sweeper.join(wait_s)

    def sweep(self) -> list[str]:
        """Save and free workspaces left by their tabs for longer than the grace period, and sessions idle for
        longer than the time-out: never one that is working or has work waiting in a queue (waiting is not
        idleness: a user whose upload waits behind a long read must not lose it). Returns the freed tabs
        (workspace ids for sessions no tab showed)."""
        now = self._clock()
        with self._lock:
            due = [s for s in self._live.values() if self._due(s, now)]
            freed = []
            for session in due:
                session.lifecycle.retiring = True  # stays in _live until saved and freed (_retire): a reload waits
                for tab in list(session.lifecycle.tabs):
                    del self._tabs[tab]
                    self._expired[tab] = now
                    freed.append(tab)
                if not session.lifecycle.tabs:
                    freed.append(session.workspace_id)
                session.lifecycle.tabs.clear()
            while len(self._expired) > EXPIRED_KEPT:
                self._expired.popitem(last=False)
        for session in due:
            if session.lifecycle.in_browser and session.unsaved:  # a save can take seconds: not in this request
                threading.Thread(target=self._retire, args=(session,), name="save-and-free", daemon=True).start()
            else:
                self._retire(session)
        return freed

    def retire_left(self, session: Session) -> None:
        """Save and free, now, a workspace its tab left for a new one (New context), so that the Workspaces list
        shows it at once rather than after the grace period. One that a tab still shows stays live."""
        with self._lock:
            if session.lifecycle.tabs or self._going(session):
                return
            session.lifecycle.retiring = True
        self._retire(session)

    def _due(self, session: Session, now: float) -> bool:
        """Idle past the time-out, or left by its last tab past the grace period; never while it works or waits."""
        lifecycle = session.lifecycle
        if lifecycle.retiring or session.busy or session.waiting():
            return False
        left = not lifecycle.tabs and lifecycle.detached_at is not None and now - lifecycle.detached_at > self.grace_s
        return left or now - session.last_active > self.config.session_timeout_s

    def _retire(self, session: Session) -> None:
        """Save (when it was in a browser and changed) and free. Work was told to stop: the save waits for it.

        It stays in ``_live`` (``retiring``) until saved: a reload or a delete meanwhile finds it there (and
        waits, or is refused) rather than the file it is about to replace."""
        save = session.lifecycle.in_browser and session.unsaved

        def before_release(retired: Session) -> None:
            if save:
                try:
                    self.save_now(retired)
                except Exception as exc:  # noqa: BLE001 - a full disk, say: the work is kept, not lost
                    log.exception("saving workspace %s before freeing it failed; it stays in memory",
                                  retired.workspace_id)
                    self._keep(retired, exc)
                    raise KeptInMemory(retired.workspace_id) from exc
            self.store.downloads.release(retired.workspace_id)
            with self._lock:
                if self._live.get(retired.workspace_id) is retired:
                    del self._live[retired.workspace_id]
            self.leases.release(self.store.path(retired.owner, retired.workspace_id))

        session.close(before_release=before_release)

    def _keep(self, session: Session, error: Exception) -> None:
        """A workspace whose save failed as it was being freed stays live, left by its tabs: its user finds it, and
        why, on the next visit; the sweep tries the save again after the grace period."""
        with self._lock:
            session.lifecycle.retiring = False
            session.lifecycle.detached_at = self._clock()
        session.keep_open(f"⚠ This workspace could not be saved when its tab closed ({type(error).__name__}: "
                          f"{error}); it is kept in memory, not freed: press Save in the Workspaces tab to keep it.")

    # -- saving ----------------------------------------------------------------------------------
    def save_all(self, wait_s: float = 30.0) -> int:
        """The server is stopping: stop every workspace's work, then save those a browser had open and that
        changed (work still running after ``wait_s`` is left: its workspace keeps its last save). Returns how
        many were saved."""
        self.stop_sweeping()  # no sweep starts a save of its own meanwhile
        with self._lock:
            sessions = [s for s in self._live.values() if s.lifecycle.in_browser]
        for session in sessions:
            session.stop()
        deadline = time.monotonic() + wait_s
        saved = 0
        for session in sessions:
            if session.lifecycle.retiring:  # being saved and freed already (_retire): let that save finish
                session.released.wait(max(0.0, deadline - time.monotonic()))
                continue
            while session.busy and time.monotonic() < deadline:
                time.sleep(0.05)
            if session.busy or not session.unsaved:
                continue
            try:
                self.save_now(session)
                saved += 1
            except Exception:  # noqa: BLE001 - one bad save must not keep the others from happening
                log.exception("saving workspace %s at shutdown failed", session.workspace_id)
        self.leases.stop_renewing()
        self.leases.release_all()  # another replica may open them now, from these saves
        return saved

    def save_now(self, session: Session) -> int:
        """Write the session to its file (it must be idle: no model step running). Returns the file's bytes."""
        changes = session.changes
        check_quota(self.store, session.owner, session.workspace_id, save_size(session), self.config.workspace_quota,
                    "saving it")
        path = self._save_target(session)
        size = write_workspace(path, session, session.name, middle_dtype=MIDDLE_DTYPES[self.config.save_middle])
        self.leases.saved(path)
        session.lifecycle.saved_changes = changes  # the file is written: a failure below loses a name, not the save
        try:
            self.store.set_name(session.owner, session.workspace_id, session.name)
        except (OSError, ValueError) as exc:
            log.warning("workspace %s saved, but its name was not recorded: %s", session.workspace_id, exc)
        return size
