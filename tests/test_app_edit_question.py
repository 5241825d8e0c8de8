"""Editing an earlier question (the chat's pencil, Chatbot.edit): the cost is said first and the same edit again
goes ahead; the context is read again with the exchanges before the question, the question and what followed it
leave the chat, and the new words are asked where it was asked; a Stop leaves everything as it was."""

from __future__ import annotations

from types import SimpleNamespace

from app.engine.history import Exchange
from app.session.state import ItemKind
from app.web import views
from app_fixtures import make_long_text
from handler_fixtures import SETTINGS, drain, make_handlers, request


def ask(handlers, req, text, files=()):
    handlers.submit({"text": text, "files": [str(f) for f in files]}, req)
    drain(handlers.read(req))
    drain(handlers.run(*SETTINGS, req))


def edit(handlers, req, index, value):
    """What the Chatbot's edit event hands the handler: the message's index and its content as edited."""
    return handlers.edit_question(SimpleNamespace(index=index, value=value, previous_value=None), req)


def questions(session):
    return [c.text for c in session.chat if c.kind == ItemKind.QUESTION]


def questions_in_cache(session):
    engine = session.engine
    return [engine.format.tokenizer.decode(engine.token_ids[s.start:s.end]) for s in engine.spans
            if s.kind == "question"]


def test_an_edited_question_is_asked_again_where_it_was_and_what_followed_it_goes(runtime, tmp_path):
    handlers, req = make_handlers(runtime), request("edit")
    ask(handlers, req, "First question?", [make_long_text(tmp_path / "notes.txt", 40)])
    for text in ("Second (old) question?", "Third question?"):
        ask(handlers, req, text)
    session = handlers.registry.peek(req.session_hash)
    second = next(i for i, c in enumerate(session.chat) if c.text == "Second (old) question?")
    shown = views.chat_messages(session.chat)[second]["content"]
    assert views.typed_text(shown) == "Second (old) question?"  # the edit box gives back the Markdown shown

    edit(handlers, req, second, shown.replace("old", "new"))
    assert "reads the context again up to it" in session.stop_note and "2 exchanges" in session.stop_note
    assert session.stop_note.endswith("Make the same edit again to go ahead.")
    assert not session.pending  # said first, nothing queued
    edit(handlers, req, second, shown.replace("old", "new"))  # the same edit again: go ahead
    drain(handlers.run(*SETTINGS, req))

    assert questions(session) == ["First question?", "Second (new) question?"]
    answers = [c for c in session.chat if c.kind == ItemKind.ANSWER]
    assert len(answers) == 2 and all(a.in_context and a.text for a in answers)
    cached = questions_in_cache(session)
    assert len(cached) == 2 and "First question?" in cached[0] and "Second (new) question?" in cached[1]
    assert [e.question for e in session.engine.history if isinstance(e, Exchange)] == [
        "First question?", "Second (new) question?"]
    assert any(c.kind == ItemKind.STATUS and c.title == "Went back to the edited question" for c in session.chat)


def test_an_edit_stopped_while_the_context_is_read_again_changes_nothing(runtime, tmp_path):
    handlers, req = make_handlers(runtime, prefill_chunk=64), request("edit-stop")
    ask(handlers, req, "First question?", [make_long_text(tmp_path / "notes.txt", 200)])
    ask(handlers, req, "Second question?")
    session = handlers.registry.peek(req.session_hash)
    engine, before = session.engine, [(c.kind, c.text) for c in session.chat]
    first = next(i for i, c in enumerate(session.chat) if c.text == "First question?")
    for _ in range(2):
        edit(handlers, req, first, "*Attached: notes.txt*\n\nFirst question, edited?")
    step = handlers.run(*SETTINGS, req)
    for _ in step:
        if session.stats.phase == "prefill" and session.stats.done > 0:
            session.stop()
    assert session.engine is engine
    kept = [(c.kind, c.text) for c in session.chat if c.kind != ItemKind.STATUS and c.in_context]
    assert kept == [k for k in before if k[0] != ItemKind.STATUS]
    assert questions_in_cache(session)[0].count("First question?") == 1


def test_only_an_answered_question_still_in_the_context_can_be_edited(runtime, tmp_path):
    handlers, req = make_handlers(runtime), request("edit-refused")
    ask(handlers, req, "Only question?")
    session = handlers.registry.peek(req.session_hash)
    answer = next(i for i, c in enumerate(session.chat) if c.kind == ItemKind.ANSWER)
    for index in (answer, 99, (0, 1)):
        edit(handlers, req, index, "Something else?")
    assert not session.pending and questions(session) == ["Only question?"]
