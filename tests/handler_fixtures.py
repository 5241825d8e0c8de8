"""The event functions in-process: Handlers built as the server builds them, and fake requests.

The demo model's ``runtime`` fixture is in conftest.py."""

from __future__ import annotations

import time
from types import SimpleNamespace

from app.engine.budget import Budget
from app.cli import AppConfig
from app.web.server import build_app

SETTINGS = ("You are a helpful assistant.", 0.0, 0.9, 16, 1.0, True, 5, True, True)  # greedy, as the Settings panel starts


def make_handlers(runtime, budget_tokens=1_000_000, budget: Budget | None = None, clock=time.monotonic, **config):
    config = AppConfig(model="test", **config)
    _, handlers = build_app(config, runtime, budget or Budget(budget_tokens, "test budget", 1), clock=clock)
    handlers.upload_root = None  # these tests hand files from a tmp dir, not from Gradio's upload folder
    return handlers


def request(name: str, username: str | None = None):
    return SimpleNamespace(session_hash=name, username=username)


def drain(generator):
    last = None
    for last in generator:
        pass
    return last


def wait_until(condition, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
