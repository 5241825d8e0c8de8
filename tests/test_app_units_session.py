"""Fast unit tests of sessions: uploads, the token budget, the registry, pending actions, exports. No model, no
server."""

from __future__ import annotations

import json
import time
from pathlib import Path

from app import cli
from app.engine.citations import Citation
from app.session.uploads import DocumentRow, fit_budget, screen_uploads
from app.session.exporting import export_data, to_markdown, write_exports
from app.session.registry import SessionRegistry
from app.session.state import ChatItem
from app.web import views
from fake_clock import FakeClock
from ingest import Corpus, FileReport, Provenance
from ingest.corpus import Chunk


# -- uploads and budget --------------------------------------------------------------------------
def test_screen_uploads_refuses_big_files_and_foreign_paths(tmp_path):
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    small, big = uploads / "small.txt", uploads / "big.txt"
    small.write_text("hello\n")
    big.write_text("x" * 5000)
    outside = tmp_path / "etc_passwd"
    outside.write_text("root:x:0:0\n")
    accepted, refused = screen_uploads([str(small), str(big), str(outside)], 1000, str(uploads))
    assert accepted == [str(small.resolve())]
    assert [(r.path, r.status) for r in refused] == [("big.txt", "refused"), ("etc_passwd", "refused")]
    assert "over the 1000 B upload limit" in refused[0].reason
    assert "--allow-local-paths" in refused[1].reason


def _chunk(source, tokens, index):
    return Chunk(text="x", where=Provenance(source, line_start=1, line_end=2), char_start=0, char_end=1,
                 tokens=tokens, index=index)


def test_fit_budget_refuses_whole_files_that_do_not_fit():
    reports = [FileReport("a.py", "ingested", tokens=300), FileReport("b.py", "partial", tokens=500, reason="lossy"),
               FileReport("c.bin", "skipped", reason="binary file"), FileReport("d.py", "ingested", tokens=100)]
    chunks = [_chunk("a.py", 200, 0), _chunk("a.py", 100, 1), _chunk("b.py", 500, 2), _chunk("d.py", 100, 3)]
    # The engine's plan, not ingest's chunk counts, decides: a.py is fed as 302 tokens, the opening takes 8.
    planned = {None: 8, "a.py": 302, "b.py": 500, "d.py": 101}
    fitted = fit_budget(Corpus(reports=reports, chunks=chunks), free_tokens=450, tokens_by_source=planned)
    statuses = [(r.path, r.status) for r in fitted.rows]
    assert statuses == [("a.py", "queued"), ("b.py", "refused"), ("c.bin", "skipped"), ("d.py", "queued")]
    assert [c.index for c in fitted.chunks] == [0, 1, 3] and fitted.tokens == 8 + 302 + 101
    assert [r.tokens for r in fitted.rows] == [302, 0, 0, 101]
    assert "needs 500 tokens but only 140" in fitted.rows[1].reason and fitted.rows[0].outcome == "ingested"
    tight = fit_budget(Corpus(reports=reports, chunks=chunks), free_tokens=8 + 302 + 100, tokens_by_source=planned)
    assert [r.status for r in tight.rows] == ["queued", "refused", "skipped", "refused"]  # one token short


# -- sessions ------------------------------------------------------------------------------------
class _Runtime:
    """Sessions never touch the model until they answer; this stands in for it."""


def _registry(timeout_s=3600.0, clock=time.monotonic):
    from app.engine.budget import Budget

    return SessionRegistry(_Runtime(), cli.AppConfig(session_timeout_s=timeout_s), Budget(1000, "test", 10),
                           clock=clock)


def test_sessions_are_separate_and_freed():
    registry = _registry()
    a, b = registry.get("hash-a"), registry.get("hash-b")
    assert a is not b and registry.get("hash-a") is a
    a.documents.append(DocumentRow("secret.pdf", "ingested"))
    assert b.documents == []
    tmpdir = Path(a.tmpdir)
    assert registry.close("hash-a") and not tmpdir.exists() and a.documents == []
    assert registry.peek("hash-a") is None and registry.get("hash-a") is not a


def test_idle_sessions_expire_but_working_ones_wait():
    clock = FakeClock()
    registry = _registry(timeout_s=0.05, clock=clock)
    idle, busy = registry.get("idle"), registry.get("busy")
    work = busy.new_work("turn", "q?")
    with busy.working():
        clock.advance(0.1)
        assert registry.sweep() == ["idle"]
        assert registry.peek("busy") is busy
        registry.close("busy")  # a disconnect mid-answer: stop now, free when the work ends
        assert work.cancel.is_set() and busy.closed and Path(busy.tmpdir).exists()
    assert not Path(busy.tmpdir).exists()
    assert idle.closed


def test_a_page_load_keeps_what_the_tab_did_before_it_landed(tmp_path):
    """A file dropped the moment the page appeared went to a session that the page load then threw away."""
    registry = _registry()
    registry.store.root = tmp_path
    early = registry.get("tab")  # the drop's request came before the page load
    early.name = "dropped at once"
    shown, note = registry.attach("tab", None, None, page_load=True)  # a browser that remembers no workspace
    assert shown is early and note == "" and shown.lifecycle.in_browser and not shown.closed and shown.name == "dropped at once"

    stray = registry.get("tab-2")  # a reload whose browser remembers a live workspace shows that one
    reloaded, _ = registry.attach("tab-2", early.workspace_id, None, page_load=True)
    assert reloaded is early and registry.peek("tab-2") is early and stray.closed
    api_client = registry.get("tab-3")
    fresh, _ = registry.attach("tab-3", None, None)  # "New workspace" (not a page load) is always a new one
    assert fresh is not api_client and api_client.closed and not fresh.closed


def test_a_page_load_never_shows_a_workspace_the_sweep_just_freed(tmp_path, monkeypatch):
    registry = _registry()
    registry.store.root = tmp_path
    early = registry.get("tab")  # the timer's first tick came before the page load
    freed = registry.get("other")
    freed.close()
    finds = iter([(freed, ""), (registry._new(None), "")])  # the sweep frees the first find before it is bound
    monkeypatch.setattr(registry, "_find", lambda workspace_id, owner: next(finds))
    shown, _ = registry.attach("tab", None, None)
    assert shown is not freed and not shown.closed and registry.peek("tab") is shown and shown.lifecycle.in_browser
    assert early.closed and early.workspace_id not in {w for w in registry._live}  # the tab's stray session went
    monkeypatch.undo()
    registry.attach("tab", shown.workspace_id, None)  # a reload in the same tab: the same workspace, kept
    assert registry.peek("tab") is shown and not shown.closed


def test_stop_sets_every_pending_action():
    session = _registry().get("s")
    first, second = session.new_work("turn", "a"), session.new_work("regenerate")
    assert session.stop() == 2 and first.cancel.is_set() and second.cancel.is_set()
    assert session.next_work("read") is first


# -- exports -------------------------------------------------------------------------------------
def test_exports_hold_documents_sources_and_flags(tmp_path):
    data = export_data(model="demo", system_prompt="Be brief.", context_tokens=99,
                       documents=[DocumentRow("r.pdf", "ingested", 3, 90),
                                  DocumentRow("x.bin", "skipped", reason="binary | file")],
                       chat=[ChatItem("user", "question", "Q?"),
                             ChatItem("assistant", "answer", "A.", citations=[Citation(Provenance("r.pdf", 2), 1.0)]),
                             ChatItem("user", "question", "Q2?", in_context=False),
                             ChatItem("assistant", "answer", "Par", stopped=True, in_context=False)])
    markdown = to_markdown(data)
    assert "| r.pdf | ingested | 3 | 90 |" in markdown and "binary \\| file" in markdown
    assert "**You**:\n\nQ?" in markdown and "Sources (share of the question's recall beyond a neutral question's): r.pdf p. 2 (100%)" in markdown
    assert "*Stopped; not kept in the context.*" in markdown
    md_path, json_path = write_exports(data, str(tmp_path))
    loaded = json.loads(Path(json_path).read_text())
    assert loaded["messages"][3]["stopped"] is True and loaded["documents"][0]["tokens"] == 90
    assert Path(md_path).read_text() == markdown


def test_files_table_formats_tokens_and_forgets_cancelled_rows_at_the_next_action():
    rows = views.document_rows([DocumentRow("r.pdf", "ingested", 3, 12345), DocumentRow("x.bin", "skipped",
                                                                                     reason="binary file")])
    assert rows == [["r.pdf", "✓ in context", 3, "12,345", ""], ["x.bin", "– skipped", "", "", "binary file"]]
    assert len(views.DOCUMENT_COLUMN_WIDTHS) == len(views.DOCUMENT_HEADERS)
    assert sum(float(w.rstrip("%")) for w in views.DOCUMENT_COLUMN_WIDTHS) == 100  # fits the panel: no Note cut off

    session = _registry().get("rows")
    session.documents += [DocumentRow("kept.pdf", "ingested", 2, 900),
                          DocumentRow("long.txt", "cancelled", reason="stopped while feeding the model")]
    session.new_work("turn", "Next question?")  # the user saw the cancelled row until this action
    assert [d.path for d in session.documents] == ["kept.pdf"]
