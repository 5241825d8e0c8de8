"""A session's actions in order: those waiting and running, the one model step that runs them, and the operations
in progress that a close waits for.

It shares its session's lock (state.py): an action joins the queue and its items join the chat in one step.
"""

from __future__ import annotations

from collections import deque
from contextlib import contextmanager
from enum import StrEnum
from typing import Protocol


class Stage(StrEnum):
    """An action's way through the queues: queued -> (reading) -> read -> done."""

    QUEUED = "queued"
    READ = "read"
    DONE = "done"


class QueuedAction(Protocol):
    """What the queue reads of an action (state.Work): how far it got, and whether its files are being read."""

    stage: Stage
    reading: bool


class WorkQueue:
    def __init__(self, lock) -> None:
        self.lock = lock  # the session's
        self.pending: deque[QueuedAction] = deque()
        self.model_step = False  # a request of this session is running its actions on the model
        self.busy = 0  # operations in progress (``working``)
        self.closed = False  # no model step takes work; the last operation to end frees the session

    def claim_model_step(self) -> bool:
        """Become the session's one model step; False when another request of this session is it already
        (model steps of different sessions run side by side, one session's actions run in order)."""
        with self.lock:
            if self.model_step:
                return False
            self.model_step = True
            return True

    def next_model_work(self) -> QueuedAction | None:
        """The oldest action for the model step, or None, releasing the step, when there is none yet (or it is
        still being read: that action's own model step comes after its reading step). One lock for both, so
        an action queued meanwhile is never left without a step."""
        with self.lock:
            work = self.pending[0] if self.pending and not self.closed else None
            if work is None or (work.stage == Stage.QUEUED and work.reading):
                self.model_step = False
                return None
            return work

    def release_model_step(self) -> None:
        with self.lock:
            self.model_step = False

    @contextmanager
    def working(self, release):
        """Mark an operation in progress; ``release`` (the session's freeing) runs when the last one ends after a
        close."""
        with self.lock:
            self.busy += 1
        try:
            yield
        finally:
            with self.lock:
                self.busy -= 1
                last = self.closed and not self.busy
            if last:
                release()
