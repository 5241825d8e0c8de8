"""One session's context: a single LM-Infinite cache fed append-only, with snapshots to undo any operation.

Every operation (add documents, ask, regenerate) is a generator that yields progress and runs as a
transaction: Stop (the ``cancel`` event), out-of-memory, an error, or a generator abandoned by a closed
browser tab puts the context back exactly where the operation found it (``InfiniteCache.rollback`` is
O(layers) and exact). What is in the cache is never encoded again.

Prefill and decode are separate steps: prefill feeds planned token pieces in chunks (Stop halts within
one chunk), decode feeds one sampled token per forward (Stop halts within one token).
"""

from __future__ import annotations

import time
from array import array
from contextlib import contextmanager
from dataclasses import InitVar, dataclass, field, replace
from itertools import accumulate
from typing import Generator, Iterator, Sequence

from ingest import Provenance

from .chat_format import Carry, ChatFormat, TurnState
from .citations import (NEUTRAL_QUESTION, CitationReport, RecallTally, Ranking, cite, lead_with_answer_source,
                        with_heading_of)
from .context_records import (AnswerDelta, AnswerProgress, AnswerResult, AnswerStage, ContextFull, ContextOutOfMemory,
                              DocumentChunk, DocumentPlan, EngineError, Piece, Saved, Stopped, Turn)
from .context_text import ContextText
from .document_choice import covers
from .feed_under_way import FeedUnderWay, planned_text
from .generation import Decoded, Finish, GenerationSettings, LoopGuard, next_token, whole_sentences
from .guess import GUESS_TOKENS, write_guess
from .history import DocumentsFed, Exchange
from .layer_stop import StoppedMidForward
from .lexical import ChunkIndex
from .metrics import Feeding, LiveStats, RateMeter
from .native_memory import trim_heap
from .neutral_recall import NeutralRecall, documents_key
from .quoting import QUOTED_CHUNKS, quote_budget
from .reader import AnswerReader
from .runtime import ModelRuntime, is_out_of_memory
from .spans import Span, SpanIndex, SpanKind

# Shorter prefills (a question) measure latency, not throughput: they do not overwrite the panel's rate.
MEASURED_PREFILL = 128


def answer_sources(citations: CitationReport, question: str, answer: str, index: ChunkIndex,
                   text: ContextText) -> CitationReport:
    """``citations`` with the page of the quoted chunk whose words the answer shares most first (``index`` scores
    the chunks for the answer; citations.lead_with_answer_source), its snippet where the answer's own words are in
    what was quoted of it (``ContextText.answered_at``): the sentence a user checks the answer against, not the
    question's words elsewhere on the page."""
    scores = index.scores(answer)
    led = lead_with_answer_source(citations, [scores.get(text.spans.at(lo), 0.0) for lo, _ in citations.quote_spans])
    at = text.answered_at(led, question, answer)
    if at is None:
        return led
    chunk = text.spans.at(at)
    first = replace(led.citations[0], where=with_heading_of(led.citations[0].where, chunk),
                    snippet=text.snippet(at, chunk))
    return replace(led, citations=(first, *led.citations[1:]))


@dataclass
class ContextEngine:
    """The per-session context. Not thread-safe by itself: sessions run one operation at a time."""

    runtime: ModelRuntime
    system_prompt: str = ""
    budget: int = 1_000_000
    stats: LiveStats = field(default_factory=LiveStats)
    with_recall: InitVar[bool] = True  # False: a cache that keeps no evicted tokens (keep_recall)

    def __post_init__(self, with_recall: bool) -> None:
        self.format = ChatFormat(self.runtime.tokenizer, self.runtime.stop_ids)
        self.use_cache(self.runtime.new_cache(keep_middle=with_recall))
        self.spans = SpanIndex()
        self.token_ids = array("l")
        self.state = TurnState.EMPTY
        self.carry = Carry()
        self.turns: list[Turn] = []
        self.history: list = []  # what the context was built from (history.py): replayed to remove a part
        self.tokens_fed = 0  # every token ever passed to the model by this engine, rolled back or not
        self.chunk_index = ChunkIndex()  # BM25 over the documents' chunks, for ranking sources (lexical.py)
        self.ranking = Ranking.HYBRID
        self._open: tuple[object, Saved] | None = None
        self._logits = None
        self._feeding: FeedUnderWay | None = None  # a document feed under way (ask_while_feeding reads it)
        self._feeding_index: ChunkIndex | None = None  # BM25 over its planned chunks, built at its first question
        self.neutral_recall: NeutralRecall | None = None  # the neutral question's, while the documents stay (saved)

    # -- state ---------------------------------------------------------------------------------
    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def document_tokens(self) -> int:
        return sum(s.length for s in self.spans.documents())

    @property
    def document_sources(self) -> int:
        """Files with tokens in the context, a file being read included (its rows say "reading" until it ends)."""
        return len({s.where.source for s in self.spans.documents() if s.where is not None})

    def memory(self) -> dict[str, int]:
        return self.cache.memory()

    @property
    def is_new(self) -> bool:
        """Whether the context holds nothing yet, and no feed is under way."""
        return not self.length and self.state is TurnState.EMPTY and self._feeding is None

    @property
    def may_give_up_recall(self) -> bool:
        """Whether ``keep_recall(False, …)`` would change anything: a new context that keeps recall."""
        return self.is_new and self.keeps_recall

    @property
    def keeps_recall(self) -> bool:
        """Whether the cache keeps the tokens that left the window, so a question's recall can pick from them."""
        return self.cache.keeps_middle

    def keep_recall(self, keep: bool, budget: int) -> None:
        """Whether the cache keeps evicted tokens for recall from now on, and the tokens the context may hold.

        Without (``keep`` False) memory stays flat however long the documents, and every question is read without
        recall, its sources ranked by its words (cite's BM25): for documents longer than the memory recall needs.
        On the blind split the 1.5B answers 23 of 36 so, as retrieval with the same model, where with recall it
        answers 26: recall's follow-ups are what is lost (docs/answers.md). Only while the context holds nothing:
        a cache cannot give up the evicted tokens its earlier answers' undo points hold."""
        if not self.is_new:
            raise EngineError("Only a new context can change how it keeps evicted tokens: start a new context.")
        if keep != self.keeps_recall:
            self.use_cache(self.runtime.new_cache(keep_middle=keep))
        self.budget = budget

    def _followed(self, settings: GenerationSettings) -> GenerationSettings:
        """``settings`` as this context can follow them: recall off when its cache keeps no evicted tokens."""
        return settings if self.keeps_recall or not settings.recall else replace(settings, recall=False)

    def _save(self, logits=None) -> Saved:
        return Saved(self.cache.snapshot(), self.length, len(self.spans), self.state, self.carry, len(self.turns),
                     len(self.history), logits)

    def use_cache(self, cache) -> None:
        """Hold ``cache`` (a new one, or one read from a file) and its decoder (runtime.decoder_for: on CUDA, the
        recorded steps answers without recall replay)."""
        self.cache, self._decoder = cache, self.runtime.decoder_for(cache)

    def _restore(self, saved: Saved) -> None:
        self.cache.rollback(saved.snapshot)
        if self._decoder is not None:
            self._decoder.release()  # it holds the rings the rollback left behind
        del self.token_ids[saved.n_tokens:]
        self.spans.truncate(saved.n_spans)
        self.state, self.carry = saved.state, saved.carry
        del self.turns[saved.n_turns:]
        del self.history[saved.n_history:]
        self._logits = saved.logits
        self.stats.context_tokens = self.length
        self.stats.set_kv(self.memory())

    def _settle(self) -> None:
        """Roll back an operation abandoned mid-way (its generator never closed). Every operation calls this
        before it plans anything: the abandoned one's tokens and turn state must not shape the next one's."""
        if self._open is not None:
            self._restore(self._open[1])
            self._open = None

    @contextmanager
    def _operation(self, restore_to: Saved | None = None):
        """Run an operation as a transaction; an abandoned earlier one is rolled back first."""
        self._settle()
        saved = restore_to or self._save(self._logits)
        token = object()
        self._open = (token, saved)
        try:
            yield saved
        except BaseException as exc:
            if self._open is not None and self._open[0] is token:
                self._restore(saved)
            self.stats.idle()
            if is_out_of_memory(exc):
                raise ContextOutOfMemory(
                    "The device ran out of memory. The context was rolled back to its last consistent state; "
                    "try a shorter document, turn top-k recall off, or start a new context."
                ) from exc
            raise
        finally:
            if self._open is not None and self._open[0] is token:
                self._open = None
            trim_heap()  # what the operation freed goes back to the system (native_memory.py)
        self.stats.idle()

    def _answering(self):
        """Hold the shared model from the question to the answer's last token (model_gate.py says why)."""
        return self.runtime.gate.turn(self.cache, answer=True, stats=self.stats)

    # -- low level: one forward ----------------------------------------------------------------
    def _forward(self, ids: list[int], *, topk: int, cancel=None):
        logits = self.runtime.forward(ids, self.cache, topk=topk, stats=self.stats, decoder=self._decoder,
                                      cancel=cancel)
        self.token_ids.extend(ids)
        self.tokens_fed += len(ids)
        self.stats.context_tokens = self.length
        self.stats.set_kv(self.memory())
        return logits

    def _check_budget(self, planned: int, what: str) -> None:
        if self.length + planned > self.budget:
            left = max(0, self.budget - self.length)
            raise ContextFull(
                f"{what} needs {planned:,} tokens but only {left:,} of the {self.budget:,}-token context budget "
                "are left. Start a new context, or raise --context-budget."
            )

    # -- prefill -------------------------------------------------------------------------------
    def _opening(self) -> list[Piece]:
        """What must precede new user content: the system block, or "<s>[INST]" after an answer."""
        if self.state is TurnState.EMPTY:
            ids, carry = self.format.start(self.system_prompt)
            return [Piece(ids, SpanKind.SYSTEM, TurnState.IN_TURN, carry)]
        if self.state is TurnState.CLOSED:
            ids, carry = self.format.open_turn(self.carry)
            return [Piece(ids, SpanKind.FORMAT, TurnState.IN_TURN, carry)]
        return []

    def _prefill(self, pieces: list[Piece], cancel, *, topk: int, what: Feeding) -> Iterator[LiveStats]:
        """Feed ``pieces`` in forwards of ``prefill_chunk`` tokens, checking ``cancel`` before each.

        Pieces are packed: a forward may end one piece and start the next, so ten thousand small files
        cost as many forwards as one file of the same size, not one forward each.
        """
        total = sum(len(p.ids) for p in pieces)
        meter = RateMeter()
        self.stats.prefilling(what, total)
        step = self.runtime.prefill_chunk
        stream = [token for piece in pieces for token in piece.ids]
        ends = list(accumulate(len(p.ids) for p in pieces))
        start, finished = self.length, 0  # the context length before the pieces; pieces fully fed
        for lo in range(0, total, step):
            if cancel is not None and cancel.is_set():
                raise Stopped(what)
            ids = stream[lo : lo + step]
            try:
                self._logits = self._forward(ids, topk=topk, cancel=cancel)
            except StoppedMidForward:  # within one layer of Stop; the operation rolls the cache back
                raise Stopped(what) from None
            meter.add(len(ids))
            while finished < len(pieces) and ends[finished] <= lo + len(ids):
                self._record(pieces[finished], start + ends[finished] - len(pieces[finished].ids))
                finished += 1
            self.stats.done = meter.tokens
            if total >= MEASURED_PREFILL:
                self.stats.prefill_tps = meter.rate
            self.stats.eta_s = meter.eta(total - meter.tokens)
            with meter.paused():  # what the consumer does meanwhile (a question answered) is not the feed's time
                yield self.stats  # progress is the live figures themselves: one home, read by the panel and the chat
        for piece in pieces[finished:]:  # empty pieces at the end
            self._record(piece, self.length)
        if total >= MEASURED_PREFILL and meter.final_rate:  # a feed shorter than the live rate's minimum
            self.stats.prefill_tps = meter.final_rate

    def _record(self, piece: Piece, start: int) -> None:
        """A piece is in the cache: its span, and the turn state and carry after it."""
        where = piece.chunk.where if piece.chunk is not None else None
        self.spans.append(Span(start, start + len(piece.ids), piece.kind, where))
        self.state, self.carry = piece.state, piece.carry

    def plan_documents(self, chunks: Sequence[DocumentChunk]) -> DocumentPlan:
        """Token pieces for ``chunks`` appended now: the exact count the budget is checked with, and what is fed."""
        pieces = self._opening()
        carry = pieces[-1].carry if pieces else self.carry
        for chunk in chunks:
            ids, carry = self.format.document(chunk.text, carry)
            pieces.append(Piece(ids, SpanKind.DOCUMENT, TurnState.IN_TURN, carry, chunk))
        if not any(p.kind == SpanKind.DOCUMENT for p in pieces):
            pieces = []
        return DocumentPlan(tuple(pieces), self._version())

    def feed_documents(self, documents: Sequence[DocumentChunk] | DocumentPlan, cancel=None) -> Iterator[LiveStats]:
        """Append documents inside the open user turn (opening one after an answer). All or nothing.

        ``documents``: chunks, or their plan from ``plan_documents`` (fed as planned while the context has not
        changed since, so every token is encoded once).
        """
        self._settle()
        plan = documents if isinstance(documents, DocumentPlan) else None
        if plan is None or plan.version != self._version():
            plan = self.plan_documents(documents.chunks if plan is not None else documents)
        self._check_budget(plan.tokens, "These documents")
        with self._operation():
            self._feeding = FeedUnderWay(self.length, len(self.spans), plan.pieces)
            try:
                yield from self._prefill(list(plan.pieces), cancel, topk=0, what=Feeding.DOCUMENTS)
            finally:
                self._feeding = self._feeding_index = None
            if plan.chunks:
                self.history.append(DocumentsFed(tuple(plan.chunks)))

    def _version(self) -> tuple[int, int]:
        """Changes whenever the context does: a forward adds to tokens_fed, a rollback changes the length."""
        return self.length, self.tokens_fed

    # -- decode --------------------------------------------------------------------------------
    def _answer(self, turn: Turn, question: str, settings: GenerationSettings, cancel, started: float,
                prefill_tps: float, reader: AnswerReader | None = None) -> Generator[AnswerDelta, None, AnswerResult]:
        """Draw the answer to ``question`` from the state its prefill left (``turn.after_question``), or in the
        ``reader`` (its logits start it, without recall); keep it in the context and commit it with ``turn``, its end
        set here: the one commit ask and regenerate share."""
        if reader is not None:
            logits, feed = reader.logits, reader.feed
        else:
            logits, feed = turn.after_question.logits, lambda ids: self._forward(ids, topk=settings.answer_topk)
        # Drawn in the reader, the answer joins the context after its question, which is not in it yet.
        room = self.budget - self.length - (turn.question_tokens if reader else 0) - 2
        decoded = yield from self._decode(logits, feed, settings, min(settings.max_new_tokens, room), cancel, started)
        answer = self._keep(decoded, turn, question, settings.answer_topk, drawn_apart=reader is not None)
        self.stats.decode_tps, self.stats.done = decoded.decode_tps, len(answer)
        text = self.format.decode_answer(answer)
        self.turns.append(replace(turn, end=self.length))
        self.history.append(Exchange(question, tuple(answer)))
        self._keep_undo_points()
        return AnswerResult(
            text=text, tokens=len(answer), finish=decoded.finish,
            citations=self._answer_sources(turn.citations, question, text) if reader else turn.citations,
            ttft_s=decoded.ttft_s, prefill_tps=prefill_tps, decode_tps=decoded.decode_tps,
            question_tokens=turn.question_tokens, answer_ids=tuple(answer), quoted=reader is not None,
        )

    def _decode(self, logits, feed, settings: GenerationSettings, max_new: int, cancel,
                started: float) -> Generator[AnswerDelta, None, Decoded]:
        """Sample from ``logits`` until an end of turn, ``max_new`` tokens or a repeat, feeding each token back with
        ``feed`` (gpt-fast's decode_n_tokens); stream the text so far. ``started``: when the user asked."""
        if max_new < 1:
            raise ContextFull("The context budget is full: no room left for an answer. Start a new context.")
        answer: list[int] = []
        loop = LoopGuard()
        self.stats.decoding(max_new)
        token = next_token(logits, answer, settings)
        ttft = self.stats.ttft_s = time.perf_counter() - started
        meter = RateMeter()  # times the forwards that follow the first token
        while token not in self.format.stop_ids:
            answer.append(token)
            self.stats.done, self.stats.decode_tps = len(answer), meter.rate
            yield AnswerDelta(self.format.decode_answer(answer), len(answer), ttft)
            cut = loop.repeat_from(answer)
            if cut is not None or len(answer) >= max_new:
                finish = Finish.LENGTH if cut is None else Finish.REPETITION
                return Decoded(answer, finish, cut, ttft, meter.final_rate)
            if cancel is not None and cancel.is_set():
                raise Stopped("the answer")
            token = next_token(feed([token]), answer, settings)
            meter.add(1)
        return Decoded(answer, Finish.EOS, None, ttft, meter.final_rate)

    def _keep(self, decoded: Decoded, turn: Turn, question: str, topk: int, *, drawn_apart: bool) -> list[int]:
        """Put the answer in the context as the user is shown it, closed with </s>; the tokens kept.

        An answer that began to repeat itself is cut where the repeat began (back to the end of its last whole
        sentence), and the context goes back to ``turn.after_question`` and reads the kept answer again: it holds
        what the user is shown, no more. One ``drawn_apart`` (in the reader) is read after its question from the
        state before it (``turn.before``), as history replays them.
        """
        answer, fed = self._shown(decoded), decoded.fed
        if decoded.repeat_from is not None:
            fed = 0
            if not drawn_apart:
                self._restore(turn.after_question)
        if drawn_apart:
            self._restore(turn.before)
            for _ in self._prefill(self._exchange_pieces(question, answer), None, topk=0, what=Feeding.ANSWER):
                pass
        else:
            self._close_answer(answer, fed, topk)
        return answer

    def _shown(self, decoded: Decoded) -> list[int]:
        """The answer's tokens as the user is shown them: one that began to repeat itself is cut where the repeat
        began, back to the end of its last whole sentence."""
        if decoded.repeat_from is None:
            return decoded.tokens
        return decoded.tokens[: whole_sentences(decoded.tokens[: decoded.repeat_from], self.format.decode_answer)]

    def _close_answer(self, answer: list[int], fed: int, topk: int) -> None:
        """Feed what the decode did not (the answer's tokens from ``fed`` on) and the end of turn: the answer's span."""
        start = self.length - fed
        closing, carry = self.format.close_answer(answer, self.carry)
        unfed = [*answer[fed:], *closing]
        for lo in range(0, len(unfed), self.runtime.prefill_chunk):
            self._forward(unfed[lo : lo + self.runtime.prefill_chunk], topk=topk)
        self.spans.append(Span(start, self.length, SpanKind.ANSWER))
        self.state, self.carry = TurnState.CLOSED, carry

    def _answer_sources(self, citations: CitationReport, question: str, answer: str) -> CitationReport:
        """The sources with the page of the quoted chunk the answer's words come from first (citations.py)."""
        text = self.text
        self.chunk_index.refresh(self.spans, text.span_text)  # documents fed since the question was read
        return answer_sources(citations, question, answer, self.chunk_index, text)

    def _is_content(self, position: int) -> bool:
        return self.token_ids[position] in self.runtime.content_ids

    @property
    def text(self) -> ContextText:
        """The context's tokens read as text: passages, snippets, the question's words, quotes."""
        return ContextText(self.format.tokenizer, self.token_ids, self.spans)

    def ask(self, question: str, settings: GenerationSettings, cancel=None,
            started: float | None = None, switched_off: frozenset[str] = frozenset()) -> Iterator[object]:
        """Prefill the question (with recall if on), then stream the answer; the last item is an AnswerResult.

        ``started`` (a ``time.perf_counter`` time) is when the user asked: time to first token includes the wait.
        ``switched_off``: documents (a file, or an archive's prefix "repo.zip/": document_choice.covers) that stay in
        the context but are neither cited nor quoted; with quoting on, the answer is drawn in the reader from the
        others' quotes alone, or from the question alone when none has any.
        """
        self._settle()
        settings = self._followed(settings)
        started = time.perf_counter() if started is None else started
        pieces = self._question_pieces(question)
        planned = sum(len(p.ids) for p in pieces)
        self._check_budget(planned + 2, "This question")
        baseline = self._neutral_pieces(settings, planned)
        earlier = self.last_exchange
        asked = AnswerProgress(AnswerStage.QUESTION, 0, planned, 0.0, context_tokens=self.length)
        guessing = settings.guess and self._searchable()
        yield AnswerProgress(AnswerStage.GUESS, 0, GUESS_TOKENS, 0.0) if guessing else asked
        with self._answering(), self._operation() as before:
            guess = (yield from write_guess(self.runtime, self.format, question, earlier, self.cache, self.stats,
                                            cancel)) if guessing else ""
            self.stats.prefilling(Feeding.QUESTION, planned)  # the model is ours: its first forward is the question's
            yield asked
            citations, seconds = yield from self._read_question(question, pieces, baseline, settings.answer_topk,
                                                                cancel, before, self._quote_budget(settings),
                                                                switched_off, earlier, guess)
            prefill_tps = planned / max(seconds, 1e-9)
            quoted, reader = "", None
            if citations.quote_spans or (switched_off and settings.quote):
                quoted = self.text.quoted_turn(question, citations)
                self._restore(before)  # the question is read again after the answer, with it (_keep)
                reader = yield from self._read_in_reader(quoted, cancel, earlier, citations.quote_sources)
            after_question = self._save(self._logits) if reader is None else None
            turn = Turn(before, after_question, citations, planned, quoted=quoted, earlier=earlier if quoted else None)
            result = yield from self._answer(turn, question, settings, cancel, started, prefill_tps, reader)
            reader = None  # its cache is freed before the operation ends and trims the heap
        yield replace(result, guess=guess)  # after the commit: a consumer that stops here cannot roll the answer back

    @property
    def feeding(self) -> bool:
        """Whether a document feed is under way (paused between two chunks when anything else runs)."""
        return self._feeding is not None

    def ask_while_feeding(self, question: str, settings: GenerationSettings, cancel=None,
                          started: float | None = None, switched_off: frozenset[str] = frozenset(),
                          earlier: Exchange | None = None) -> Iterator[object]:
        """Answer ``question`` between two chunks of the feed under way, without waiting for its end; the last item
        is an AnswerResult. The context is not changed: the caller reads the exchange into it (``read_answered``)
        once the feed is over, where the question was asked.

        The quotes are the best chunks of the documents as they will be once the feed ends (feed_under_way.py),
        fed or not, ranked by the question's words alone (recall has not read them) and read in the reader.
        ``earlier``: the conversation's last exchange, which may itself be waiting to be read."""
        started = time.perf_counter() if started is None else started
        if self._feeding is None:
            raise EngineError("No document is being fed: ask the question in the context.")
        question_tokens = len(self.format.question(question, self.carry)[0])
        room = self.budget - self.length - self._feeding.left(self.length) - question_tokens - 2
        with self._answering(), self.stats.aside():
            guess = (yield from write_guess(self.runtime, self.format, question, earlier, self.cache, self.stats,
                                            cancel)) if settings.guess else ""
            view, index, report = self.sources_while_feeding(question, settings, switched_off, earlier, guess)
            quoted = view.quoted_turn(question, report)
            reader = yield from self._read_in_reader(quoted, cancel, earlier, report.quote_sources)
            decoded = yield from self._decode(reader.logits, reader.feed, settings,
                                              min(settings.max_new_tokens, room), cancel, started)
            reader = None  # its cache is freed now
            trim_heap()
        answer = self._shown(decoded)
        text = self.format.decode_answer(answer)
        self.stats.decode_tps = decoded.decode_tps
        citations = answer_sources(report, question, text, index, view)
        yield AnswerResult(text=text, tokens=len(answer), finish=decoded.finish, citations=citations,
                           ttft_s=decoded.ttft_s, prefill_tps=0.0, decode_tps=decoded.decode_tps,
                           question_tokens=question_tokens, answer_ids=tuple(answer), quoted=True,
                           while_feeding=Turn(None, None, report, question_tokens, quoted=quoted, earlier=earlier),
                           guess=guess)

    def sources_while_feeding(self, question: str, settings: GenerationSettings,
                              switched_off: frozenset[str] = frozenset(), earlier: Exchange | None = None,
                              guess: str = "") -> tuple[ContextText, ChunkIndex, CitationReport]:
        """What a question asked while a document is fed reads (``ask_while_feeding``): the context as it will be
        once the feed ends, BM25 over its chunks, and the sources ranked and quoted by the question's words (and
        those of the ``guess``, guess.py)."""
        feed = self._feeding
        if feed is None:
            raise EngineError("No document is being fed: ask the question in the context.")
        view = planned_text(self.text, feed)
        if self._feeding_index is None:  # the planned chunks do not change while they are fed
            index = ChunkIndex()
            index.refresh(view.spans, view.span_text)
            self._feeding_index = index  # kept once whole
        index = self._feeding_index
        report = cite(RecallTally(), view.spans, snippet=view.snippet, quote_budget=self._quote_budget(settings),
                      quotes=QUOTED_CHUNKS,
                      lexical=index.scores(question, earlier.question if earlier else "", guess),
                      lexical_hits=lambda start, end: view.question_words_in(start, end, question),
                      ranking=Ranking.LEXICAL,
                      may_cite=lambda where: not any(covers(off, where.source) for off in switched_off))
        return view, index, replace(report, recall_on=False)

    def read_answered(self, question: str, result: AnswerResult, cancel=None) -> Iterator[LiveStats]:
        """Read a question answered while documents were fed (``ask_while_feeding``), and its answer, into the
        context, after what was fed before it; as ``append_exchange``, and once its quotes are where they were
        planned (the feed ended as planned), it can be drawn again (``regenerate``) from them, as any quoted
        answer."""
        self._settle()
        pieces = self._exchange_pieces(question, result.answer_ids)
        self._check_budget(sum(len(p.ids) for p in pieces), "This question and its answer")
        with self._operation() as before:
            yield from self._prefill(pieces, cancel, topk=0, what=Feeding.CONVERSATION)
            self.history.append(Exchange(question, result.answer_ids))
            turn = result.while_feeding
            if turn is not None and self._quotes_in_place(turn.citations):
                asked = sum(len(p.ids) for p in pieces[:-1])
                self.turns.append(replace(turn, before=before, question_tokens=asked, end=self.length))
                self._keep_undo_points()

    def _quotes_in_place(self, citations: CitationReport) -> bool:
        """Whether every quote's tokens are in the context, in the chunk they were quoted from."""
        spans = [self.spans.at(lo) for lo, _ in citations.quote_spans]
        return all(span is not None and span.kind == SpanKind.DOCUMENT and span.where == where
                   for span, where in zip(spans, citations.quote_sources))

    @property
    def last_exchange(self) -> Exchange | None:
        """The conversation's last question and answer, if any: what a follow-up question refers to."""
        return next((entry for entry in reversed(self.history) if isinstance(entry, Exchange)), None)

    def _keep_undo_points(self) -> None:
        """Drop the states of turns no operation can go back to: all but the first turn's ``before`` (clearing the
        chat) and the last turn's (regenerate). Each state holds the window ring as it was then."""
        for index, turn in enumerate(self.turns[:-1]):
            if turn.after_question is not None or (index and turn.before is not None):
                self.turns[index] = replace(turn, before=turn.before if index == 0 else None, after_question=None)

    def _read_question(self, question: str, pieces: list[Piece], baseline: list[Piece], topk: int, cancel,
                       before: Saved, quote_budget: int, switched_off: frozenset[str] = frozenset(),
                       earlier: Exchange | None = None, guess: str = ""
                       ) -> Generator[LiveStats, None, tuple[CitationReport, float]]:
        """Feed the question with recall ``topk``; return its sources and the seconds the question's own prefill
        took. Sources: the passages the question's recall went to beyond what ``baseline`` (the neutral question,
        read first and undone back to ``before``) recalls here, fused with BM25 over the chunks for the question
        and, less, the ``earlier`` one and the ``guess`` (citations.py, lexical.py and guess.py say why), with
        ``quote_budget`` tokens of the best chunks to quote."""
        neutral = (yield from self._neutral_tally(baseline, topk, cancel, before)) if baseline and topk else None
        recalled = RecallTally()
        started = time.perf_counter()
        if topk:
            with self.runtime.observe_recall(recalled):
                yield from self._prefill(pieces, cancel, topk=topk, what=Feeding.QUESTION)
        else:
            yield from self._prefill(pieces, cancel, topk=0, what=Feeding.QUESTION)
        seconds = time.perf_counter() - started
        text = self.text
        self.chunk_index.refresh(self.spans, text.span_text)
        lexical = self.chunk_index.scores(question, earlier.question if earlier else "", guess)
        if not topk and not lexical:
            return CitationReport.recall_off(), seconds
        report = cite(recalled, self.spans, baseline=neutral, snippet=text.snippet, counts=self._is_content,
                      quote_budget=quote_budget, quotes=QUOTED_CHUNKS, lexical=lexical,
                      lexical_hits=lambda start, end: text.question_words_in(start, end, question),
                      ranking=self.ranking,
                      may_cite=lambda where: not any(covers(off, where.source) for off in switched_off))
        return (report if topk else replace(report, recall_on=False)), seconds

    def _neutral_tally(self, pieces: list[Piece], topk: int, cancel, before: Saved
                       ) -> Generator[LiveStats, None, RecallTally]:
        """The neutral question's recall tally: the one kept while the documents and ``topk`` are as when it was
        read (neutral_recall.py), else ``pieces`` read now and undone back to ``before``."""
        key = documents_key(self.token_ids, self.spans, topk)
        if self.neutral_recall is not None and self.neutral_recall.key == key:
            return self.neutral_recall.tally
        tally = RecallTally()
        with self.runtime.observe_recall(tally):
            yield from self._prefill(pieces, cancel, topk=topk, what=Feeding.QUESTION)
        self._restore(before)
        self.neutral_recall = NeutralRecall(key, tally)
        return tally

    def _searchable(self) -> bool:
        """Whether the context holds document chunks to search (a guess is written only then: guess.py)."""
        self.chunk_index.refresh(self.spans, self.text.span_text)
        return bool(self.chunk_index.chunks)

    def _quote_budget(self, settings: GenerationSettings) -> int:
        """How many tokens of the best chunks to quote in all: none unless asked."""
        return quote_budget(self.runtime.window) if settings.quote else 0

    def _read_in_reader(self, text: str, cancel, earlier: Exchange | None = None,
                        sources: tuple[Provenance, ...] = ()) -> Generator[AnswerProgress, None, "AnswerReader"]:
        """A context of its own holding the system prompt, the ``earlier`` exchange and ``text`` (AnswerReader),
        read without recall; how far it has read is yielded before the first chunk and after each (``sources``:
        the passages quoted in ``text``)."""
        reader = AnswerReader(self.runtime, self.cache, self.stats)
        ids = reader.opening(self.format, self.system_prompt, text, earlier)
        step = self.runtime.prefill_chunk
        meter = RateMeter()
        self.stats.prefilling(Feeding.QUOTES, len(ids))  # the activity box says so, not the question's last figures
        yield AnswerProgress(AnswerStage.QUOTES, 0, len(ids), 0.0, sources=sources)
        for lo in range(0, len(ids), step):
            if cancel is not None and cancel.is_set():
                raise Stopped(Feeding.QUESTION)
            try:
                reader.feed(ids[lo : lo + step], cancel)
            except StoppedMidForward:
                raise Stopped(Feeding.QUESTION) from None
            meter.add(len(ids[lo : lo + step]))
            self.stats.done, self.stats.eta_s = meter.tokens, meter.eta(len(ids) - meter.tokens)
            rate = meter.rate if meter.tokens < len(ids) else meter.final_rate  # 0 until measured: the last one stays
            if len(ids) >= MEASURED_PREFILL and rate > 0:
                self.stats.prefill_tps = rate
            yield AnswerProgress(AnswerStage.QUOTES, meter.tokens, len(ids), meter.elapsed, sources=sources,
                                 rate=meter.rate, eta_s=self.stats.eta_s)
        return reader

    def _question_pieces(self, question: str) -> list[Piece]:
        """The opening a turn needs, then the question and the answer's header."""
        opening = self._opening()
        carry = opening[-1].carry if opening else self.carry
        ids, carry = self.format.question(question, carry)
        return [*opening, Piece(ids, SpanKind.QUESTION, TurnState.IN_TURN, carry)]

    def _neutral_pieces(self, settings: GenerationSettings, question_tokens: int) -> list[Piece]:
        """The neutral question to read before this one, or none: when recall cannot pick anything (it is off,
        or no token will have left the window) or the budget has no room for it (the question's recall alone
        then ranks the sources)."""
        if not self._recalls(settings, question_tokens):
            return []
        pieces = self._question_pieces(NEUTRAL_QUESTION)
        return pieces if self.length + sum(len(p.ids) for p in pieces) <= self.budget else []

    def _recalls(self, settings: GenerationSettings, question_tokens: int) -> bool:
        """Whether recall can pick anything for the question: it is on, and tokens will have left the window."""
        middle_from = self.runtime.lm_config.n_starting + self.runtime.window
        return settings.answer_topk > 0 and self.length + question_tokens > middle_from

    @property
    def can_regenerate(self) -> bool:
        """Only the newest answer, and only while nothing was appended after it."""
        return bool(self.turns) and self.turns[-1].end == self.length and self.turns[-1].before is not None

    def regenerate(self, settings: GenerationSettings, cancel=None,
                   started: float | None = None) -> Iterator[object]:
        """Answer the last question again from the state right after its prefill (no re-encoding).

        Stopping a regeneration removes the whole turn, as stopping an answer does: the old answer's
        state cannot be restored once the context went back before it. ``started`` is as for ``ask``.
        """
        self._settle()
        if not self.can_regenerate:
            raise EngineError("Nothing to regenerate: the last answer is no longer the end of the context.")
        turn, question = self.turns[-1], self.history[-1].question
        settings = self._followed(settings)
        started = time.perf_counter() if started is None else started
        with self._answering(), self._operation(restore_to=turn.before):
            reader = None
            if turn.quoted:  # drawn in a reader of its own: read the quoted turn there again
                self._restore(turn.before)
                reader = yield from self._read_in_reader(turn.quoted, cancel, turn.earlier,
                                                         turn.citations.quote_sources)
            else:
                self._restore(turn.after_question)
            result = yield from self._answer(turn, question, settings, cancel, started, 0.0, reader)
            reader = None  # as in ask
        yield result

    def append_exchange(self, exchange: Exchange, cancel=None) -> Iterator[LiveStats]:
        """A question and the answer it got, fed as text (no decoding): a context built again from its history
        (replay.py) holds the conversation it had. All or nothing, like every operation."""
        self._settle()
        pieces = self._exchange_pieces(exchange.question, exchange.answer_ids)
        self._check_budget(sum(len(p.ids) for p in pieces), "This conversation")
        with self._operation():
            yield from self._prefill(pieces, cancel, topk=0, what=Feeding.CONVERSATION)
            self.history.append(exchange)

    def _exchange_pieces(self, question: str, answer_ids: Sequence[int]) -> list[Piece]:
        """A question and its answer as a turn fed whole (a context rebuilt, or an answer drawn from a quote)."""
        pieces = self._question_pieces(question)
        closing, closed = self.format.close_answer(list(answer_ids), pieces[-1].carry)
        return [*pieces, Piece([*answer_ids, *closing], SpanKind.ANSWER, TurnState.CLOSED, closed)]

    def _forget_point(self) -> tuple[bool, Saved | None]:
        """Whether the conversation can be dropped by a rollback, and to which state (None: nothing to drop).

        It can when the first turn's undo point precedes every question and no document came after it; a
        reopened context has no undo points of its own, and documents added between questions are kept.
        """
        asked = [i for i, s in enumerate(self.spans) if s.kind == SpanKind.QUESTION]
        if not asked:
            return True, None
        first = self.turns[0].before if self.turns else None
        if first is None or first.n_spans > asked[0]:
            return False, None
        if any(s.kind == SpanKind.DOCUMENT for s in self.spans[first.n_spans:]):
            return False, None
        return True, first

    @property
    def forgets_by_rollback(self) -> bool:
        """Clearing the chat is a rollback (instant); otherwise the documents are read again (replay.py)."""
        return self._forget_point()[0]

    def forget_conversation(self) -> bool:
        """Drop every question and answer, keeping the documents, when a rollback can (``forgets_by_rollback``).

        Returns False otherwise: the caller then rebuilds a context of the documents alone.
        """
        self._settle()
        possible, first = self._forget_point()
        if not possible:
            return False
        if first is not None:
            with self._operation():
                self._restore(first)
        return True

    def close(self) -> None:
        """Release the cache's memory (the session is gone)."""
        self.cache = self._decoder = None
        self.turns.clear()
        self.history.clear()
        self._logits = None
        self._open = None
        self.neutral_recall = None
