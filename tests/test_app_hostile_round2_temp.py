"""Hostile use, round 2 (issue 31), item 16 (temporary folders): session folders left by a stopped or killed
server are removed at the next start, never those of a server still running, and a server removes its own at
stop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from handler_fixtures import make_handlers, request


def test_session_folders_live_under_the_servers_own_folder_and_go_at_stop_and_at_the_next_start(runtime, tmp_path,
                                                                                             monkeypatch):
    from app.session import temp_folders

    monkeypatch.setattr(temp_folders.tempfile, "tempdir", str(tmp_path))
    temp_folders.server_temp_root.cache_clear()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left_behind = tmp_path / f"lminfinite-chat-{int(dead.stdout)}-abcd" / "session-x"
    left_behind.mkdir(parents=True)
    (left_behind / "export.md").write_text("a chat")
    beside = tmp_path / f"lminfinite-chat-{os.getppid()}-efgh"  # a server still running (this test's parent)
    beside.mkdir()
    unrelated = tmp_path / "something-else"
    unrelated.mkdir()

    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))  # a server starting
    assert not left_behind.parent.exists() and beside.exists() and unrelated.exists()
    session = handlers.registry.get("tab")
    own = Path(session.tmpdir)
    assert own.parent.name.startswith(f"lminfinite-chat-{os.getpid()}-") and own.parent.parent == tmp_path
    handlers.export(request("tab"))
    assert any(own.iterdir())

    handlers.registry.save_all()  # the server stopping
    temp_folders.remove_own()
    assert not own.parent.exists() and beside.exists()


def test_icons_and_avatars_are_served_from_static_so_the_hourly_cache_clean_up_cannot_remove_them(runtime, tmp_path):
    """Issue "What a user sees", item 3: icons and avatars were copies in Gradio's cache, which the app's
    ``delete_cache`` empties of files over an hour old; after an hour every icon answered 403 until a restart."""
    from app.web.server import build_app
    from app.web.ui import STATIC_DIR
    from app.cli import AppConfig
    from app.engine.budget import Budget

    demo, _ = build_app(AppConfig(model="test", workspaces=str(tmp_path / "ws")), runtime, Budget(10_000, "test", 1))
    served = []

    def paths(value):
        if isinstance(value, dict):
            if isinstance(value.get("path"), str) and value["path"].endswith(".svg"):
                served.append(Path(value["path"]).resolve())
            for item in value.values():
                paths(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                paths(item)

    paths(demo.get_config_file()["components"])
    assert len(served) >= 4  # the two avatars and the buttons' icons
    assert all(path.parent == STATIC_DIR.resolve() for path in served), served
