"""Per-browser-session state, owned by a registry keyed by Gradio's session hash.

Nothing about a user lives at module level: each session has its own engine (cache), chat, documents and
metrics. The registry frees a session when its tab disconnects (``demo.unload``) or after an idle
time-out, so documents never outlive their user or leak into another session.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import threading
import time
from collections import OrderedDict, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum

from ..cli import AppConfig
from ..engine.budget import Budget
from ..engine.citations import Citation
from ..engine.context import ContextEngine
from ..engine.metrics import LiveStats, SessionSeries
from ..engine.runtime import ModelRuntime, release_memory
from .documents import DocumentRow, RowStatus

EXPIRED_KEPT = 10_000  # freed session hashes remembered, to tell their late requests what happened
STALE_WORK_S = 24 * 3600.0  # queued work older than this no longer keeps a session from the idle sweep


class ItemKind(StrEnum):
    QUESTION = "question"
    ANSWER = "answer"
    STATUS = "status"  # progress and outcome of reading and feeding: a titled, collapsible block


class WorkKind(StrEnum):
    TURN = "turn"  # documents and/or a question
    REGENERATE = "regenerate"
    FORGET = "forget"  # clear chat, keep documents
    RESET = "reset"  # new context


class Stage(StrEnum):
    """An action's way through the queues: queued -> (reading) -> read -> done."""

    QUEUED = "queued"
    READ = "read"
    DONE = "done"


@dataclass
class ChatItem:
    """One chat message and what the exports need to know about it."""

    role: str  # "user" | "assistant"
    kind: ItemKind
    text: str = ""
    title: str | None = None  # status/notice messages render as collapsible, titled blocks
    pending: bool = False
    files: list[str] = field(default_factory=list)
    citations: list[Citation] = field(default_factory=list)
    recall_note: str = ""
    stats: dict = field(default_factory=dict)
    stopped: bool = False
    in_context: bool = True


@dataclass
class Work:
    """One user action waiting for the reading queue and then the model queue."""

    id: int
    kind: WorkKind
    question: str | None = None
    sources: list[str] = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)
    stage: Stage = Stage.QUEUED
    reading: bool = False
    corpus: object = None  # ingest.Corpus once read
    rows: list[DocumentRow] = field(default_factory=list)
    status_item: ChatItem | None = None
    question_item: ChatItem | None = None
    created: float = field(default_factory=time.perf_counter)  # when the user acted: time to first token starts here


class SessionDenied(Exception):
    """The request's user is not the user the session belongs to (with --auth)."""


class SessionExpired(Exception):
    """The session was freed after its idle time-out; a request for it must not silently start an empty one."""


class Session:
    def __init__(self, session_hash: str, runtime: ModelRuntime, config: AppConfig, budget: Budget,
                 owner: str | None = None):
        self.hash = session_hash
        self.owner = owner  # the logged-in user who created it (with --auth); None without a login
        self.runtime = runtime
        self.config = config
        self.budget = budget
        self.stats = LiveStats()
        self.series = SessionSeries()
        self.chat: list[ChatItem] = []
        self.documents: list[DocumentRow] = []
        self.fed_chunks: list[list] = []  # chunk lists in the order fed, to rebuild a context without its chat
        self.pending: deque[Work] = deque()
        self.engine: ContextEngine | None = None
        self.system_prompt: str | None = None
        self.last_active = time.monotonic()
        self.stop_note = ""  # what Stop said ("Stopping 2 actions…"), until that work is over or new work starts
        self.exported: list | None = None  # the chat messages the shown export was made of
        self.shown_rows: list | None = None  # the documents table this session's tab was last sent
        self.panel_shown: dict = {}  # what this session's tab was last sent by the panel timer
        self.busy = 0
        self.model_step = False  # a request of this session is running its actions on the model
        self.closed = False
        self.lock = threading.RLock()
        self.tmpdir = tempfile.mkdtemp(prefix="lminfinite-session-")
        self._ids = itertools.count(1)

    # -- engine --------------------------------------------------------------------------------
    def ensure_engine(self, system_prompt: str) -> ContextEngine:
        """The session's engine; a new one takes the current system prompt."""
        if self.engine is None:
            self.engine = ContextEngine(self.runtime, system_prompt=system_prompt, budget=self.budget.tokens,
                                        stats=self.stats)
            self.system_prompt = system_prompt
        return self.engine

    def drop_engine(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self.engine = None
        self.system_prompt = None
        self.stats.context_tokens = 0
        self.stats.set_kv({"starting": 0, "window": 0, "middle": 0})

    @property
    def context_tokens(self) -> int:
        return self.engine.length if self.engine is not None else 0

    @property
    def free_tokens(self) -> int:
        return self.budget.tokens - self.context_tokens

    # -- work ----------------------------------------------------------------------------------
    def new_work(self, kind: str, question: str | None = None, sources: list[str] | None = None) -> Work:
        """Queue an action; one without files to read is ready for the model at once.

        The rows an earlier action's Stop cancelled stay in the table until now, so the user saw them.
        """
        work = Work(next(self._ids), kind, question, list(sources or []))
        if not work.sources:
            work.stage = Stage.READ
        with self.lock:
            self.documents[:] = [d for d in self.documents if d.status != RowStatus.CANCELLED]
            self.stop_note = ""
            self.pending.append(work)
        return work

    def answer_to(self, question: ChatItem | None) -> ChatItem | None:
        """The answer that followed ``question`` in the chat, if there is one."""
        if question is None or question not in self.chat:
            return None
        return next((c for c in self.chat[self.chat.index(question) + 1:] if c.kind == ItemKind.ANSWER), None)

    def waiting(self) -> bool:
        """Work queued for the reading or model queue (not abandoned for a day): the session is in use."""
        with self.lock:
            return any(time.perf_counter() - w.created < STALE_WORK_S for w in self.pending)

    @property
    def has_work(self) -> bool:
        """Running or queued actions: what Stop and Cancel can act on."""
        return bool(self.pending)

    def next_work(self, stage: Stage) -> Work | None:
        with self.lock:
            return next((w for w in self.pending if w.stage == stage), None)

    def claim_model_step(self) -> bool:
        """Become the session's one model step; False when another request of this session is it already
        (model steps of different sessions run side by side, one session's actions run in order)."""
        with self.lock:
            if self.model_step:
                return False
            self.model_step = True
            return True

    def next_model_work(self) -> Work | None:
        """The oldest action for the model step, or None, releasing the step, when there is none yet (or it is
        still being read: that action's own model step comes after its reading step). One lock for both, so
        an action queued meanwhile is never left without a step."""
        with self.lock:
            work = self.pending[0] if self.pending and not self.closed else None
            if work is None or (work.stage == Stage.QUEUED and work.reading):
                self.model_step = False
                return None
            return work

    def release_model_step(self) -> None:
        with self.lock:
            self.model_step = False

    def finish_work(self, work: Work) -> None:
        with self.lock:
            work.stage = Stage.DONE
            if work in self.pending:
                self.pending.remove(work)
            if not self.pending:
                self.stop_note = ""

    def stop(self) -> int:
        """Stop everything this session started or queued; returns how many actions were told."""
        with self.lock:
            for work in self.pending:
                work.cancel.set()
            return len(self.pending)

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def reset(self) -> None:
        """New context: forget documents, chat and cache (settings and metrics history stay)."""
        self.stop()
        self.pending.clear()
        self.drop_engine()
        self.chat.clear()
        self.documents.clear()
        self.fed_chunks.clear()

    @contextmanager
    def working(self):
        """Mark an operation in progress: idle sweeps skip the session, and a close waits for the end."""
        with self.lock:
            self.busy += 1
        try:
            yield self
        finally:
            with self.lock:
                self.busy -= 1
                release = self.closed and not self.busy
            if release:
                self._release()

    def close(self) -> None:
        """Free everything now, or, while an operation runs, stop it and free when it ends."""
        with self.lock:
            self.closed = True
            self.stop()
            if self.busy:
                return
        self._release()

    def _release(self) -> None:
        self.reset()
        release_memory()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


class SessionRegistry:
    """All live sessions of one server; created on first use, freed on disconnect or idleness."""

    def __init__(self, runtime: ModelRuntime, config: AppConfig, budget: Budget):
        self.runtime = runtime
        self.config = config
        self.budget = budget
        self._sessions: dict[str, Session] = {}
        self._expired: OrderedDict[str, float] = OrderedDict()  # hashes the sweep freed, newest last
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_hash: str, *, touch: bool = True, owner: str | None = None) -> Session:
        """The session for ``session_hash``; ``touch=False`` (the panel timer) does not count as activity.

        ``owner`` is the request's logged-in user: a session is created for it, and then answers no other
        user (SessionDenied), so knowing another tab's session hash gives no access to it. A hash whose
        session the idle sweep freed raises SessionExpired (once per new request stream, see ``forget_expired``).
        """
        self.sweep()
        with self._lock:
            session = self._sessions.get(session_hash)
            if session is None:
                if session_hash in self._expired:
                    raise SessionExpired(session_hash)
                session = self._sessions[session_hash] = Session(session_hash, self.runtime, self.config,
                                                                 self.budget, owner=owner)
        if session.owner is not None and session.owner != owner:
            raise SessionDenied(session_hash)
        if touch:
            session.touch()
        return session

    def forget_expired(self, session_hash: str) -> None:
        """The user was told the session expired: the hash may start a new session now."""
        with self._lock:
            self._expired.pop(session_hash, None)

    def cache_bytes(self) -> int:
        """Bytes every live session's cache holds now: what the memory budget (--memory-budget) measures."""
        with self._lock:
            engines = [s.engine for s in self._sessions.values() if s.engine is not None]
        return sum(sum(engine.memory().values()) for engine in engines if engine.cache is not None)

    def peek(self, session_hash: str) -> Session | None:
        return self._sessions.get(session_hash)

    def close(self, session_hash: str, *, owner: str | None = None, as_user: bool = False) -> bool:
        """Free a session; ``as_user``: only when ``owner`` is its owner (another user's disconnect frees nothing)."""
        with self._lock:
            session = self._sessions.get(session_hash)
            if session is None or (as_user and session.owner is not None and session.owner != owner):
                return False
            del self._sessions[session_hash]
        session.close()
        return True

    def sweep(self) -> list[str]:
        """Close sessions idle for longer than the time-out: never one that is working or has work waiting in
        a queue (waiting is not idleness: a user whose upload waits behind a long read must not lose it)."""
        now = time.monotonic()
        with self._lock:
            idle = [h for h, s in self._sessions.items()
                    if not s.busy and not s.waiting() and now - s.last_active > self.config.session_timeout_s]
        for session_hash in idle:
            if self.close(session_hash):
                with self._lock:
                    self._expired[session_hash] = now
                    while len(self._expired) > EXPIRED_KEPT:
                        self._expired.popitem(last=False)
        return idle
