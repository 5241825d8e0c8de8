"""What the live panel last sent each browser tab, kept per tab: one workspace can be open in several tabs.

A timer tick sends only what changed since the tab's own last tick. Kept on the shared Session, the first tab
to tick took the change and every other tab showing the workspace got gr.skip() for it. Records are held
weakly by session (they go when the workspace is freed) and a tab's is dropped when the tab leaves.
"""

from __future__ import annotations

import threading
import weakref


class PanelSent:
    def __init__(self) -> None:
        self._by_session: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Session -> {tab: sent}
        self._lock = threading.Lock()

    def get(self, session, tab: str) -> dict:
        """What ``tab`` was last sent of ``session``'s panel ({} before its first panel)."""
        with self._lock:
            return self._by_session.get(session, {}).get(tab, {})

    def set(self, session, tab: str, sent: dict) -> None:
        with self._lock:
            self._by_session.setdefault(session, {})[tab] = sent

    def forget(self, tab: str) -> None:
        """The tab left: whatever it was sent no longer matters."""
        with self._lock:
            for tabs in self._by_session.values():
                tabs.pop(tab, None)
