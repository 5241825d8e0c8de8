"""A model step that goes on after the request that ran it has its reply.

``/ask`` with documents gets its answer between two chunks of their feed (model_work.py): on a CPU that is minutes
before the feed ends, and the script that called it should have the answer then. The step, a generator that holds
the session's model step, is handed to a thread that runs it to its end as the request would have; Stop, a closed
session and the server's shutdown end it the same way.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


def finish_unattended(steps, name: str) -> threading.Thread:
    """Run the rest of ``steps`` in a daemon thread called ``name``; what it yields goes nowhere."""
    def drain():
        try:
            for _ in steps:
                pass
        except Exception:  # noqa: BLE001 - nobody waits for it: say it in the log, as a request's error would be
            log.exception("%s failed after its reply was sent", name)
        finally:
            steps.close()

    thread = threading.Thread(target=drain, name=name, daemon=True)
    thread.start()
    return thread
