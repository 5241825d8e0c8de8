"""One workspace's live state: its context (engine), chat, documents, metrics and queued work.

Nothing about a user lives at module level: each session has its own engine (cache), chat, documents and
metrics. The registry (registry.py) attaches browser tabs to sessions, saves them and frees them.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum

from ..cli import AppConfig
from ..engine.budget import WITHOUT_RECALL, Budget
from ..engine.citations import Citation
from ..engine.context import ContextEngine
from ..engine.context_records import AnswerProgress, AnswerResult
from ..engine.document_choice import covers
from ..engine.metrics import LiveStats, SessionSeries
from ..engine.runtime import ModelRuntime, release_memory
from .answer_from import answer_choices, still_off
from .lifecycle import Lifecycle
from .uploads import DocumentRow, RowStatus, plural, replace_rows
from .source_files import SourceFiles
from .temp_folders import session_temp_folder
from .work_queue import Stage, WorkQueue

log = logging.getLogger(__name__)

STALE_WORK_S = 24 * 3600.0  # queued work older than this no longer keeps a session from the idle sweep


class KeptInMemory(Exception):
    """Raised by a close's last step (the registry's save) that failed: the session stays live, nothing is freed."""


class ItemKind(StrEnum):
    QUESTION = "question"
    ANSWER = "answer"
    STATUS = "status"  # progress and outcome of reading and feeding: a titled, collapsible block


class WorkKind(StrEnum):
    TURN = "turn"  # documents and/or a question
    REGENERATE = "regenerate"
    FORGET = "forget"  # clear chat, keep documents
    RESET = "reset"  # new context
    SAVE = "save"  # write the workspace to disk, after the actions before it
    REMOVE = "remove"  # take one document out of the context (the Work's ``removing``)
    EDIT = "edit"  # ask an earlier question in new words (the Work's question); what followed it goes


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
    progress: AnswerProgress | None = None  # a pending answer's reading before its first token; never saved


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
    edited: ChatItem | None = None  # EDIT: the question asked anew; the exchanges before it stay
    removing: str | None = None  # REMOVE: the file, or an archive's prefix ("repo.zip/": document_choice.covers)
    created: float = field(default_factory=time.perf_counter)  # when the user acted: time to first token starts here
    # A question answered while the documents queued before it were fed (model_work.py): its answer, and the result
    # the context reads after them when its turn comes (None once it was stopped or failed).
    answer_item: ChatItem | None = None
    answered: AnswerResult | None = None

    @property
    def items(self) -> list[ChatItem]:
        """The chat items shown when it was queued (before it ran), and an answer given while it waited."""
        return [i for i in (self.question_item, self.status_item, self.answer_item) if i is not None]

    @property
    def plain_question(self) -> bool:
        """A question with no files of its own (what may be answered while documents before it are fed)."""
        return self.kind == WorkKind.TURN and bool(self.question) and not self.sources and self.corpus is None


class Session:
    def __init__(self, workspace_id: str, runtime: ModelRuntime, config: AppConfig, budget: Budget,
                 owner: str | None = None, name: str = ""):
        self.workspace_id = workspace_id
        self.name = name or "Workspace of " + time.strftime("%Y-%m-%d %H:%M")
        self.owner = owner  # the logged-in user who created it (with --auth); None without a login
        self.lifecycle = Lifecycle()  # tabs, leaving and saves: the registry's record, written by it only
        self.changes = 0  # actions finished; compared with lifecycle.saved_changes to know whether a save is due
        self.released = threading.Event()  # set once its memory is freed (a reopen waits for a last save)
        self._before_release = None
        self._armed: tuple[tuple, float] | None = None  # a costly action asked for once, awaiting its confirmation
        self.runtime = runtime
        self.config = config
        self.budget = budget
        self.stats = LiveStats()
        self.series = SessionSeries()
        self.chat: list[ChatItem] = []
        self.documents: list[DocumentRow] = []
        self.fed_digests: dict[str, str] = {}  # content digest -> the file that brought it (duplicates are skipped)
        self.switched_off: set[str] = set()  # documents not cited nor quoted (answer_from.py); switch_documents
        self.sources = SourceFiles()  # the uploads its citations open (source_files.py)
        self.engine: ContextEngine | None = None
        self.system_prompt: str | None = None
        self.last_active = time.monotonic()
        self.stop_note = ""  # what Stop or a save said, until that work is over (Stop) or new work starts
        self.lock = threading.RLock()
        self.queue = WorkQueue(self.lock)  # its actions, their model step, the operations in progress
        self.tmpdir = session_temp_folder()  # under this server's own folder (temp_folders.py)
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
    def recall_kept(self) -> bool:
        """Whether the context keeps evicted tokens for recall (a session without one yet will)."""
        return self.engine is None or self.engine.keeps_recall

    @property
    def budget_tokens(self) -> int:
        """The context's budget: the server's, or the engine's own (larger once it reads without recall)."""
        return self.budget.tokens if self.engine is None else self.engine.budget

    @property
    def free_tokens(self) -> int:
        """Tokens the context may still take."""
        return self.budget_tokens - self.context_tokens

    @property
    def room_for_documents(self) -> int:
        """The most tokens of documents this session could take: a new context reads documents over its budget
        without recall (ModelWork._feed), up to WITHOUT_RECALL."""
        fresh = self.engine is None or self.engine.may_give_up_recall
        return max(self.free_tokens, WITHOUT_RECALL) if fresh else self.free_tokens

    # -- work ----------------------------------------------------------------------------------
    def new_work(self, kind: str, question: str | None = None, sources: list[str] | None = None, *,
                 question_item: ChatItem | None = None, status_item: ChatItem | None = None,
                 refused: list[DocumentRow] = (), edited: ChatItem | None = None, removing: str | None = None) -> Work:
        """Queue an action; one without files to read is ready for the model at once.

        Its chat items (and the rows of files refused at the door) join the chat and the table under the same
        lock as the queue: an answer or a Clear running meanwhile sees the action whole, or not at all. The
        rows an earlier action's Stop cancelled stay in the table until now, so the user saw them.
        """
        work = Work(next(self._ids), kind, question, list(sources or []), question_item=question_item,
                    status_item=status_item, edited=edited, removing=removing)
        if not work.sources:
            work.stage = Stage.READ
        with self.lock:
            self.documents[:] = [d for d in self.documents if d.status != RowStatus.CANCELLED]
            self.documents.extend(refused)
            self.stop_note = ""
            self.pending.append(work)
            self.chat.extend(work.items)
        return work

    # -- chat and documents: changed here only, under the lock ----------------------------------
    def drop_items(self, items) -> None:
        """Take ``items`` (matched by identity) out of the chat."""
        with self.lock:
            gone = {id(i) for i in items}
            self.chat[:] = [c for c in self.chat if id(c) not in gone]

    def add_rows(self, rows: list[DocumentRow]) -> None:
        """Rows join the documents table (files about to be read)."""
        with self.lock:
            self.documents.extend(rows)

    def replace_rows(self, old: list[DocumentRow], new: list[DocumentRow]) -> None:
        """``new`` rows take the place of ``old`` ones in the table (uploads.replace_rows)."""
        with self.lock:
            replace_rows(self.documents, old, new)

    def drop_document(self, source: str) -> None:
        """A Remove rebuilt the context without ``source`` (a file, or an archive's prefix): its rows in the context
        leave the table, and its digests no longer skip the same text."""
        with self.lock:
            self.documents[:] = [r for r in self.documents if not (covers(source, r.path) and r.status.in_context)]
            self.fed_digests = {d: path for d, path in self.fed_digests.items() if not covers(source, path)}

    def restore(self, chat: list[ChatItem], rows: list[DocumentRow]) -> None:
        """The chat and the documents table of a workspace read back from its file."""
        with self.lock:
            self.chat[:], self.documents[:] = chat, rows

    def switch_documents(self, on: list[str]) -> None:
        """The user's "Answer from" list: the documents in the context not in ``on`` are switched off. Nothing is
        read again, so it takes effect at the next question; saved with the workspace."""
        with self.lock:
            switched_off = {value for _, value in answer_choices(self.documents) if value not in set(on)}
            if switched_off != self.switched_off:
                self.switched_off = switched_off
                self.changes += 1

    def answering_off(self) -> frozenset[str]:
        """The documents answers are not drawn from now."""
        with self.lock:
            return still_off(self.switched_off, self.documents)

    def confirmed(self, action: tuple, within_s: float) -> bool:
        """The second request for the same costly ``action`` within ``within_s``: go ahead. The first arms it."""
        now = time.monotonic()
        armed = self._armed
        self._armed = None if armed and armed[0] == action and now - armed[1] <= within_s else (action, now)
        return self._armed is None

    def answer_to(self, question: ChatItem | None) -> ChatItem | None:
        """The answer that followed ``question`` in the chat, if there is one."""
        if question is None or question not in self.chat:
            return None
        return next((c for c in self.chat[self.chat.index(question) + 1:] if c.kind == ItemKind.ANSWER), None)

    def waiting(self) -> bool:
        """Work queued for the reading or model queue (not abandoned for a day): the session is in use."""
        with self.lock:
            return any(time.perf_counter() - w.created < STALE_WORK_S for w in self.pending)

    def exchanges_before(self, question: ChatItem) -> int:
        """How many exchanges the context holds before ``question``: the answers kept in it above it."""
        with self.lock:
            above = self.chat[:self.chat.index(question)] if question in self.chat else []
        return sum(1 for c in above if c.kind == ItemKind.ANSWER and c.in_context)

    def queued_items(self, after: Work | None = None) -> set[int]:
        """Ids of the chat items of actions still waiting (queued after ``after``, when given): they are not in
        the context yet, whatever the chat above them becomes."""
        with self.lock:
            return {id(i) for w in self.pending if after is None or w.id > after.id for i in w.items}

    def show(self, item: ChatItem, work: Work) -> None:
        """Add ``work``'s ``item`` to the chat before the items of actions queued after it, so the chat keeps the
        order the context has while later questions wait."""
        with self.lock:
            later = self.queued_items(after=work)
            self.chat.insert(next((n for n, c in enumerate(self.chat) if id(c) in later), len(self.chat)), item)

    def questions_behind(self, work: Work) -> list[Work]:
        """The plain questions queued right after ``work`` and not answered yet, in order, up to the first other
        action (an upload, Clear, an edit…): those must wait for it, and so must what follows them."""
        with self.lock:
            behind = [w for w in self.pending if w.id > work.id]
        questions = []
        for waiting in behind:
            if not waiting.plain_question:
                break
            if waiting.answer_item is None and not waiting.cancel.is_set():
                questions.append(waiting)
        return questions

    def awaits_an_answer(self) -> bool:
        """A question of this session is queued or being answered (one answered while documents are still fed is
        not: its answer is shown, and only the context has yet to read it)."""
        with self.lock:
            return any(w.question and (w.answer_item is None or w.answer_item.pending) for w in self.pending)

    def only_feeding_left(self) -> bool:
        """The work left is a document feed under way and questions answered beside it, which wait only to be read
        into the context after it: a request that asked one of them has its answer."""
        with self.lock:
            later = list(self.pending)[1:]
        engine = self.engine
        return engine is not None and engine.feeding and all(
            w.answer_item is not None and not w.answer_item.pending for w in later)

    @property
    def has_work(self) -> bool:
        """Running or queued actions: what Stop and Cancel can act on."""
        return bool(self.pending)

    def controls_state(self) -> tuple[str, bool]:
        """The stop note and whether Stop / Cancel have work to act on, read together under the lock that
        ends work: read apart, a work ending in between showed its "Stopping 1 action…" beside idle buttons."""
        with self.lock:
            return self.stop_note, bool(self.pending)

    def next_work(self, stage: Stage) -> Work | None:
        with self.lock:
            return next((w for w in self.pending if w.stage == stage), None)

    @property
    def pending(self) -> deque[Work]:
        """Its actions waiting or running, oldest first (the queue's)."""
        return self.queue.pending

    def claim_model_step(self) -> bool:
        return self.queue.claim_model_step()

    def next_model_work(self) -> Work | None:
        return self.queue.next_model_work()

    def release_model_step(self) -> None:
        self.queue.release_model_step()

    def last_prefill_rate(self) -> float:
        """The prefill rate the newest answer measured (0 when none did): what a cost estimate uses after a reopen,
        before this server has read anything for the session."""
        with self.lock:
            return next((c.stats["prefill_tps"] for c in reversed(self.chat)
                         if c.kind == ItemKind.ANSWER and c.stats.get("prefill_tps")), 0.0)

    @property
    def unsaved(self) -> bool:
        """Work finished since the last save (or never saved), and something to keep."""
        return self.changes != self.lifecycle.saved_changes and bool(self.engine or self.chat or self.documents)

    def finish_work(self, work: Work) -> None:
        with self.lock:
            if work.kind != WorkKind.SAVE:
                self.changes += 1
            work.stage = Stage.DONE
            if work in self.pending:
                self.pending.remove(work)
            if not self.pending and work.kind != WorkKind.SAVE:  # a save's outcome is its note
                self.stop_note = ""

    def stop(self, *, say: bool = False) -> int:
        """Stop everything this session started or queued; returns how many actions were told.

        ``say``: the Stop button's note, set under the lock that ends work (``finish_work`` clears it), so a
        work ending in between cannot leave "Stopping…" on screen for good.
        """
        with self.lock:
            for work in self.pending:
                work.cancel.set()
            told = len(self.pending)
            if say:
                self.stop_note = f"Stopping {plural(told, 'action')}…" if told else "Nothing to stop."
            return told

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def reset(self) -> None:
        """New context: forget documents, chat and cache (settings and metrics history stay)."""
        self.stop()
        with self.lock:
            self.pending.clear()
            self.chat.clear()
            self.documents.clear()
            self.fed_digests.clear()
            self.sources.release()
        self.drop_engine()

    @contextmanager
    def working(self):
        """Mark an operation in progress: idle sweeps skip the session, and a close waits for the end."""
        with self.queue.working(self._release):
            yield self

    @property
    def busy(self) -> int:
        """Operations in progress: a close waits for them, the idle sweep skips the session meanwhile."""
        return self.queue.busy

    @property
    def pristine(self) -> bool:
        """Nothing was done in it yet."""
        return not (self.engine or self.chat or self.documents or self.pending)

    @property
    def closed(self) -> bool:
        """Closed (freed, or to be freed when its last operation ends): its queue gives no more work."""
        return self.queue.closed

    def close(self, before_release=None) -> None:
        """Free everything now, or, while an operation runs, stop it and free when it ends. ``before_release``
        (a save) runs first, once the session is idle, whichever thread that is."""
        with self.lock:
            self.queue.closed = True
            self._before_release = before_release or self._before_release
            self.stop()
            if self.busy:
                return
        self._release()

    def keep_open(self, note: str) -> None:
        """Undo a close whose last save failed: the session stays live with its work, and ``note`` tells its user."""
        with self.lock:
            self.queue.closed = False
            self._before_release = None
            self.stop_note = note

    def _release(self) -> None:
        if self._before_release is not None:
            try:
                self._before_release(self)
            except KeptInMemory:  # the save failed and the registry keeps it live (keep_open): nothing is freed
                return
            except Exception:  # noqa: BLE001 - a failed last save must not keep the memory
                log.exception("saving workspace %s before freeing it failed", self.workspace_id)
        self.reset()
        release_memory()
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        self.released.set()
