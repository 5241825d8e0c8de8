"""Hostile use, round 2 (issue 31), one workspace in two tabs and the chat's one lock: what the live panel sent
is kept per tab (item 17), and every change to the chat list is made under ``session.lock`` (item 18)."""

from __future__ import annotations

import threading

from app_fixtures import make_long_text
from handler_fixtures import SETTINGS, drain, make_handlers, request


def _is_skip(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1


# -- 17. the panel's record is each tab's ---------------------------------------------------------------------
def test_two_tabs_on_one_workspace_each_get_the_panel_change_and_the_plots_sample_once_per_tick(runtime, tmp_path,
                                                                                              monkeypatch):
    import app.web.handlers as handlers_module
    from app.engine.metrics import DeviceMemory

    memory = DeviceMemory("cpu", 500 * 2**20, None, 600 * 2**20, 8 * 2**30, "CPU (process RSS)")
    monkeypatch.setattr(handlers_module, "device_memory", lambda kind: memory)  # the process's RSS jitters
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    left, right = request("left"), request("right")
    workspace_id = handlers.attach(None, left)[0]
    assert handlers.attach(workspace_id, right)[0] == workspace_id
    session = handlers.registry.peek("left")
    assert handlers.registry.peek("right") is session
    handlers.panel(left)
    handlers.panel(right)
    assert all(_is_skip(v) for v in handlers.tick(left)) and all(_is_skip(v) for v in handlers.tick(right))

    handlers.add_files([str(make_long_text(tmp_path / "doc.txt", 20))], left)
    drain(handlers.read(left))
    drain(handlers.run(*SETTINGS, left))
    seen_left, seen_right = handlers.tick(left), handlers.tick(right)
    assert not _is_skip(seen_left[0]) and "tokens" in seen_left[0]
    assert seen_right[0] == seen_left[0], "the other tab was sent nothing: the first tab consumed the change"
    assert not _is_skip(seen_right[3]) and seen_right[3]["context_tokens"] == session.context_tokens

    session.stats.phase = "decode"  # work under way: each tick interval takes one sample, whatever the tabs
    try:
        before = session.series.version
        handlers.tick(left)
        handlers.tick(right)
        assert session.series.version == before + 1
    finally:
        session.stats.phase = "idle"

    handlers.tick(left)
    handlers.unload(right)  # the tab that left no longer has a record; the other's is as it was
    assert handlers.tab_sent.get(session, "right") == {}
    assert all(_is_skip(v) for v in handlers.tick(left))


# -- 18. the chat list changes under the session's lock only -------------------------------------------------
class LockedList(list):
    """A chat list that records every change made without its session's lock held by the changing thread."""

    def __init__(self, items, lock, unlocked: list):
        super().__init__(items)
        self._lock, self._unlocked = lock, unlocked

    def _check(self, what: str) -> None:
        if not self._lock._is_owned():  # RLock's own check: held by this thread
            self._unlocked.append((what, threading.current_thread().name))

    def append(self, item):
        self._check("append")
        super().append(item)

    def insert(self, index, item):
        self._check("insert")
        super().insert(index, item)

    def __setitem__(self, index, value):
        self._check("assign")
        super().__setitem__(index, value)

    def clear(self):
        self._check("clear")
        super().clear()

    def remove(self, item):
        self._check("remove")
        super().remove(item)


def test_every_change_to_the_chat_list_holds_the_session_lock(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req = request("tab")
    handlers.attach(None, req)
    session = handlers.registry.peek("tab")
    unlocked: list = []
    session.chat = LockedList(session.chat, session.lock, unlocked)

    handlers.submit({"text": "What is this?", "files": [str(make_long_text(tmp_path / "doc.txt", 20))]}, req)
    drain(handlers.read(req))
    drain(handlers.run(*SETTINGS, req))
    handlers.queue_regenerate(req)
    drain(handlers.run(*SETTINGS, req))
    handlers.submit({"text": "And then?", "files": []}, req)
    session.stop()  # stopped before it ran: the question is marked, an empty answer shown
    drain(handlers.run(*SETTINGS, req))
    handlers.queue_regenerate(req)  # asks the stopped question again
    drain(handlers.run(*SETTINGS, req))
    handlers.queue_forget(req)
    handlers.queue_forget(req)
    drain(handlers.run(*SETTINGS, req))
    handlers.submit({"text": "Last?", "files": []}, req)
    handlers.queue_reset(req)
    drain(handlers.run(*SETTINGS, req))
    assert isinstance(session.chat, LockedList)  # the same list all along: every change was seen
    assert unlocked == [], unlocked
