"""Actions queued while another runs: the chat keeps the context's order and holds only what the context holds.

A session's actions run in order on one model step; a second request of the session (a button clicked, or the
chat box used again, while an answer streams) only queues its action, and the running step does it next. Each
test holds the running step half way (a generator stepped by hand, no threads or timing), acts, then lets
it finish, and compares the chat with the tokens in the cache.
"""

from __future__ import annotations

import threading

import pytest

from app.session import model_work
from app.session.state import ItemKind, Session
from app.session.workspace_file import read_workspace
from app_fixtures import make_long_text
from handler_fixtures import SETTINGS, drain, make_handlers, request

LONG_ANSWER = (*SETTINGS[:3], 200, *SETTINGS[4:])  # enough tokens to act while it streams


@pytest.fixture(autouse=True)
def every_token_shown(monkeypatch):
    """Each streamed token is a step to hold, however fast the machine: throttled to 10 a second, a whole answer
    of the demo model on an idle CPU fits in one interval, and its step never yields while it decodes."""
    monkeypatch.setattr(model_work, "UI_INTERVAL_S", 0.0)


def ask(handlers, req, text, files=(), settings=SETTINGS):
    handlers.submit({"text": text, "files": [str(f) for f in files]}, req)
    drain(handlers.read(req))
    return drain(handlers.run(*settings, req))


def started(handlers, req, text, files=(), until=lambda stats: stats.phase == "decode"):
    """Submit ``text`` and run its model step until ``until`` holds; returns the step, paused there."""
    handlers.submit({"text": text, "files": [str(f) for f in files]}, req)
    drain(handlers.read(req))
    step = handlers.run(*LONG_ANSWER, req)
    stats = handlers.registry.peek(req.session_hash).stats
    for _ in step:
        if until(stats):
            return step
    raise AssertionError("the step ended before it got there")


def follow(handlers, req):
    """A second model step of the session (a button's, or another tab's), in a thread: it follows the running
    one, which does its action; returns a function that waits for it and gives its last view."""
    views = []
    thread = threading.Thread(target=lambda: views.append(drain(handlers.run(*SETTINGS, req))))
    thread.start()

    def last_view():
        thread.join(60)
        assert not thread.is_alive()
        return views[0]
    return last_view


def chat_of(session: Session) -> list[tuple[str, str]]:
    return [(c.kind, c.text) for c in session.chat if c.kind != ItemKind.STATUS]


def questions_in_cache(session: Session) -> list[str]:
    engine = session.engine
    return [engine.format.tokenizer.decode(engine.token_ids[s.start:s.end]) for s in engine.spans
            if s.kind == "question"]


def test_a_question_asked_after_clear_chat_stays_in_the_chat_and_the_context(runtime):
    handlers, req = make_handlers(runtime), request("clear-then-ask")
    ask(handlers, req, "Hello?")
    step = started(handlers, req, "Tell me a long story.")
    handlers.queue_forget(req)
    clears = follow(handlers, req)  # Clear's own model step follows the running one, which clears
    handlers.submit({"text": "Second question?", "files": []}, req)
    drain(step)
    session = handlers.registry.peek(req.session_hash)
    assert clears()[0] == handlers.view(session, req.session_hash)[0]  # it ended with the work, showing where it ended
    assert [kind for kind, _ in chat_of(session)] == [ItemKind.QUESTION, ItemKind.ANSWER]
    assert chat_of(session)[0][1] == "Second question?" and session.chat[-1].in_context
    cached = questions_in_cache(session)
    assert len(cached) == 1 and "Second question?" in cached[0]


def test_a_question_asked_while_clear_chat_reads_the_documents_again_stays_in_the_chat(runtime, tmp_path):
    handlers, req = make_handlers(runtime, prefill_chunk=64), request("clear-rebuild-ask")
    ask(handlers, req, "Hello?")
    ask(handlers, req, "", [make_long_text(tmp_path / "notes.txt", 100)])  # after a question: Clear re-reads
    session = handlers.registry.peek(req.session_hash)
    handlers.queue_forget(req)
    handlers.queue_forget(req)  # asked (it costs a re-read), then confirmed
    step = handlers.run(*SETTINGS, req)
    for _ in step:
        if session.stats.phase == "prefill" and session.stats.done > 0:
            break
    handlers.submit({"text": "Second question?", "files": []}, req)  # asked while the documents are re-read
    drain(step)
    assert [(kind, text) for kind, text in chat_of(session) if text] == [(ItemKind.QUESTION, "Second question?"),
                                                                         (ItemKind.ANSWER, session.chat[-1].text)]
    assert session.chat[-1].kind == ItemKind.ANSWER and session.chat[-1].in_context
    cached = questions_in_cache(session)
    assert len(cached) == 1 and "Second question?" in cached[0]


def test_a_question_queued_behind_a_feed_shows_after_the_answer_before_it(runtime, tmp_path):
    handlers, req = make_handlers(runtime, prefill_chunk=64), request("order")
    long = make_long_text(tmp_path / "long.txt", 200)
    step = started(handlers, req, "What is in the file?", [long],
                   until=lambda stats: stats.phase == "prefill" and stats.done > 0)
    handlers.submit({"text": "Second question?", "files": []}, req)
    drain(step)
    session = handlers.registry.peek(req.session_hash)
    shown = chat_of(session)
    assert [kind for kind, _ in shown] == [ItemKind.QUESTION, ItemKind.ANSWER, ItemKind.QUESTION, ItemKind.ANSWER]
    assert [text for kind, text in shown if kind == ItemKind.QUESTION] == ["What is in the file?", "Second question?"]
    first, second = (c for c in session.chat if c.kind == ItemKind.QUESTION)
    assert session.answer_to(first) is not session.answer_to(second)
    assert [q.count("Second question?") for q in questions_in_cache(session)] == [0, 1]


def test_ask_waits_for_its_answer_when_another_request_of_the_session_runs(runtime):
    handlers, req = make_handlers(runtime), request("api")
    step = started(handlers, req, "Tell me a long story.")
    session = handlers.registry.peek(req.session_hash)
    replies = []
    second = threading.Thread(target=lambda: replies.append(drain(handlers.ask("Second question?", [], req))))
    second.start()
    while len(session.pending) < 2:  # /ask has queued its question behind the running answer
        second.join(0.01)
    drain(step)  # the running step answers it too
    second.join(60)
    assert not second.is_alive()
    reply = replies[0]
    assert "error" not in reply and reply["in_context"] and reply["answer"]
    assert reply["answer"] == session.chat[-1].text and session.chat[-2].text == "Second question?"


def test_stop_also_stops_a_queued_clear_chat(runtime):
    handlers, req = make_handlers(runtime), request("stop-clear")
    ask(handlers, req, "Hello?")
    tokens = handlers.registry.peek(req.session_hash).context_tokens
    step = started(handlers, req, "Tell me a long story.")
    handlers.queue_forget(req)
    assert handlers.stop(req) == "Stopping 2 actions…"
    drain(step)
    session = handlers.registry.peek(req.session_hash)
    assert session.context_tokens == tokens and session.chat[0].text == "Hello?" and session.chat[1].in_context
    assert session.chat[-1].title == "■ Stopped before it started: the chat was not cleared"
    assert len(questions_in_cache(session)) == 1 and not session.pending


def test_a_remove_whose_request_ends_mid_rebuild_leaves_the_context_and_settles(runtime, tmp_path):
    handlers, req = make_handlers(runtime, prefill_chunk=64), request("closed-remove")
    for name, sentences in (("long", 200), ("short", 20)):
        ask(handlers, req, "", [make_long_text(tmp_path / f"{name}.txt", sentences)])
    session = handlers.registry.peek(req.session_hash)
    tokens, engine = session.context_tokens, session.engine
    handlers.queue_remove("short.txt", req)
    handlers.queue_remove("short.txt", req)  # asked, then confirmed
    step = handlers.run(*SETTINGS, req)
    for _ in step:
        if session.stats.phase == "prefill" and session.stats.done > 0:
            break
    step.close()  # the tab closed mid-rebuild
    assert session.engine is engine and session.context_tokens == tokens and not session.pending
    assert session.stats.phase == "idle" and not any(c.pending for c in session.chat)
    assert session.chat[-1].title == "⚠ short.txt was not removed; the context is unchanged"


def test_a_save_whose_request_ends_before_it_writes_settles_the_panel(runtime, tmp_path):
    handlers, req = make_handlers(runtime, workspaces=str(tmp_path / "ws")), request("closed-save")
    handlers.attach(None, req)
    ask(handlers, req, "Hello?")
    handlers.queue_save("mine", req)
    step = handlers.run(*SETTINGS, req)
    next(step)
    step.close()
    session = handlers.registry.peek(req.session_hash)
    assert (session.stats.phase, session.stats.detail) == ("idle", "") and not session.pending


def test_a_save_leaves_out_a_question_still_waiting_for_the_model(runtime, tmp_path):
    handlers, req = make_handlers(runtime, workspaces=str(tmp_path / "ws")), request("save-queued")
    handlers.attach(None, req)
    ask(handlers, req, "Hello?")
    step = started(handlers, req, "Tell me a long story.")
    handlers.queue_save("mine", req)
    saves = follow(handlers, req)
    handlers.submit({"text": "Second question?", "files": []}, req)  # queued after the save
    drain(step)
    saves()
    session = handlers.registry.peek(req.session_hash)
    assert session.chat[-2].text == "Second question?" and session.chat[-1].in_context  # answered after the save
    saved = Session("saved", runtime, handlers.config, handlers.budget)
    read_workspace(handlers.registry.store.path(None, session.workspace_id), saved)
    assert [text for kind, text in chat_of(saved) if kind == ItemKind.QUESTION] == ["Hello?", "Tell me a long story."]
    assert all(c.in_context for c in saved.chat) and len(questions_in_cache(saved)) == 2
