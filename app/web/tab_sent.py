"""What each browser tab was last sent of its workspace, kept per tab: one workspace can be open in several tabs.

A timer tick sends only what changed since the tab's own last tick; a progress view skips the documents table the
tab already has; an export's files are hidden once the chat this tab exported has moved on. Kept on the shared
Session, the first tab to be sent a change took it and every other tab showing the workspace got gr.skip() for it.
Records are held weakly by session (they go when the workspace is freed) and a tab's is dropped when the tab leaves.
"""

from __future__ import annotations

import threading
import weakref


class TabSent:
    def __init__(self) -> None:
        self._by_session: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Session -> {tab: sent}
        self._lock = threading.Lock()

    def get(self, session, tab: str) -> dict:
        """What ``tab`` was last sent of ``session`` ({} before anything was)."""
        with self._lock:
            return self._by_session.get(session, {}).get(tab, {})

    def update(self, session, tab: str, **sent) -> None:
        """Record what ``tab`` was just sent; the rest of its record stays. A new record each time: one read
        with ``get`` before is not changed under its reader."""
        with self._lock:
            tabs = self._by_session.setdefault(session, {})
            tabs[tab] = {**tabs.get(tab, {}), **sent}

    def forget(self, tab: str) -> None:
        """The tab left: whatever it was sent no longer matters."""
        with self._lock:
            for tabs in self._by_session.values():
                tabs.pop(tab, None)
