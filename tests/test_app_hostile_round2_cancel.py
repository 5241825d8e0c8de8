"""Hostile use, round 2 (issue 31), item 14: a cancelled or abandoned ``/ask`` stops its work as Stop does.

``/ask`` was one plain function: gradio_client's ``job.cancel()`` (or a client that left) cancelled the task
awaiting it, but the thread running it went on, and a long feed and its answer ran to the end for nobody."""

from __future__ import annotations

import time

import httpx
import pytest
from gradio_client import Client, handle_file

from app_fixtures import make_long_text

PORT = 7945


@pytest.fixture(scope="module")
def app(runtime, tmp_path_factory):
    """The app launched in this process: its URL, and its registry to watch a session's work from outside."""
    from app.cli import AppConfig
    from app.engine.budget import Budget
    from app.web.server import build_app, launch

    folder = tmp_path_factory.mktemp("cancel")
    config = AppConfig(model="test", port=PORT, workspaces=str(folder / "ws"), prefill_chunk=128)
    demo, handlers = build_app(config, runtime, Budget(1_000_000, "test budget", 1))
    launch(config, demo, block=False)
    yield f"http://127.0.0.1:{PORT}", handlers.registry
    demo.close()


def wait_for(registry, session_hash: str, until, timeout_s: float):
    """The tab's session once ``until(session)`` holds, or as it is after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        session = registry.peek(session_hash)
        if (session is not None and until(session)) or time.monotonic() > deadline:
            return session
        time.sleep(0.02)


def feeding(session) -> bool:
    return session.stats.phase == "prefill" and session.stats.done > 0


def settled_as_stop_leaves(registry, session_hash: str) -> None:
    """The feed stopped within a few chunks and rolled back, and the chat and table say so, as after Stop."""
    session = wait_for(registry, session_hash, lambda s: not s.pending and s.stats.phase == "idle", timeout_s=10)
    assert not session.pending and session.context_tokens == 0, (
        f"the work went on for nobody: {session.stats.phase}, {session.stats.done:,} / {session.stats.total:,}")
    assert [row.status.value for row in session.documents] == ["cancelled"]
    assert [item.in_context for item in session.chat if item.kind == "question"] == [False]


def test_a_cancelled_ask_stops_its_feed_and_answer_as_stop_does(app, tmp_path):
    url, registry = app
    client = Client(url, verbose=False)
    long = make_long_text(tmp_path / "long.txt", sentences=1000)
    job = client.submit("What is in the long file?", [handle_file(str(long))], api_name="/ask")
    assert feeding(wait_for(registry, client.session_hash, feeding, timeout_s=60))
    job.cancel()
    settled_as_stop_leaves(registry, client.session_hash)
    reply = client.predict("Still answering?", [], api_name="/ask")  # the session goes on serving
    assert reply["answer"] and "error" not in reply


def test_an_ask_whose_client_leaves_stops_its_feed_as_stop_does(app, tmp_path):
    url, registry = app
    session_hash = "client-that-leaves"
    long = make_long_text(tmp_path / "long.txt", sentences=1000)
    with httpx.Client(base_url=url, timeout=30) as raw:  # the browser's protocol: upload, join, then a stream
        fn_index = next(i for i, dep in enumerate(raw.get("/config").json()["dependencies"])
                        if dep.get("api_name") == "ask")
        with long.open("rb") as file:
            uploaded = raw.post("/gradio_api/upload", files={"files": (long.name, file, "text/plain")}).json()[0]
        attached = {"path": uploaded, "orig_name": long.name, "meta": {"_type": "gradio.FileData"}}
        joined = raw.post("/gradio_api/queue/join", json={
            "session_hash": session_hash, "fn_index": fn_index, "event_data": None, "trigger_id": None,
            "data": ["What is in it?", [attached]]})
        assert joined.status_code == 200, joined.text
        with raw.stream("GET", "/gradio_api/queue/data", params={"session_hash": session_hash}):
            assert feeding(wait_for(registry, session_hash, feeding, timeout_s=60))
        # the stream is closed: the client left mid-feed
    settled_as_stop_leaves(registry, session_hash)
