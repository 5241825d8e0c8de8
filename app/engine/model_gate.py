"""Who runs the shared model next: answers and document feeds take turns.

Sessions' model steps run side by side (Gradio runs them in threads); the gate lets one forward through at
a time. An answer holds the gate from its question's prefill to its last token, so answers never
interleave (recall observers see one answer's forwards only). A document feed takes the gate one chunk at
a time and steps aside while an answer waits: a question waits behind at most one chunk of someone else's
document, not behind the whole upload. A feed that waited while an answer went has the next turn
(ANSWERS_BEFORE_A_FEED): sessions asking in a loop cannot keep an upload waiting for as long as they ask.

Ownership is a token (the session's cache), not a thread: a Gradio generator may resume on any worker thread.
While a session waits, its live panel says behind what and for how long, measured as it goes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

from .metrics import LiveStats, Phase

WAIT_TICK_S = 0.5  # how often a waiting session's "waited" line is refreshed
STALE_S = 30.0  # an answer idle between forwards this long was abandoned (a generator never closed)
ANSWERS_BEFORE_A_FEED = 1  # answers that may go while a feed waits before the feed's next chunk goes first


class ModelGate:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock  # when a hold lapses and how long a session waited; a test's clock moves on its own
        self._cond = threading.Condition()
        self._holder: object | None = None
        self._depth = 0
        self._holder_stats: LiveStats | None = None
        self._answers_waiting = 0
        self._feeds_waiting = 0
        self._answers_passed = 0  # answers that ended while a feed waited, since a feed's last turn
        self._holder_answer = False  # the holder's outermost turn is an answer's (held between its forwards)
        self._last_used = 0.0  # when the holder last entered or left a turn

    @contextmanager
    def turn(self, owner: object, *, answer: bool, stats: LiveStats | None = None):
        """Hold the model for ``owner`` (re-entrant for the same owner); ``answer`` goes before a feed that has
        not yet waited through ANSWERS_BEFORE_A_FEED answers."""
        self._acquire(owner, answer, stats)
        try:
            yield
        finally:
            self._release(owner)

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._holder is not None

    def _acquire(self, owner: object, answer: bool, stats: LiveStats | None) -> None:
        with self._cond:
            if self._holder is owner:
                self._depth += 1
                self._last_used = self._clock()
                return
            self._count_waiting(answer, +1)
            try:
                self._wait_for_turn(answer, stats)
            finally:
                self._count_waiting(answer, -1)
            if not answer:
                self._answers_passed = 0
            self._holder, self._depth, self._holder_stats = owner, 1, stats
            self._holder_answer = answer
            self._last_used = self._clock()

    def _count_waiting(self, answer: bool, change: int) -> None:
        if answer:
            self._answers_waiting += change
        else:
            self._feeds_waiting += change

    def _free_for(self, answer: bool) -> bool:
        """Whether a waiting answer (or feed chunk) may take the model now: an answer goes first, unless a feed
        has waited through ANSWERS_BEFORE_A_FEED answers already."""
        if not (self._holder is None or self._abandoned()):
            return False
        feeds_turn = self._feeds_waiting > 0 and self._answers_passed >= ANSWERS_BEFORE_A_FEED
        return not feeds_turn if answer else (feeds_turn or self._answers_waiting == 0)

    def _abandoned(self) -> bool:
        """An answer's hold lapses when it has sat between forwards for STALE_S (its generator was never resumed
        or closed); a forward in progress never does, however slow the model."""
        between_forwards = self._holder_answer and self._depth == 1
        return between_forwards and self._clock() - self._last_used > STALE_S

    def _wait_for_turn(self, answer: bool, stats: LiveStats | None) -> None:
        """Block (the condition's lock held) until free; meanwhile ``stats`` shows the measured wait."""
        if self._free_for(answer):
            return
        started = self._clock()
        shown = (stats.phase, stats.detail) if stats is not None else None
        try:
            while not self._free_for(answer):
                if stats is not None:
                    stats.phase, stats.detail = Phase.WAITING, self._waiting_line(self._clock() - started)
                self._cond.wait(WAIT_TICK_S)
        finally:
            if shown is not None:
                stats.phase, stats.detail = shown

    def _waiting_line(self, waited: float) -> str:
        holder = self._holder_stats
        if holder is None:
            what = "work"
        elif holder.answering:
            what = "answer"
        else:
            what = "documents"
        return f"behind another session's {what} · waited {waited:.1f} s"

    def _release(self, owner: object) -> None:
        with self._cond:
            if self._holder is not owner:
                return
            self._depth -= 1
            self._last_used = self._clock()
            if self._depth == 0:
                if self._holder_answer and self._feeds_waiting:
                    self._answers_passed += 1
                self._holder, self._holder_stats = None, None
                self._cond.notify_all()
