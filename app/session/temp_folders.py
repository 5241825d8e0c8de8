"""This server's temporary folders (each session's exports and downloads), under one folder per process.

Sessions made their folders straight in the system's temp folder, so a server stopped by SIGTERM, or killed,
left them behind (11-46 per run). Now they live under ``lminfinite-chat-<pid>-…``: the server removes its own at
stop, and at start the folders of servers that are no longer running (another server running beside it keeps
its own).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from pathlib import Path

PREFIX = "lminfinite-chat-"
_OURS = re.compile(re.escape(PREFIX) + r"(\d+)-")


@functools.cache
def server_temp_root() -> Path:
    """This process's folder for session folders, made on first use."""
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))


def session_temp_folder() -> str:
    """A new session's own folder."""
    return tempfile.mkdtemp(prefix="session-", dir=server_temp_root())


def remove_own() -> None:
    """The server is stopping: its sessions' folders go."""
    shutil.rmtree(server_temp_root(), ignore_errors=True)
    server_temp_root.cache_clear()


def remove_stale(folder: str | None = None) -> int:
    """Remove the folders left by servers no longer running; returns how many."""
    removed = 0
    for path in Path(folder or tempfile.gettempdir()).glob(PREFIX + "*"):
        match = _OURS.match(path.name)
        if match is None or not path.is_dir() or _running(int(match.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: running
        return True
    return True
