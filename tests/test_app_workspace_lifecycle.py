"""A workspace between tabs: saved and freed while a reload or a delete arrives, switched mid-run, an Open that
fails, a name the index cannot hold. Nothing the user did is lost, and a tab shows only its own workspace."""

from __future__ import annotations

import threading

import gradio as gr
import pytest

import app.session.registry as registry_module
from app_fixtures import make_long_text
from handler_fixtures import SETTINGS, drain, make_handlers, request


def ask(handlers, req, text="", files=()):
    handlers.submit({"text": text, "files": [str(f) for f in files]}, req)
    drain(handlers.read(req))
    return drain(handlers.run(*SETTINGS, req))


def fed(handlers, name, tmp_path):
    """A tab that loaded the page and asked about a document."""
    req = request(name)
    workspace_id = handlers.attach(None, req)[0]
    ask(handlers, req, "What is it?", [make_long_text(tmp_path / f"{name}.txt", 40)])
    return req, workspace_id, handlers.registry.peek(name)


@pytest.fixture
def held_save(monkeypatch):
    """Once armed, saves block until ``release`` is set (a large context takes seconds to write); ``writing`` is
    set when one has started."""
    writing, release, armed = threading.Event(), threading.Event(), threading.Event()
    write = registry_module.write_workspace

    def held(*args, **kwargs):
        if armed.is_set():
            writing.set()
            assert release.wait(30)
        return write(*args, **kwargs)

    monkeypatch.setattr(registry_module, "write_workspace", held)
    yield armed, writing, release
    release.set()


def leave_and_start_the_sweeps_save(handlers, req, session, held_save):
    armed, writing, _ = held_save
    armed.set()
    handlers.registry.grace_s = 0.01
    handlers.unload(req)
    session.lifecycle.detached_at -= 1  # past the grace period
    handlers.registry.sweep()  # saves in a thread of its own
    assert writing.wait(30)


def test_a_reload_while_the_sweep_saves_waits_and_opens_what_was_saved(runtime, tmp_path, held_save):
    release = held_save[2]
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req, workspace_id, session = fed(handlers, "tab", tmp_path)
    handlers.registry.save_now(session)
    ask(handlers, req, "One more question")  # changed since that save
    tokens, chat = session.context_tokens, [c.text for c in session.chat]
    leave_and_start_the_sweeps_save(handlers, req, session, held_save)
    threading.Timer(0.3, release.set).start()  # the save ends while the reload waits for it
    assert handlers.attach(workspace_id, request("reloaded"))[0] == workspace_id
    reloaded = handlers.registry.peek("reloaded")
    assert reloaded is not session and reloaded.context_tokens == tokens and [c.text for c in reloaded.chat] == chat


def test_a_workspace_being_saved_cannot_be_deleted_from_under_its_save(runtime, tmp_path, held_save):
    release = held_save[2]
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req, workspace_id, session = fed(handlers, "tab", tmp_path)
    handlers.registry.save_now(session)
    ask(handlers, req, "One more question")
    leave_and_start_the_sweeps_save(handlers, req, session, held_save)
    other = request("other")
    handlers.attach(None, other)
    with pytest.raises(gr.Error, match="is open"):
        handlers.delete_workspace(workspace_id, other)
    release.set()
    assert session.released.wait(30) and not handlers.registry.is_open(workspace_id)
    assert handlers.registry.store.exists(None, workspace_id)
    handlers.delete_workspace(workspace_id, other)  # once saved and freed, it can go
    assert not handlers.registry.store.exists(None, workspace_id)


def test_an_open_that_fails_leaves_the_tab_on_its_workspace_with_its_queued_work(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    other_req, damaged_id, other = fed(handlers, "other", tmp_path)
    handlers.registry.save_now(other)
    handlers.registry.grace_s = 0
    handlers.unload(other_req)  # saved and freed: only its file is left
    handlers.registry.grace_s = registry_module.DETACHED_GRACE_S
    path = handlers.registry.store.path(None, damaged_id)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    req, workspace_id, session = fed(handlers, "tab", tmp_path)
    handlers.submit({"text": "A queued question", "files": []}, req)
    queued = session.pending[-1]
    with pytest.warns(UserWarning, match="could not be opened"):
        drain(handlers.open_workspace(damaged_id, req))
    assert handlers.registry.peek("tab") is session and session.lifecycle.tabs == {"tab"} and not queued.cancel.is_set()
    with pytest.warns(UserWarning, match="no longer exists"):
        drain(handlers.open_workspace("0" * 32, req))
    assert handlers.registry.peek("tab") is session
    drain(handlers.run(*SETTINGS, req))
    assert session.chat[-2].text == "A queued question" and session.chat[-1].in_context


def test_a_run_that_ends_after_its_tab_switched_workspace_sends_the_new_workspace(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"), prefill_chunk=64)
    req, _, old = fed(handlers, "tab", tmp_path)
    handlers.submit({"text": "Summarize", "files": [str(make_long_text(tmp_path / "long.txt", 200))]}, req)
    drain(handlers.read(req))
    step = handlers.run(*SETTINGS, req)
    next(step)
    next(step)  # feeding
    handlers.new_workspace(req)
    new = handlers.registry.peek("tab")
    last = drain(step)
    assert new is not old and last[0] == handlers.view(new, "tab")[0] == []


def test_a_save_whose_name_index_cannot_be_written_is_still_a_save(runtime, tmp_path, monkeypatch):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req, workspace_id, session = fed(handlers, "tab", tmp_path)

    def disk_full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(handlers.registry.store, "set_name", disk_full)
    drain(handlers.queue_save("Notes \ud800", req))  # a lone surrogate, as a JSON client can send
    drain(handlers.run(*SETTINGS, req))
    assert session.name == "Notes \ufffd" and session.stop_note.startswith("Saved “Notes \ufffd”") and not session.unsaved
    assert handlers.registry.store.exists(None, workspace_id)


def test_a_refused_remove_or_open_says_why_and_leaves_the_screen_as_it_was(runtime, tmp_path):
    """gr.Error would mark every output of the event, the chat included, as failed until dismissed."""
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req, workspace_id, session = fed(handlers, "tab", tmp_path)
    with pytest.warns(UserWarning, match="Choose a document that is in the context"):
        view = handlers.queue_remove(None, req)
    assert view[0] == handlers.view(session, req.session_hash)[0] and not session.pending
    with pytest.warns(UserWarning, match="Choose a saved workspace first"):
        shown = drain(handlers.open_workspace(None, req))
    assert shown[0] == workspace_id and shown[1] == view[0]
