"""Two replicas of the app sharing one workspace folder, behind nginx configured by deploy/nginx_config.py, in
headless Chromium (docs/deploy.md). A replica stopped as a service manager stops it (SIGTERM) saves, and its user's
next page load reopens the workspace on the other, answering the next question token for token as the context never
moved would; a replica killed outright (SIGKILL) lets its workspaces go when their leases end, and they reopen
elsewhere from their last save; two replicas asked to open one saved workspace at the same moment: one holds it, the
other says which replica has it. The lease rules themselves: tests/test_app_workspace_leases.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from app_fixtures import launch_server
from benchmarks.launched_app import NGINX, AppServer, free_port, start_proxy
from test_app_browser import _table_includes, _wait_for_page_load, chromium, drop_and_ask

LEASE_S = "3"
NOTES = "The spare keys are in the blue drawer, behind the atlas.\n" * 30

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(NGINX), reason="nginx is not installed (apt-get install nginx)")]


class Cluster:
    """Replicas ``a`` and ``b`` on the loopback and nginx in front, all stopped at the end."""

    def __init__(self, tmp_path: Path):
        self.folder = tmp_path / "shared-workspaces"
        self.ports = {"a": free_port(), "b": free_port()}
        self.replicas: dict[str, AppServer] = {}
        self.prefix = tmp_path / "nginx"
        self.prefix.mkdir()
        self.url = ""  # the proxy's, once started
        self.proxy: subprocess.Popen | None = None

    def start(self, *names: str) -> None:
        """The named replicas, launched side by side; returns once each page answers."""
        for name in names:
            self.replicas[name] = launch_server("--workspaces", str(self.folder), "--replica", name,
                                                "--lease-seconds", LEASE_S, port=self.ports[name])
        for name in names:
            self.replicas[name].wait_until_ready()

    def start_proxy(self) -> None:
        self.proxy, self.url = start_proxy(self.ports, self.prefix)

    def kill(self, name: str) -> None:
        """SIGKILL: no save, no lease given back."""
        server = self.replicas[name]
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(10)

    def close(self) -> None:
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.terminate()
            self.proxy.wait(10)
        for server in self.replicas.values():
            server.stop()


@pytest.fixture
def cluster(tmp_path):
    made = Cluster(tmp_path)
    try:
        made.start("a", "b")
        made.start_proxy()
        yield made
    finally:
        made.close()


def _replica_of(page) -> str:
    """The replica that served the page, from the cookie the proxy routes by."""
    return next(c["value"] for c in page.context.cookies() if c["name"] == "lminfinite_replica")


def _messages(page) -> list[str]:
    """The chat's messages as shown, without the timings an answer's footer shows (they vary run to run)."""
    shown = page.evaluate("() => [...document.querySelectorAll('#chat .message')].map(m => m.innerText)")
    return [re.sub(r"\d+(\.\d+)? ?(s|ms|tok/s)\b", "#", text) for text in shown]


def _ask(page, question: str) -> str:
    """Send ``question`` and return the answer's text once it is complete."""
    before = len(_messages(page))
    page.fill("#chat-input textarea", question)
    page.keyboard.press("Enter")
    _wait_until_idle(page, before + 2)
    return _messages(page)[-1]


def _wait_until_idle(page, messages: int) -> None:
    page.wait_for_function("(n) => document.querySelectorAll('#chat .message').length >= n && "
                           "document.querySelector('#stop-button').disabled", arg=messages, timeout=120_000)


def _fed_page(browser, url: str, notes: Path):
    """A new browser (no cookie yet) that dropped ``notes`` and asked about them; its first answer."""
    page = browser.new_context(viewport={"width": 1280, "height": 1000}).new_page()
    page.goto(url)
    _wait_for_page_load(page)
    drop_and_ask(page, "#chat-input .full-container", notes, "text/plain", "Where are the spare keys?")
    _table_includes(page, "in context")
    _wait_until_idle(page, 2)
    return page, _messages(page)[-1]


def _notes(tmp_path: Path) -> Path:
    notes = tmp_path / "keys.txt"
    notes.write_text(NOTES, encoding="utf-8")
    return notes


def _reload(page) -> None:
    page.goto(page.url)
    _wait_for_page_load(page)


def test_a_stopped_replicas_user_goes_on_on_the_other_one_as_if_nothing_moved(cluster, tmp_path):
    notes = _notes(tmp_path)
    with chromium() as browser:
        page, first = _fed_page(browser, cluster.url, notes)
        served, other = _replica_of(page), {"a": "b", "b": "a"}[_replica_of(page)]
        cluster.replicas[served].stop()  # SIGTERM, as systemd or Kubernetes stops it: it saves what changed
        assert "saved 1 workspace changed since its last save" in cluster.replicas[served].log()

        _reload(page)  # the user's next page load: the proxy sends it to the other replica, which reopens it
        assert _replica_of(page) == other
        _table_includes(page, "keys.txt")
        assert _messages(page)[-1] == first
        moved = _ask(page, "And what is the book in front of them?")
        assert "Reopened workspace" in cluster.replicas[other].log()  # its toast may be gone by now, under load

        # The same two questions in a context that never moved answer the same, token for token.
        fresh, fresh_first = _fed_page(browser, cluster.url, notes)
        assert _replica_of(fresh) == other and fresh_first == first
        assert _ask(fresh, "And what is the book in front of them?") == moved


def test_a_killed_replicas_workspace_opens_elsewhere_from_its_last_save_once_its_lease_ends(cluster, tmp_path):
    with chromium() as browser:
        page, first = _fed_page(browser, cluster.url, _notes(tmp_path))
        served, other = _replica_of(page), {"a": "b", "b": "a"}[_replica_of(page)]
        page.get_by_role("tab", name="Workspaces").click()
        page.click("#save-button")
        page.wait_for_function("() => document.querySelector('#workspaces-table').innerText.includes('●')",
                               timeout=30_000)
        _ask(page, "Is anything else in the drawer?")  # after the save: lost with the replica
        cluster.kill(served)
        lease = next(cluster.folder.glob("*/*.lease"))
        assert f'"replica": "{served}"' in lease.read_text()  # nobody gave it back

        started = time.monotonic()
        _reload(page)
        assert _replica_of(page) == other
        _table_includes(page, "keys.txt")
        assert time.monotonic() - started < float(LEASE_S) + 30
        texts = _messages(page)
        assert texts[-1] == first and not any("anything else in the drawer" in t for t in texts)
        assert f'"replica": "{other}"' in lease.read_text()


def _open_listed(page, listed: str) -> None:
    """Choose the saved workspace whose list line shows ``listed`` (Workspaces tab), ready for Open."""
    page.get_by_role("tab", name="Workspaces").click()
    page.locator("#workspaces-table .cell-wrap >> visible=true").filter(has_text=listed).first.click()
    page.wait_for_function("() => document.querySelector('#workspace-choice input').value.length > 0",
                           timeout=30_000)


def test_two_replicas_asked_to_open_one_workspace_at_once_one_holds_it_the_other_says_which(cluster, tmp_path):
    with chromium() as browser:
        page, _ = _fed_page(browser, cluster.url, _notes(tmp_path))
        served = _replica_of(page)
        cluster.replicas[served].stop()  # saved, and its lease given back
        cluster.start(served)  # back, on the same folder: both replicas can open it now
        pages = {}
        for name in ("a", "b"):  # each straight at its replica, past the proxy
            pages[name] = browser.new_context(viewport={"width": 1280, "height": 1000}).new_page()
            pages[name].goto(cluster.replicas[name].url)
            _wait_for_page_load(pages[name])
            _open_listed(pages[name], "Where are the spare keys?")
        for name in ("a", "b"):
            pages[name].click("#open-workspace")
        for name in ("a", "b"):
            pages[name].wait_for_function(
                "() => document.querySelector('#chat').innerText.includes('spare keys') || "
                "document.body.innerText.includes('is open on replica')", timeout=60_000)
        holders = [n for n in ("a", "b") if "spare keys" in pages[n].inner_text("#chat")]
        assert len(holders) == 1, holders
        other = {"a": "b", "b": "a"}[holders[0]]
        assert f"is open on replica “{holders[0]}”" in pages[other].inner_text("body")
        assert "spare keys" not in pages[other].inner_text("#chat")
