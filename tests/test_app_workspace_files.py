"""Workspace files without a model: every field of a file's record is checked when it is read, so a hostile or
damaged file is refused with a reason and never reaches a view; names that UTF-8 cannot hold are cleaned."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors import safe_open

from app.cli import AppConfig
from app.engine.budget import Budget
from app.engine.citations import Citation
from app.session.uploads import DocumentRow, RowStatus
from app.session.state import ChatItem, ItemKind, Session
from app.session.workspace_file import (RECORD_KEY, Summary, WorkspaceFileError, check_compatible, read_summary,
                                        read_workspace, write_workspace)
from app.session.workspace_store import WorkspaceStore, new_workspace_id
from app.web.workspace_views import chosen_row, workspace_rows
from ingest import Provenance
from lminfinite.tensor_file import write_tensors


def new_session() -> Session:
    """A session on no model: enough for a workspace without a context (only its runtime's name is read)."""
    return Session(new_workspace_id(), SimpleNamespace(name="demo"), AppConfig(model="test"), Budget(1000, "test", 1))


def saved_workspace(path: Path) -> Path:
    """A question, an answer citing a page (with its stats) and a document, saved without a context."""
    session = new_session()
    session.chat += [
        ChatItem("user", ItemKind.QUESTION, "Which page?", files=["a.pdf"]),
        ChatItem("assistant", ItemKind.ANSWER, "Page 2.", citations=[Citation(Provenance("a.pdf", 2, "ii"), 0.75, "key")],
                 stats={"ttft_s": 0.1, "decode_tps": 12.5, "tokens": 3, "finish": "eos", "guess": "Page 3."}),
    ]
    session.documents.append(DocumentRow("a.pdf", RowStatus.INGESTED, pages=3, tokens=900))
    write_workspace(path, session, "Notes")
    return path


def rewrite_record(path: Path, edit) -> Path:
    """``path`` with ``edit(record)`` applied to its workspace record (a file with no tensors)."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    record = json.loads(metadata[RECORD_KEY])
    edit(record)
    write_tensors({}, {RECORD_KEY: json.dumps(record)}, path)
    return path


def test_a_well_formed_workspace_reads_back_whole(tmp_path):
    path = saved_workspace(tmp_path / "w.lmiw")
    summary = check_compatible(path, runtime=None)  # no context: nothing to compare with a model
    assert (summary.name, summary.documents, summary.tokens, summary.model) == ("Notes", 1, 0, "demo")
    assert read_summary(path) == summary
    session = new_session()
    read_workspace(path, session)
    assert [(c.kind, c.text, c.files) for c in session.chat] == [("question", "Which page?", ["a.pdf"]),
                                                                 ("answer", "Page 2.", [])]
    assert session.chat[1].citations == [Citation(Provenance("a.pdf", 2, "ii"), 0.75, "key")]
    assert session.chat[1].stats == {"ttft_s": 0.1, "decode_tps": 12.5, "tokens": 3, "finish": "eos", "guess": "Page 3."}
    assert [(r.path, r.status, r.pages, r.tokens) for r in session.documents] == [("a.pdf", "ingested", 3, 900)]


def test_a_file_saved_before_chunks_had_headings_reads_back(tmp_path):
    def as_saved_then(record):
        where = record["session"]["chat"][1]["citations"][0]["where"]
        where.pop("heading"), where.pop("listing")
    path = rewrite_record(saved_workspace(tmp_path / "w.lmiw"), as_saved_then)
    session = new_session()
    read_workspace(path, session)
    assert session.chat[1].citations == [Citation(Provenance("a.pdf", 2, "ii"), 0.75, "key")]


def _set(*keys_and_value):
    """An edit setting ``record[k1][k2]...[kn] = value``."""
    *keys, last, value = keys_and_value
    def edit(record):
        for key in keys:
            record = record[key]
        record[last] = value
    return edit


HOSTILE = {  # edit, and where the refusal says the record is wrong
    "summary-tokens-text": (_set("summary", "tokens", "lots"), "summary.tokens is 'lots', expected a count"),
    "summary-name-list": (_set("summary", "name", ["a"]), r"summary.name is \['a'\], expected text"),
    "summary-missing": (lambda r: r.pop("summary"), "record: missing field 'summary'"),
    "chat-text-number": (_set("session", "chat", 0, "text", 123), r"session.chat\[0\].text is 123, expected text"),
    "chat-kind-unknown": (_set("session", "chat", 0, "kind", "poem"), r"session.chat\[0\].kind is 'poem', expected one of"),
    "citation-share-text": (_set("session", "chat", 1, "citations", 0, "share", "most"),
                            r"session.chat\[1\].citations\[0\].share is 'most', expected a number"),
    "citation-heading-number": (_set("session", "chat", 1, "citations", 0, "where", "heading", 7),
                                r"session.chat\[1\].citations\[0\].where.heading is 7, expected text"),
    "citation-listing-text": (_set("session", "chat", 1, "citations", 0, "where", "listing", "yes"),
                              r"session.chat\[1\].citations\[0\].where.listing is 'yes', expected true or false"),
    "stats-rate-text": (_set("session", "chat", 1, "stats", "decode_tps", "fast"),
                        r"session.chat\[1\].stats.decode_tps is 'fast', expected a number"),
    "stats-guess-number": (_set("session", "chat", 1, "stats", "guess", 3),
                           r"session.chat\[1\].stats.guess is 3, expected text"),
    "document-tokens-text": (_set("session", "documents", 0, "tokens", "x"),
                             r"session.documents\[0\].tokens is 'x', expected a count"),
    "document-unknown-field": (_set("session", "documents", 0, "extra", 1),
                               r"session.documents\[0\]: unknown field 'extra'"),
    "digests-not-texts": (_set("session", "fed_digests", {"abc": 1}), "session.fed_digests is {'abc': 1}"),
    "context-not-an-object": (_set("context", "yes"), "record.context is 'yes', expected an object"),
}


@pytest.mark.parametrize("edit, where", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_field_of_the_wrong_type_is_refused_saying_where(tmp_path, edit, where):
    path = rewrite_record(saved_workspace(tmp_path / "w.lmiw"), edit)
    refusal = rf"w.lmiw is damaged or incomplete \((record.)?{where}"
    with pytest.raises(WorkspaceFileError, match=refusal):
        check_compatible(path, runtime=None)  # an import: refused before the file is added
    session = new_session()
    with pytest.raises(WorkspaceFileError, match=refusal):
        read_workspace(path, session)  # an open: refused before the session changes
    assert session.chat == [] and session.documents == [] and session.engine is None


def test_a_stored_file_with_a_bad_summary_is_listed_as_damaged_and_the_list_still_shows(tmp_path):
    store = WorkspaceStore(tmp_path / "ws")
    good, bad = new_workspace_id(), new_workspace_id()
    saved_workspace(store.path(None, good))
    rewrite_record(saved_workspace(store.path(None, bad)), _set("summary", "tokens", "lots"))
    store.set_name(None, good, "Good")
    store.set_name(None, bad, "Bad")
    with pytest.raises(WorkspaceFileError, match=r"summary.tokens is 'lots', expected a count"):
        read_summary(store.path(None, bad))
    listed = {w.id: w for w in store.list(None)}
    assert listed[good].summary == read_summary(store.path(None, good)) and isinstance(listed[good].summary, Summary)
    assert listed[bad].summary is None and "summary.tokens is 'lots'" in listed[bad].problem
    rows = {row[0].split(" — ")[0]: row for row in workspace_rows(list(listed.values()), current_id=good)}
    assert rows["● Good"][1:3] == [1, "0"] and rows["● Good"][0] == "● Good — “Which page?” (1 question)"
    assert rows["Bad"][1:3] == ["", ""] and rows["Bad"][4] == f"cannot be opened: {listed[bad].problem}"


def test_a_name_with_a_lone_surrogate_is_stored_cleaned_and_later_saves_still_write_the_index(tmp_path):
    store = WorkspaceStore(tmp_path / "ws")
    first, second = new_workspace_id(), new_workspace_id()
    store.set_name(None, first, json.loads('"Notes \\ud800"'))  # what a JSON API client can send
    store.set_name(None, second, "Second 😀")
    assert store.name(None, first) == "Notes \ufffd" and store.name(None, second) == "Second 😀"
    index = (store.folder(None) / "names.json").read_bytes().decode("utf-8")  # strict UTF-8
    assert json.loads(index) == {first: "Notes \ufffd", second: "Second 😀"}


def test_the_list_reads_like_conversations_and_a_row_clicked_chooses_its_workspace(tmp_path):
    """Issue "What a user sees", item 11: each line names the last question asked and how many were; a question
    not kept (stopped) is not counted; a file saved before these were kept lists by its name alone."""
    store = WorkspaceStore(tmp_path / "ws")
    talk, older = new_workspace_id(), new_workspace_id()
    session = new_session()
    long_question = "How do I set the " + "very " * 30 + "long option?"
    session.chat += [
        ChatItem("user", ItemKind.QUESTION, "First?"), ChatItem("assistant", ItemKind.ANSWER, "One."),
        ChatItem("user", ItemKind.QUESTION, long_question), ChatItem("assistant", ItemKind.ANSWER, "Two."),
        ChatItem("user", ItemKind.QUESTION, "Stopped?"),
        ChatItem("assistant", ItemKind.ANSWER, "Sto", stopped=True, in_context=False),
    ]
    write_workspace(store.path(None, talk), session, "Manual")
    summary = read_summary(store.path(None, talk))
    assert (summary.questions, summary.last_question) == (2, long_question)
    rewrite_record(saved_workspace(store.path(None, older)),
                   lambda record: [record["summary"].pop(k) for k in ("questions", "last_question")])
    assert read_summary(store.path(None, older)).questions == 0  # an older file still reads
    saved = store.list(None)
    rows = workspace_rows(saved, current_id=older)
    by_id = dict(zip((w.id for w in saved), rows))
    line = by_id[talk][0]
    assert line.startswith("Manual — “How do I set the very") and line.endswith("…” (2 questions)")
    assert len(line) < len("Manual — “”  (2 questions)") + 81 and by_id[older][0] == "● Notes"
    for row, listed in enumerate(saved):
        assert chosen_row(saved, row, rows[row][0]) == listed.id
    assert chosen_row(saved, 0, "a line drawn before the list changed") is None
    assert chosen_row(saved, len(saved), rows[0][0]) is None and chosen_row(saved, None, "") is None
    # Under another model (Settings → Model) each says which model read it: it opens only under that one.
    model = summary.model
    assert not any("read by" in row[4] for row in workspace_rows(saved, older, running_model=model))
    other = workspace_rows(saved, older, running_model="SmolLM2-135M-Instruct")
    assert all(row[4].endswith(f" · read by {model}") for row in other), other


def test_a_saved_workspace_carries_its_uploads_and_a_reopened_one_links_its_citations_again(tmp_path):
    """Issue "What a user sees", item 11: a reopened workspace's citations open their PDF page or their lines, from
    the uploads the file carries (documents still in the context only); a tensor that cannot be a file's bytes is
    refused as damage."""
    from app.session.source_files import FILE_ROUTE
    from app.session.workspace_quota import save_size

    pdf, code, gone = tmp_path / "a.pdf", tmp_path / "tool.py", tmp_path / "old.txt"
    pdf.write_bytes(b"%PDF-1.4 pages")
    code.write_text("import os\n<b>bold</b>\n")
    gone.write_text("removed since\n")
    session = new_session()
    for upload in (pdf, code, gone):
        session.sources.keep(upload.name, upload)
    session.documents += [DocumentRow("a.pdf", RowStatus.INGESTED, pages=1, tokens=9),
                          DocumentRow("tool.py", RowStatus.INGESTED, tokens=9),
                          DocumentRow("old.txt", RowStatus.ROLLED_BACK)]
    empty = new_session()
    assert save_size(session) == save_size(empty) + pdf.stat().st_size + code.stat().st_size
    path = tmp_path / "w.lmiw"
    write_workspace(path, session, "With files")
    session.sources.release()
    reopened = new_session()
    read_workspace(path, reopened)
    page_url = reopened.sources.url(Provenance("a.pdf", 1))
    assert page_url.startswith(FILE_ROUTE) and page_url.endswith("#page=1")
    from urllib.parse import unquote
    assert Path(unquote(page_url.removeprefix(FILE_ROUTE).split("#")[0])).read_bytes() == pdf.read_bytes()
    lines = reopened.sources.url(Provenance("tool.py", line_start=2, line_end=2))
    page = Path(unquote(lines.removeprefix(FILE_ROUTE).split("#")[0])).read_text()
    assert lines.endswith("#L2") and '<li id="L2">&lt;b&gt;bold&lt;/b&gt;</li>' in page
    assert reopened.sources.url(Provenance("old.txt", line_start=1, line_end=1)) is None  # not in the context
    reopened.sources.release()

    import torch

    with safe_open(str(path), framework="pt") as handle:
        record = json.loads(handle.metadata()[RECORD_KEY])
    for tensors, refusal in (({"sources.0": torch.ones(3), "sources.1": torch.zeros(2, dtype=torch.uint8)},
                              r"damaged or hostile: sources.0 is not a file's bytes"),
                             ({"cache.x": torch.zeros(2, dtype=torch.uint8), "sources.1": torch.zeros(2, dtype=torch.uint8)},
                              r"damaged or hostile: session.sources names 'cache.x'")):
        named = json.loads(json.dumps(record))
        named["session"]["sources"][0]["tensor"] = next(iter(tensors))
        write_tensors(tensors, {RECORD_KEY: json.dumps(named)}, path)
        session = new_session()
        with pytest.raises(WorkspaceFileError, match=refusal):
            read_workspace(path, session)
        assert session.chat == [] and session.sources.url(Provenance("a.pdf", 1)) is None
