"""Drills against a launched server over loopback: what a hostile or unlucky client can and cannot do."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from gradio_client import Client

from app_client import AppClient, message_text
from app_fixtures import ROOT, make_long_text, shared_server, start_server


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared-docs")
    server = start_server("--auth", "alice:wonderland", "--auth", "bob:builder", "--allow-local-paths", str(root))
    server.root = root
    yield server
    server.stop()


def test_a_session_hash_gives_another_user_no_access(auth_server):
    alice = Client(auth_server.url, auth=("alice", "wonderland"), verbose=False)
    alice.predict({"text": "alice's private question", "files": []}, api_name="/submit")
    chat = alice.predict(api_name="/show")[0]
    assert any("alice's private question" in str(m["content"]) for m in chat)

    bob = Client(auth_server.url, auth=("bob", "builder"), verbose=False)
    bob.session_hash = alice.session_hash  # the hash leaked (a shared screen, a log, a guess)
    for api_name in ("/show", "/new_context", "/export", "/stop"):
        with pytest.raises(Exception, match="403 Forbidden"):  # refused before any event runs (tab_guard.py)
            bob.predict(api_name=api_name)

    chat = alice.predict(api_name="/show")[0]  # untouched
    assert any("alice's private question" in str(m["content"]) for m in chat)


def test_the_start_up_warning_names_the_readable_folders(auth_server):
    log = auth_server.log()
    assert "WARNING: --allow-local-paths" in log and str(auth_server.root.resolve()) in log


def test_the_app_sends_no_usage_analytics_by_default():
    env = {k: v for k, v in os.environ.items() if k != "GRADIO_ANALYTICS_ENABLED"}
    code = ("import app.web.server, gradio.analytics as a, os; "
            "print(os.environ['GRADIO_ANALYTICS_ENABLED'], a.analytics_enabled())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["False", "False"]


def test_a_question_does_not_wait_for_another_users_whole_upload(tmp_path):
    server = shared_server()
    feeder, asker = AppClient(server.url), AppClient(server.url)
    feeder.add_files([make_long_text(tmp_path / "long.txt", sentences=6000)])
    feeder.read()
    feeding = feeder.run_job()
    started = feeder.wait_for_phase("prefill", timeout_s=120)

    asker.submit("What is this about?")
    asker.run()
    during = feeder.panel()
    feeder.call("/stop")  # the rest of the upload proves nothing more here (and took 80 s of the suite)
    feeding.result()

    assert asker.last_answer() and "(empty answer)" not in asker.last_answer()
    assert during["phase"] == "prefill" and started["done"] <= during["done"] < during["total"], (
        f"the question waited for the other user's whole upload: {during}")


def wait_until_settled(app: AppClient, name: str, timeout_s: float = 60) -> None:
    """Until the model is idle for this session and ``name``'s row is final (not reading or waiting)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if app.panel()["phase"] == "idle":
            app.show()
            if not app.row(name)[1].startswith("…"):
                return
        time.sleep(0.1)
    raise AssertionError(f"the session's work did not end: {app.rows}")


def test_api_cancel_while_feeding_leaves_chat_export_and_context_consistent(tmp_path):
    app = AppClient(shared_server().url)
    app.submit("What is in the long file?", [make_long_text(tmp_path / "long.txt", sentences=6000)])
    app.read()
    job = app.run_job()
    app.wait_for_phase("prefill", timeout_s=120)
    job.cancel()
    wait_until_settled(app, "long.txt")

    assert app.context_tokens == 0
    assert app.row("long.txt")[1] == "■ cancelled" and "none of its" in app.row("long.txt")[4]
    assert "not in the context" in message_text(app.chat[0])
    _, exported = app.export()
    assert [m["in_context"] for m in exported["messages"] if m["kind"] == "question"] == [False]
    assert [d["status"] for d in exported["documents"]] == ["cancelled"]

    app.call("/regenerate")  # asks the cancelled question again, in its place: the last one the user asked
    app.run()
    questions = [message_text(m) for m in app.chat if m["role"] == "user"]
    assert questions == ["What is in the long file?"]  # the cancelled exchange gave way to the new answer
    assert app.chat[-1]["role"] == "assistant" and app.answers()
    _, exported = app.export()
    assert [m["in_context"] for m in exported["messages"] if m["kind"] == "question"] == [True]
