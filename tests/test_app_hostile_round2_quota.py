"""Hostile use, round 2 (issue 31), item 16 (disk): each user's saved workspaces are capped by
--workspace-quota; a save or an import that would cross it is refused, saying so, and the previous save stays."""

from __future__ import annotations

import pytest

from app_fixtures import make_long_text
from handler_fixtures import SETTINGS, drain, make_handlers, request
from test_app_hostile_round2 import ask, toasts

from app import cli


def test_the_quota_is_a_size_flag_off_by_default():
    assert cli.parse_args([]).workspace_quota is None
    assert cli.parse_args(["--workspace-quota", "2GB"]).workspace_quota == 2 * 2**30
    with pytest.raises(SystemExit):
        cli.parse_args(["--workspace-quota", "0"])


def test_a_save_or_import_over_the_users_quota_is_refused_and_the_previous_save_stays(runtime, tmp_path):
    roomy = make_handlers(runtime, workspaces=str(tmp_path / "ws"), auth=[("alice", "x"), ("bob", "y")])
    req = request("tab", "alice")
    workspace_id = roomy.attach(None, req)[0]
    ask(roomy, req, "What is this about?", [make_long_text(tmp_path / "notes.txt", 10)])
    drain(roomy.queue_save("First", req))
    drain(roomy.run(*SETTINGS, req))
    first = roomy.registry.store.path("alice", workspace_id)
    size = first.stat().st_size
    saved_bytes = first.read_bytes()
    downloaded = tmp_path / "first.lmiw"
    downloaded.write_bytes(saved_bytes)
    roomy.unload(req)

    tight = make_handlers(runtime, workspaces=str(tmp_path / "ws"), auth=[("alice", "x"), ("bob", "y")],
                          workspace_quota=size + size // 2)
    req = request("tab-2", "alice")
    assert tight.attach(workspace_id, req)[0] == workspace_id
    ask(tight, req, "And then?", [make_long_text(tmp_path / "more.txt", 30)])  # a bigger context now
    drain(tight.queue_save("Second", req))
    view = drain(tight.run(*SETTINGS, req))
    note = tight.registry.peek("tab-2").stop_note
    assert note.startswith("⚠ Not saved: alice's saved workspaces would take "), note
    assert "--workspace-quota" in note and "the previous save is intact" in note and "Not saved" in view[4]
    assert first.read_bytes() == saved_bytes  # the first save, whole

    _, said = toasts(lambda: tight.import_workspace(str(downloaded), req))  # a second copy would cross it too
    assert said and said[0].startswith("Not imported: alice's saved workspaces would take "), said
    assert [w.id for w in tight.registry.store.list("alice")] == [workspace_id]
    _, said = toasts(lambda: tight.import_workspace(str(downloaded), request("bob-tab", "bob")))  # bob has room
    assert said and said[0].startswith("Reopened"), said
