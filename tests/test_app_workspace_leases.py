"""Replicas sharing one workspace folder: a workspace is held by one replica at a time, through a lease that a
crashed replica's stops renewing; a save never replaces another replica's newer save (app/session/workspace_lease.py).
The proxy in front and real replica processes: tests/test_deploy_replicas.py."""

from __future__ import annotations

import multiprocessing
import re
import threading
from pathlib import Path

import pytest

from app.session.workspace_lease import Leases, WorkspaceHeld
from handler_fixtures import SETTINGS, drain, make_handlers, request


class Clock:
    """Wall time that moves only when told."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_one_replica_holds_a_workspace_until_it_lets_go(tmp_path):
    workspace = tmp_path / "a.lmiw"
    clock = Clock()
    a, b = Leases("a", 30, clock), Leases("b", 30, clock)
    a.take(workspace)
    a.take(workspace)  # held already: renewed
    with pytest.raises(WorkspaceHeld, match="replica “a”") as held:
        b.take(workspace)
    assert held.value.replica == "a" and 29 <= held.value.ends_in_s <= 30
    assert b.held_elsewhere(workspace) is not None and a.held_elsewhere(workspace) is None
    a.release(workspace)
    assert not Leases.lease_path(workspace).exists()
    b.take(workspace)
    assert b.holds(workspace) and not a.holds(workspace)


def test_a_crashed_replicas_lease_ends_and_its_restart_takes_its_own_back_at_once(tmp_path):
    workspace, clock = tmp_path / "a.lmiw", Clock()
    Leases("a", 30, clock).take(workspace)  # then the replica dies: nobody renews
    b = Leases("b", 30, clock)
    clock.now += 29
    with pytest.raises(WorkspaceHeld):
        b.take(workspace)
    restarted = Leases("a", 30, clock)  # the same replica again (same host and port): no wait
    restarted.take(workspace)
    clock.now += 31
    b.take(workspace)  # ended: broken and taken
    assert b.holds(workspace)
    assert restarted.renew_all() == [workspace]  # it finds out at its next renewal that it lost it
    assert not restarted.holds(workspace)
    with pytest.raises(WorkspaceHeld, match="replica “b”"):
        restarted.take(workspace)


def test_renewing_keeps_a_lease_past_its_time_to_live(tmp_path):
    workspace, clock = tmp_path / "a.lmiw", Clock()
    a, b = Leases("a", 30, clock), Leases("b", 30, clock)
    a.take(workspace)
    for _ in range(5):
        clock.now += 20
        assert a.renew_all() == []
    with pytest.raises(WorkspaceHeld):
        b.take(workspace)


def test_a_save_by_another_replica_in_between_is_seen(tmp_path):
    workspace, clock = tmp_path / "a.lmiw", Clock()
    workspace.write_bytes(b"first save")
    a, b = Leases("a", 30, clock), Leases("b", 30, clock)
    a.take(workspace)
    assert not a.newer_save(workspace)
    workspace.write_bytes(b"a's own save, longer")
    a.saved(workspace)
    assert not a.newer_save(workspace)
    clock.now += 60  # a paused past its lease
    b.take(workspace)
    tmp = tmp_path / "b.tmp"
    tmp.write_bytes(b"b's save")
    tmp.replace(workspace)  # as atomic_file saves
    assert a.newer_save(workspace)  # still, after a's next take fails or succeeds
    with pytest.raises(WorkspaceHeld):
        a.take(workspace)
    assert a.newer_save(workspace)


def _race(path: str, replica: str, ended: bool, start, results) -> None:
    leases = Leases(replica, 30)
    start.wait()
    try:
        leases.take(Path(path))
        results.put(replica)
    except WorkspaceHeld:
        results.put("")


@pytest.mark.parametrize("ended", [False, True], ids=["free", "ended lease"])
def test_replicas_racing_for_one_lease_across_processes_one_wins(tmp_path, ended):
    """Four processes take the same lease at the same moment, 15 times over: exactly one holds it each time, also
    when they race to break a lease that ended."""
    context = multiprocessing.get_context("fork")
    for attempt in range(15):
        workspace = tmp_path / f"w{attempt}.lmiw"
        if ended:
            Leases.lease_path(workspace).write_text('{"replica": "gone", "token": "x", "expires": 1}')
        start, results = context.Barrier(4), context.Queue()
        racers = [context.Process(target=_race, args=(str(workspace), f"r{i}", ended, start, results))
                  for i in range(4)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(30)
        winners = [w for w in (results.get(timeout=5) for _ in racers) if w]
        assert len(winners) == 1, (attempt, winners)
        assert f'"replica": "{winners[0]}"' in Leases.lease_path(workspace).read_text()
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_a_late_breaker_leaves_the_lease_taken_in_place_of_the_ended_one(tmp_path):
    """Two replicas saw the same lease end; the first broke it and took it. The second breaks only under the lock
    and only what has ended, so the new lease stays (the CI failure of 2026-11-28: a second rename moved it aside,
    and a third replica took the name meanwhile, so two held it). While a live lock says someone else is breaking,
    a take waits for it and then finds who holds the lease; a lock left by a replica that died ends like a lease."""
    workspace, clock = tmp_path / "a.lmiw", Clock()
    lease = Leases.lease_path(workspace)
    lease.write_text('{"replica": "gone", "token": "x", "expires": 1}')
    a, b, c = (Leases(name, 30, clock) for name in "abc")
    a.take(workspace)
    assert b._break(lease)  # b, late, still thinks the lease has ended
    assert a.holds(workspace) and '"replica": "a"' in lease.read_text()
    with pytest.raises(WorkspaceHeld, match="replica “a”"):
        c.take(workspace)

    clock.now += 31  # a died; c died while breaking its lease, leaving the lock
    lock = lease.with_name(lease.name + ".breaking")
    lock.write_text(f'{{"replica": "c", "token": "break", "expires": {clock.now + 10}}}')
    with pytest.raises(WorkspaceHeld, match="replica “a”"):
        b.take(workspace)  # the lock is live: b waited its 2 s and gave up, breaking nothing
    assert '"replica": "a"' in lease.read_text()
    clock.now += 11  # the lock has ended too
    b.take(workspace)
    assert b.holds(workspace) and not lock.exists() and '"replica": "b"' in lease.read_text()


# -- two replicas' registries on one folder (in one process: the real servers are in test_deploy_replicas) ------
def _replica(runtime, folder: Path, name: str):
    handlers = make_handlers(runtime, workspaces=str(folder), replica=name, lease_s=3.0)
    handlers.registry.leases.start_renewing()
    return handlers


def _saved_workspace(handlers, tmp_path) -> str:
    req = request("writer")
    workspace_id = handlers.attach(None, req)[0]
    notes = tmp_path / "notes.txt"
    notes.write_text("The spare keys are in the blue drawer.\n" * 20, encoding="utf-8")
    drain(handlers.add_files([str(notes)], req))
    drain(handlers.run(*SETTINGS, req))
    drain(handlers.queue_save("Keys", req))
    drain(handlers.run(*SETTINGS, req))
    handlers.registry.close("writer")  # saved and freed at once? no: a browser tab waits for the grace period
    return workspace_id


def test_two_replicas_asked_to_open_one_workspace_at_once_one_holds_it_the_other_says_so(runtime, tmp_path):
    folder = tmp_path / "ws"
    a, b = _replica(runtime, folder, "a"), _replica(runtime, folder, "b")
    writer = _replica(runtime, folder, "writer")
    workspace_id = _saved_workspace(writer, tmp_path)
    writer.registry.save_all()  # the writer stops: its lease is given back
    start, shown = threading.Barrier(2), {}

    def open_on(handlers, name):
        start.wait()
        shown[name] = handlers.registry.attach(f"tab-{name}", workspace_id, None, fallback_new=False)

    threads = [threading.Thread(target=open_on, args=(h, n)) for h, n in ((a, "a"), (b, "b"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    opened = [name for name, (session, _) in shown.items() if session is not None]
    assert len(opened) == 1, shown
    holder, other = opened[0], ({"a", "b"} - set(opened)).pop()
    assert shown[holder][0].workspace_id == workspace_id and shown[holder][0].name == "Keys"
    assert re.fullmatch(f"“Keys” was not opened here: it is open on replica “{holder}” \\(its lease ends in [0-3] s "
                        "unless that replica renews it\\)\\. Reload this page to try again\\.", shown[other][1])
    with pytest.raises(Exception, match=f"open on replica “{holder}”"):  # nor deleted under the holder
        (b if holder == "a" else a).delete_workspace(workspace_id, request("tab-deleter"))
    for handlers in (a, b):
        handlers.registry.save_all()


def test_a_save_never_replaces_another_replicas_newer_save(runtime, tmp_path):
    """A replica that lost its lease (paused past it) and saves afterwards keeps both: its own becomes a copy."""
    folder = tmp_path / "ws"
    a = make_handlers(runtime, workspaces=str(folder), replica="a", lease_s=1.0)
    b = make_handlers(runtime, workspaces=str(folder), replica="b", lease_s=1.0)
    workspace_id = _saved_workspace(a, tmp_path)
    session = a.registry.peek("writer") or a.registry._live[workspace_id]
    path = a.registry.store.path(None, workspace_id)
    a.registry.leases._held.clear()  # a paused: it renews nothing, and its lease ends
    Leases.lease_path(path).write_text('{"replica": "a", "token": "old", "expires": 1}')
    reopened, _ = b.registry.reopen(workspace_id, None)
    b.registry.save_now(reopened)  # b's save: the file a read is replaced
    b_save = path.read_bytes()
    session.changes += 1  # a has something new to save
    a.registry.save_now(session)
    assert path.read_bytes() == b_save  # b's save stands
    assert session.workspace_id != workspace_id and "(copy: saved elsewhere meanwhile)" in session.name
    listed = {w.id: w.name for w in a.registry.store.list(None)}
    assert listed == {workspace_id: "Keys", session.workspace_id: "Keys (copy: saved elsewhere meanwhile)"}
    b.registry.save_all()
    a.registry.save_all()


# -- a tab whose page another replica served ------------------------------------------------------
def _cookie_request(name: str, replica: str | None):
    req = request(name)
    req.cookies = {} if replica is None else {"lminfinite_replica": replica}
    return req


def test_a_tab_served_by_a_replica_that_stopped_is_told_to_reload_not_given_an_empty_context(runtime, tmp_path):
    import gradio as gr

    b = make_handlers(runtime, workspaces=str(tmp_path / "ws"), replica="b")
    with pytest.raises(gr.Error, match="served by replica “a:7860”.*reload the page"):
        b.show(_cookie_request("tab-from-a", "a%3A7860"))  # the cookie as the page set it (quoted)
    assert b.registry.peek("tab-from-a") is None  # no empty session was made for it
    b.show(_cookie_request("tab-of-b", "b"))  # its own page: served
    b.show(_cookie_request("api-client", None))  # no page at all (a script): served, as before
    b.attach(None, _cookie_request("tab-from-a", "a%3A7860"))  # the reload's page load attaches it here ...
    b.show(_cookie_request("tab-from-a", "a%3A7860"))  # ... and then its requests are this replica's
    assert b.registry.peek("tab-from-a") is not None


def test_the_page_names_its_replica_in_a_cookie_and_nothing_else_does():
    import asyncio

    from app.web.replica_cookie import ReplicaCookie

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/html")]})
        await send({"type": "http.response.body", "body": b"ok"})

    def headers_of(method: str, path: str) -> list:
        sent = []

        async def send(message):
            sent.append(message)

        asyncio.run(ReplicaCookie(app, "host:7860")({"type": "http", "method": method, "path": path}, None, send))
        return sent[0]["headers"]

    assert (b"set-cookie", b"lminfinite_replica=host%3A7860; Path=/; HttpOnly; SameSite=Lax") in headers_of("GET", "/")
    assert all(name != b"set-cookie" for name, _ in headers_of("GET", "/gradio_api/info"))
    assert all(name != b"set-cookie" for name, _ in headers_of("POST", "/"))


def test_the_proxy_configuration_routes_each_replica_by_its_cookie_with_the_others_as_backups():
    import argparse

    from deploy.nginx_config import parse_replica, render

    text = render([("a", "10.0.0.5:7860"), ("b:1", "10.0.0.6:7860")], "443", 2_000_000, ("c.pem", "k.pem"))
    assert '"a" lminfinite_a;' in text and '"b%3A1" lminfinite_b_1;' in text  # the cookie's value, as quoted
    assert "upstream lminfinite_a {\n    server 10.0.0.5:7860 max_fails=1 fail_timeout=5s;\n" \
           "    server 10.0.0.6:7860 backup;\n}" in text
    assert "client_max_body_size 2000000;" in text and "listen 443 ssl;" in text and "proxy_buffering off;" in text
    with pytest.raises(ValueError):
        render([("a", "h:1"), ("a", "h:2")], "80", 1)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_replica("a=no-port")


def test_where_the_file_system_has_no_hard_links_an_exclusive_create_takes_the_lease(tmp_path, monkeypatch):
    import os

    def no_links(source, target):
        raise PermissionError(1, "Operation not permitted")  # as some FUSE, SMB and exFAT mounts answer

    monkeypatch.setattr(os, "link", no_links)
    workspace, clock = tmp_path / "a.lmiw", Clock()
    a, b = Leases("a", 30, clock), Leases("b", 30, clock)
    a.take(workspace)
    with pytest.raises(WorkspaceHeld, match="replica “a”"):
        b.take(workspace)
    clock.now += 31
    b.take(workspace)  # ended: broken and taken here too
    assert b.holds(workspace) and '"replica": "b"' in Leases.lease_path(workspace).read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.lease"]  # nothing left beside it


def test_a_shared_folder_that_cannot_be_written_refuses_the_reopen_and_keeps_the_file(runtime, tmp_path, monkeypatch):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"), replica="a")
    workspace_id = _saved_workspace(handlers, tmp_path)
    handlers.registry.save_all()
    path = handlers.registry.store.path(None, workspace_id)
    saved = path.read_bytes()
    reader = make_handlers(runtime, workspaces=str(tmp_path / "ws"), replica="b")

    def read_only(self, workspace_file, wait_s, poll_s=0.25):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Leases, "take_waiting", read_only)
    session, why = reader.registry.reopen(workspace_id, None)
    assert session is None and why == "“Keys” could not be opened: its folder cannot be written (PermissionError)."
    assert path.read_bytes() == saved
