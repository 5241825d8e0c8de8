"""The event functions in-process (no HTTP): server paths, the context budget, out-of-memory, disconnects."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pytest
import torch

from app.budget import Budget
from app.cli import AppConfig
from app.model_loading import ModelChoice, load_runtime
from app.server import build_app
from app_fixtures import make_pdf, make_repo_zip, model_dir

SETTINGS = ("You are a helpful assistant.", 0.0, 0.9, 16, 1.0, True, 5)


@pytest.fixture(scope="module")
def runtime():
    threads = torch.get_num_threads()
    directory = str(model_dir())
    yield load_runtime(AppConfig(model=directory, cpu_threads=1), ModelChoice(directory, "test"))
    torch.set_num_threads(threads)


def make_handlers(runtime, budget_tokens=1_000_000, **config):
    config = AppConfig(model="test", **config)
    _, handlers = build_app(config, runtime, Budget(budget_tokens, "test budget", 1))
    handlers.upload_root = None  # these tests hand files from a tmp dir, not from Gradio's upload folder
    return handlers


def request(name: str):
    return SimpleNamespace(session_hash=name)


def drain(generator):
    last = None
    for last in generator:
        pass
    return last


def rows_of(view):
    return {row[0]: row for row in view[1]}


def ask(handlers, req, text="", files=()):
    handlers.submit({"text": text, "files": [str(f) for f in files]}, req)
    drain(handlers.read(req))
    return drain(handlers.run(*SETTINGS, req))


def test_server_paths_need_the_flag(runtime, tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    closed = make_handlers(runtime)
    with pytest.raises(gr.Error, match="--allow-local-paths"):
        closed.add_server_path(str(repo), request("a"))

    opened = make_handlers(runtime, allow_local_paths=True)
    opened.add_server_path(str(repo), request("b"))
    drain(opened.read(request("b")))
    view = drain(opened.run(*SETTINGS, request("b")))
    assert rows_of(view)["repo/pkg/mod.py"][1] == "✓ in context"  # a folder's entries carry its name


def test_budget_refuses_a_document_before_any_work(runtime, tmp_path):
    handlers = make_handlers(runtime, budget_tokens=400)
    forwarded = runtime.tokens_forwarded
    view = ask(handlers, request("c"), files=[make_pdf(tmp_path / "long.pdf", pages=6)])
    row = rows_of(view)["long.pdf"]
    assert row[1] == "⊘ refused" and "context budget" in row[4]
    assert runtime.tokens_forwarded == forwarded  # nothing was fed
    assert handlers.registry.peek("c").context_tokens == 0


def test_out_of_memory_is_reported_and_the_server_keeps_serving(runtime, tmp_path, monkeypatch):
    handlers = make_handlers(runtime)
    req = request("d")
    ask(handlers, req, files=[make_pdf(tmp_path / "r.pdf")])
    tokens = handlers.registry.peek(req.session_hash).context_tokens
    model_forward = runtime.model.forward

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(runtime.model, "forward", out_of_memory)
    view = ask(handlers, req, "What is the pass key?")
    assert "ran out of memory" in view[0][-1]["content"] and "rolled back" in view[0][-1]["content"]
    assert handlers.registry.peek(req.session_hash).context_tokens == tokens
    view = ask(handlers, req, files=[make_repo_zip(tmp_path / "r.zip")])
    assert rows_of(view)["r.zip/demo_repo/src/greet.py"][1] == "↩ not added"
    monkeypatch.setattr(runtime.model, "forward", model_forward)

    view = ask(handlers, req, "What is the pass key?")
    assert "ran out of memory" not in view[0][-1]["content"]
    assert handlers.registry.peek(req.session_hash).context_tokens > tokens


def test_disconnect_frees_the_session(runtime, tmp_path):
    handlers = make_handlers(runtime)
    req = request("e")
    ask(handlers, req, "Hello?", files=[make_pdf(tmp_path / "r.pdf")])
    session = handlers.registry.peek("e")
    assert session.engine is not None and session.context_tokens > 0
    handlers.unload(req)
    assert handlers.registry.peek("e") is None and session.engine is None and session.documents == []


def test_stop_before_the_model_step_adds_nothing(runtime, tmp_path):
    handlers = make_handlers(runtime)
    req = request("f")
    handlers.submit({"text": "What is the pass key?", "files": [str(make_pdf(tmp_path / "r.pdf"))]}, req)
    drain(handlers.read(req))
    assert handlers.stop(req) == "Stopping 1 action…"
    view = drain(handlers.run(*SETTINGS, req))
    assert rows_of(view)["r.pdf"][1] == "■ cancelled"
    assert "Stopped: this exchange was not kept" in view[0][-1]["content"]
    assert handlers.registry.peek("f").context_tokens == 0
    assert handlers.stop(req) == "Nothing to stop."


def test_clear_chat_rebuilds_when_documents_follow_a_question(runtime, tmp_path):
    handlers = make_handlers(runtime)
    pdf, repo = make_pdf(tmp_path / "r.pdf"), make_repo_zip(tmp_path / "r.zip")
    req = request("g")
    ask(handlers, req, "What is the pass key?", files=[pdf])
    ask(handlers, req, files=[repo])  # documents after a question: the conversation cannot just be rolled back
    handlers.queue_forget(req)
    view = drain(handlers.run(*SETTINGS, req))
    assert [m for m in view[0] if m["role"] == "user" or not m.get("metadata")] == []

    fresh = request("h")
    ask(handlers, fresh, files=[pdf])
    ask(handlers, fresh, files=[repo])
    rebuilt, expected = handlers.registry.peek("g").engine, handlers.registry.peek("h").engine
    assert list(rebuilt.token_ids) == list(expected.token_ids)  # the documents alone, in the same order
