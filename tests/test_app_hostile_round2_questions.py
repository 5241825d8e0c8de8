"""Hostile use, round 2 (issue 31), item 11: a question's length is capped (--max-question-tokens), and one
over the cap is refused the moment it is asked, before it waits for the model (an answer holds the model from
its question's first token to its last: a 31.5 KB question held it for 221 s)."""

from __future__ import annotations

import time

import gradio as gr
import pytest

from handler_fixtures import SETTINGS, drain, make_handlers, request

from app import cli


def test_the_cap_is_a_flag_with_a_default_of_a_few_thousand_tokens():
    assert cli.parse_args([]).max_question_tokens == 4096
    assert cli.parse_args(["--max-question-tokens", "100"]).max_question_tokens == 100
    with pytest.raises(SystemExit):
        cli.parse_args(["--max-question-tokens", "0"])


def test_a_question_over_the_cap_is_refused_at_once_in_the_chat_box_and_the_api(runtime):
    handlers = make_handlers(runtime, max_question_tokens=50)
    req = request("tab")
    long_question = "Why is the sky blue? " * 40
    started = time.perf_counter()
    with pytest.raises(gr.Error) as refused:
        handlers.submit({"text": long_question, "files": []}, req)
    assert time.perf_counter() - started < 1.0
    said = refused.value.message
    assert said.startswith("This question is ") and "tokens long; a question may have at most 50 tokens" in said
    assert "--max-question-tokens" in said and "as a file" in said
    session = handlers.registry.peek("tab")
    assert session.chat == [] and not session.pending  # nothing queued: the box keeps the text to shorten
    with pytest.raises(gr.Error, match="at most 50 tokens"):
        drain(handlers.ask(long_question, [], req))  # a generator (item 14): refused at its first step
    with pytest.raises(gr.Error, match=r"characters long; a question may have at most 50 tokens"):
        handlers.submit({"text": "x" * 1_000_000, "files": []}, req)  # refused without tokenising a megabyte
    assert session.chat == [] and not session.pending

    handlers.submit({"text": "Why is the sky blue?", "files": []}, req)  # under the cap: asked and answered
    drain(handlers.read(req))
    drain(handlers.run(*SETTINGS, req))
    assert session.chat[-1].kind == "answer" and session.chat[-1].text
