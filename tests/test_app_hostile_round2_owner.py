"""Hostile use, round 2 (issue 31), item 8: with --auth, a tab's session hash is no key to another user's tab.

User b who learns a's session hash must not take a's tab over (a page load or New on it: a's running feed was
cancelled) nor use Gradio's own routes with it: read a's queue stream (b received a's question, and a's stream
broke when b's closed), cancel a's events, or hang up a's heartbeat."""

from __future__ import annotations


import gradio as gr
import httpx
import pytest
from gradio_client import Client

from app_fixtures import make_long_text
from handler_fixtures import SETTINGS, drain, make_handlers, request

ACCOUNTS = [("alice", "wonderland"), ("bob", "builder")]
PORT = 7941


# -- the app's own events: a page load, New, Open and Import on another user's tab -----------------------------
def test_another_user_cannot_take_over_a_tab_by_its_session_hash_and_its_feed_runs_on(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"), auth=ACCOUNTS, prefill_chunk=64)
    alice, intruder = request("alice-tab", "alice"), request("alice-tab", "bob")
    workspace_id = handlers.attach(None, alice)[0]
    handlers.add_files([str(make_long_text(tmp_path / "long.txt", 200))], alice)
    drain(handlers.read(alice))
    step = handlers.run(*SETTINGS, alice)
    session = handlers.registry.peek("alice-tab")
    for _ in step:  # until the feed is under way
        if session.stats.phase == "prefill" and session.stats.done > 0:
            break

    for takeover in (lambda: handlers.attach(None, intruder), lambda: handlers.attach(workspace_id, intruder),
                     lambda: handlers.new_workspace(intruder)):
        with pytest.raises(gr.Error, match="belongs to another user"):
            takeover()
    assert handlers.registry.peek("alice-tab") is session and "alice-tab" in session.lifecycle.tabs
    assert not any(work.cancel.is_set() for work in session.pending), "bob's request stopped alice's feed"

    drain(step)
    assert session.documents[0].status.in_context and session.context_tokens > runtime.window
    assert handlers.attach(workspace_id, alice)[0] == workspace_id  # alice's own reload still shows it


# -- Gradio's routes that take a session hash, over HTTP --------------------------------------------------------
@pytest.fixture(scope="module")
def auth_app(runtime, tmp_path_factory):
    from app.cli import AppConfig
    from app.engine.budget import Budget
    from app.web.server import build_app, launch

    folder = tmp_path_factory.mktemp("owner")
    config = AppConfig(model="test", auth=ACCOUNTS, port=PORT, workspaces=str(folder / "ws"))
    demo, _ = build_app(config, runtime, Budget(100_000, "test budget", 1))
    launch(config, demo, block=False)
    yield f"http://127.0.0.1:{PORT}"
    demo.close()


def logged_in(url: str, user: str, password: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=30)
    assert client.post("/login", data={"username": user, "password": password}).status_code == 200
    return client


def status_of_stream(client: httpx.Client, path: str) -> int:
    """The status a streaming route answers with (the stream itself is left at once)."""
    with client.stream("GET", path) as response:
        return response.status_code


def test_gradio_routes_refuse_another_users_session_hash(auth_app):
    alice = Client(auth_app, auth=ACCOUNTS[0], verbose=False)
    alice.predict({"text": "alice's private question", "files": []}, api_name="/submit")
    hash_ = alice.session_hash
    bob = logged_in(auth_app, *ACCOUNTS[1])
    fn_index = next(i for i, dep in enumerate(alice.config["dependencies"]) if dep.get("api_name") == "show")

    assert status_of_stream(bob, f"/gradio_api/queue/data?session_hash={hash_}") == 403, "bob reads alice's stream"
    assert status_of_stream(bob, f"/gradio_api/heartbeat/{hash_}") == 403
    assert bob.post("/gradio_api/cancel", json={"session_hash": hash_, "fn_index": fn_index,
                                                "event_id": "x"}).status_code == 403
    joined = bob.post("/gradio_api/queue/join", json={"session_hash": hash_, "fn_index": fn_index, "data": [],
                                                      "event_data": None, "trigger_id": None})
    assert joined.status_code == 403 and "another user" in joined.text
    with httpx.Client(base_url=auth_app, timeout=30) as anonymous:  # /cancel and the heartbeat skip Gradio's login
        assert anonymous.post("/gradio_api/cancel", json={"session_hash": hash_, "fn_index": fn_index,
                                                          "event_id": "x"}).status_code == 403
        assert status_of_stream(anonymous, f"/gradio_api/heartbeat/{hash_}") == 403

    assert status_of_stream(bob, "/gradio_api/queue/data?session_hash=bobs-own-tab") == 200  # bob's own tab works
    chat = alice.predict(api_name="/show")[0]  # alice's tab, stream and session as they were
    assert any("alice's private question" in str(m["content"]) for m in chat)
    bob.close()
