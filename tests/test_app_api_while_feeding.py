"""``/ask`` with a long document replies once its question is answered beside the feed; the feed goes on."""

from __future__ import annotations

import logging
import threading

from app.web import handlers as handlers_module
from app.web.unattended import finish_unattended
from app_fixtures import make_pdf
from handler_fixtures import drain, make_handlers, request, wait_until


def _asked_with_a_long_pdf(runtime, tmp_path, monkeypatch, name):
    """``/ask`` given a question and an 8-page PDF (a feed of many forwards, every question answered beside it):
    the handlers, the session, the reply and the steps handed off to go on without the call."""
    monkeypatch.setattr(runtime, "prefill_chunk", 64)
    handed = []
    monkeypatch.setattr(handlers_module, "finish_unattended", lambda steps, _name: handed.append(steps))
    handlers = make_handlers(runtime, answer_while_feeding=0)
    pdf = make_pdf(tmp_path / "r.pdf", pages=8, secret_page=7)
    reply = drain(handlers.ask("What is the pass key?", [str(pdf)], request(name)))
    return handlers, handlers.registry.peek(name), reply, handed


def test_ask_replies_when_answered_beside_the_feed_and_the_context_reads_it_after(runtime, tmp_path, monkeypatch):
    handlers, session, reply, handed = _asked_with_a_long_pdf(runtime, tmp_path, monkeypatch, "api-feed")
    assert len(handed) == 1 and session.engine.feeding  # replied while the feed goes on
    assert "error" not in reply and not reply["in_context"] and reply["stats"]["while_feeding"]
    assert reply["sources"][0]["page"] == 7 and "while the documents were still being fed" in reply["recall_note"]
    assert [(d["file"], d["status"]) for d in reply["documents"]] == [("r.pdf", "feeding")]
    feed = reply["feed"]
    assert 0 < feed["fed_tokens"] < feed["tokens"] and reply["context_tokens"] < feed["tokens"]
    assert session.chat[-1].text == reply["answer"]
    drain(handed[0])  # the feed's end: the context reads the exchange after the document
    assert not session.engine.feeding and not session.pending and session.chat[-1].in_context
    assert [type(h).__name__ for h in session.engine.history] == ["DocumentsFed", "Exchange"]
    assert [r.status for r in session.documents] == ["ingested"]


def test_a_second_ask_during_that_feed_is_answered_beside_it_too(runtime, tmp_path, monkeypatch):
    handlers, session, first, handed = _asked_with_a_long_pdf(runtime, tmp_path, monkeypatch, "api-feed-2")
    feed = handed[0]
    second = handlers.ask("Say the pass key once more.", [], request("api-feed-2"))
    next(second)  # queued behind the feed; it follows the steps that run it
    question = next(c for c in reversed(session.chat) if c.kind == "question")
    for _ in feed:
        answer = session.answer_to(question)
        if answer is not None and not answer.pending:
            break
    assert session.engine.feeding
    reply = drain(second)
    assert "error" not in reply and reply["stats"]["while_feeding"] and reply["answer"] == answer.text
    assert reply["feed"]["fed_tokens"] > first["feed"]["fed_tokens"] and reply["documents"] == []
    drain(feed)
    assert [type(h).__name__ for h in session.engine.history] == ["DocumentsFed", "Exchange", "Exchange"]
    assert session.engine.history[-1].question == "Say the pass key once more."


def test_stop_ends_a_feed_that_goes_on_after_its_reply(runtime, tmp_path, monkeypatch):
    handlers, session, reply, handed = _asked_with_a_long_pdf(runtime, tmp_path, monkeypatch, "api-feed-stop")
    session.stop()
    drain(handed[0])
    assert session.engine.length == 0 and not session.pending  # rolled back; the exchange was not read in
    assert session.chat[-1].text == reply["answer"] and not session.chat[-1].in_context


def test_the_unattended_thread_runs_the_feed_to_its_end(runtime, tmp_path, monkeypatch):
    """The hand-off as the server does it: the reply comes, and a thread of its own finishes the feed."""
    monkeypatch.setattr(runtime, "prefill_chunk", 64)
    handlers = make_handlers(runtime, answer_while_feeding=0)
    pdf = make_pdf(tmp_path / "r.pdf", pages=8, secret_page=7)
    reply = drain(handlers.ask("What is the pass key?", [str(pdf)], request("api-thread")))
    session = handlers.registry.peek("api-thread")
    assert "error" not in reply and reply["sources"][0]["page"] == 7
    wait_until(lambda: not session.pending)
    assert session.chat[-1].in_context and session.context_tokens > reply["context_tokens"]
    assert [type(h).__name__ for h in session.engine.history] == ["DocumentsFed", "Exchange"]


def test_finish_unattended_drains_closes_and_logs_a_failure(caplog):
    seen, closed = [], threading.Event()

    def steps():
        try:
            seen.append(1)
            yield
            seen.append(2)
            yield
            raise RuntimeError("the model fell over")
        finally:
            closed.set()

    with caplog.at_level(logging.ERROR, logger="app.web.unattended"):
        finish_unattended(steps(), "feed of workspace w").join(5)
    assert seen == [1, 2] and closed.is_set()
    assert "feed of workspace w failed after its reply was sent" in caplog.text
