"""Another model from the Settings tab: every open workspace saved, then the server started again with it.

A context is the model's own keys and values, which no other model can read, and the model is shared by every
session. So a switch is a restart of the whole server under the new ``--model``, as a user would do it by hand
but without the terminal: ``app.py`` waits on ``ModelSwitch``, saves every workspace open in a browser (as at
Ctrl-C), and replaces its process with the same command and flags but the new ``--model`` (same address, same
port). The pages that were open reload once it listens again (``RELOAD_WHEN_BACK``). A saved workspace stays
in the list, marked with the model that read it, and opens under that model.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

from ..engine import bundled_model

APP_SCRIPT = Path(__file__).resolve().parents[2] / "app.py"  # what a restart runs again


class ModelSwitch:
    """The one request to restart with another model: the first asked wins, ``app.py`` acts on it."""

    def __init__(self) -> None:
        self._requested = threading.Event()
        self._lock = threading.Lock()
        self.model: str | None = None

    def request(self, model: str) -> bool:
        """Ask for a restart with the bundled model ``model``; False when one was asked for already."""
        with self._lock:
            if self._requested.is_set():
                return False
            self.model = model
            self._requested.set()
            return True

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Whether a switch was asked for within ``timeout_s`` (None: wait for it)."""
        return self._requested.wait(timeout_s)


def picker_choices() -> list[tuple[str, str]]:
    """The installed bundled models, as (label, short name) for the Settings dropdown."""
    return [(f"{bundled_model.BUNDLED[name].display_name} ({name})", name) for name in bundled_model.installed_names()]


def restart_argv(argv: list[str], model: str) -> list[str]:
    """``argv`` (app.py's flags) with ``--model`` set to ``model``: any ``--model X`` or ``--model=X`` given is
    dropped, the rest kept as given."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--model":
            skip = True
        elif not arg.startswith("--model="):
            kept.append(arg)
    return [*kept, "--model", model]


SWITCHED_FROM = "LMINFINITE_SWITCHED_FROM"  # the flags before a switch, for a start that cannot load the new model


def switched_from(environ=os.environ) -> list[str] | None:
    """The flags the server ran with before the switch that started this process, taken out of the environment
    (so a start with them does not fall back again); None when this start was no switch."""
    text = environ.pop(SWITCHED_FROM, None)
    try:
        flags = json.loads(text) if text else None
    except ValueError:
        return None
    return flags if isinstance(flags, list) and all(isinstance(f, str) for f in flags) else None


def restart(argv: list[str], switched_from_argv: list[str] | None = None) -> None:
    """Replace this process with ``app.py argv``; ``switched_from_argv``: the flags to start with again if the new
    model cannot be loaded (the server comes back as it was, rather than not at all)."""
    from ingest.pdf import stop_worker

    stop_worker()  # no exit handlers run across exec: its PDF worker process would be left behind
    if switched_from_argv is None:
        os.environ.pop(SWITCHED_FROM, None)
    else:
        os.environ[SWITCHED_FROM] = json.dumps(switched_from_argv)
    os.execv(sys.executable, [sys.executable, str(APP_SCRIPT), *argv])


# Run in the page after a switch was asked for: wait until the server has gone (its process replaced) and come
# back (the new model loaded), then reload; the reload reattaches the workspace the browser remembers.
RELOAD_WHEN_BACK = """
async (restarting) => {
  if (!restarting) return;
  const config = new URL("config", location.href.replace(/[?#].*$/, "").replace(/\\/?$/, "/"));
  let gone = false;
  for (let tries = 0; tries < 3600; tries++) {
    await new Promise((resolve) => setTimeout(resolve, 2000));
    try {
      const answer = await fetch(config, {cache: "no-store"});
      if (answer.ok && gone) { location.reload(); return; }
      gone = gone || !answer.ok;
    } catch (error) {
      gone = true;
    }
  }
}
"""
