"""The passage the model writes before the documents are searched (app/engine/guess.py): its words join the
question's in BM25 at GUESS_WEIGHT, it is written greedily in a reader of its own before the question is read, Stop
ends it, it leaves the context as it was, and the Settings and the command line can turn it off."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from app.cli import parse_args
from app.engine.context_records import AnswerProgress, AnswerResult, AnswerStage, Stopped
from app.engine.generation import GenerationSettings
from app.engine.guess import GUESS_TOKENS
from app.engine.lexical import GUESS_WEIGHT
from app.web import views
from test_app_answer_sources import TEXTS, _index
from test_app_engine import _feed_until, new_engine, pdf_like, run, runtime  # noqa: F401 (runtime: the fixture)

GUESSING = GenerationSettings(temperature=0.0, max_new_tokens=12, recall=True, topk=5, quote=True, guess=True)


def test_the_guess_adds_its_words_scores_at_their_weight_and_finds_what_the_question_words_miss():
    index, spans = _index(TEXTS)
    question, guess = "How much randomness is gathered before seeding?", "The yarrow quick pool needs 100 bits."
    alone, both, written = index.scores(question), index.scores(question, "", guess), index.scores(guess)
    assert max(both, key=both.get) == spans[7] and spans[7] not in alone
    for span in spans:
        assert abs(both.get(span, 0.0) - alone.get(span, 0.0) - GUESS_WEIGHT * written.get(span, 0.0)) < 1e-6
    assert index.scores("the of and", "", guess) == {s: GUESS_WEIGHT * v for s, v in written.items()}


def _events(engine, question: str, settings: GenerationSettings, cancel=None) -> list:
    return list(engine.ask(question, settings, cancel))


def test_the_guess_is_written_first_then_searched_with_beside_the_question(runtime):  # noqa: F811
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like()))
    question = "What is the pass key?"
    events = _events(engine, question, GUESSING)
    stages = [e.stage for e in events if isinstance(e, AnswerProgress)]
    guessed = [e for e in events if isinstance(e, AnswerProgress) and e.stage is AnswerStage.GUESS]
    assert stages[: len(guessed)] == [AnswerStage.GUESS] * len(guessed) and AnswerStage.QUESTION in stages
    # Shown at once (before the model is free), then once per token written.
    assert [e.done for e in guessed] == [0, *range(len(guessed) - 1)] and len(guessed) <= GUESS_TOKENS + 2
    guess = guessed[-1].text
    result = events[-1]
    assert isinstance(result, AnswerResult) and result.guess == guess
    # The report's keyword scores are those of the question and the guess together (each page at its best chunk).
    scores = engine.chunk_index.scores(question, "", guess)
    best: dict = {}
    for chunk, score in sorted(scores.items(), key=lambda item: -item[1]):
        best.setdefault(chunk.where.page_only(), score)
    assert result.citations.lexical_scores == tuple(sorted(best.values(), reverse=True))[:10]
    assert guess and engine.chunk_index.scores(guess)  # the tiny model's guess has words the pages hold


def test_the_guess_is_read_apart_and_without_it_less_is_read(runtime):  # noqa: F811
    forwarded = {}
    for guess in (False, True):
        engine = new_engine(runtime)
        run(engine.feed_documents(pdf_like()))
        before, length = runtime.tokens_forwarded, engine.length
        guessed = False
        for event in engine.ask("What is the pass key?", replace(GUESSING, guess=guess)):
            if isinstance(event, AnswerProgress) and event.stage is AnswerStage.GUESS:
                guessed = True
            elif isinstance(event, AnswerProgress):  # the question is read next: the guess left the context as it was
                assert engine.length == engine.cache.get_seq_length() == length
        assert guessed == guess
        forwarded[guess] = runtime.tokens_forwarded - before
    assert forwarded[True] > forwarded[False]  # the guess's own reader


def test_stop_while_the_guess_is_written_leaves_the_context_as_it_was(runtime):  # noqa: F811
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like()))
    ids, length = list(engine.token_ids), engine.length
    cancel = threading.Event()
    with pytest.raises(Stopped):
        for event in engine.ask("What is the pass key?", GUESSING, cancel):
            if isinstance(event, AnswerProgress) and event.stage is AnswerStage.GUESS and event.done == 2:
                cancel.set()
            assert not (isinstance(event, AnswerProgress) and event.stage is AnswerStage.QUESTION)
    assert engine.length == length and list(engine.token_ids) == ids
    assert run(engine.ask("What is the pass key?", GUESSING)).text  # and the next question is answered


def test_asked_while_a_document_is_fed_the_guess_is_searched_with_and_the_feed_goes_on_as_before(runtime):  # noqa: F811
    question = "What is the pass key?"
    engine = new_engine(runtime)
    feeding = _feed_until(engine, pdf_like(pages=10, secret_page=9), 2)
    fed = list(engine.token_ids), engine.stats.done
    events = list(engine.ask_while_feeding(question, GUESSING))
    guessed = [e for e in events if isinstance(e, AnswerProgress) and e.stage is AnswerStage.GUESS]
    result = events[-1]
    assert guessed and isinstance(result, AnswerResult) and not result.citations.recall_on
    assert result.guess == guessed[-1].text
    view, index, report = engine.sources_while_feeding(question, GUESSING, guess=guessed[-1].text)
    assert report.lexical_scores == result.citations.lexical_scores  # the question's and the guess's words
    assert report.lexical_scores != engine.sources_while_feeding(question, GUESSING)[2].lexical_scores
    assert (list(engine.token_ids), engine.stats.done, engine.stats.feeding) == (*fed, "documents")
    run(feeding)
    assert not engine.feeding


def test_a_context_without_documents_writes_no_guess(runtime):  # noqa: F811
    engine = new_engine(runtime)
    events = _events(engine, "Hello?", GUESSING)
    assert not [e for e in events if isinstance(e, AnswerProgress) and e.stage is AnswerStage.GUESS]


def test_the_pending_answer_shows_the_guess_on_one_line_and_the_switch_reaches_the_settings():
    progress = AnswerProgress(AnswerStage.GUESS, 9, GUESS_TOKENS, 1.0, text="The key is `TMOUT`.\n\n```bash\nx\n```")
    shown = views.progress_markdown(progress)
    assert "\n" not in shown and "TMOUT" in shown and shown.startswith("*Guessing")
    assert views.progress_markdown(replace(progress, done=0, text="")) == (
        "*Guessing what the documents say, to search them with…*")
    assert parse_args([]).guess and not parse_args(["--no-guess"]).guess
    assert not GenerationSettings.from_ui(0.0, 0.9, 16, 1.0, True, 5, True, False).guess
    assert GenerationSettings.from_ui(0.0, 0.9, 16, 1.0, True, 5, True).guess


def test_the_guess_is_kept_with_its_answer_shown_under_its_sources_and_in_the_ask_reply():
    from app.engine.citations import Citation, CitationReport
    from app.session.model_work import ModelWork
    from app.session.state import ChatItem, ItemKind
    from app.web.api import answer_json
    from ingest import Provenance

    cited = CitationReport((Citation(Provenance("bashref.pdf", 91), 1.0, "TMOUT"),), 0.4, recalled=True)
    guess = "Set the `TMOUT` variable\n\nto *60*."
    item = ChatItem("assistant", ItemKind.ANSWER, pending=True)
    ModelWork._finish_answer(item, AnswerResult("Set TMOUT.", 3, "eos", cited, 0.1, 10.0, 5.0, 4, guess=guess))
    assert item.stats["guess"] == guess
    lines = views.answer_markdown(item).split("\n\n")
    # After the sources, one line, its Markdown escaped, said not to be the answer; then the numbers.
    assert lines[-2] == ("<sub>Also searched with a guess the model wrote before reading (not the answer): "
                         "“Set the \\`TMOUT\\` variable to \\*60\\*.”</sub>")
    assert lines[1].startswith("**") and "bashref.pdf p. 91" in lines[1] and lines[-1].startswith("<sub>first token")
    assert answer_json(item, [], 100, "m")["stats"]["guess"] == guess
    unguessed = ChatItem("assistant", ItemKind.ANSWER, pending=True)
    ModelWork._finish_answer(unguessed, AnswerResult("Set TMOUT.", 3, "eos", cited, 0.1, 10.0, 5.0, 4))
    assert "guess" not in unguessed.stats and "guess" not in views.answer_markdown(unguessed)
