"""The model step: feed documents, answer, regenerate or clear, for one queued action of a session.

Runs on the model queue only. Every engine operation is a transaction, so whatever happens here (Stop,
out-of-memory, an error) the context is left consistent; this module turns the outcome into chat items and
document rows the user can read.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

from ingest.units import human_bytes

from ..engine.budget import WITHOUT_RECALL, Budget
from ..engine.context import ContextEngine
from ..engine.context_records import AnswerDelta, AnswerProgress, AnswerResult, EngineError, Stopped
from ..engine.replay import DOCUMENTS_ONLY, before_exchange, replay, replay_cost, without_source
from ..engine.generation import GenerationSettings
from ..engine.history import Exchange
from ..engine.metrics import LiveStats, Phase, human_seconds
from ..engine.runtime import ModelRuntime, is_out_of_memory
from .uploads import FittedCorpus, RowStatus, fit_budget, plural, rows_summary, set_rows
from .removal import removal_label
from .state import ChatItem, ItemKind, Session, Work, WorkKind
from .workspace_quota import QuotaExceeded

log = logging.getLogger(__name__)

ASK_MEANWHILE = " · a question asked now is answered before the feed ends"  # said while it is so
UI_INTERVAL_S = 0.1  # streamed updates per second are capped at 10: the browser, not the model, is the limit
FEED_INTERVAL_S = 0.5  # feeding progress (a line of text) needs fewer: each costs a post-processed chat
# Regenerate at temperature 0 would decode the same tokens again: it samples that one answer instead.
REGENERATE_TEMPERATURE, REGENERATE_TOP_P = 0.7, 0.9


READ_WITHOUT_RECALL = ("The model reads every token with LM-Infinite's bounded memory, and keeps none of those that "
                       "left its window: each question's sources are found by its words (BM25), and the context's "
                       "memory stays flat however long it grows.")
OUT_OF_MEMORY_TEXT = ("The device ran out of memory. The context was rolled back to its last consistent state; "
                      "try a shorter document, turn top-k recall off, or start a new context.")


@dataclass(frozen=True)
class Failure:
    """What the user is told when an operation failed; the engine has rolled it back."""

    message: str
    internal: bool = False  # a bug, not the user's input or the machine's limits


def failure(exc: Exception, during: str) -> Failure:
    """The one place where a refused operation, out-of-memory or a bug becomes words (and a log line)."""
    if isinstance(exc, EngineError):
        return Failure(str(exc))
    if is_out_of_memory(exc):
        log.warning("out of memory while %s: %s", during, exc)
        return Failure(OUT_OF_MEMORY_TEXT)
    log.exception("%s failed", during)
    return Failure(f"Internal error while {during} ({type(exc).__name__}); the context was rolled back.",
                   internal=True)


class Throttle:
    """True at most once per interval: keeps streaming from flooding the browser."""

    def __init__(self, interval: float | None = None):
        self.interval = UI_INTERVAL_S if interval is None else interval
        self.last = 0.0

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            return True
        return False


def feeding_line(stats: LiveStats) -> str:
    """'1,024 / 9,000 tokens · 812 tok/s · ETA 15.8 min' from the engine's live figures."""
    rate = f" · {stats.prefill_tps:,.0f} tok/s" if stats.prefill_tps else ""
    eta = f" · ETA {human_seconds(stats.eta_s)}" if stats.eta_s is not None else ""
    return f"{stats.done:,} / {stats.total:,} tokens{rate}{eta}"


class ModelWork:
    def __init__(self, runtime: ModelRuntime, budget: Budget, cache_bytes, save, answer_while_feeding_s: float = 30.0):
        # A question asked while documents are fed is answered at once, between two chunks of the feed, when the feed
        # has at least this long left (its measured ETA; --answer-while-feeding); otherwise it waits the few seconds
        # for its turn, and recall ranks its sources too. The 1.5B reads about 30 tokens/s on a CPU without bfloat16
        # units: a 100-page manual is half an hour of feeding, which a question waited through before.
        self.answer_while_feeding_s = answer_while_feeding_s
        self.runtime = runtime
        self.budget = budget
        self.cache_bytes = cache_bytes  # () -> bytes all sessions' caches hold (the memory budget's measure)
        self.save = save  # session -> bytes written (SessionRegistry.save_now)

    def run(self, session: Session, work: Work, settings: GenerationSettings, system_prompt: str):
        """Generator: carry out one ready action, yielding whenever what its user sees changed (the web layer
        sends each tab its own view)."""
        if work.cancel.is_set():  # Stop reached it while it waited: whatever it is, it does nothing
            self._mark_not_done(session, work)
            return
        if work.kind == WorkKind.RESET:
            session.reset()
            return
        if work.kind == WorkKind.FORGET:
            yield from self._forget(session, work)
            return
        if work.kind == WorkKind.SAVE:
            yield from self._save(session)
            return
        if work.kind == WorkKind.REMOVE:
            if session.engine is not None:
                yield from self._remove(session, work)
            return
        if work.kind == WorkKind.EDIT:
            if session.engine is not None:
                yield from self._edit(session, work, settings)
            return
        engine = session.ensure_engine(system_prompt)
        if work.kind == WorkKind.REGENERATE:
            yield from self._regenerate(session, work, engine, settings)
            return
        if work.corpus is not None:
            fed = yield from self._feed(session, work, engine, settings)
            if not fed:
                if work.question_item is not None and work.question_item.text:
                    work.question_item.in_context = False
                if work.answer_item is not None:  # answered while its documents were fed; they were not added
                    work.answer_item.in_context = False
                return
        if work.answer_item is not None:  # answered while documents were fed, its own or those before it
            yield from self._read_answered(session, work, engine)
        elif work.question:
            yield from self._answer(session, work, engine, settings)

    def _save(self, session: Session):
        """Write the workspace (no model step of it runs meanwhile: this is one); say how big and how long."""
        session.stats.phase, session.stats.detail = Phase.SAVING, session.name
        try:
            yield  # a request that ends here saves nothing (a closed tab saves on release)
            started = time.perf_counter()
            size = self.save(session)
        except QuotaExceeded as exc:  # checked before writing: nothing was written
            session.stop_note = f"⚠ Not saved: {exc}; the previous save is intact."
        except Exception as exc:  # noqa: BLE001 - the previous save is intact (written beside, then renamed)
            log.exception("saving workspace %s failed", session.workspace_id)
            session.stop_note = f"⚠ Not saved ({type(exc).__name__}: {exc}); the previous save is intact."
        else:
            session.stop_note = f"Saved “{session.name}”: {human_bytes(size)} in {time.perf_counter() - started:.1f} s."
        finally:
            session.stats.idle()

    def _mark_not_done(self, session: Session, work: Work) -> None:
        """Say what a stopped action that never started left undone (nothing changed)."""
        for row in work.rows:
            if row.status == RowStatus.QUEUED:
                set_rows([row], RowStatus.CANCELLED, "stopped before it reached the model; nothing was added")
        if work.status_item is not None:
            work.status_item.title, work.status_item.pending = "■ Stopped before it started: nothing was added", False
        if work.question_item is not None and work.question_item.text:
            work.question_item.in_context = False
            if work.answer_item is not None:  # answered while documents were fed: shown, but never read in
                work.answer_item.in_context = False
            else:
                session.show(ChatItem("assistant", ItemKind.ANSWER, "", stopped=True, in_context=False), work)
        undone = {WorkKind.FORGET: "the chat was not cleared", WorkKind.RESET: "the context was not replaced",
                  WorkKind.REMOVE: f"{work.removing} was not removed"}.get(work.kind)
        if undone:
            session.show(ChatItem("assistant", ItemKind.STATUS, title=f"■ Stopped before it started: {undone}"), work)
        elif work.kind == WorkKind.SAVE:
            session.stop_note = "■ Stopped before saving; the previous save is intact."

    def _feed(self, session: Session, work: Work, engine: ContextEngine, settings: GenerationSettings):
        """Prefill the read documents that fit the budget; returns False when nothing could be committed."""
        plan = engine.plan_documents(work.corpus.chunks)
        fitted = fit_budget(work.corpus, session.free_tokens, plan.tokens_by_source(), session.fed_digests)
        refusal = self._memory_refusal(engine, fitted.tokens)
        beyond_recall = engine.may_give_up_recall and bool(fitted.refused_tokens or refusal)
        if beyond_recall:
            why_without_recall = self._why_without_recall(engine, fitted, refusal)
            engine.keep_recall(False, WITHOUT_RECALL)
            fitted = fit_budget(work.corpus, session.free_tokens, plan.tokens_by_source(), session.fed_digests)
            refusal = None
        session.replace_rows(work.rows, fitted.rows)
        work.rows = fitted.rows
        item = work.status_item or ChatItem("assistant", ItemKind.STATUS)
        if not fitted.chunks:
            item.title, item.pending, item.text = "Nothing to add", False, rows_summary(fitted.rows)
            return True
        queued = [r for r in fitted.rows if r.status == RowStatus.QUEUED]
        if refusal is not None:
            set_rows(queued, RowStatus.REFUSED, f"not added: {refusal}")
            item.title, item.pending = "⚠ Documents not added: the server is out of context memory", False
            item.text = refusal[0].upper() + refusal[1:] + "."
            return False
        item.title = f"Adding {plural(len(queued), 'file')} ({fitted.tokens:,} tokens)"
        if beyond_recall:
            item.title += " without recall"
        whole = len(fitted.chunks) == len(plan.chunks)  # nothing refused: feed the plan as counted
        feeding = engine.feed_documents(plan if whole else fitted.chunks, work.cancel)
        for row in queued:
            row.feeding()
        try:
            yield from self._show_feeding(session, work, engine, item, feeding, settings)
        except GeneratorExit:  # the request ended (API cancel, closed tab): exactly what Stop leaves
            work.cancel.set()
            feeding.close()  # the engine rolls back now, not whenever the generator is collected
            self._feed_stopped(queued, item)
            if work.question_item is not None and work.question_item.text:
                work.question_item.in_context = False
            raise
        except Stopped:
            self._feed_stopped(queued, item)
            return False
        except Exception as exc:  # noqa: BLE001 - the engine rolled back; keep serving
            said = failure(exc, "feeding documents")
            set_rows(queued, RowStatus.ROLLED_BACK, said.message)
            item.title = "⚠ Documents not added" + (" (internal error)" if said.internal else "")
            item.pending, item.text = False, said.message
            return False
        finally:
            if beyond_recall and engine.is_new:  # nothing kept: a new context again
                engine.keep_recall(True, self.budget.tokens)
        for row in queued:
            row.added()
        session.fed_digests.update(fitted.digests)
        item.title = f"Added {plural(len(queued), 'file')} · {fitted.tokens:,} tokens"
        item.pending, item.text = False, rows_summary(fitted.rows)
        if not engine.keeps_recall:
            item.title += " · without recall"
            item.text += "\n\n" + (why_without_recall if beyond_recall else READ_WITHOUT_RECALL)
        return True

    def _memory_refusal(self, engine: ContextEngine, tokens: int, what: str = "") -> str | None:
        """Why ``tokens`` more in ``engine``'s cache would cross the memory budget across sessions; never for a
        context read without recall, whose cache does not grow."""
        if not engine.keeps_recall:
            return None
        return self.budget.memory_refusal(self.cache_bytes(), tokens, what)

    def _why_without_recall(self, engine: ContextEngine, fitted: FittedCorpus, refusal: str | None) -> str:
        """Why a new context reads these documents without recall (ContextEngine.keep_recall): they would not fit
        the tokens recall can keep, or the memory the server has left for it."""
        why = (f"these documents need {fitted.tokens + fitted.refused_tokens:,} tokens, more than the "
               f"{engine.budget:,} the memory for recall can hold ({self.budget.why})" if fitted.refused_tokens
               else refusal)
        return f"Read without recall: {why}. " + READ_WITHOUT_RECALL

    def _show_feeding(self, session: Session, work: Work, engine: ContextEngine, item: ChatItem, feeding,
                      settings: GenerationSettings):
        """Show the feed's progress; between two of its chunks, answer the question asked with the documents and those
        asked meanwhile, when the feed has long to go (``answer_while_feeding_s``)."""
        throttle = Throttle(FEED_INTERVAL_S)
        for stats in feeding:
            meanwhile = self._answers_while_feeding(stats, settings)
            item.text = "Feeding " + feeding_line(stats) + (ASK_MEANWHILE if meanwhile else "")
            if meanwhile:
                own = [work] if work.question and work.answer_item is None and not work.cancel.is_set() else []
                for question in own + session.questions_behind(work):
                    yield from self._answer_while_feeding(session, question, engine, settings)
            if throttle():
                yield

    def _answers_while_feeding(self, stats: LiveStats, settings: GenerationSettings) -> bool:
        """Whether a question asked now is answered before the feed ends: it quotes its sources (the reader
        needs no recall over what is not read yet), and the feed has long to go."""
        if not settings.quote:
            return False
        after = self.answer_while_feeding_s  # 0 or less: every question asked during a feed
        return after <= 0 or (stats.eta_s is not None and stats.eta_s >= after)

    def _answer_while_feeding(self, session: Session, work: Work, engine: ContextEngine,
                              settings: GenerationSettings):
        """Answer ``work``'s question between two chunks of the feed before it, from every chunk planned, fed or not
        (ContextEngine.ask_while_feeding); the context reads the exchange at the question's turn (_read_answered)."""
        if self._question_memory_refusal(engine, work.question, settings) is not None:
            return  # it waits for its turn, and is refused then, saying why
        item = yield from self._pending_answer(session, work, kept_on_work=True)
        with session.lock:  # the last question answered while this feed runs, waiting to be read too
            answered = [w for w in session.pending if w.id < work.id and w.answered is not None]
        earlier = (Exchange(answered[-1].question, answered[-1].answered.answer_ids) if answered
                   else engine.last_exchange)
        events = engine.ask_while_feeding(work.question, settings, work.cancel, started=work.created,
                                          switched_off=session.answering_off(), earlier=earlier)
        work.answered = yield from self._stream_answer(session, item, events, work.question_item)

    def _read_answered(self, session: Session, work: Work, engine: ContextEngine):
        """The context reads a question answered while documents were fed, and its answer, after them."""
        if work.answered is None:  # stopped or failed: the chat says so already, nothing to read
            return
        question_item, answer_item = work.question_item, work.answer_item

        def not_kept() -> None:
            answer_item.in_context = False
            if question_item is not None:
                question_item.in_context = False

        try:
            for _ in engine.read_answered(work.question, work.answered, work.cancel):
                yield
        except GeneratorExit:  # the request ended (API cancel, closed tab): what Stop leaves
            not_kept()
            raise
        except Stopped:
            not_kept()
        except Exception as exc:  # noqa: BLE001 - the engine rolled back; keep serving
            not_kept()
            said = failure(exc, "reading the answer into the context")
            session.show(ChatItem("assistant", ItemKind.STATUS, title="⚠ This exchange was not kept in the context",
                                  text=said.message), work)

    @staticmethod
    def _feed_stopped(queued: list, item: ChatItem) -> None:
        for row in queued:  # each row says how many tokens it would have added
            set_rows([row], RowStatus.CANCELLED,
                     f"stopped while feeding the model; none of its {row.tokens:,} tokens were added")
        item.title, item.pending, item.text = "■ Stopped: nothing from this upload was added", False, ""

    def _stream_answer(self, session: Session, item: ChatItem, events, question_item: ChatItem | None):
        throttle = Throttle()
        finished = False
        stats = session.stats
        shown = None  # what the activity box said at the last update: a new phase is shown at once
        try:
            for event in events:
                if isinstance(event, AnswerProgress):  # shown in the answer's place until its first token
                    stage_changed = item.progress is None or item.progress.stage is not event.stage
                    item.progress = event
                    if throttle() or stage_changed or (stats.phase, stats.feeding) != shown:
                        shown = stats.phase, stats.feeding
                        yield
                elif isinstance(event, AnswerDelta):
                    item.text, item.progress = event.text, None
                    if throttle():
                        yield
                elif isinstance(event, AnswerResult):
                    self._finish_answer(item, event, session.recall_kept)
                    finished = event
        except GeneratorExit:  # the request ended mid-answer (API cancel, closed tab): what Stop leaves
            if not finished:
                events.close()  # the engine rolls the question and the partial answer back now
                self._mark_stopped(item, question_item)
            raise
        except Stopped:
            self._mark_stopped(item, question_item)
        except Exception as exc:  # noqa: BLE001 - the engine rolled back; keep serving
            said = failure(exc, "answering")
            item.pending, item.in_context = False, False
            item.text = (item.text + "\n\n" if item.text else "") + f"⚠ {said.message}"
            if question_item is not None:
                question_item.in_context = False
        finally:
            item.progress = None  # answered, stopped or failed: nothing is being read for it now
        return finished or None  # the AnswerResult, or None when it was stopped or failed

    @staticmethod
    def _mark_stopped(item: ChatItem, question_item: ChatItem | None) -> None:
        item.pending, item.stopped, item.in_context = False, True, False
        if question_item is not None:
            question_item.in_context = False

    def _question_memory_refusal(self, engine: ContextEngine, question: str, settings: GenerationSettings) -> str | None:
        """Why reading ``question`` and the answer it may get (up to max new tokens) would cross the memory
        budget across sessions: a question is read into the cache as a document is."""
        tokens = len(engine.format.question(question, engine.carry)[0]) + settings.max_new_tokens
        return self._memory_refusal(engine, tokens, f"this question and its answer (up to {tokens:,} tokens)")

    def _pending_answer(self, session: Session, work: Work, *, kept_on_work: bool = False):
        """Show ``work``'s answer, pending, before its question reaches the model (``kept_on_work``: an answer given
        while documents are fed, which the context reads later: ``_read_answered``); returns it."""
        item = ChatItem("assistant", ItemKind.ANSWER, pending=True)
        if kept_on_work:
            work.answer_item = item
        session.show(item, work)
        try:
            yield
        except GeneratorExit:  # ended before the question reached the model
            self._mark_stopped(item, work.question_item)
            raise
        return item

    def _answer(self, session: Session, work: Work, engine: ContextEngine, settings: GenerationSettings):
        refusal = self._question_memory_refusal(engine, work.question, settings)
        if refusal is not None:  # nothing was read: the context is as it was
            if work.question_item is not None:
                work.question_item.in_context = False
            text = f"⚠ Not answered: {refusal}."
            session.show(ChatItem("assistant", ItemKind.ANSWER, text, in_context=False), work)
            return
        item = yield from self._pending_answer(session, work)
        events = engine.ask(work.question, settings, work.cancel, started=work.created,
                            switched_off=session.answering_off())
        yield from self._stream_answer(session, item, events, work.question_item)

    def _regenerate(self, session: Session, work: Work, engine: ContextEngine, settings: GenerationSettings):
        # The newest answer still in the context (a stopped or cancelled one is not: its turn was rolled back).
        index = next((i for i in range(len(session.chat) - 1, -1, -1)
                      if session.chat[i].kind == ItemKind.ANSWER and session.chat[i].in_context), None)
        if index is None or not engine.can_regenerate:
            return
        item = session.chat[index]
        question = next((c for c in reversed(session.chat[:index]) if c.kind == ItemKind.QUESTION), None)
        old = item.text, item.citations, item.stats, item.recall_note, False
        item.text, item.citations, item.stats, item.recall_note, item.pending = "", [], {}, "", True
        sampling = ""
        if settings.temperature == 0:
            settings = dataclasses.replace(settings, temperature=REGENERATE_TEMPERATURE, top_p=REGENERATE_TOP_P)
            sampling = f"regenerated with sampling, temperature {REGENERATE_TEMPERATURE}"
        try:
            yield
        except GeneratorExit:  # ended before the engine started: the old answer is still in the context
            item.text, item.citations, item.stats, item.recall_note, item.pending = old
            raise
        events = engine.regenerate(settings, work.cancel, started=work.created)
        yield from self._stream_answer(session, item, events, question)
        if item.stats and sampling:
            item.stats["sampling"] = sampling

    def _forget(self, session: Session, work: Work):
        """Clear chat: drop questions and answers from the context, keep the documents."""
        engine = session.engine
        statuses = {id(c) for c in session.chat if c.kind == ItemKind.STATUS}  # notes from before Clear stay

        def clear() -> None:  # questions asked after Clear stay, even while it re-reads: they come after it
            with session.lock:  # one step: a question asked meanwhile is in ``later`` or not yet in the chat
                later = session.queued_items(after=work)
                session.drop_items([c for c in session.chat if id(c) not in statuses and id(c) not in later])

        if engine is None or engine.forget_conversation():
            clear()
            return
        # Documents came after a question (or the context was reopened): build it again without the chat.
        rebuilt = yield from self._rebuild(session, work, DOCUMENTS_ONLY, (
            "Re-reading the documents without the conversation", "Re-read the documents without the conversation",
            "⚠ Chat not cleared; the context is unchanged"))
        if rebuilt:
            clear()

    def _remove(self, session: Session, work: Work):
        """Remove a document: the context is built again from its history without the file's chunks."""
        source = work.removing
        name = removal_label(source, session.documents)
        rebuilt = yield from self._rebuild(session, work, without_source(source), (
            f"Removing {name}", f"Removed {name}", f"⚠ {name} was not removed; the context is unchanged"))
        if rebuilt:
            session.drop_document(source)

    def _edit(self, session: Session, work: Work, settings: GenerationSettings):
        """Ask an earlier question in new words: the context is built again with the exchanges before it, the
        question and what followed it leave the chat (notes stay), and the new words are asked there."""
        edited = work.edited
        if edited not in session.chat or not edited.in_context:  # a Clear or an edit before it took it away
            work.question_item.in_context = False
            return
        kept = session.exchanges_before(edited)
        rebuilt = yield from self._rebuild(session, work, before_exchange(kept), (
            "Going back to the edited question", "Went back to the edited question",
            "⚠ Not edited; the context is unchanged"))
        if not rebuilt:
            work.question_item.in_context = False
            return
        with session.lock:
            start, later = session.chat.index(edited), session.queued_items(after=work)
            session.drop_items([c for c in session.chat[start:] if c.kind != ItemKind.STATUS and id(c) not in later
                                and c is not work.question_item])
        yield from self._answer(session, work, session.engine, settings)

    def _rebuild(self, session: Session, work: Work, keep, titles: tuple[str, str, str]):
        """Replay the history as ``keep`` says into a new engine, then swap; on Stop or failure the old engine
        stays. ``titles``: the status block's while it runs, once done, and on failure. Returns whether the
        context changed."""
        title, done, failed = titles
        engine = session.engine
        note = ChatItem("assistant", ItemKind.STATUS, title=title, pending=True)
        session.show(note, work)
        throttle = Throttle(FEED_INTERVAL_S)
        rebuilt = None
        replaying = replay(engine, keep, work.cancel, session.stats)  # the panel follows the rebuild

        def unchanged(text: str) -> None:  # the old context is untouched: say why
            session.stats.idle()
            session.stats.context_tokens = engine.length
            session.stats.set_kv(engine.memory())
            note.title, note.pending, note.text = failed, False, text

        cost = replay_cost(engine, keep)  # read into a second cache while the old one is kept
        refusal = self._memory_refusal(engine, cost, f"reading the context again ({cost:,} tokens)")
        if refusal is not None:
            unchanged(refusal[0].upper() + refusal[1:] + ".")
            return False
        try:
            for item in replaying:
                if isinstance(item, LiveStats):
                    note.text = feeding_line(item)
                    if throttle():
                        yield
                else:
                    rebuilt = item
        except GeneratorExit:  # the request ended (API cancel, closed tab): exactly what Stop leaves
            work.cancel.set()
            replaying.close()  # the half-built context is freed now, not whenever it is collected
            unchanged("Stopped: the request ended before the context was read again.")
            raise
        except Exception as exc:  # noqa: BLE001
            unchanged(failure(exc, title.lower()).message)
            return False
        engine.close()
        session.engine = rebuilt
        session.stats.idle()
        session.stats.context_tokens = rebuilt.length
        session.stats.set_kv(rebuilt.memory())
        note.title, note.pending = done, False
        note.text = f"{rebuilt.length:,} tokens in the context now."
        return True

    @staticmethod
    def _finish_answer(item: ChatItem, result: AnswerResult, recall_kept: bool = True) -> None:
        item.text, item.pending = result.text, False
        item.citations = list(result.citations.citations)
        report = result.citations
        words = "ranked by the question's words (BM25)"
        if result.while_feeding is not None:
            item.recall_note = ("Answered while the documents were still being fed, from every part of them, "
                                f"{words}: recall had not read them yet. The question and its answer join the "
                                "context after them." if item.citations else
                                "Asked while the documents were still being fed, and no part of them has the "
                                "question's words: no sources.")
        elif not report.recall_on:  # how the question was read: an answer drawn again keeps its sources
            off = ("top-k recall was off when the question was read" if recall_kept else
                   "this context is read without recall, its documents being longer than the memory recall needs")
            item.recall_note = (f"Sources {words}: {off}." if item.citations
                                else f"{off[0].upper()}{off[1:]}, and no passage has the question's words: no sources.")
        elif not report.recalled:
            item.recall_note = (f"Sources {words}: the whole context is inside the attention window, so recall had "
                                "nothing to pick from the middle." if item.citations else
                                "No sources: the whole context is inside the attention window, so recall had nothing "
                                "to pick from the middle, and no passage has the question's words.")
        elif not item.citations and report.document_share == 0:
            item.recall_note = "Recall attended to the conversation rather than to documents."
        elif not item.citations:
            item.recall_note = "No passage drew more of the question's recall than any question draws: no sources."
        item.stats = {"ttft_s": round(result.ttft_s, 4), "decode_tps": round(result.decode_tps, 2),
                      "prefill_tps": round(result.prefill_tps, 2), "tokens": result.tokens, "finish": str(result.finish),
                      "question_tokens": result.question_tokens, "quoted": result.quoted}
        if result.quoted:  # the first sources cited are those quoted to the model
            item.stats["quoted_sources"] = report.quoted_passages
        if result.while_feeding is not None:  # its note shows under its sources (views.answer_markdown)
            item.stats["while_feeding"] = True
        if result.guess:  # what the sources were also searched with: shown under them, kept with the workspace
            item.stats["guess"] = result.guess
