"""Hostile use, round 2 (issue 31), memory: every token read is checked against --memory-budget (item 13: a
question too, not documents alone), and a reopened workspace is counted from its tensors, not from the summary
its file claims (item 4)."""

from __future__ import annotations

import shutil

from app_fixtures import make_long_text
from handler_fixtures import SETTINGS, drain, make_handlers, request
from test_app_hostile_round2 import ask, edit_record, toasts

from app.engine.budget import Budget, middle_bytes_per_token
from app.session.workspace_store import new_workspace_id


def _fed(handlers, name: str, document) -> None:
    handlers.add_files([str(document)], request(name))
    drain(handlers.read(request(name)))
    drain(handlers.run(*SETTINGS, request(name)))


# -- 13. a question is memory too ------------------------------------------------------------------------------
def test_a_long_question_is_refused_when_the_memory_budget_is_full_and_a_short_one_is_answered(runtime, tmp_path):
    document = make_long_text(tmp_path / "doc.txt", sentences=60)
    measuring = make_handlers(runtime)
    _fed(measuring, "measure", document)
    session = measuring.registry.peek("measure")
    per_token = middle_bytes_per_token(runtime)
    full = max(measuring.registry.cache_bytes(), session.context_tokens * per_token)
    room = 60  # tokens left: a short question and its 16-token answer fit, a long question does not
    budget = Budget(1_000_000, "test", per_token, memory_bytes=full + room * per_token,
                    memory_why="set with --memory-budget")
    handlers = make_handlers(runtime, budget=budget)
    _fed(handlers, "tab", document)
    session = handlers.registry.peek("tab")
    before = session.context_tokens
    assert before > runtime.window and session.documents[0].status.in_context

    ask(handlers, request("tab"), "Why? " * 200)
    refused = session.chat[-1]
    assert "memory for contexts is taken" in refused.text and "--memory-budget" in refused.text, refused.text
    assert not refused.in_context and not session.chat[-2].in_context  # the question is marked not kept
    assert session.context_tokens == before  # nothing of the question was read

    ask(handlers, request("tab"), "Why?")
    assert session.chat[-1].in_context and session.context_tokens > before


def test_removing_a_document_reads_the_rest_again_only_when_the_memory_budget_has_room_for_it(runtime, tmp_path):
    """A rebuild (Remove, or Clear by re-reading) reads the kept context into a second cache beside the first."""
    first, second = make_long_text(tmp_path / "first.txt", 20), make_long_text(tmp_path / "second.txt", 21)
    measuring = make_handlers(runtime)
    _fed(measuring, "measure", first)
    _fed(measuring, "measure", second)
    per_token = middle_bytes_per_token(runtime)
    full = max(measuring.registry.cache_bytes(), measuring.registry.peek("measure").context_tokens * per_token)
    handlers = make_handlers(runtime, budget=Budget(1_000_000, "test", per_token, full + 60 * per_token,
                                                    "set with --memory-budget"))
    _fed(handlers, "tab", first)
    _fed(handlers, "tab", second)
    session = handlers.registry.peek("tab")
    before = session.context_tokens
    handlers.queue_remove("first.txt", request("tab"))
    handlers.queue_remove("first.txt", request("tab"))  # the second click goes ahead
    drain(handlers.run(*SETTINGS, request("tab")))
    note = session.chat[-1]
    assert note.title == "⚠ first.txt was not removed; the context is unchanged", note.title
    assert "memory for contexts is taken: reading the context again" in note.text, note.text
    assert session.context_tokens == before and len(session.documents) == 2


# -- 4. a reopened file's size is its tensors' -----------------------------------------------------------------
def test_a_reopened_workspace_is_counted_from_its_tensors_not_its_claimed_summary(runtime, tmp_path):
    maker = make_handlers(runtime, workspaces=str(tmp_path / "made"))
    req = request("maker")
    maker.attach(None, req)
    ask(maker, req, "What is this about?", [make_long_text(tmp_path / "notes.txt", 60)])
    session = maker.registry.peek("maker")
    real = maker.registry.cache_bytes()
    maker.registry.save_now(session)
    saved = maker.registry.store.path(None, session.workspace_id)

    def claim_nothing(record):
        record["summary"]["tokens"] = 0
        record["summary"]["documents"] = 0

    liar = edit_record(saved, tmp_path / "liar.lmiw", claim_nothing)
    per_token = middle_bytes_per_token(runtime)
    tight = make_handlers(runtime, workspaces=str(tmp_path / "ws"),
                          budget=Budget(1_000_000, "test", per_token, real // 2, "set with --memory-budget"))
    workspace_id = new_workspace_id()
    shutil.copyfile(liar, tight.registry.store.path(None, workspace_id))
    shown, said = toasts(lambda: tight.attach(workspace_id, request("reloader")))
    assert shown[0] != workspace_id and tight.registry.peek("reloader").engine is None
    assert len(said) == 1 and "was not reopened" in said[0] and "memory for contexts is taken" in said[0], said
    assert tight.registry.store.exists(None, workspace_id)  # still saved, to open when memory is free

    roomy = make_handlers(runtime, workspaces=str(tmp_path / "ws"),
                          budget=Budget(1_000_000, "test", per_token, real * 4, "set with --memory-budget"))
    shown, said = toasts(lambda: roomy.attach(workspace_id, request("reloader")))
    assert shown[0] == workspace_id and said[0].startswith("Reopened"), said
