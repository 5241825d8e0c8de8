"""The event functions in-process, for what the UI shows around the work: Regenerate, the live panel's
timer, Stop / Cancel, the stop note and the export's files."""

from __future__ import annotations

import time

import pandas as pd
import pytest
import torch

from app.engine import context as engine_module
from app.web import handlers as handlers_module
from app.engine.metrics import DeviceMemory
from app_fixtures import make_pdf
from handler_fixtures import SETTINGS, drain, make_handlers, request

SKIP = {"__type__": "update"}  # gr.skip()
# Handlers.view: chat, documents, context, activity, stop note, export files, Stop, Cancel.
STOP_NOTE, EXPORT, STOP, CANCEL = 4, 5, 6, 7


@pytest.fixture
def handlers(runtime):
    return make_handlers(runtime)


def skipped(outputs) -> list[bool]:
    return [isinstance(value, dict) and value == SKIP for value in outputs]


def ask(handlers, req, text="", files=()):
    handlers.submit({"text": text, "files": [str(f) for f in files]}, req)
    drain(handlers.read(req))
    return drain(handlers.run(*SETTINGS, req))


def test_regenerate_samples_when_decoding_is_greedy_and_times_from_the_request(handlers, tmp_path, monkeypatch):
    """At temperature 0 Regenerate gave the same answer again, with "first token 1 ms" (timed from its cached
    logits): it samples that one answer, says so, and times the first token from the click."""
    req = request("regenerate")
    ask(handlers, req, "What is the pass key?", files=[make_pdf(tmp_path / "r.pdf")])
    session = handlers.registry.peek("regenerate")
    greedy = session.chat[-1].text
    sampled_with = []
    next_token = engine_module.next_token
    monkeypatch.setattr(engine_module, "next_token", lambda logits, answer, settings, *rest: (
        sampled_with.append((settings.temperature, settings.top_p)) or next_token(logits, answer, settings, *rest)))

    handlers.queue_regenerate(req)
    time.sleep(0.3)  # waiting for the model queue is part of the user's wait
    view = drain(handlers.run(*SETTINGS, req))
    answer = session.chat[-1]
    assert set(sampled_with) == {(0.7, 0.9)}
    assert answer.in_context and answer.stats["sampling"] == "regenerated with sampling, temperature 0.7"
    assert "· regenerated with sampling, temperature 0.7</sub>" in view[0][-1]["content"]
    assert answer.stats["ttft_s"] >= 0.3
    torch.manual_seed(0)
    for _ in range(10):  # the demo model is sure of itself: most samples are its greedy answer again
        if session.chat[-1].text != greedy:
            break
        handlers.queue_regenerate(req)
        drain(handlers.run(*SETTINGS, req))
    assert session.chat[-1].text != greedy

    sampled_with.clear()
    handlers.queue_regenerate(req)  # a temperature the user chose is kept, and the footer adds nothing
    drain(handlers.run(SETTINGS[0], 1.0, 0.8, *SETTINGS[3:], req))
    assert set(sampled_with) == {(1.0, 0.8)} and "sampling" not in session.chat[-1].stats


def test_idle_ticks_send_nothing(handlers, tmp_path, monkeypatch):
    """An idle tab redrew its panel and both plots every second: unchanged outputs are now skipped."""
    memory = DeviceMemory("cpu", 500 * 2**20, None, 600 * 2**20, 8 * 2**30, "CPU (process RSS)")
    monkeypatch.setattr(handlers_module, "device_memory", lambda kind: memory)  # the process's RSS jitters
    req = request("ticks")
    loaded = handlers.panel(req)  # page load: the whole panel
    assert isinstance(loaded[0], str) and isinstance(loaded[1], pd.DataFrame) and not any(skipped(loaded))
    for _ in range(2):
        assert skipped(handlers.tick(req)) == [True] * 5

    ask(handlers, req, files=[make_pdf(tmp_path / "r.pdf")])  # work between ticks: the cache grew
    panel, memory_plot, prefill_plot, data, decode_plot = handlers.tick(req)
    assert "tokens" in panel and len(memory_plot) > len(loaded[1]) and data["context_tokens"] > 0
    for plot, series in ((prefill_plot, "prefill"), (decode_plot, "decode")):  # each on its own scale
        assert set(plot["series"]) == {series} and list(plot["value"]) == [0.0] * len(plot)  # idle: no stale rates
    assert skipped(handlers.tick(req)) == [True] * 5


def test_a_work_that_ends_as_stop_lands_leaves_no_stopping_note(handlers, monkeypatch):
    """The note was set after the work was told to stop; a work ending in between left "Stopping 1 action…"
    on screen for good."""
    from app.session.state import Session

    req = request("stop-race")
    handlers.submit({"text": "What is the pass key?", "files": []}, req)
    session = handlers.registry.peek("stop-race")
    stop = Session.stop

    def stop_and_the_work_ends(self, **kwargs):
        told = stop(self, **kwargs)
        self.finish_work(self.pending[0])  # the model step saw the cancel and ended right away
        return told

    monkeypatch.setattr(Session, "stop", stop_and_the_work_ends)
    handlers.stop(req)
    assert not session.has_work and session.stop_note == "" and handlers.controls(req)[0] == ""


def test_the_stop_note_and_the_buttons_are_read_together(handlers):
    """The buttons' state and the note were read one after the other: a work ending in between showed Stop and
    Cancel active with nothing to stop (or, read the other way round, a stale note beside idle buttons). Here the
    work ends, in its own thread as it does, right after the reader has looked at its pending work."""
    import threading

    req = request("torn-read")
    handlers.submit({"text": "What is the pass key?", "files": []}, req)
    session = handlers.registry.peek("torn-read")
    handlers.stop(req)
    before, after = ("Stopping 1 action…", True), ("", False)
    started, ended = threading.Event(), threading.Event()

    class EndsWhileRead(list):
        def __bool__(self):
            had_work = len(self) > 0
            if had_work and not started.is_set():
                started.set()
                threading.Thread(target=lambda: (session.finish_work(self[0]), ended.set())).start()
                ended.wait(0.5)  # it ends now, unless the reader holds the lock that ends work
            return had_work

    session.queue.pending = EndsWhileRead(session.queue.pending)
    note, stop, cancel = handlers.controls(req)
    assert (note, stop["interactive"]) in (before, after) and cancel["interactive"] == stop["interactive"]
    assert ended.wait(10)
    note, stop, cancel = handlers.controls(req)
    assert (note, stop["interactive"], cancel["interactive"]) == ("", False, False)


def test_stop_cancel_note_and_export_follow_the_work(handlers, tmp_path):
    req = request("controls")
    view = handlers.show(req)
    assert view[STOP]["interactive"] is False and view[CANCEL]["interactive"] is False  # nothing to stop

    assert handlers.stop(req) == "Nothing to stop."
    assert handlers.controls(req)[0] == "Nothing to stop."  # true while there is no work
    out = handlers.submit({"text": "What is the pass key?", "files": [str(make_pdf(tmp_path / "r.pdf"))]}, req)
    view = out[1:]
    assert view[STOP_NOTE] == ""  # the note about no work does not stay through the new work
    assert view[STOP]["interactive"] is True and view[CANCEL]["interactive"] is True
    drain(handlers.read(req))
    assert handlers.stop(req) == "Stopping 1 action…"
    assert handlers.show(req)[STOP_NOTE] == "Stopping 1 action…"
    view = drain(handlers.run(*SETTINGS, req))
    assert view[STOP_NOTE] == "" and view[STOP]["interactive"] is False and view[CANCEL]["interactive"] is False
    note, stop, cancel = handlers.controls(req)  # after Stop's reply and after the model step: the same
    assert note == "" and stop["interactive"] is False and cancel["interactive"] is False

    exported = handlers.export(req)
    assert exported.visible and handlers.show(req)[EXPORT] == SKIP  # nothing changed: the files stay
    out = handlers.submit({"text": "And now?", "files": []}, req)
    assert out[1 + EXPORT] == {"__type__": "update", "value": None, "visible": False}  # the chat moved on
    view = drain(handlers.run(*SETTINGS, req))
    assert view[EXPORT] == SKIP
