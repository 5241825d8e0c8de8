"""Workspace downloads served from the disk as they are: a link to the saved file in a folder Gradio serves
without copying it.

Gradio copies every file an event returns into its cache (an 89 MB workspace: 178 MB of temp after one
download, 267 after two) unless the file lies under a static path (``gr.set_static_paths``, its public API for
files served as they are). The links live in one folder under the workspaces folder, so a hard link is possible
(same disk: no bytes copied), each session's in a folder named by a random token (a URL names no workspace and
cannot be guessed). A session has one link at a time, and loses it when it is freed: a link kept would keep a
replaced save's bytes on disk. The whole folder is emptied at start and at stop.
"""

from __future__ import annotations

import os
import secrets
import shutil
import threading
from pathlib import Path

FOLDER = ".downloads"


class Downloads:
    def __init__(self, workspaces_root: Path):
        self.root = Path(workspaces_root) / FOLDER
        self._folders: dict[str, Path] = {}  # workspace id of the session downloading -> its folder
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Remove every link (start and stop: no session of this server is live)."""
        shutil.rmtree(self.root, ignore_errors=True)
        with self._lock:
            self._folders.clear()

    def link(self, session_id: str, source: Path, file_name: str) -> Path:
        """``source`` under ``file_name`` in a new folder of the session ``session_id``'s (its last one removed)."""
        self.release(session_id)
        folder = self.root / secrets.token_hex(16)
        folder.mkdir(parents=True, mode=0o700)
        with self._lock:
            self._folders[session_id] = folder
        target = folder / file_name
        try:
            os.link(source, target)
        except OSError:  # a filesystem without hard links: one copy, still served without a second
            shutil.copyfile(source, target)
        return target

    def release(self, session_id: str) -> None:
        """The session's link goes (a new download replaces it, or the session is freed)."""
        with self._lock:
            folder = self._folders.pop(session_id, None)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
