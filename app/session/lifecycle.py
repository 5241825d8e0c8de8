"""Where a live workspace stands with the registry: the tabs showing it, whether a browser had it open, when it
was left, whether it is being saved and freed, and how far its last save went.

The registry (registry.py) is its one writer, under its lock (as the Session's own fields were before); the
Session reads only ``saved_changes`` (``Session.unsaved``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Lifecycle:
    tabs: set[str] = field(default_factory=set)  # the browser tabs (Gradio session hashes) showing it now
    in_browser: bool = False  # a page load attached it: it is saved when left, and reopened on reload
    detached_at: float | None = None  # when its last tab left (the registry's clock)
    retiring: bool = False  # the registry is saving and freeing it (SessionRegistry._retire)
    saved_changes: int = 0  # Session.changes when its file was last written
