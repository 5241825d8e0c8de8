"""The event functions in-process (no HTTP): server paths, the context budget, out-of-memory, disconnects."""

from __future__ import annotations

import asyncio
import time
import zipfile
from collections import deque
from types import SimpleNamespace

import gradio as gr
import pytest
import torch

from app.engine.context_records import AnswerStage
from app.session.state import Session
from app.session.workspace_file import read_workspace, session_record
from app.web import views
from app_fixtures import make_long_text, make_pdf, make_repo_zip
from fake_clock import FakeClock
from handler_fixtures import SETTINGS, drain, make_handlers, request



def rows_of(view):
    return {row[0]: row for row in view[1]}


def ask(handlers, req, text="", files=()):
    handlers.submit({"text": text, "files": [str(f) for f in files]}, req)
    drain(handlers.read(req))
    return drain(handlers.run(*SETTINGS, req))


def test_server_paths_need_the_flag(runtime, tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    closed = make_handlers(runtime)
    with pytest.raises(gr.Error, match="--allow-local-paths"):
        closed.add_server_path(str(repo), request("a"))

    opened = make_handlers(runtime, allow_local_paths=[str(tmp_path)])
    opened.add_server_path(str(repo), request("b"))
    drain(opened.read(request("b")))
    view = drain(opened.run(*SETTINGS, request("b")))
    assert rows_of(view)["repo/pkg/mod.py"][1] == "✓ in context"  # a folder's entries carry its name


def test_a_document_over_the_budget_is_read_without_recall_in_a_new_context_and_refused_in_a_used_one(runtime,
                                                                                                      tmp_path):
    handlers = make_handlers(runtime, budget_tokens=400)
    pdf = make_pdf(tmp_path / "long.pdf", pages=6)
    view = ask(handlers, request("new"), "What is the pass key?", files=[pdf])
    session = handlers.registry.peek("new")
    assert rows_of(view)["long.pdf"][1] == "✓ in context"
    assert not session.engine.keeps_recall and session.context_tokens > 400 + runtime.window
    assert session.engine.memory()["middle"] == 0  # the tokens that left the window were not kept
    status = next(item for item in session.chat if item.kind == "status")
    assert status.title.endswith("· without recall") and "more than the 400 the memory for recall" in status.text
    answer = [item for item in session.chat if item.kind == "answer"][-1]
    assert "this context is read without recall" in answer.recall_note and answer.citations
    shown = views.answer_markdown(answer)
    assert views.WORDS_ONLY_HEADING in shown and answer.recall_note in shown  # not "and the attention it drew"
    assert "read without recall" in views.session_view(session, handlers.budget)[2]  # the context box says so
    data = handlers.panel(request("new"))[3]  # and the panel's numbers, as /panel gives them
    assert data["budget"] == session.engine.budget > 400 and data["recall_kept"] is False

    used = request("used")
    ask(handlers, used, "Hello?")  # the context holds a question and its answer: it keeps recall, and its budget
    forwarded = runtime.tokens_forwarded
    view = ask(handlers, used, files=[pdf])
    row = rows_of(view)["long.pdf"]
    assert row[1] == "⊘ refused" and "context budget" in row[4] and "a new context reads it without recall" in row[4]
    assert runtime.tokens_forwarded == forwarded  # nothing was fed
    assert handlers.registry.peek("used").engine.keeps_recall


def test_stop_while_a_new_context_is_read_without_recall_leaves_a_new_context_with_recall(runtime, tmp_path):
    handlers = make_handlers(runtime, budget_tokens=400)
    req = request("stopped")
    handlers.submit({"text": "", "files": [str(make_pdf(tmp_path / "long.pdf", pages=6))]}, req)
    drain(handlers.read(req))
    session = handlers.registry.peek("stopped")
    for _ in handlers.run(*SETTINGS, req):
        if session.engine is not None and session.engine.feeding and session.context_tokens:
            assert not session.engine.keeps_recall
            handlers.stop(req)
    assert session.context_tokens == 0 and session.engine.keeps_recall and session.free_tokens == 400
    assert any((item.title or "").startswith("■ Stopped") for item in session.chat)


def test_out_of_memory_is_reported_and_the_server_keeps_serving(runtime, tmp_path, monkeypatch):
    handlers = make_handlers(runtime)
    req = request("d")
    ask(handlers, req, files=[make_pdf(tmp_path / "r.pdf")])
    tokens = handlers.registry.peek(req.session_hash).context_tokens
    model_forward = runtime.model.forward

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(runtime.model, "forward", out_of_memory)
    view = ask(handlers, req, "What is the pass key?")
    assert "ran out of memory" in view[0][-1]["content"] and "rolled back" in view[0][-1]["content"]
    assert handlers.registry.peek(req.session_hash).context_tokens == tokens
    view = ask(handlers, req, files=[make_repo_zip(tmp_path / "r.zip")])
    assert rows_of(view)["r.zip/demo_repo/src/greet.py"][1] == "↩ not added"
    monkeypatch.setattr(runtime.model, "forward", model_forward)

    view = ask(handlers, req, "What is the pass key?")
    assert "ran out of memory" not in view[0][-1]["content"]
    assert handlers.registry.peek(req.session_hash).context_tokens > tokens


def test_disconnect_frees_the_session(runtime, tmp_path):
    handlers = make_handlers(runtime)
    req = request("e")
    ask(handlers, req, "Hello?", files=[make_pdf(tmp_path / "r.pdf")])
    session = handlers.registry.peek("e")
    assert session.engine is not None and session.context_tokens > 0
    handlers.unload(req)
    assert handlers.registry.peek("e") is None and session.engine is None and session.documents == []


def test_stop_before_the_model_step_adds_nothing(runtime, tmp_path):
    handlers = make_handlers(runtime)
    req = request("f")
    handlers.submit({"text": "What is the pass key?", "files": [str(make_pdf(tmp_path / "r.pdf"))]}, req)
    drain(handlers.read(req))
    assert handlers.stop(req) == "Stopping 1 action…"
    view = drain(handlers.run(*SETTINGS, req))
    assert rows_of(view)["r.pdf"][1] == "■ cancelled"
    assert "Stopped: this exchange was not kept" in view[0][-1]["content"]
    assert handlers.registry.peek("f").context_tokens == 0
    assert handlers.stop(req) == "Nothing to stop."


def test_clear_chat_rebuilds_when_documents_follow_a_question(runtime, tmp_path):
    handlers = make_handlers(runtime)
    pdf, repo = make_pdf(tmp_path / "r.pdf"), make_repo_zip(tmp_path / "r.zip")
    req = request("g")
    ask(handlers, req, "What is the pass key?", files=[pdf])
    ask(handlers, req, files=[repo])  # documents after a question: the conversation cannot just be rolled back
    session = handlers.registry.peek("g")
    tokens = session.context_tokens
    handlers.queue_forget(req)  # costly: it says so first, and does nothing yet
    assert session.stop_note.startswith("Clearing the chat reads the documents again without the conversation: ")
    assert session.stop_note.endswith(" tokens/s. Click again to go ahead.")
    assert not session.pending and drain(handlers.run(*SETTINGS, req)) and session.context_tokens == tokens
    handlers.queue_forget(req)  # the second click goes ahead
    view = drain(handlers.run(*SETTINGS, req))
    assert [m for m in view[0] if m["role"] == "user" or not m.get("metadata")] == []

    fresh = request("h")
    ask(handlers, fresh, files=[pdf])
    ask(handlers, fresh, files=[repo])
    rebuilt, expected = handlers.registry.peek("g").engine, handlers.registry.peek("h").engine
    assert list(rebuilt.token_ids) == list(expected.token_ids)  # the documents alone, in the same order


def test_server_paths_stay_inside_the_allowed_roots(runtime, tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "docs").mkdir(parents=True)
    outside.mkdir()
    (root / "docs" / "ok.txt").write_text("fine to read\n")
    (outside / "secret.txt").write_text("the server's secret\n")
    (root / "escape").symlink_to(outside)  # a link inside the root that leads out of it
    (root / "escape.txt").symlink_to(outside / "secret.txt")
    handlers = make_handlers(runtime, allow_local_paths=[str(root)])
    req = request("paths")
    for path in (outside / "secret.txt", outside, root / "escape", root / "escape.txt", root / ".." / "outside",
                 "/etc/passwd"):
        with pytest.raises(gr.Error, match="outside the folders"):
            handlers.add_server_path(str(path), req)
    assert handlers.registry.peek("paths").pending == deque()
    handlers.add_server_path(str(root / "docs" / "ok.txt"), req)
    drain(handlers.read(req))
    view = drain(handlers.run(*SETTINGS, req))
    assert rows_of(view)["ok.txt"][1] == "✓ in context"


def test_git_clone_failures_say_nothing_about_the_network(runtime):
    from app.session.uploads import CLONE_FAILED, hide_network_details
    from ingest import FileReport

    reports = [FileReport("https://10.0.0.1/x.git", "error", reason="git clone failed: Failed to connect: "
                          "Connection refused"),
               FileReport("https://intranet.example/x.git", "error",
                          reason="cannot resolve intranet.example (offline or unknown host); nothing cloned"),
               FileReport("https://slow.example/x.git", "error",
                          reason="git clone took longer than 60 s and was stopped")]
    hide_network_details(reports, [r.path for r in reports])
    assert [r.reason for r in reports] == [CLONE_FAILED] * 3


def test_sessions_belong_to_their_logged_in_user(runtime):
    handlers = make_handlers(runtime)
    alice = SimpleNamespace(session_hash="shared", username="alice")
    handlers.submit({"text": "my secret question", "files": []}, alice)
    mallory = SimpleNamespace(session_hash="shared", username="mallory")
    for call in (handlers.show, handlers.queue_reset, handlers.export, handlers.stop, handlers.queue_regenerate):
        with pytest.raises(gr.Error, match="another user"):
            call(mallory)
    handlers.unload(mallory)  # another user's disconnect frees nothing
    session = handlers.registry.peek("shared")
    assert session is not None and session.chat[0].text == "my secret question" and session.pending


def test_queued_work_keeps_its_session_and_a_swept_one_says_so(runtime, tmp_path):
    clock = FakeClock()
    handlers = make_handlers(runtime, session_timeout_s=60, clock=clock)
    waiting = request("waiting")
    handlers.submit({"text": "", "files": [str(make_repo_zip(tmp_path / "r.zip"))]}, waiting)
    clock.advance(120)  # B's upload waits in the queue past the time-out while another user's read runs
    handlers.registry.sweep()
    session = handlers.registry.peek("waiting")
    assert session is not None and session.pending  # waiting is not idleness
    drain(handlers.read(waiting))
    view = drain(handlers.run(*SETTINGS, waiting))
    assert rows_of(view)["r.zip/demo_repo/src/greet.py"][1] == "✓ in context"

    clock.advance(120)  # now really idle
    assert "waiting" in handlers.registry.sweep()
    assert handlers.tick(waiting) == (gr.skip(),) * 5  # the panel timer does not start a new session
    with pytest.raises(gr.Error, match="freed after"):
        handlers.show(waiting)
    assert handlers.show(waiting)[1] == []  # told once; the tab may start afresh


def _answering(handlers, req, question="Tell me a long story.", tokens=64):
    """The model step's generator, advanced until the answer streams."""
    handlers.submit({"text": question, "files": []}, req)
    drain(handlers.read(req))
    settings = list(SETTINGS)
    settings[3] = tokens
    step = handlers.run(*settings, req)
    session = handlers.registry.peek(req.session_hash)
    for _ in step:
        if session.engine is not None and session.stats.phase == "decode":
            return step
    pytest.fail("the answer ended before it streamed")


def test_a_closed_model_step_leaves_what_stop_leaves(runtime, tmp_path, monkeypatch):
    import app.session.model_work as model_work

    monkeypatch.setattr(model_work, "UI_INTERVAL_S", 0.0)
    handlers = make_handlers(runtime)
    req = request("cancel")
    ask(handlers, req, "What is the pass key?", files=[make_pdf(tmp_path / "r.pdf")])
    session = handlers.registry.peek("cancel")
    kept_tokens, kept_answer = session.context_tokens, session.chat[-1]
    step = _answering(handlers, req, tokens=200)
    step.close()  # gradio_client Job.cancel(), a closed tab: the generator is closed mid-answer
    assert session.context_tokens == kept_tokens and not session.pending
    question, answer = session.chat[-2], session.chat[-1]
    assert question.kind == "question" and not question.in_context
    assert answer.kind == "answer" and answer.stopped and not answer.in_context and not answer.pending
    data = json_export(handlers, req)
    assert [(m["kind"], m["in_context"], m["stopped"]) for m in data["messages"]][-2:] == [
        ("question", False, False), ("answer", False, True)]
    assert kept_answer.in_context
    handlers.queue_regenerate(req)  # re-asks the question that was not kept, not the previous one's answer
    drain(handlers.run(*SETTINGS, req))
    assert session.chat[-2].text == "Tell me a long story." and session.chat[-2].in_context
    assert kept_answer.text and kept_answer.in_context


def test_a_closed_feed_leaves_no_row_waiting(runtime, tmp_path, monkeypatch):
    import app.session.model_work as model_work

    monkeypatch.setattr(model_work, "UI_INTERVAL_S", 0.0)
    handlers = make_handlers(runtime, prefill_chunk=64)
    req = request("feed")
    handlers.submit({"text": "", "files": [str(make_long_text(tmp_path / "long.txt", 400))]}, req)
    drain(handlers.read(req))
    step = handlers.run(*SETTINGS, req)
    session = handlers.registry.peek("feed")
    for _ in step:
        if session.stats.phase == "prefill" and session.stats.done > 0:
            break
    step.close()
    assert session.context_tokens == 0
    assert [r.status for r in session.documents] == ["cancelled"]
    assert not any(c.pending for c in session.chat)


def test_cpu_out_of_memory_is_reported_as_such(runtime, monkeypatch):
    handlers = make_handlers(runtime)
    req = request("cpu-oom")
    model_forward = runtime.model.forward

    def cpu_out_of_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 123456789 bytes.")

    monkeypatch.setattr(runtime.model, "forward", cpu_out_of_memory)
    view = ask(handlers, req, "What is the pass key?")
    monkeypatch.setattr(runtime.model, "forward", model_forward)
    assert "ran out of memory" in view[0][-1]["content"] and "internal error" not in view[0][-1]["content"].lower()


def test_a_source_too_big_for_the_budget_is_refused_before_reading(runtime, tmp_path, monkeypatch):
    big = tmp_path / "big.zip"
    with zipfile.ZipFile(big, "w", zipfile.ZIP_STORED) as z:
        for i in range(4):
            z.writestr(f"notes/part{i}.txt", (f"{i}. The grass is green and the sky is blue.\n") * 40_000)
    handlers = make_handlers(runtime, budget_tokens=2_000)
    req = request("too-big")
    ask(handlers, req, "Hello?")  # a new context would read it without recall, up to WITHOUT_RECALL tokens
    calls = []
    encode = runtime.ingest_tokenizer.encode
    monkeypatch.setattr(runtime.ingest_tokenizer, "encode", lambda *a, **k: calls.append(1) or encode(*a, **k))
    started = time.monotonic()
    view = ask(handlers, req, files=[big])
    assert time.monotonic() - started < 30 and calls == []  # nothing was tokenised
    row = rows_of(view)["big.zip"]
    assert row[1] == "⊘ refused" and "context budget" in row[4] and "a new context reads it without recall" in row[4]

    small = make_repo_zip(tmp_path / "small.zip")  # a source that fits still goes through
    view = ask(handlers, req, files=[small])
    assert rows_of(view)["small.zip/demo_repo/src/greet.py"][1] == "✓ in context"


def test_stop_lands_quickly_while_a_large_text_is_read(runtime, tmp_path):
    handlers = make_handlers(runtime)
    req = request("slow-read")
    text = make_long_text(tmp_path / "huge.txt", 60_000)
    handlers.submit({"text": "", "files": [str(text)]}, req)
    session = handlers.registry.peek("slow-read")
    reading = handlers.read(req)
    next(reading)
    time.sleep(0.5)
    handlers.stop(req)
    stopped = time.monotonic()
    drain(reading)
    assert time.monotonic() - stopped < 5  # one poll and the grace period, ~1 s; reading it all takes ~20 s
    assert [r.status for r in session.documents] == ["cancelled"]
    drain(handlers.run(*SETTINGS, req))
    assert session.context_tokens == 0 and not session.pending


def json_export(handlers, req):
    import json

    update = handlers.export(req)
    paths = update.value if hasattr(update, "value") else update["value"]
    paths = paths if isinstance(paths, list) else [paths]
    path = next(p if isinstance(p, str) else p["path"] for p in paths if str(p).endswith(".json") or
                (isinstance(p, dict) and p["path"].endswith(".json")))
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_a_pending_answer_shows_what_it_reads_then_only_the_answer(runtime, tmp_path, monkeypatch):
    """The answer's place says what is read before its first token (each stage shown as it begins), the first
    token replaces it, and the answer kept (and saved) holds nothing of it."""
    import app.session.model_work as model_work

    monkeypatch.setattr(model_work, "UI_INTERVAL_S", 3600.0)  # only a stage that begins is shown at once
    handlers = make_handlers(runtime)
    req = request("progress")
    handlers.submit({"text": "What is the pass key?", "files": [str(make_pdf(tmp_path / "r.pdf"))]}, req)
    drain(handlers.read(req))
    session = handlers.registry.peek("progress")
    shown = []
    for _ in handlers.run(*SETTINGS, req):
        answer = session.chat[-1]
        if answer.kind == "answer" and answer.pending and answer.progress is not None:
            shown.append((answer.progress.stage, answer.progress.done, answer.text))
    # the guess once asked, again once the model is its own (the activity box changes then), then the question and
    # the quotes, each as it begins
    assert [stage for stage, _, _ in shown] == [AnswerStage.GUESS, AnswerStage.GUESS, AnswerStage.QUESTION,
                                                AnswerStage.QUOTES]
    assert shown[3][1] == 0 and not any(text for _, _, text in shown)
    answer = session.chat[-1]
    assert answer.text and not answer.pending and answer.progress is None and answer.stats["quoted"]
    assert "progress" not in session_record(session)["chat"][-1]


def test_the_activity_box_says_what_an_answer_reads_before_its_first_token(runtime, tmp_path):
    """The question read into the context, then the quotes read in the reader, each with its own tokens: the box said
    "Waiting for its turn at the model" while the question was read, and the question's "32 / 32 tokens (100%)"
    while the quotes were (a minute on a CPU in float32)."""
    handlers, req = make_handlers(runtime), request("activity")
    ask(handlers, req, files=[make_pdf(tmp_path / "r.pdf", pages=4, secret_page=3)])
    handlers.submit({"text": "What is the pass key?", "files": []}, req)
    drain(handlers.read(req))
    session = handlers.registry.peek("activity")
    boxes = {}  # the activity box sent at each update, by what the answer's place said then
    for view in handlers.run(*SETTINGS, req):
        answer = session.chat[-1]
        if answer.kind == "answer" and answer.progress is not None:
            boxes.setdefault(answer.progress.stage, []).append((answer.progress.total, view[3]))
    assert any("Feeding the model (guessed answer)" in box for _, box in boxes[AnswerStage.GUESS])  # guess.py
    total, box = boxes[AnswerStage.QUESTION][-1]
    assert "Feeding the model (question)" in box and f"0 / {total:,} tokens (0%)" in box and "tok/s" not in box
    total, box = boxes[AnswerStage.QUOTES][0]
    assert "Feeding the model (quoted passages)" in box and f"0 / {total:,} tokens" in box and total > 100
    assert "ETA –" in box  # not the question's last figure
    assert not any("Waiting for its turn" in box for stage in boxes.values() for _, box in stage[1:])


def _feeding_with_a_question(runtime, tmp_path, monkeypatch, name):
    """A PDF dropped alone into the chat box, its feed started, then a question asked in the box: the handlers, the
    session, the model step's generator (paused in the feed) and the question's chat item."""
    monkeypatch.setattr(runtime, "prefill_chunk", 64)  # a feed of many forwards
    # --answer-while-feeding 0: every question asked during a feed, however soon it ends
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"), answer_while_feeding=0)
    req = request(name)
    box = handlers.submit({"text": "", "files": [str(make_pdf(tmp_path / "r.pdf", pages=8, secret_page=7))]}, req)
    assert box[0].interactive  # files alone leave the box open for a question
    drain(handlers.read(req))
    session = handlers.registry.peek(name)
    steps = handlers.run(*SETTINGS, req)
    while session.engine is None or not session.engine.feeding:
        next(steps)
    box = handlers.submit({"text": "What is the pass key?", "files": []}, req)
    assert not box[0].interactive  # a question locks it until its answer is done
    question = next(c for c in session.chat if c.kind == "question" and c.text)
    return handlers, session, steps, question


def test_a_question_asked_while_a_document_is_fed_is_answered_before_the_feed_ends(runtime, tmp_path, monkeypatch):
    """Answered between two chunks of the feed, from the page not fed yet, saying so; the request that asked it
    stops following once it is answered (its chat box opens); the context reads it once the feed is over."""
    handlers, session, steps, question = _feeding_with_a_question(runtime, tmp_path, monkeypatch, "aside")
    follower = handlers.run(*SETTINGS, request("aside"))  # the question's own request: another runs its work
    next(follower)
    answered_while_feeding = False
    for _ in steps:
        answer = session.answer_to(question)
        if answer is not None and not answer.pending and session.engine.feeding:
            answered_while_feeding = True
            break
    assert answered_while_feeding and answer.text and answer.citations[0].where.page == 7
    assert session.chat[1].text.endswith(" · a question asked now is answered before the feed ends")
    assert [(r.path, r.status) for r in session.documents] == [("r.pdf", "feeding")]  # said in its row too
    assert "while the documents were still being fed" in answer.recall_note and answer.stats["while_feeding"]
    shown = views.answer_markdown(answer)
    assert answer.recall_note in shown and views.WORDS_ONLY_HEADING in shown and answer.stats["quoted"]
    for polls, _ in enumerate(follower):  # it has its answer: it ends while the feed goes on (its last view)
        assert polls < 2, "the question's request still follows the feed"
    assert session.engine.feeding
    drain(steps)
    engine = session.engine
    # The upload's message (its files, no words), its status, then the question and its answer.
    assert [c.kind for c in session.chat] == ["question", "status", "question", "answer"]
    assert session.chat[1].title.startswith("Added 1 file") and question.in_context and answer.in_context
    assert [r.status for r in session.documents] == ["ingested"]
    assert engine.history[-1].question == "What is the pass key?" and not session.pending
    assert [s.kind for s in engine.spans][-2:] == ["question", "answer"] and engine.can_regenerate
    # Saved and reopened, it is the same chat and context (the answer's record says how it was drawn).
    handlers.registry.save_now(session)
    saved = Session("saved", runtime, handlers.config, handlers.budget)
    read_workspace(handlers.registry.store.path(None, session.workspace_id), saved)
    assert saved.chat[-1].stats["while_feeding"] and saved.chat[-1].recall_note == answer.recall_note
    assert list(saved.engine.token_ids) == list(engine.token_ids)


def test_stop_after_a_question_answered_while_feeding_keeps_the_answer_shown_but_not_in_the_context(
        runtime, tmp_path, monkeypatch):
    handlers, session, steps, question = _feeding_with_a_question(runtime, tmp_path, monkeypatch, "aside-stop")
    for _ in steps:
        answer = session.answer_to(question)
        if answer is not None and not answer.pending:
            break
    text = answer.text
    session.stop()
    drain(steps)
    assert [c.kind for c in session.chat] == ["question", "status", "question", "answer"] and answer.text == text
    assert not question.in_context and not answer.in_context and not answer.stopped
    assert session.engine.length == 0 and not session.pending  # the feed rolled back; nothing was read in


def test_a_question_asked_with_a_long_document_is_answered_while_it_is_fed_and_the_box_opens_then(
        runtime, tmp_path, monkeypatch):
    """Dropped with its question in one message: the answer comes between two chunks of the feed, the chat box opens
    then (not when the feed is over), and the context reads the exchange after the document."""
    monkeypatch.setattr(runtime, "prefill_chunk", 64)
    handlers = make_handlers(runtime, answer_while_feeding=0)
    req = request("drop-and-ask")
    pdf = make_pdf(tmp_path / "r.pdf", pages=8, secret_page=7)
    assert not handlers.submit({"text": "What is the pass key?", "files": [str(pdf)]}, req)[0].interactive
    drain(handlers.read(req))
    session = handlers.registry.peek("drop-and-ask")
    with pytest.raises(asyncio.TimeoutError):  # the box stays locked while the question waits
        asyncio.run(asyncio.wait_for(handlers.open_input_once_answered(req), 0.3))
    question = next(c for c in session.chat if c.kind == "question")
    steps = handlers.run(*SETTINGS, req)
    for _ in steps:
        answer = session.answer_to(question)
        if answer is not None and not answer.pending:
            break
    assert session.engine.feeding and answer.stats["while_feeding"] and answer.citations[0].where.page == 7
    assert asyncio.run(asyncio.wait_for(handlers.open_input_once_answered(req), 5)).interactive
    drain(steps)
    assert [c.kind for c in session.chat] == ["question", "status", "answer"] and answer.in_context
    assert [type(h).__name__ for h in session.engine.history] == ["DocumentsFed", "Exchange"]
