"""Workspaces: a context saved and reopened answers as if it had never closed; reloads, users, bad files."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from app_fixtures import make_long_text, make_pdf
from handler_fixtures import SETTINGS, drain, make_handlers, request


def ask(handlers, req, text="", files=()):
    handlers.submit({"text": text, "files": [str(f) for f in files]}, req)
    drain(handlers.read(req))
    return drain(handlers.run(*SETTINGS, req))


def last_answer(session):
    return next(c for c in reversed(session.chat) if c.kind == "answer")


def fed_session(handlers, name, tmp_path):
    """A tab that loaded the page, read a document larger than the window and asked a question."""
    req = request(name)
    workspace_id = handlers.attach(None, req)[0]
    ask(handlers, req, "What is the pass key?", [make_pdf(tmp_path / f"{name}.pdf", pages=8)])
    return req, workspace_id, handlers.registry.peek(name)


def test_a_reopened_context_answers_exactly_as_the_one_never_closed(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req, workspace_id, session = fed_session(handlers, "saver", tmp_path)
    assert session.context_tokens > runtime.window  # the middle store and a wrapped ring are part of the save
    drain(handlers.queue_save("Pass keys", req))
    drain(handlers.run(*SETTINGS, req))
    assert session.stop_note.startswith("Saved “Pass keys”")
    assert not session.unsaved

    # Another server (same model, same folder) reopens it in a new tab.
    other = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    shown = other.attach(workspace_id, request("reader"))
    reopened = other.registry.peek("reader")
    assert shown[0] == workspace_id and reopened is not session and reopened.name == "Pass keys"
    _assert_the_same_context(reopened, session)

    question = "Which page holds the pass key, and what is it?"
    ask(handlers, req, question)
    ask(other, request("reader"), question)
    _assert_the_same_answer(reopened, session)
    # And the caches are the same bit for bit: the same next logits with recall reading the middle store.
    probe = list(session.engine.token_ids[100:140])
    with torch.inference_mode():
        logits = [runtime.forward(probe, s.engine.cache, topk=5) for s in (session, reopened)]
    assert torch.equal(*logits)


def _assert_the_same_context(reopened, session):
    """The reopened workspace holds what the saved one held: tokens, state, spans, chat, documents, sources."""
    assert reopened.context_tokens == session.context_tokens
    assert list(reopened.engine.token_ids) == list(session.engine.token_ids)
    assert (reopened.engine.state, reopened.engine.carry) == (session.engine.state, session.engine.carry)
    assert list(reopened.engine.spans) == list(session.engine.spans)
    assert [c.text for c in reopened.chat] == [c.text for c in session.chat]
    assert [(r.path, r.status, r.tokens) for r in reopened.documents] == \
        [(r.path, r.status, r.tokens) for r in session.documents]
    assert last_answer(reopened).citations == last_answer(session).citations


def _assert_the_same_answer(reopened, session):
    """The same question got the same answer, sources and context in both."""
    never_closed, after_reopen = last_answer(session), last_answer(reopened)
    assert after_reopen.text == never_closed.text and after_reopen.text
    assert after_reopen.stats["tokens"] == never_closed.stats["tokens"]
    assert after_reopen.citations == never_closed.citations
    assert list(reopened.engine.token_ids) == list(session.engine.token_ids)


def test_a_reload_reopens_the_workspace_the_browser_remembers(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    handlers.registry.grace_s = 0  # the tab's leaving saves and frees at once
    req, workspace_id, session = fed_session(handlers, "tab-1", tmp_path)
    tokens, chat = session.context_tokens, [c.text for c in session.chat]
    handlers.unload(req)  # the page unloads (reload): saved, then freed
    assert session.released.is_set() and session.engine is None
    assert handlers.registry.store.exists(None, workspace_id)

    shown = handlers.attach(workspace_id, request("tab-2"))  # the reloaded page, a new Gradio session
    reopened = handlers.registry.peek("tab-2")
    assert shown[0] == workspace_id and reopened.context_tokens == tokens
    assert [c.text for c in reopened.chat] == chat
    assert "Saved at" in shown[-3]  # the Workspaces tab's note


def test_a_reload_within_the_grace_period_finds_the_live_context(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req, workspace_id, session = fed_session(handlers, "tab-a", tmp_path)
    handlers.unload(req)
    assert not session.closed  # left, not freed: within the grace period
    handlers.attach(workspace_id, request("tab-b"))
    assert handlers.registry.peek("tab-b") is session
    assert handlers.registry.sweep() == [] and not session.closed  # a tab shows it again


def test_a_user_never_opens_another_users_workspace(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    handlers.registry.grace_s = 0
    alice = request("alice-tab", username="alice")
    workspace_id = handlers.attach(None, alice)[0]
    ask(handlers, alice, files=[make_long_text(tmp_path / "diary.txt", 200)])
    handlers.unload(alice)
    assert handlers.registry.store.exists("alice", workspace_id)

    bob = request("bob-tab", username="bob")
    shown = handlers.attach(workspace_id, bob)  # Alice's id, stolen from her browser
    assert shown[0] != workspace_id and handlers.registry.peek("bob-tab").context_tokens == 0
    assert handlers.workspace_panel(bob)[2] == []  # Bob's list is his own: empty
    assert [row[0] for row in handlers.workspace_panel(request("alice-2", username="alice"))[2]] != []


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other_model"])
def test_a_damaged_workspace_file_is_refused_with_a_reason_and_nothing_breaks(runtime, tmp_path, damage):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    handlers.registry.grace_s = 0
    req, workspace_id, session = fed_session(handlers, "damaged", tmp_path)
    handlers.unload(req)
    path = handlers.registry.store.path(None, workspace_id)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff not a workspace" * 100)
    else:
        handlers.runtime.name, real_name = "another model", handlers.runtime.name
    try:
        shown = handlers.attach(workspace_id, request("next"))
    finally:
        if damage == "other_model":
            handlers.runtime.name = real_name
    fresh = handlers.registry.peek("next")
    assert shown[0] != workspace_id and fresh.context_tokens == 0 and fresh.chat == []
    listed = {row[0]: row for row in handlers.workspace_panel(request("next"))[2]}
    assert any("cannot be opened" in str(row[4]) for row in listed.values()) or damage == "other_model"
    ask(handlers, request("next"), "Still there?")  # the server keeps serving
    assert fresh.chat[-1].text


def test_the_same_document_is_fed_once_whichever_panel_or_name_it_comes_from(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    handlers.registry.grace_s = 0
    req = request("dupes")
    workspace_id = handlers.attach(None, req)[0]
    text = make_long_text(tmp_path / "notes.txt", 60)
    copy = tmp_path / "copy of notes.txt"
    copy.write_bytes(text.read_bytes())
    handlers.add_files([str(text)], req)  # the Documents panel
    drain(handlers.read(req))
    drain(handlers.run(*SETTINGS, req))
    session = handlers.registry.peek("dupes")
    tokens = session.context_tokens
    assert tokens > 0

    ask(handlers, req, "", [text, copy])  # the chat box: the same file again, and a renamed copy, in one upload
    rows = [(r.path, r.status, r.reason) for r in session.documents]
    assert [status for _, status, _ in rows] == ["ingested", "skipped", "skipped"]
    assert rows[1][2] == "same text as notes.txt, already in the context: not added again"
    assert "notes.txt" in rows[2][2]  # ingest's own within-one-upload check, or ours: either names the original
    assert session.context_tokens == tokens  # nothing fed twice

    other = tmp_path / "other.txt"
    other.write_text("A different document.\n" * 5)
    ask(handlers, req, "", [other, other])  # two copies in one upload: the second is the duplicate
    assert [r.status for r in session.documents[-2:]] == ["ingested", "skipped"]
    assert "other.txt" in session.documents[-1].reason

    handlers.unload(req)  # saved and freed; the digests travel with the workspace
    handlers.attach(workspace_id, request("dupes-2"))
    reopened = handlers.registry.peek("dupes-2")
    before = reopened.context_tokens
    ask(handlers, request("dupes-2"), "", [copy])
    assert reopened.documents[-1].status == "skipped" and reopened.context_tokens == before


def remove(handlers, req, source):
    """The Remove button twice: the first click says what it costs, the second does it."""
    handlers.queue_remove(source, req)
    session = handlers.registry.peek(req.session_hash)
    assert session.stop_note.startswith(f"Removing {source} reads the rest of the context again: ")
    assert not session.pending
    handlers.queue_remove(source, req)
    return drain(handlers.run(*SETTINGS, req))


def test_removing_a_document_equals_a_context_built_without_it(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    a, b, c = (make_long_text(tmp_path / f"{name}.txt", n) for name, n in (("a", 40), ("b", 300), ("c", 25)))
    req = request("remove")
    for document in (a, b, c):
        ask(handlers, req, "", [document])
    session = handlers.registry.peek("remove")
    remove(handlers, req, "b.txt")
    assert [r.path for r in session.documents] == ["a.txt", "c.txt"]

    fresh = request("fresh")
    for document in (a, c):
        ask(handlers, fresh, "", [document])
    assert list(session.engine.token_ids) == list(handlers.registry.peek("fresh").engine.token_ids)
    ask(handlers, req, "", [b])  # its digest went with it: it can be added again
    assert session.documents[-1].status == "ingested"


def test_removing_a_document_keeps_the_conversation_and_survives_a_reopen(runtime, tmp_path):
    from app.engine.context import ContextEngine

    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    handlers.registry.grace_s = 0
    req, workspace_id, session = fed_session(handlers, "keep-chat", tmp_path)  # keep-chat.pdf and a question
    notes = make_long_text(tmp_path / "notes.txt", 50)
    ask(handlers, req, "What is in the notes?", [notes])
    exchanges = [e for e in session.engine.history if not hasattr(e, "chunks")]
    handlers.unload(req)  # saved; the history travels with the workspace
    handlers.attach(workspace_id, request("keep-chat-2"))
    reopened = handlers.registry.peek("keep-chat-2")
    assert len(reopened.engine.history) == 4  # the pdf, a question, the notes, a question
    remove(handlers, request("keep-chat-2"), "keep-chat.pdf")

    expected = ContextEngine(runtime, system_prompt=reopened.engine.system_prompt)  # notes, then both exchanges
    drain(expected.append_exchange(exchanges[0]))
    drain(expected.feed_documents(reopened.engine.history[1].chunks))
    drain(expected.append_exchange(exchanges[1]))
    assert list(reopened.engine.token_ids) == list(expected.token_ids)
    assert [r.path for r in reopened.documents if r.status.in_context] == ["notes.txt"]
    assert sum(1 for c in reopened.chat if c.kind == "answer") == 2  # the chat is untouched


def test_a_stopped_removal_leaves_the_context_as_it_was(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req = request("stop-remove")
    ask(handlers, req, "", [make_long_text(tmp_path / "long.txt", 2000), make_long_text(tmp_path / "short.txt", 20)])
    session = handlers.registry.peek("stop-remove")
    before = list(session.engine.token_ids)
    handlers.queue_remove("short.txt", req)
    handlers.queue_remove("short.txt", req)
    run = handlers.run(*SETTINGS, req)
    next(run)
    handlers.stop(req)
    drain(run)
    assert list(session.engine.token_ids) == before and [r.path for r in session.documents] == ["long.txt", "short.txt"]
    assert "was not removed" in session.chat[-1].title and "Stopped" in session.chat[-1].text


def test_clear_chat_of_a_reopened_context_reads_the_documents_again(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    handlers.registry.grace_s = 0
    req, workspace_id, session = fed_session(handlers, "clear", tmp_path)
    documents_only = session.engine.spans.documents()[-1].end
    handlers.unload(req)
    handlers.attach(workspace_id, request("clear-2"))
    reopened = handlers.registry.peek("clear-2")
    handlers.queue_forget(request("clear-2"))
    assert "Clearing the chat reads the documents again" in reopened.stop_note
    handlers.queue_forget(request("clear-2"))
    drain(handlers.run(*SETTINGS, request("clear-2")))
    assert reopened.context_tokens == documents_only and not any(c.kind == "answer" for c in reopened.chat)


def test_a_downloaded_workspace_imports_on_another_server_and_a_foreign_one_is_refused(runtime, tmp_path):
    import gradio as gr

    here = make_handlers(runtime, workspaces=str(tmp_path / "here"))
    req, workspace_id, session = fed_session(here, "export", tmp_path)
    with pytest.raises(gr.Error, match="press Save first"):
        here.download_workspace(None, req)
    drain(here.queue_save("Report", req))
    drain(here.run(*SETTINGS, req))
    downloaded = here.download_workspace(None, req)["value"]  # an update: Gradio serves the file as it is
    assert downloaded.endswith("Report.lmiw")

    there = make_handlers(runtime, workspaces=str(tmp_path / "there"))
    shown = there.import_workspace(downloaded, request("import"))
    imported = there.registry.peek("import")
    assert shown[1] == imported.workspace_id != workspace_id and imported.name == "Report (imported)"
    assert list(imported.engine.token_ids) == list(session.engine.token_ids)
    assert [row[0] for row in there.workspace_panel(request("import"))[2]] == [
        "● Report (imported) — “What is the pass key?” (1 question)"]
    # The upload came with it: the imported workspace's citation opens the PDF (workspace_sources.py).
    cited = imported.chat[-1].citations[0].where
    assert imported.sources.url(cited).endswith(f"#page={cited.page}") and session.sources.url(cited) is not None
    assert imported.sources.url(cited) != session.sources.url(cited)  # its own folder on the other server

    not_a_workspace = tmp_path / "notes.lmiw"
    not_a_workspace.write_text("hello")
    with pytest.warns(UserWarning, match="Not imported: notes.lmiw is not a readable workspace file"):
        there.import_workspace(str(not_a_workspace), request("import-2"))
    there.runtime.name, real_name = "another model", there.runtime.name
    try:
        with pytest.warns(UserWarning, match="Not imported: this context was made with another model"):
            there.import_workspace(downloaded, request("import-3"))
    finally:
        there.runtime.name = real_name
    # The same model in another dtype is converted (test_app_hostile_round2_dtype.py), when the file records its
    # weights whatever their dtype; one saved before it did says which --dtype opens it.
    unknown_weights = rewrite_record(Path(downloaded), tmp_path / "older.lmiw",
                                     lambda record: record["context"]["identity"].pop("weights"))
    there.runtime.dtype = torch.bfloat16
    try:
        with pytest.warns(UserWarning, match="made with the model in float32, this server runs it in bfloat16; "
                                             "open it on a server started with --dtype float32"):
            there.import_workspace(str(unknown_weights), request("import-4"))
    finally:
        there.runtime.dtype = torch.float32


def rewrite_record(source, target, edit):
    """``source`` with ``edit(record)`` applied to its workspace record; the tensors as they are (header only)."""
    import json
    import struct

    from app.session.workspace_file import RECORD_KEY

    data = source.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + size])
    record = json.loads(header["__metadata__"][RECORD_KEY])
    edit(record)
    header["__metadata__"][RECORD_KEY] = json.dumps(record)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    target.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + size :])
    return target


HOSTILE_IMPORTS = {  # a field of a real saved workspace, and where the refusal says it is wrong
    "summary-tokens": (lambda r: r["summary"].update(tokens="lots"), "summary.tokens is 'lots', expected a count"),
    "chat-text": (lambda r: r["session"]["chat"][0].update(text=123), r"session.chat\[0\].text is 123"),
    "document-tokens": (lambda r: r["session"]["documents"][0].update(tokens="x"), r"session.documents\[0\].tokens"),
    "span-kind": (lambda r: r["context"]["spans"][0].__setitem__(2, "poem"), r"context.spans\[0\]\[2\] is 'poem'"),
    "history-answer": (lambda r: r["context"]["history"][-1].update(answer_ids=["x"]), r"context.history\[\d+\]"),
    "carry": (lambda r: r["context"]["carry"].update(started="yes"), "context.carry.started is 'yes'"),
}


def test_an_import_with_a_field_of_the_wrong_type_is_refused_adding_nothing(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req, workspace_id, session = fed_session(handlers, "hostile", tmp_path)
    handlers.registry.save_now(session)
    saved = handlers.registry.store.path(None, workspace_id)
    for name, (edit, where) in HOSTILE_IMPORTS.items():
        hostile = rewrite_record(saved, tmp_path / f"{name}.lmiw", edit)
        with pytest.warns(UserWarning, match=rf"Not imported: {name}.lmiw is damaged or incomplete \(record.{where}"):
            handlers.import_workspace(str(hostile), request(f"import-{name}"))
        assert [w.id for w in handlers.registry.store.list(None)] == [workspace_id]  # nothing added
    # Such a file already in the folder (copied there by hand): listed as damaged, and the list still shows.
    copied = handlers.registry.store.path(None, "0" * 32)
    rewrite_record(saved, copied, HOSTILE_IMPORTS["summary-tokens"][0])
    rows = handlers.workspace_panel(req)[2]
    assert len(rows) == 2 and any(str(row[4]).startswith("cannot be opened: ") and "summary.tokens" in row[4]
                                  for row in rows)


def test_a_save_interrupted_by_a_crash_leaves_the_old_file_and_its_leftovers_go_at_start_up(runtime, tmp_path):
    from app.session.workspace_store import WorkspaceStore

    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req, workspace_id, session = fed_session(handlers, "crash", tmp_path)
    handlers.registry.save_now(session)
    path = handlers.registry.store.path(None, workspace_id)
    saved = path.read_bytes()
    leftover = path.parent / f".{path.name}.abc123.tmp"  # what a save killed mid-write leaves beside the file
    leftover.write_bytes(saved[: len(saved) // 3])
    assert [w.id for w in handlers.registry.store.list(None)] == [workspace_id]  # never listed
    under_way = path.parent / f".{path.name}.def456.tmp"  # another replica's save, being written now
    under_way.write_bytes(b"x")
    old = time.time() - 16 * 60  # the crash was a while ago: nothing has written the leftover since
    os.utime(leftover, (old, old))
    assert WorkspaceStore(tmp_path / "ws").remove_leftovers() == 1 and not leftover.exists()
    assert under_way.exists() and path.read_bytes() == saved


@pytest.mark.parametrize("save_middle", ["exact", "bfloat16"])
def test_the_size_shown_before_saving_is_the_size_saved(runtime, tmp_path, save_middle):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"), save_middle=save_middle)
    req, workspace_id, session = fed_session(handlers, "size", tmp_path)
    note = handlers.workspace_panel(req)[1]
    promised = note.split("Saving writes about ")[1].split(" (")[0]
    size = handlers.registry.save_now(session)
    from ingest.units import human_bytes

    assert promised == human_bytes(size) or abs(size - _parse(promised)) / size < 0.05, (promised, size)


def _parse(text: str) -> float:
    number, unit = text.split()
    return float(number) * {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}[unit]


def test_reopening_respects_the_memory_budget_and_keeps_the_save(runtime, tmp_path):
    from app.engine.budget import Budget

    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    handlers.registry.grace_s = 0
    req, workspace_id, session = fed_session(handlers, "big", tmp_path)
    handlers.unload(req)
    tight = make_handlers(runtime, budget=Budget(1_000_000, "test", 1, 1000, "a test limit"),
                          workspaces=str(tmp_path / "ws"))  # the same folder, on a server with no memory to spare
    shown = tight.attach(workspace_id, request("big-2"))
    assert shown[0] != workspace_id and tight.registry.peek("big-2").context_tokens == 0
    assert tight.registry.store.exists(None, workspace_id)  # still saved, still listed
    assert handlers.attach(workspace_id, request("big-3"))[0] == workspace_id


def test_two_tabs_reopening_the_same_workspace_at_once_share_one_context(runtime, tmp_path):
    import threading

    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    handlers.registry.grace_s = 0
    req, workspace_id, session = fed_session(handlers, "first", tmp_path)
    handlers.unload(req)
    start = threading.Barrier(2)

    def load(tab):
        start.wait()  # both page loads at the same moment
        handlers.attach(workspace_id, request(tab))

    threads = [threading.Thread(target=load, args=(tab,)) for tab in ("left", "right")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    left, right = handlers.registry.peek("left"), handlers.registry.peek("right")
    assert left is right and left.workspace_id == workspace_id and left.lifecycle.tabs == {"left", "right"}
