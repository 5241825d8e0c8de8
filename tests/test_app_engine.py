"""The per-session context engine without HTTP: append-only feeding, rollback, Stop, OOM, regenerate, sources."""

from __future__ import annotations

import gc
import os
import threading
from types import SimpleNamespace
import dataclasses
from dataclasses import dataclass

import pytest
import torch

from app.engine import context as context_module, native_memory
from app.engine.budget import Budget
from app.engine.chat_format import TurnState
from app.session.uploads import DocumentRow, RowStatus
from app.session.source_files import SourceFiles
from app.web import views
from app.cli import AppConfig
from app.engine.context import ContextEngine
from app.engine.context_records import (AnswerDelta, AnswerProgress, AnswerResult, AnswerStage, ContextFull,
                                        ContextOutOfMemory, EngineError, Stopped)
from app.engine.citations import CARRIED_TOKENS, NEUTRAL_QUESTION, lead_with_answer_source
from app.engine.generation import GenerationSettings
from app.engine.history import Exchange
from app.engine.layer_stop import decoder_layers
from app.engine.reader import AnswerReader
from app.engine.quoting import QUOTED_CHUNKS, quoted_question
from ingest.documents import without_page_markers
from app.engine.model_loading import ModelChoice, load_runtime
from ingest import Provenance
from app_fixtures import FILLER, model_dir

# The answer's own recall path; QUOTING (the app's default) quotes the top source and answers without recall.
GREEDY = GenerationSettings(temperature=0.0, max_new_tokens=24, recall=True, topk=5, quote=False, guess=False)
QUOTING = GenerationSettings(temperature=0.0, max_new_tokens=24, recall=True, topk=5, quote=True, guess=False)
# Sampling at temperature 2 rambles on instead of ending after one sentence: room to stop mid-answer.
RAMBLE = GenerationSettings(temperature=2.0, top_p=1.0, max_new_tokens=200, quote=False, guess=False)
SYSTEM = "You are a helpful assistant. Answer questions about the document."


@dataclass
class Chunk:
    text: str
    source: str
    page: int | None = None
    page_label: str | None = None
    line_start: int | None = None
    line_end: int | None = None

    @property
    def where(self) -> Provenance:
        return Provenance(self.source, self.page, self.page_label, self.line_start, self.line_end)


def pdf_like(pages: int = 8, secret_page: int = 5) -> list[Chunk]:
    """One chunk per page, several windows long in total; the pass key sits on one page."""
    chunks = []
    for page in range(1, pages + 1):
        body = " ".join([FILLER] * 5)
        if page == secret_page:
            body += " The pass key is 71432. Remember it. 71432 is the pass key."
        header = "### report.pdf\n" if page == 1 else ""
        chunks.append(Chunk(f"{header}--- page {page} ---\n{body}\n", "report.pdf", page=page))
    return chunks


def code_file() -> list[Chunk]:
    lines = [f"def function_{i}(x):\n    return x + {i}\n" for i in range(12)]
    return [Chunk("### src/funcs.py\n" + "".join(lines[:6]), "src/funcs.py", line_start=1, line_end=12),
            Chunk("".join(lines[6:]), "src/funcs.py", line_start=13, line_end=24)]


@pytest.fixture(scope="module")
def runtime():
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    directory = str(model_dir())
    # One thread: on a small shared machine, more threads only spin against each other.
    yield load_runtime(AppConfig(model=directory, prefill_chunk=64, cpu_threads=1, dtype="float32"),
                       ModelChoice(directory, "test"))
    torch.set_num_threads(threads)


def new_engine(runtime, budget: int = 1_000_000) -> ContextEngine:
    return ContextEngine(runtime, system_prompt=SYSTEM, budget=budget)


def run(operation):
    """Exhaust an engine operation; returns the AnswerResult or the last progress item."""
    last = None
    for last in operation:
        pass
    return last


def answer(engine, question, settings=GREEDY) -> AnswerResult:
    result = run(engine.ask(question, settings))
    assert isinstance(result, AnswerResult)
    return result


class StopAfter:
    """A cancel flag that sets itself after ``n`` progress items (only answer tokens with ``tokens=True``)."""

    def __init__(self, items: int, tokens: bool = False):
        self.remaining = items
        self.tokens = tokens
        self.event = threading.Event()

    def drive(self, operation):
        torch.manual_seed(1234)  # RAMBLE samples: make it the same ramble every run
        with pytest.raises(Stopped):
            for item in operation:
                if self.tokens and not isinstance(item, AnswerDelta):
                    continue
                self.remaining -= 1
                if self.remaining <= 0:
                    self.event.set()


def test_feeding_is_append_only(runtime):
    engine = new_engine(runtime)
    forwarded = runtime.tokens_forwarded
    run(engine.feed_documents(pdf_like()))
    after_docs = engine.length
    neutral = sum(len(p.ids) for p in engine._question_pieces(NEUTRAL_QUESTION))  # read and undone (citations)
    first = answer(engine, "What is the pass key?")
    run(engine.feed_documents(code_file()))
    neutral += sum(len(p.ids) for p in engine._question_pieces(NEUTRAL_QUESTION))
    second = answer(engine, "Which file defines function_3?")
    # Every token reached the model exactly once, in order: nothing was re-encoded.
    assert runtime.tokens_forwarded - forwarded == engine.length + neutral == engine.tokens_fed
    assert engine.cache.get_seq_length() == engine.length
    fmt = engine.format
    ids = list(engine.token_ids)
    bos = runtime.tokenizer.bos_token_id
    assert ids[0] == bos and ids.count(bos) == 2  # the system turn, then the turn after answer 1
    assert ids.count(fmt.end_of_turn) == 2 and ids[-1] == fmt.end_of_turn
    kinds = [s.kind for s in engine.spans]
    # The next turn's opening markers are held back and fed with the first document (chat_format: pending).
    assert kinds == ["system"] + ["document"] * 8 + ["question", "answer"] + ["document"] * 2 + \
        ["question", "answer"]
    assert engine.spans[8].end == after_docs
    assert first.tokens >= 1 and second.tokens >= 1


def test_answer_streams_and_reports_timings(runtime):
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like()))
    items = list(engine.ask("What is the pass key?", GREEDY))
    deltas = [i for i in items if isinstance(i, AnswerDelta)]
    result = items[-1]
    assert isinstance(result, AnswerResult)
    assert len(deltas) == result.tokens  # one streamed update per generated token
    assert deltas[-1].text == result.text
    assert result.ttft_s > 0 and result.decode_tps > 0
    assert result.finish in ("eos", "length")


def test_stop_mid_prefill_rolls_back_exactly(runtime):
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like()))
    answer(engine, "What is the pass key?")
    length, spans, state = engine.length, len(engine.spans), engine.state
    stopper = StopAfter(2)  # two chunks of 64 tokens in: mid-prefill
    stopper.drive(engine.feed_documents(code_file() * 3, stopper.event))
    assert engine.tokens_fed > length  # it did feed before stopping
    assert (engine.length, len(engine.spans), engine.state) == (length, spans, state)
    assert engine.cache.get_seq_length() == length
    _answers_on_as_if_never_stopped(runtime, engine)


def _answers_on_as_if_never_stopped(runtime, engine):
    """The next answer, and every token of the context after it, are those of a context never stopped (the same
    document and first question)."""
    fresh = new_engine(runtime)
    run(fresh.feed_documents(pdf_like()))
    answer(fresh, "What is the pass key?")
    question = "Say the pass key again."
    assert answer(engine, question).answer_ids == answer(fresh, question).answer_ids
    assert list(engine.token_ids) == list(fresh.token_ids)


def test_stop_mid_answer_removes_the_turn(runtime):
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like()))
    length = engine.length
    stopper = StopAfter(3, tokens=True)  # three answer tokens streamed
    stopper.drive(engine.ask("Write a long story about the sky.", RAMBLE, stopper.event))
    assert engine.length == length and engine.state is TurnState.IN_TURN and not engine.turns

    fresh = new_engine(runtime)
    run(fresh.feed_documents(pdf_like()))
    assert answer(engine, "What is the pass key?").text == answer(fresh, "What is the pass key?").text
    assert list(engine.token_ids) == list(fresh.token_ids)


class StopAtLayer:
    """Sets a cancel flag as decoder layer ``at`` ends a forward of several tokens once ``armed`` (Stop pressed
    then), and counts the layers that start after it. Its hooks come after the runtime's (layer_stop.py), so a layer
    the runtime stops is not counted."""

    def __init__(self, runtime, at: int = 1, armed: bool = True):
        self.event, self.armed, self.after = threading.Event(), armed, 0
        layers = decoder_layers(runtime.model)
        assert len(layers) > at + 1
        self.handles = [layer.register_forward_pre_hook(self._count) for layer in layers]
        self.handles.append(layers[at].register_forward_hook(self._set))

    def _count(self, module, args):
        self.after += self.event.is_set()

    def _set(self, module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        if self.armed and hidden.shape[-2] > 1:
            self.event.set()

    def remove(self):
        for handle in self.handles:
            handle.remove()


def test_stop_ends_a_prefill_forward_between_two_layers_and_rolls_back_exactly(runtime):
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like()))
    answer(engine, "What is the pass key?")
    kept = (engine.length, list(engine.token_ids), engine.cache.get_seq_length(), engine.state)
    calls, stop = runtime.forward_calls, StopAtLayer(runtime)
    try:
        with pytest.raises(Stopped):
            run(engine.feed_documents(code_file() * 3, stop.event))
    finally:
        stop.remove()
    assert stop.after == 0 and runtime.forward_calls == calls  # no layer ran after Stop; no forward finished
    assert (engine.length, list(engine.token_ids), engine.cache.get_seq_length(), engine.state) == kept
    _answers_on_as_if_never_stopped(runtime, engine)


def test_stop_while_the_quotes_are_read_ends_within_a_layer_and_leaves_the_context_as_it_was(runtime):
    engine, fresh = new_engine(runtime), new_engine(runtime)
    for each in (engine, fresh):
        run(each.feed_documents(pdf_like(pages=10)))
    kept = (engine.length, list(engine.token_ids), engine.cache.get_seq_length(), engine.state)
    stop = StopAtLayer(runtime, armed=False)
    calls = None
    try:
        with pytest.raises(Stopped):
            for event in engine.ask("What is the pass key?", QUOTING, stop.event):
                if isinstance(event, AnswerProgress) and event.stage is AnswerStage.QUOTES:
                    stop.armed, calls = True, runtime.forward_calls  # the reader's first forward comes next
    finally:
        stop.remove()
    assert calls is not None and stop.after == 0 and runtime.forward_calls == calls
    assert (engine.length, list(engine.token_ids), engine.cache.get_seq_length(), engine.state) == kept
    assert not engine.turns
    question = "What is the pass key?"
    assert answer(engine, question, QUOTING).answer_ids == answer(fresh, question, QUOTING).answer_ids


def test_out_of_memory_rolls_back_and_keeps_serving(runtime, monkeypatch):
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like()))
    answer(engine, "What is the pass key?")
    length = engine.length
    model_forward = runtime.model.forward
    failures = {"prefill": torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                "decode": RuntimeError("CUDA error: out of memory")}
    calls = {"n": 0, "fail": "prefill"}

    def failing_forward(*args, **kwargs):  # inside the model, after some layers may have updated the cache
        calls["n"] += 1
        n_ids = kwargs["input_ids"].shape[1]
        if calls["fail"] == "prefill" and calls["n"] == 3 or calls["fail"] == "decode" and n_ids == 1:
            raise failures[calls["fail"]]
        return model_forward(*args, **kwargs)

    monkeypatch.setattr(runtime.model, "forward", failing_forward)
    with pytest.raises(ContextOutOfMemory, match="rolled back"):
        run(engine.feed_documents(code_file() * 3))
    assert calls["n"] == 3
    assert engine.length == length and engine.cache.get_seq_length() == length

    calls["fail"] = "decode"
    with pytest.raises(ContextOutOfMemory):
        run(engine.ask("And now?", GenerationSettings(max_new_tokens=20)))
    assert engine.length == length and engine.cache.get_seq_length() == length
    monkeypatch.setattr(runtime.model, "forward", model_forward)

    fresh = new_engine(runtime)
    run(fresh.feed_documents(pdf_like()))
    answer(fresh, "What is the pass key?")
    assert answer(engine, "Once more?").text == answer(fresh, "Once more?").text
    assert list(engine.token_ids) == list(fresh.token_ids)


def test_other_errors_roll_back_too(runtime, monkeypatch):
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like()))
    length = engine.length

    def broken(ids, cache, **options):
        raise ValueError("boom")

    monkeypatch.setattr(runtime, "forward", broken)
    with pytest.raises(ValueError):
        run(engine.ask("Anything?", GREEDY))
    assert engine.length == length and engine.state is TurnState.IN_TURN


def test_abandoned_operation_is_rolled_back(runtime):
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like()))
    length = engine.length
    torch.manual_seed(1234)
    operation = engine.ask("Write a long story about the sky.", RAMBLE)
    first = next(item for item in operation if isinstance(item, AnswerDelta))  # a closed tab: never resumed after
    assert first.tokens == 1 and engine.length > length
    del operation
    gc.collect()
    assert engine.length == length and engine.cache.get_seq_length() == length


def test_budget_refuses_before_any_work(runtime):
    engine = new_engine(runtime, budget=600)
    forwarded = runtime.tokens_forwarded
    with pytest.raises(ContextFull, match="budget"):
        run(engine.feed_documents(pdf_like(pages=20)))
    assert runtime.tokens_forwarded == forwarded and engine.length == 0


def test_regenerate_reuses_the_question_prefill(runtime):
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like()))
    first = answer(engine, "What is the pass key?")
    length, fed = engine.length, engine.tokens_fed
    again = run(engine.regenerate(GREEDY))
    assert again.text == first.text and engine.length == length
    # only the answer (and what closes it) was decoded again, the question was not re-encoded
    answer_span = engine.length - engine.turns[-1].after_question.n_tokens
    assert engine.tokens_fed - fed == answer_span and first.tokens < answer_span <= first.tokens + 3
    stopper = StopAfter(2, tokens=True)
    stopper.drive(engine.regenerate(RAMBLE, stopper.event))
    assert not engine.turns and engine.state is TurnState.IN_TURN
    with pytest.raises(EngineError):
        run(engine.regenerate(GREEDY))


def scripted(monkeypatch, tokens: list[int]) -> None:
    """The engine's sampler says ``tokens``, one per call, whatever the logits: an answer shaped at will."""
    import app.engine.context as context

    script = iter(tokens)
    monkeypatch.setattr(context, "next_token", lambda logits, answer, settings: next(script))


def test_an_answer_that_repeats_itself_is_cut_and_the_context_holds_what_is_shown(runtime, monkeypatch):
    """The repeat is cut off the answer, and out of the context: the context is then the one an answer that ended
    where the repeat began leaves (same tokens, same next-token logits), so a regeneration starts from there too."""
    probe = new_engine(runtime)
    sentence = probe.format.tokenizer.encode(" The pass key is 71432.", add_special_tokens=False)
    assert len(sentence) > 16 and len(set(sentence)) > 8  # longer than LoopGuard's n-gram
    end, settings = probe.format.end_of_turn, dataclasses.replace(GREEDY, max_new_tokens=4 * len(sentence))
    engines, results = [new_engine(runtime), new_engine(runtime)], []
    for engine, said in zip(engines, [sentence * 3, [*sentence, end]]):
        run(engine.feed_documents(pdf_like()))
        scripted(monkeypatch, said)
        streamed = [item.tokens for item in engine.ask("What is the pass key?", settings)
                    if isinstance(item, AnswerDelta)]
        results.append((engine.turns[-1], engine.history[-1], streamed))
    (cut, cut_history, streamed), (ended, ended_history, _) = results
    repeated, plain = engines
    assert max(streamed) == len(sentence) + 16  # the repeat was streamed until it was sure
    assert cut_history.answer_ids == ended_history.answer_ids == tuple(sentence)
    assert repeated.token_ids == plain.token_ids and repeated.length == plain.length == cut.end == ended.end
    assert [(s.start, s.end, s.kind) for s in repeated.spans] == [(s.start, s.end, s.kind) for s in plain.spans]
    assert repeated.state is plain.state is TurnState.CLOSED and repeated.stats.done == len(sentence)
    scripted(monkeypatch, sentence * 3)  # drawn again, from the state the question left: cut the same way
    again = run(repeated.regenerate(settings))
    assert again.finish == "repetition" and again.answer_ids == tuple(sentence)
    assert repeated.token_ids == plain.token_ids and len(repeated.turns) == 1
    monkeypatch.undo()
    follow = [answer(engine, "Who wrote page 3?") for engine in engines]
    assert follow[0].answer_ids == follow[1].answer_ids
    logits = [runtime.forward([5], engine.cache, topk=5) for engine in engines]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)


def test_an_answer_that_repeats_mid_sentence_is_cut_back_to_its_last_whole_sentence(runtime, monkeypatch):
    """"The author is Thomas Leonard. He wrote the spec and the key … and he wrote the spec …": the repeat begins
    mid-sentence, and the answer kept (and read into the context) is the first sentence alone."""
    probe = new_engine(runtime)
    tokenizer, end = probe.format.tokenizer, probe.format.end_of_turn
    whole = tokenizer.encode(" The author is Thomas Leonard.", add_special_tokens=False)
    unended = tokenizer.encode(" He wrote the spec and the pass key is 71432 and then he", add_special_tokens=False)
    assert len(unended) > 16  # longer than LoopGuard's n-gram
    settings = dataclasses.replace(GREEDY, max_new_tokens=4 * (len(whole) + len(unended)))
    engines = [new_engine(runtime), new_engine(runtime)]
    for engine, said in zip(engines, [[*whole, *unended, *unended, *unended], [*whole, end]]):
        run(engine.feed_documents(pdf_like()))
        scripted(monkeypatch, said)
        answer(engine, "Who wrote it?", settings)
    repeated, plain = engines
    assert repeated.history[-1].answer_ids == plain.history[-1].answer_ids == tuple(whole)
    assert repeated.token_ids == plain.token_ids and repeated.stats.done == len(whole)
    logits = [runtime.forward([5], engine.cache, topk=5) for engine in engines]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)


def test_forget_conversation_keeps_documents(runtime):
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like()))
    docs_only = engine.length
    answer(engine, "What is the pass key?")
    assert engine.forget_conversation()
    assert engine.length == docs_only and not engine.turns
    run(engine.feed_documents(code_file()))
    answer(engine, "Which file?")
    run(engine.feed_documents(code_file()))
    assert not engine.forget_conversation()  # a document after a question: the caller must rebuild


def test_sources_come_from_recalled_document_tokens(runtime):
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like(pages=10)))
    result = answer(engine, "What is the pass key?")
    report = result.citations
    assert report.recalled and report.citations
    assert 0 < report.document_share <= 1
    assert all(c.where.source == "report.pdf" and 1 <= c.where.page <= 10 for c in report.citations)
    assert sum(c.share for c in report.citations) <= 1 + 1e-9
    assert [c.share for c in report.citations] == sorted((c.share for c in report.citations), reverse=True)

    # Recall off: the passages are ranked by their words alone (BM25, lexical.py), and the report says so.
    no_recall = answer(engine, "What is the pass key again?", GenerationSettings(max_new_tokens=8, recall=False))
    report = no_recall.citations
    assert not report.recalled and not report.recall_on and not report.attention_ranking
    assert [c.where for c in report.citations] == list(report.lexical_ranking[: len(report.citations)])


def test_the_neutral_question_is_read_and_undone_without_a_trace(runtime, monkeypatch):
    """Sources are ranked against a neutral question read first (citations.py), once for the documents
    (neutral_recall.py); the answer, the context and the next answer are those of an engine that never read it."""
    def ask_twice(engine):
        run(engine.feed_documents(pdf_like(pages=10)))
        fed = engine.tokens_fed
        neutral = sum(len(p.ids) for p in engine._question_pieces(NEUTRAL_QUESTION))
        first = answer(engine, "What is the pass key?")
        then = answer(engine, "Say it again.")
        return first, then, engine.tokens_fed - fed, neutral

    never = new_engine(runtime)
    monkeypatch.setattr(never, "_recalls", lambda *args: False)
    expected, expected_then, fed_without, _ = ask_twice(never)
    engine = new_engine(runtime)
    first, then, fed, neutral = ask_twice(engine)
    assert (first.text, then.text) == (expected.text, expected_then.text)
    assert list(engine.token_ids) == list(never.token_ids) and len(engine.spans) == len(never.spans)
    assert neutral > 0 and fed == fed_without + neutral  # read once, before the first question with recall
    assert first.citations.citations and first.citations.citations != expected.citations.citations


def test_the_neutral_question_is_read_again_once_the_documents_or_topk_change(runtime):
    """Its recall is kept while the documents are as they were: the same question asked again at the same point
    gets the sources a fresh read gives; more documents, or another top-k, and it is read again."""
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like(pages=10)))

    def asked(question, settings=GREEDY):
        """Whether the neutral question was read (its tokens read beyond what the answer left in the context)."""
        neutral = sum(len(p.ids) for p in engine._question_pieces(NEUTRAL_QUESTION))
        fed, length = engine.tokens_fed, engine.length
        result = answer(engine, question, settings)
        read = (engine.tokens_fed - fed) - (engine.length - length)
        assert read in (0, neutral)
        return result, read == neutral

    first, read = asked("What is the pass key?")
    assert read
    engine.forget_conversation()  # back to the same point: the kept tally, the same sources as the fresh read
    again, read = asked("What is the pass key?")
    assert not read and again.citations == first.citations and again.text == first.text
    fewer = dataclasses.replace(GREEDY, topk=3)
    assert asked("Say it again.", fewer)[1]  # another top-k recalls other tokens
    assert not asked("And once more.", fewer)[1]
    run(engine.feed_documents(code_file()))
    assert asked("Which file defines function_3?", fewer)[1]  # the documents changed


def test_an_answer_drawn_again_keeps_the_sources_its_question_was_read_with(runtime):
    """Regenerate takes the Settings panel as it is now; the sources belong to the question's reading."""
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like(pages=10)))
    off = answer(engine, "What is the pass key?", GenerationSettings(max_new_tokens=8, recall=False))
    assert not off.citations.recall_on and off.citations.citations and not off.citations.attention_ranking
    again = run(engine.regenerate(GREEDY))
    assert again.citations == off.citations  # the question was read without recall: ranked by its words alone
    run(engine.regenerate(GREEDY))
    engine.forget_conversation()
    on = answer(engine, "What is the pass key?")
    assert on.citations.recall_on and on.citations.citations
    assert run(engine.regenerate(GenerationSettings(max_new_tokens=8, recall=False))).citations == on.citations


def test_a_question_that_fits_the_budget_is_answered_when_the_neutral_one_would_not(runtime):
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like(pages=10)))
    question = sum(len(p.ids) for p in engine._question_pieces("Key?"))
    neutral = sum(len(p.ids) for p in engine._question_pieces(NEUTRAL_QUESTION))
    assert neutral > question + 6
    engine.budget = engine.length + question + 2 + 4  # room for the question and a 4-token answer only
    length, fed = engine.length, engine.tokens_fed
    result = answer(engine, "Key?")
    assert result.tokens >= 1 and engine.tokens_fed - fed == engine.length - length  # no neutral read
    assert result.citations.recall_on  # ranked by the question's recall alone


def test_an_operation_abandoned_without_closing_does_not_shape_the_next(runtime):
    """A generator dropped mid-question (not closed) is rolled back before the next operation plans its tokens:
    after a closed turn, the next question still opens a turn of its own."""
    def context():
        engine = new_engine(runtime)
        run(engine.feed_documents(pdf_like(pages=10)))
        answer(engine, "What is the pass key?")
        return engine

    abandoned, never = context(), context()
    pending = abandoned.ask("What colour is the grass?", GREEDY)
    next(pending)  # the first progress item, mid-read; the generator is kept alive, not closed
    answer(abandoned, "Say it again.")
    answer(never, "Say it again.")
    assert list(abandoned.token_ids) == list(never.token_ids)
    pending.close()


def test_context_inside_the_window_has_nothing_to_recall(runtime):
    engine = new_engine(runtime)
    run(engine.feed_documents([Chunk("### a.txt\nShort.\n", "a.txt", line_start=1, line_end=1)]))
    result = answer(engine, "What?")
    assert engine.length < runtime.window
    assert not result.citations.recalled


def test_a_plan_is_the_count_the_feed_adds_and_a_stale_plan_is_made_again(runtime):
    engine = new_engine(runtime)
    plan = engine.plan_documents(pdf_like())
    by_source = plan.tokens_by_source()
    assert by_source[None] > 0 and by_source["report.pdf"] == plan.tokens - by_source[None]
    run(engine.feed_documents(plan))
    assert engine.length == plan.tokens  # the budget was checked with exactly what the context now holds
    assert engine.document_tokens == by_source["report.pdf"]

    stale = engine.plan_documents(code_file())
    answer(engine, "What is the pass key?")  # the turn closes: the stale plan lacks the new turn's opening
    fresh = engine.plan_documents(code_file())
    stale_ids, fresh_ids = ([t for p in plan_.pieces for t in p.ids] for plan_ in (stale, fresh))
    assert stale_ids != fresh_ids and stale.version != fresh.version
    before = engine.length
    run(engine.feed_documents(stale))
    assert list(engine.token_ids[before:]) == fresh_ids
    assert [s.where for s in engine.spans.documents()][-2:] == [c.where for c in code_file()]


def test_answers_without_recall_replay_recorded_steps_and_say_the_same(runtime):
    """On CUDA an engine decodes answers without recall through a GraphedDecoder (runtime.decoder_for); here a CPU
    stand-in for CUDA graphs records and replays. The answers, token for token, and the context are those of an
    engine that runs the model at every step, through a second question, a regeneration and an answer with recall."""
    from graph_replay import ReplayedOps

    graphed_runtime = dataclasses.replace(runtime, graph_recorder=ReplayedOps)
    engines = [new_engine(runtime), new_engine(graphed_runtime)]
    no_recall = dataclasses.replace(GREEDY, recall=False)
    results = []
    for engine in engines:
        run(engine.feed_documents(pdf_like()))
        asked = [answer(engine, "What is the pass key?", no_recall), answer(engine, "Who wrote page 3?", no_recall)]
        asked.append(run(engine.regenerate(no_recall)))
        asked.append(answer(engine, "What is on page 7?"))  # recall on: the model runs every step
        results.append(([(r.answer_ids, r.finish) for r in asked], list(engine.token_ids)))
    plain, graphed = engines
    assert plain._decoder is None and graphed._decoder is not None
    assert results[1] == results[0] and all(len(ids) > 4 for ids, _ in results[1][0][:3])
    for kept, replayed in zip(plain.cache.layers, graphed.cache.layers):  # what recall reads: the same rows
        assert (kept.middle is None) == (replayed.middle is None)
        if kept.middle is not None:
            assert all(torch.equal(a, b) for a, b in zip(kept.middle.view(), replayed.middle.view()))
    # Recorded again after each question's snapshot: the first and second answers and the regeneration.
    assert graphed._decoder.recordings == 3 and graphed._decoder.cache is graphed.cache
    stopper = StopAfter(3, tokens=True)  # rolled back mid-answer: the decoder lets go of the rings it recorded
    stopper.drive(graphed.ask("Write a long story about the sky.", dataclasses.replace(RAMBLE, recall=False),
                              stopper.event))
    assert graphed._decoder.recordings == 4 and graphed._decoder._recorded_with is None
    graphed.close()
    assert graphed._decoder is None


def test_quoted_answers_replay_recorded_steps_and_say_the_same(runtime):
    """A quoted answer is read in a short context of its own (reader.py), whose window never fills: where steps are
    recorded its steps keep fixed shapes (the whole ring, masked: decode_step.py), so one recording stands for the
    answer's steps. The same answers, token for token, as an engine that runs the model at every step."""
    from graph_replay import ReplayedOps

    graphed_runtime, decoders = dataclasses.replace(runtime, graph_recorder=ReplayedOps), []
    make = graphed_runtime.decoder_for
    graphed_runtime.decoder_for = lambda cache: decoders.append(make(cache)) or decoders[-1]
    engines, results = [new_engine(runtime), new_engine(graphed_runtime)], []
    for engine in engines:
        run(engine.feed_documents(pdf_like()))
        asked = [answer(engine, "What is the pass key?", QUOTING), answer(engine, "And who wrote page 3?", QUOTING)]
        assert all(result.quoted and result.tokens > 4 for result in asked)
        results.append([result.answer_ids for result in asked])
    assert results[1] == results[0]
    readers = decoders[1:]  # the first is the engine's own
    assert len(readers) == 2 and all(decoder.recordings == 1 for decoder in readers)
    assert all(layer.fixed_window for layer in readers[0].cache.layers)
    assert not any(layer.fixed_window for layer in engines[0].cache.layers)  # without recordings: as before


# -- quoting the top source (quoting.py) ---------------------------------------------------------------
def test_a_quoted_answer_comes_from_the_quote_and_leaves_only_its_question_and_answer(runtime):
    question = "What is the pass key?"
    engine, alone, replayed = new_engine(runtime), new_engine(runtime), new_engine(runtime)
    for each in (engine, replayed):
        run(each.feed_documents(pdf_like(pages=10)))
    before, forwarded = engine.length, runtime.tokens_forwarded
    read = {text: sum(len(p.ids) for p in engine._question_pieces(text)) for text in (question, NEUTRAL_QUESTION)}
    result = answer(engine, question, QUOTING)
    forwarded = runtime.tokens_forwarded - forwarded  # the three engines share the model
    assert result.quoted and result.tokens >= 1
    _check_the_quotes_are_the_best_chunks(runtime, engine, result)
    text = _check_the_user_turn_quotes_them(runtime, engine, result, question, before)
    # The answer is the one that user turn gets in a context holding nothing else (the reader: no documents, no
    # earlier answers to copy), read and answered without recall...
    plain = GenerationSettings(temperature=0.0, max_new_tokens=24, recall=False, quote=False)
    assert answer(alone, text, plain).answer_ids == result.answer_ids
    reader = len(AnswerReader.opening(engine.format, SYSTEM, text))
    assert reader == alone.spans[-1].start  # all that precedes the answer there
    _check_only_the_question_and_answer_stay(engine, replayed, result, question)
    # The documents were never read again: the neutral question, the question, the reader (system prompt, quote
    # and question), the sampled tokens fed back there (all but the last), then the question and the answer.
    sampled_fed = result.tokens - (result.finish != "eos")
    assert forwarded == read[NEUTRAL_QUESTION] + read[question] + reader + sampled_fed + engine.length - before


def test_before_its_first_token_an_answer_says_what_it_reads_and_how_far(runtime):
    """First the question, read into the context; then the passages quoted for the answer with the question, in the
    reader, chunk by chunk up to its whole opening (prefill_chunk is 64 here). Drawn again, the answer reads the
    same passages again."""
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like(pages=10)))
    length = engine.length
    items = list(engine.ask("What is the pass key?", QUOTING))
    result = items[-1]
    assert isinstance(result, AnswerResult) and result.quoted
    first_token = next(i for i, item in enumerate(items) if isinstance(item, AnswerDelta))
    progress = [(i, item) for i, item in enumerate(items) if isinstance(item, AnswerProgress)]
    assert all(i < first_token for i, _ in progress)
    # the question as asked, and again once the model is its own (the activity box says it is read then)
    asked, read, quotes = progress[0][1], progress[1][1], [item for _, item in progress[2:]]
    assert asked == read == AnswerProgress(AnswerStage.QUESTION, 0, result.question_tokens, 0.0, context_tokens=length)
    reader = len(AnswerReader.opening(engine.format, SYSTEM, engine.turns[-1].quoted))
    assert reader > 128  # several chunks
    assert [q.stage for q in quotes] == [AnswerStage.QUOTES] * len(quotes)
    assert [q.done for q in quotes] == [0, *range(64, reader, 64), reader] and {q.total for q in quotes} == {reader}
    assert all(q.sources == result.citations.quote_sources for q in quotes) and result.citations.quote_sources
    assert quotes[0].seconds == 0 < quotes[1].seconds <= quotes[-1].seconds
    again = [item for item in engine.regenerate(GREEDY) if isinstance(item, AnswerProgress)]
    assert [(q.stage, q.done, q.total, q.sources) for q in again] == [(q.stage, q.done, q.total, q.sources)
                                                                       for q in quotes]


def _check_the_quotes_are_the_best_chunks(runtime, engine, result):
    """The quotes: the best chunks, QUOTED_CHUNKS at most, in all at most the budget, below the window; each inside
    its chunk (and the chunk's last word, fed with the next), the first in the first source's page."""
    quoted, budget = result.citations, engine._quote_budget(QUOTING)
    assert 1 <= len(quoted.quote_spans) <= QUOTED_CHUNKS and budget < runtime.window
    assert 0 < sum(hi - lo for lo, hi in quoted.quote_spans) <= budget
    for (lo, hi), where in zip(quoted.quote_spans, quoted.quote_sources):
        chunk = engine.spans.at(lo)
        assert chunk.where == where and chunk.start <= lo < hi <= chunk.end + CARRIED_TOKENS
    assert quoted.quote_sources[0] == quoted.citations[0].where
    # The passages quoted are the first cited, in the order of their best chunk.
    pages = list(dict.fromkeys(w.page_only() for w in quoted.quote_sources))
    assert [c.where for c in quoted.citations[:len(pages)]] == pages == pages[:quoted.quoted_passages]


def _check_the_user_turn_quotes_them(runtime, engine, result, question, before) -> str:
    """The quoted user turn: the quotes' text without page markers, then the question. Returns it."""
    quoted = result.citations
    text = engine.turns[-1].quoted
    assert text == quoted_question([(where.label(), without_page_markers(
        runtime.tokenizer.decode(engine.token_ids[a:b], skip_special_tokens=True)))
        for (a, b), where in zip(quoted.quote_spans, quoted.quote_sources)], question)
    assert "--- page" not in text and "--- page" in runtime.tokenizer.decode(engine.token_ids[:before])
    return text


def _check_only_the_question_and_answer_stay(engine, replayed, result, question):
    """...and the context holds the question and the answer alone, as a context rebuilt from its history does."""
    run(replayed.append_exchange(Exchange(question, result.answer_ids)))
    assert list(engine.token_ids) == list(replayed.token_ids)
    assert torch.equal(engine._logits, replayed._logits)
    assert [s.kind for s in engine.spans][-2:] == ["question", "answer"] and engine.history[-1].question == question


def test_a_quoted_answer_drawn_again_reads_its_quote_again_and_stop_leaves_the_context_as_it_was(runtime):
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like(pages=10)))
    before = list(engine.token_ids)
    first = answer(engine, "What is the pass key?", QUOTING)
    after = list(engine.token_ids)
    again = run(engine.regenerate(GREEDY))  # the turn's own way: quoted, whatever the settings say now
    assert again.quoted and again.answer_ids == first.answer_ids and list(engine.token_ids) == after
    assert again.question_tokens == first.question_tokens  # the question's, not the quote's too
    stopper = StopAfter(2, tokens=True)
    stopper.drive(engine.regenerate(RAMBLE, stopper.event))
    assert not engine.turns and list(engine.token_ids) == before
    stopper = StopAfter(2, tokens=True)
    stopper.drive(engine.ask("What is the pass key?", dataclasses.replace(RAMBLE, quote=True), stopper.event))
    assert list(engine.token_ids) == before
    # The snapshots the quote left behind are not used again: the same question gets the same answer.
    assert answer(engine, "What is the pass key?", QUOTING).answer_ids == first.answer_ids
    assert list(engine.token_ids) == after


def test_no_quote_without_a_source_and_a_quote_needs_no_room_in_the_context(runtime):
    short = new_engine(runtime)
    run(short.feed_documents([Chunk("### a.txt\nShort.\n", "a.txt", line_start=1, line_end=1)]))
    assert not answer(short, "What?", QUOTING).quoted  # in the window, and no word to match: nothing is cited
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like(pages=10)))
    question = sum(len(p.ids) for p in engine._question_pieces("Key?"))
    neutral = sum(len(p.ids) for p in engine._question_pieces(NEUTRAL_QUESTION))
    engine.budget = engine.length + max(question, neutral) + 2 + 4  # room for the question and a short answer only
    result = answer(engine, "Key?", QUOTING)
    assert result.quoted and result.citations.citations and result.tokens >= 1  # the quote is read elsewhere
    assert engine.length <= engine.budget




def test_the_heap_is_trimmed_after_each_operation_once_the_answer_reader_is_freed(runtime, monkeypatch):
    """A quoted answer's reader holds a cache of its own; trimming the heap while it is still alive would keep its
    pages, and a long session grew ~30 MB a question that way (native_memory.py)."""
    readers_alive_at_trim = []

    def trim():
        gc.collect()
        readers_alive_at_trim.append(sum(isinstance(o, AnswerReader) for o in gc.get_objects()))

    monkeypatch.setattr(context_module, "trim_heap", trim)
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like(pages=10)))
    assert readers_alive_at_trim == [0]  # the documents' operation
    result = answer(engine, "What is the pass key?", QUOTING)
    assert result.quoted
    assert len(readers_alive_at_trim) == 2 and readers_alive_at_trim[-1] == 0
    run(engine.regenerate(QUOTING))
    assert len(readers_alive_at_trim) == 3 and readers_alive_at_trim[-1] == 0


def test_the_kernel_caches_are_capped_unless_the_user_chose_a_capacity(monkeypatch):
    oneDNN, ideep = native_memory.CAPACITY_VARIABLES
    monkeypatch.delenv(oneDNN, raising=False)
    monkeypatch.setenv(ideep, "7")
    native_memory.bound_kernel_caches()
    assert os.environ[oneDNN] == str(native_memory.KERNEL_CACHE_CAPACITY) and os.environ[ideep] == "7"


def test_a_snippet_leaves_out_the_page_markers_the_model_reads(runtime):
    """A citation's label names its page; the marker the model reads ('--- page 8 (3) ---') is not shown."""
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like(pages=3)))
    documents = [span for span in engine.spans if span.where is not None]
    assert len(documents) == 3
    for span in documents[1:]:  # each begins at its page's marker (the first one at the file's header)
        assert "--- page" in runtime.tokenizer.decode(engine.token_ids[span.start:span.end])
        snippet = engine.text.snippet(span.start + 2, span)
        assert "--- page" not in snippet and FILLER.split()[0] in snippet
        marker = runtime.tokenizer.decode(engine.token_ids[span.start:span.start + 20]).split("---")[1]
        for position in range(span.start, span.start + 40):  # windows that begin or end inside the marker too
            snippet = engine.text.snippet(position, span)
            assert "---" not in snippet and marker.strip() not in snippet, (position, snippet)


def test_a_snippet_at_a_pages_end_shows_its_last_word_which_was_fed_with_the_next_page(runtime):
    """A piece's last word is fed with the next piece (chat_format.py), so a snippet cut at its span's end showed
    "…The pass key is" without the key; the next page's marker and words are still left out."""
    engine = new_engine(runtime)
    pages = pdf_like(pages=3, secret_page=2)
    run(engine.feed_documents(pages))
    documents = [span for span in engine.spans if span.where is not None]
    for span, page in zip(documents[:-1], pages):
        assert page.text.split()[-1] not in runtime.tokenizer.decode(engine.token_ids[span.end - 2:span.end])
        for position in range(span.end - 8, span.end):
            snippet = engine.text.snippet(position, span)
            assert snippet.split()[-1] == page.text.split()[-1] and "---" not in snippet, (position, snippet)


def test_the_documents_counted_are_those_with_tokens_in_the_context_while_they_are_read(runtime):
    """The context line said "5,049 from 0 documents" while the files were read (issue "What a user sees")."""
    engine = new_engine(runtime)
    feeding = engine.feed_documents([*pdf_like(pages=2), *code_file()])
    for _ in feeding:  # until the first page is in, the feed not over
        if engine.document_tokens:
            break
    assert engine.document_sources == 1  # report.pdf's first page; src/funcs.py is still to come
    reading = [DocumentRow(name, RowStatus.READING) for name in ("report.pdf", "src/funcs.py")]
    shown = SimpleNamespace(engine=engine, chat=[], documents=reading, context_tokens=engine.length,
                            stats=engine.stats, pending=[], sources=SourceFiles(), budget_tokens=1_000_000,
                            recall_kept=True)
    summary = views.session_view(shown, Budget(tokens=1_000_000, why="test", middle_bytes_per_token=1))[2]
    assert f"{engine.document_tokens:,} from 1 document<" in summary
    run(feeding)
    assert engine.document_sources == 2  # report.pdf and src/funcs.py


def test_a_document_switched_off_is_neither_cited_nor_quoted_and_with_all_off_the_question_is_read_alone(runtime):
    """Issue "What a user sees", item 11: switching a document off and on, nothing read again."""
    engine = new_engine(runtime)
    run(engine.feed_documents([*pdf_like(pages=10), *code_file()]))
    length = engine.length
    both = answer(engine, "What is the pass key? What does function_7 return?", QUOTING)
    sources = {c.where.source for c in both.citations.citations}
    assert sources == {"report.pdf", "src/funcs.py"}
    code_only = run(engine.ask("What is the pass key? What does function_7 return?", QUOTING,
                               switched_off=frozenset({"report.pdf"})))
    assert code_only.citations.citations and code_only.quoted
    assert {c.where.source for c in code_only.citations.citations} == {"src/funcs.py"}
    assert {w.source for w in code_only.citations.quote_sources} == {"src/funcs.py"}
    assert "report.pdf" not in engine.turns[-1].quoted and "src/funcs.py" in engine.turns[-1].quoted
    # Every document off: no sources, and the answer is drawn from the question alone, in a reader of its own.
    alone = run(engine.ask("What is the pass key?", QUOTING, switched_off=frozenset({"report.pdf", "src/funcs.py"})))
    assert alone.quoted and not alone.citations.citations and not alone.citations.quote_spans
    assert engine.turns[-1].quoted == "What is the pass key?"
    # Nothing was read again: the context grew by the three questions and their answers only.
    assert engine.history[0].chunks and len([h for h in engine.history if hasattr(h, "chunks")]) == 1
    assert engine.length > length


# -- follow-ups and the answer's own source (reader.py, citations.lead_with_answer_source) ----------------------
def test_a_quoted_follow_up_is_drawn_after_the_exchange_before_it_and_drawn_again_the_same_way(runtime):
    """The reader holds the conversation's last question and answer before the quotes: "and its default?" names
    its subject there. Its answer is the one a context holding just that exchange and the quoted turn gives."""
    engine, alone = new_engine(runtime), new_engine(runtime)
    run(engine.feed_documents(pdf_like(pages=10)))
    first = answer(engine, "What is the pass key?", QUOTING)
    assert engine.turns[-1].earlier is None  # nothing was asked before the first question
    follow_up = answer(engine, "And is it on page 5?", QUOTING)
    turn = engine.turns[-1]
    assert follow_up.quoted and turn.earlier == Exchange("What is the pass key?", first.answer_ids)
    run(alone.append_exchange(turn.earlier))
    plain = GenerationSettings(temperature=0.0, max_new_tokens=24, recall=False, quote=False)
    assert answer(alone, turn.quoted, plain).answer_ids == follow_up.answer_ids
    assert len(AnswerReader.opening(engine.format, SYSTEM, turn.quoted, turn.earlier)) == alone.spans[-1].start
    after = list(engine.token_ids)
    again = run(engine.regenerate(GREEDY))
    assert again.answer_ids == follow_up.answer_ids and list(engine.token_ids) == after


def test_the_reader_keeps_the_first_tokens_of_a_long_earlier_exchange(runtime):
    from app.engine.reader import EARLIER_TOKENS

    engine = new_engine(runtime)
    tokenizer = runtime.tokenizer
    long_answer = tuple(tokenizer.encode(" ".join([FILLER] * 20), add_special_tokens=False))
    long_question = " ".join([FILLER] * 20)
    assert len(long_answer) > EARLIER_TOKENS
    short = Exchange(tokenizer.decode(tokenizer.encode(long_question, add_special_tokens=False)[:EARLIER_TOKENS]),
                     long_answer[:EARLIER_TOKENS])
    assert (AnswerReader.opening(engine.format, SYSTEM, "Q?", Exchange(long_question, long_answer))
            == AnswerReader.opening(engine.format, SYSTEM, "Q?", short))
    added = len(AnswerReader.opening(engine.format, SYSTEM, "Q?", short)) - len(
        AnswerReader.opening(engine.format, SYSTEM, "Q?"))
    assert 2 * EARLIER_TOKENS <= added <= 2 * EARLIER_TOKENS + 32  # the two, and the chat format's markers


def test_the_quoted_page_the_answer_is_read_from_is_cited_first(runtime):
    said = {3: "The pass key is 71432.", 7: "The pass key was later changed to zanzibar."}
    pages = [Chunk(f"--- page {n} ---\nThe sky is blue. {said.get(n, 'The grass is green.')}\n", "report.pdf", page=n)
             for n in range(1, 11)]
    engine = new_engine(runtime)
    run(engine.feed_documents(pages))
    result = answer(engine, "What is the pass key?", QUOTING)
    asked = engine.turns[-1].citations  # as the question ranked them
    quoted_pages = {w.page for w in asked.quote_sources}
    assert {3, 7} <= quoted_pages
    # The answer drawn is cited by the quote its words match best; the engine did that for the answer it drew.
    support = engine.chunk_index.scores(result.text)
    led = lead_with_answer_source(asked, [support.get(engine.spans.at(lo), 0.0) for lo, _ in asked.quote_spans])
    assert [(c.where, c.share) for c in result.citations.citations] == [(c.where, c.share) for c in led.citations]
    assert result.citations.citations[1:] == led.citations[1:]  # only the first one's snippet may change
    for said, page, shown in (("It was changed to zanzibar.", 7, "zanzibar"), ("The pass key is 71432.", 3, "71432")):
        first = engine._answer_sources(asked, "What is the pass key?", said).citations[0]
        assert first.where.page == page and shown in first.snippet
    assert ({c.where for c in engine._answer_sources(asked, "What is the pass key?", "zanzibar").citations}
            == {c.where for c in asked.citations})


# Recall off: the question's ranking is its words alone, as it is for a question answered while a document is fed.
WORDS_ONLY = GenerationSettings(temperature=0.0, max_new_tokens=24, recall=False, quote=True, guess=False)


def _feed_until(engine, chunks, fed_chunks: int, cancel=None):
    """Start feeding ``chunks`` and stop between two forwards once ``fed_chunks`` of them went; the feed goes on
    when the returned generator is driven again."""
    feeding = engine.feed_documents(chunks, cancel)
    for _ in range(fed_chunks):
        next(feeding)
    return feeding


def test_a_question_asked_while_a_document_is_fed_is_answered_from_what_is_not_fed_yet_and_read_in_after_it(runtime):
    """The quotes come from every chunk planned, fed or not (the pass key's page is not fed yet); the answer is the
    one a context fed whole gives the same question ranked by its words; the context is not touched until the feed
    ends, then it reads the question and the answer as that context holds them, and the answer can be drawn again."""
    question = "What is the pass key?"
    chunks = pdf_like(pages=10, secret_page=9)
    engine, whole = new_engine(runtime), new_engine(runtime)
    feeding = _feed_until(engine, chunks, 2)
    assert engine.feeding and engine.stats.feeding == "documents"
    fed = list(engine.token_ids), len(engine.spans), list(engine.history), engine.stats.done
    assert 9 not in {s.where.page for s in engine.spans.documents()}  # the pass key's page is still to come
    items = list(engine.ask_while_feeding(question, QUOTING))
    result = items[-1]
    assert isinstance(result, AnswerResult) and result.quoted and result.while_feeding is not None
    assert result.citations.quote_sources[0].page == 9 and not result.citations.recall_on
    assert any(isinstance(item, AnswerProgress) for item in items)
    # Nothing of the context changed, and the feed's figures are back.
    assert (list(engine.token_ids), len(engine.spans), list(engine.history), engine.stats.done) == fed
    assert engine.stats.feeding == "documents" and engine.stats.phase == "prefill"
    run(feeding)
    assert not engine.feeding
    # The same question, asked once the whole document is in a context, ranked by its words: the same quotes, the
    # same quoted turn, the same answer.
    run(whole.feed_documents(chunks))
    assert list(whole.token_ids) == list(engine.token_ids)
    reference = answer(whole, question, WORDS_ONLY)
    assert result.while_feeding.quoted == whole.turns[-1].quoted
    assert result.citations.quote_spans == reference.citations.quote_spans
    assert result.answer_ids == reference.answer_ids and result.citations == reference.citations
    run(engine.read_answered(question, result))
    assert list(engine.token_ids) == list(whole.token_ids) and torch.equal(engine._logits, whole._logits)
    assert engine.history[-1] == Exchange(question, result.answer_ids)
    assert engine.can_regenerate and run(engine.regenerate(GREEDY)).answer_ids == result.answer_ids
    assert list(engine.token_ids) == list(whole.token_ids)


def test_a_question_answered_while_a_feed_that_was_then_stopped_is_read_in_but_cannot_be_drawn_again(runtime):
    """Its quotes are not in the context (the feed rolled back): the exchange is kept as conversation, as a context
    built again from its history holds it, and it is not drawn again from quotes that are not there."""
    engine, replayed = new_engine(runtime), new_engine(runtime)
    stop = threading.Event()
    feeding = _feed_until(engine, pdf_like(pages=10, secret_page=9), 2, stop)
    result = run(engine.ask_while_feeding("What is the pass key?", QUOTING))
    stop.set()
    with pytest.raises(Stopped):
        run(feeding)
    assert engine.length == 0 and not engine.feeding
    run(engine.read_answered("What is the pass key?", result))
    run(replayed.append_exchange(Exchange("What is the pass key?", result.answer_ids)))
    assert list(engine.token_ids) == list(replayed.token_ids) and not engine.can_regenerate
    with pytest.raises(EngineError):
        run(engine.ask_while_feeding("What is the pass key?", QUOTING))  # no feed is under way now


def test_a_question_answered_while_feeding_after_another_reads_that_exchange_first(runtime, monkeypatch):
    """A follow-up asked during the same feed: the reader holds the exchange before it, waiting to be read too. The
    planned chunks' BM25 index is built once for the feed (a 4,000-page PDF's took 3.4 s), and again for the next."""
    import bm25s

    builds = []
    index = bm25s.BM25.index
    monkeypatch.setattr(bm25s.BM25, "index", lambda self, *a, **k: builds.append(1) or index(self, *a, **k))
    engine, alone = new_engine(runtime), new_engine(runtime)
    feeding = _feed_until(engine, pdf_like(pages=10, secret_page=9), 2)
    first = run(engine.ask_while_feeding("What is the pass key?", QUOTING))
    earlier = Exchange("What is the pass key?", first.answer_ids)
    follow_up = run(engine.ask_while_feeding("And on which page?", QUOTING, earlier=earlier))
    assert follow_up.while_feeding.earlier == earlier
    assert len(builds) == 1 and follow_up.citations.quote_sources[0].page == first.citations.quote_sources[0].page == 9
    run(alone.append_exchange(earlier))
    plain = GenerationSettings(temperature=0.0, max_new_tokens=24, recall=False, quote=False)
    assert answer(alone, follow_up.while_feeding.quoted, plain).answer_ids == follow_up.answer_ids
    run(feeding)
    door = [dataclasses.replace(c, text=c.text.replace("pass key", "door code")) for c in pdf_like(10, secret_page=3)]
    feeding = _feed_until(engine, door, 2)  # a new feed: its own chunks, indexed anew
    assert run(engine.ask_while_feeding("What is the door code?", QUOTING)).citations.quote_sources[0].page == 3
    assert len(builds) == 2
    run(feeding)


def test_a_context_read_without_recall_keeps_no_evicted_tokens_and_ranks_sources_by_their_words(runtime):
    from app.engine.budget import WITHOUT_RECALL
    from app.engine.context_file import context_record, reopen_context
    from app.engine.replay import DOCUMENTS_ONLY, replay

    engine = new_engine(runtime, budget=300)
    engine.keep_recall(False, WITHOUT_RECALL)
    assert not engine.keeps_recall and engine.budget == WITHOUT_RECALL
    run(engine.feed_documents(pdf_like(pages=4)))
    assert engine.length > runtime.window + 300  # past the window, and past the budget recall had
    memory = engine.memory()
    run(engine.feed_documents(pdf_like(pages=8)))
    assert engine.memory() == memory and memory["middle"] == 0  # the cache is as large as before: flat

    result = answer(engine, "What is the pass key?")  # asked with recall on: read without it
    report = result.citations
    assert not report.recall_on and not report.recalled and report.citations
    assert report.citations[0].where.page == 5  # the pass key's page, found by the question's words
    with pytest.raises(EngineError, match="start a new context"):
        engine.keep_recall(True, 300)  # it holds tokens: too late to keep what left the window

    rebuilt = run(replay(engine, DOCUMENTS_ONLY))  # Clear chat, Remove: the rebuilt context keeps no recall either
    assert isinstance(rebuilt, ContextEngine) and not rebuilt.keeps_recall and rebuilt.budget == WITHOUT_RECALL
    tensors, record = context_record(engine)
    reopened = reopen_context(runtime, tensors, record, budget=300)  # Save, then reopen
    assert not reopened.keeps_recall and reopened.budget == WITHOUT_RECALL and reopened.length == engine.length
    assert answer(reopened, "What is the pass key?").citations.citations[0].where.page == 5


def test_a_new_context_goes_back_to_recall_and_its_budget(runtime):
    engine = new_engine(runtime, budget=300)
    engine.keep_recall(False, 5_000)
    engine.keep_recall(True, 300)  # a feed that did not commit leaves a new context: recall again
    assert engine.keeps_recall and engine.budget == 300
    with pytest.raises(ContextFull):
        run(engine.feed_documents(pdf_like(pages=1)))  # 546 tokens
    assert engine.length == 0
