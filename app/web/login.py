"""--auth's password check, with a growing wait after wrong passwords.

Gradio checks a login against the accounts it is given as fast as requests come: 200 wrong passwords in a
second, then the right one, all answered. Here each name (a user's, or any name tried) gets a few free tries;
after them every wrong password makes the next try wait twice as long as the last (1 s, 2 s, 4 s, ... up to
5 minutes), and a try before the wait is over is refused unchecked, with HTTP 429 saying how long is left.
Guessing a password then takes days, not seconds. The right password, once the wait is over, logs in and
clears the count.

The wait is per name, whoever tries (Gradio hands the check a name and a password, not the client): someone
who knows a user's name can keep that user waiting, at most 5 minutes after their last wrong try.
"""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from fastapi import HTTPException

FREE_TRIES = 3  # wrong passwords tried before the first wait (a typo or two)
FIRST_WAIT_S = 1.0  # the wait after the last free try; each wrong password after it doubles the wait
LONGEST_WAIT_S = 300.0
NAMES_KEPT = 10_000  # names whose wrong tries are remembered (the oldest forgotten first): bounded memory
TOO_MANY = 429


@dataclass
class _Tries:
    wrong: int = 0
    wait_until: float = 0.0


class LoginGuard:
    """The ``auth`` callable given to Gradio's launch: True for a right USER:PASS, False for a wrong one, and
    HTTPException(429) while the name must wait."""

    def __init__(self, accounts: list[tuple[str, str]], *, first_wait_s: float = FIRST_WAIT_S,
                 clock=time.monotonic):
        self._passwords = {user: password.encode("utf-8", "surrogatepass") for user, password in accounts}
        self._first_wait_s = first_wait_s
        self._clock = clock
        self._tries: OrderedDict[str, _Tries] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, username: str, password: str) -> bool:
        with self._lock:
            left = self._waiting(username)
        if left > 0:
            raise HTTPException(status_code=TOO_MANY, headers={"Retry-After": str(math.ceil(left))},
                                detail=f"Too many wrong passwords for this user: try again in {math.ceil(left)} s.")
        right = self._is_right(username, password)
        with self._lock:
            if right:
                self._tries.pop(username, None)
            else:
                self._wrong(username)
        return right

    def _is_right(self, username: str, password: str) -> bool:
        """Compared in constant time, and as long for an unknown name as for a known one."""
        expected = self._passwords.get(username)
        given = str(password).encode("utf-8", "surrogatepass")
        same = hmac.compare_digest(given, expected if expected is not None else given + b"\0")
        return expected is not None and same

    def _waiting(self, username: str) -> float:
        """Seconds ``username`` must still wait before its next try is checked (under the lock)."""
        tries = self._tries.get(username)
        return 0.0 if tries is None else max(0.0, tries.wait_until - self._clock())

    def _wrong(self, username: str) -> None:
        """Count a wrong password; past the free tries, the next try waits (under the lock)."""
        tries = self._tries.pop(username, None) or _Tries()
        tries.wrong += 1
        if tries.wrong >= FREE_TRIES:
            wait = min(LONGEST_WAIT_S, self._first_wait_s * 2 ** min(tries.wrong - FREE_TRIES, 32))
            tries.wait_until = self._clock() + wait
        self._tries[username] = tries  # the most recent last
        while len(self._tries) > NAMES_KEPT:
            self._tries.popitem(last=False)
