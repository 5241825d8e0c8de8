"""Drills against a launched server over loopback: what a hostile or unlucky client can and cannot do."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from gradio_client import Client

from app_fixtures import ROOT, start_server


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
        with pytest.raises(Exception, match="belongs to another user"):
            bob.predict(api_name=api_name)

    chat = alice.predict(api_name="/show")[0]  # untouched
    assert any("alice's private question" in str(m["content"]) for m in chat)


def test_the_start_up_warning_names_the_readable_folders(auth_server):
    log = auth_server.log()
    assert "WARNING: --allow-local-paths" in log and str(auth_server.root.resolve()) in log


def test_the_app_sends_no_usage_analytics_by_default():
    env = {k: v for k, v in os.environ.items() if k != "GRADIO_ANALYTICS_ENABLED"}
    code = ("import app.server, gradio.analytics as a, os; "
            "print(os.environ['GRADIO_ANALYTICS_ENABLED'], a.analytics_enabled())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["False", "False"]
