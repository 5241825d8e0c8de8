"""Hostile use, round 2 (issue 31), item 5 (first part): a save that fails (a full disk, or a kill mid-save)
leaves the list's name with the content it names: Save records the new name only once the file is written."""

from __future__ import annotations

import errno

from handler_fixtures import SETTINGS, drain, make_handlers, request
from test_app_hostile_round2 import ask


def test_a_save_that_fails_on_a_full_disk_keeps_the_old_name_with_the_old_content(runtime, tmp_path, monkeypatch):
    import app.session.registry as registry_module

    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req = request("tab")
    workspace_id = handlers.attach(None, req)[0]
    ask(handlers, req, "First?")
    drain(handlers.queue_save("v1", req))
    drain(handlers.run(*SETTINGS, req))
    store = handlers.registry.store
    assert store.name(None, workspace_id) == "v1"
    saved = store.path(None, workspace_id).read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(registry_module, "write_workspace", full_disk)
    ask(handlers, req, "Second?")
    drain(handlers.queue_save("v2", req))
    drain(handlers.run(*SETTINGS, req))
    session = handlers.registry.peek("tab")
    assert session.stop_note.startswith("⚠ Not saved (OSError") and "the previous save is intact" in session.stop_note
    assert store.name(None, workspace_id) == "v1", "the list names v2 while the file holds v1"
    assert store.path(None, workspace_id).read_bytes() == saved
    assert session.name == "v2" and session.unsaved  # the tab keeps the name asked for, for the next save

    monkeypatch.undo()
    drain(handlers.queue_save("v2", req))
    drain(handlers.run(*SETTINGS, req))
    assert store.name(None, workspace_id) == "v2" and not session.unsaved


def test_a_save_that_fails_when_the_tab_closes_keeps_the_work_in_memory_and_says_so_on_the_next_visit(
        runtime, tmp_path, monkeypatch):
    import app.session.registry as registry_module

    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    handlers.registry.grace_s = 0  # saved and freed as soon as the tab leaves
    req = request("tab")
    workspace_id = handlers.attach(None, req)[0]
    ask(handlers, req, "Worth keeping?")
    session = handlers.registry.peek("tab")
    answer = session.chat[-1].text

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(registry_module, "write_workspace", full_disk)
    handlers.unload(req)
    assert not session.released.is_set() and handlers.registry.is_open(workspace_id)
    assert session.engine is not None and session.chat[-1].text == answer  # nothing freed

    shown = handlers.attach(workspace_id, request("back"))  # the next visit finds it live, and is told
    assert shown[0] == workspace_id and handlers.registry.peek("back") is session
    note = session.stop_note
    assert note.startswith("⚠ This workspace could not be saved when its tab closed (OSError"), note
    assert "kept in memory" in note and "Save" in note

    monkeypatch.undo()
    handlers.unload(request("back"))  # the disk has room again: saved and freed
    assert session.released.is_set() and handlers.registry.store.exists(None, workspace_id)
