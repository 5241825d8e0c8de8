"""A clock a test moves on by hand, so that time passes for a time-out or a lapse without sleeping."""

from __future__ import annotations

import time


class FakeClock:
    """time.monotonic plus the seconds ``advance`` added: it reads the real clock's seconds (a session stamps
    its last action with time.monotonic), only further on."""

    def __init__(self) -> None:
        self.ahead_s = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.ahead_s

    def advance(self, seconds: float) -> None:
        self.ahead_s += seconds
