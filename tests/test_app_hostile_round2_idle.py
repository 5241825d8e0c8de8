"""Hostile use, round 2 (issue 31), item 15: idle sessions are saved and freed on the registry's own timer,
with no request arriving (they were freed only when some request came), and the timer stops at shutdown."""

from __future__ import annotations

import time

from handler_fixtures import make_handlers, request
from test_app_hostile_round2 import ask


def test_an_idle_session_is_saved_and_freed_with_no_request_arriving_and_the_sweeper_stops(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"), session_timeout_s=0.5)
    registry = handlers.registry
    req = request("idle")
    workspace_id = handlers.attach(None, req)[0]
    ask(handlers, req, "Hello?")
    session = registry.peek("idle")
    assert session.unsaved and len(registry) == 1
    registry.start_sweeping(every_s=0.1)
    try:
        deadline = time.monotonic() + 10
        while not session.released.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)  # no request at all meanwhile
        assert session.released.is_set() and len(registry) == 0
        assert registry.store.exists(None, workspace_id)  # saved before it was freed
    finally:
        sweeper = registry._sweeper
        assert registry.save_all() == 0  # the shutdown path stops the sweeping first
    assert sweeper is not None and not sweeper.is_alive() and registry._sweeper is None
