"""Hostile use, round 2 (issue 31): crafted workspace files (token ids, NaN, huge or deep records, huge names),
markup in names and files shown in messages, lone surrogates at every door, and guessing passwords.

Each file here is a real workspace saved by the app on the demo model, then changed byte by byte as an
attacker would change it."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import socket
import struct
import time
import warnings
from pathlib import Path

import httpx
import orjson
import pytest
import torch

from app_fixtures import make_long_text
from handler_fixtures import SETTINGS, drain, make_handlers, request

from app.engine.context_file import NEUTRAL_POSITIONS, NEUTRAL_WEIGHTS, ContextDamaged, checked_neutral_recall
from app.session.workspace_file import (RECORD_KEY, WorkspaceFileError, check_compatible, read_summary,
                                        write_workspace)
from app.session.workspace_record import MAX_DEPTH, MAX_HEADER_BYTES
from app.session.workspace_store import MAX_NAME_CHARS, new_workspace_id
from lminfinite.tensor_file import write_tensors


# -- helpers: a saved workspace, and the bytes of its file -----------------------------------------------------
def ask(handlers, req, text="", files=()):
    handlers.submit({"text": text, "files": [str(f) for f in files]}, req)
    drain(handlers.read(req))
    return drain(handlers.run(*SETTINGS, req))


@pytest.fixture(scope="module")
def saved(runtime, tmp_path_factory) -> Path:
    """A workspace with a context (a document longer than the window, a question and its answer), saved."""
    folder = tmp_path_factory.mktemp("saved")
    handlers = make_handlers(runtime, workspaces=str(folder / "ws"))
    req = request("maker")
    workspace_id = handlers.attach(None, req)[0]
    ask(handlers, req, "What is this about?", [make_long_text(folder / "notes.txt", 60)])
    session = handlers.registry.peek("maker")
    session.name = "Notes"
    handlers.registry.save_now(session)
    return handlers.registry.store.path(None, workspace_id)


def header_of(data: bytes) -> tuple[dict, int]:
    """The file's JSON header and where its tensors' bytes begin."""
    size = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + size]), 8 + size


def with_header(data: bytes, header: dict) -> bytes:
    """``data`` with ``header`` in place of its own, the tensors' bytes unchanged."""
    _, start = header_of(data)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded + data[start:]


def patch_tensor(source: Path, target: Path, name: str, first: bytes, dtype: str | None = None) -> Path:
    """``source`` with the first bytes of tensor ``name`` set to ``first`` (and its dtype renamed)."""
    data = bytearray(source.read_bytes())
    header, start = header_of(bytes(data))
    if dtype is not None:
        header[name]["dtype"] = dtype
        data = bytearray(with_header(bytes(data), header))
        header, start = header_of(bytes(data))
    begin = start + header[name]["data_offsets"][0]
    data[begin : begin + len(first)] = first
    target.write_bytes(bytes(data))
    return target


def edit_record(source: Path, target: Path, edit) -> Path:
    """``source`` with ``edit(record)`` applied to its workspace record, the tensors as they are."""
    data = source.read_bytes()
    header, _ = header_of(data)
    record = json.loads(header["__metadata__"][RECORD_KEY])
    edit(record)
    header["__metadata__"][RECORD_KEY] = json.dumps(record)
    target.write_bytes(with_header(data, header))
    return target


def toasts(call) -> tuple[object, list[str]]:
    """``call()``'s result and the texts of the toasts it showed: outside a request, Gradio prints a gr.Info
    and turns a gr.Warning into a Python warning."""
    printed = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(printed):
        warnings.simplefilter("always")
        result = call()
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    return result, said + [line for line in printed.getvalue().splitlines() if line]


def sendable(value) -> None:
    """Encode ``value`` as Gradio sends it (orjson: strict UTF-8); raises on a lone surrogate."""
    orjson.dumps(value, default=str)


# -- 1. token ids and tensors no model made ------------------------------------------------------------------
def _u64_max(saved, target):
    return patch_tensor(saved, target, "context.token_ids", b"\xff" * 8, dtype="U64")


def _past_vocabulary(saved, target):
    return patch_tensor(saved, target, "context.token_ids", struct.pack("<q", 10**6))


def _nan_in_cache(saved, target):
    return patch_tensor(saved, target, "cache.layers.0.ring_k", struct.pack("<f", float("nan")))


def _inf_in_middle(saved, target):
    return patch_tensor(saved, target, "cache.layers.1.middle_v", struct.pack("<f", float("inf")))


def _answer_past_vocabulary(saved, target):
    def edit(record):
        answer = next(e for e in record["context"]["history"] if "answer_ids" in e)
        answer["answer_ids"][0] = 2**64 - 1
    return edit_record(saved, target, edit)


def _neutral_position_outside(saved, target):
    return patch_tensor(saved, target, "context.neutral_positions", struct.pack("<q", 10**9))


def _nan_neutral_weight(saved, target):
    return patch_tensor(saved, target, "context.neutral_weights", struct.pack("<d", float("nan")))


FOREIGN_TENSORS = {  # how the file is changed, and what the refusal says
    "u64-max-token": (_u64_max, r"the token ids are uint64 of shape \(\d+,\), expected one row of int64"),
    "token-past-vocabulary": (_past_vocabulary, r"token id 1000000 at position 0 is outside this model's vocabulary"),
    "nan-in-ring": (_nan_in_cache, r"tensor layers.0.ring_k holds NaN or infinite values"),
    "inf-in-middle-store": (_inf_in_middle, r"tensor layers.1.middle_v holds NaN or infinite values"),
    "answer-token-past-vocabulary": (_answer_past_vocabulary, r"holds token id 18446744073709551615, outside"),
    "neutral-position-outside": (_neutral_position_outside, r"neutral question's recall names positions outside"),
    "nan-neutral-weight": (_nan_neutral_weight, r"recall holds a weight that is not a finite number above zero"),
}


@pytest.mark.parametrize("damage, why", FOREIGN_TENSORS.values(), ids=FOREIGN_TENSORS.keys())
def test_token_ids_and_cache_values_no_model_made_are_refused_at_import_and_at_reopen(runtime, saved, tmp_path,
                                                                                     damage, why):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    crafted = damage(saved, tmp_path / "crafted.lmiw")
    _, said = toasts(lambda: handlers.import_workspace(str(crafted), request("importer")))
    assert len(said) == 1 and said[0].startswith("Not imported: ") and "damaged or hostile: " in said[0], said
    assert re.search(why, said[0]), said
    assert handlers.registry.store.list(None) == []  # nothing added
    assert handlers.registry.peek("importer").chat == []  # the tab keeps its (empty) workspace

    # The same file already in the user's folder (copied there, or saved by an older server): the page load
    # says why, starts a new workspace, and the file stays listed so that it can be deleted.
    workspace_id = new_workspace_id()
    shutil.copyfile(crafted, handlers.registry.store.path(None, workspace_id))
    shown, said = toasts(lambda: handlers.attach(workspace_id, request("reloader")))
    assert shown[0] != workspace_id and handlers.registry.peek("reloader").engine is None
    assert len(said) == 1 and "could not be opened" in said[0] and re.search(why, said[0]), said
    assert [w.id for w in handlers.registry.store.list(None)] == [workspace_id]
    handlers.delete_workspace(workspace_id, request("reloader"))
    assert handlers.registry.store.list(None) == []
    ask(handlers, request("reloader"), "Still answering?")  # the server goes on serving
    assert handlers.registry.peek("reloader").chat[-1].text


def test_the_saved_workspace_these_files_are_made_from_opens(runtime, saved, tmp_path):
    """The control: unchanged, the file imports and answers (so each refusal above is its change's)."""
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    shown, said = toasts(lambda: handlers.import_workspace(str(saved), request("importer")))
    session = handlers.registry.peek("importer")
    assert session.engine is not None and session.context_tokens > runtime.window and said[0].startswith("Reopened")
    assert session.engine.neutral_recall is not None  # kept with the context, and read back (the files above)


def test_a_neutral_recall_that_no_save_wrote_is_refused_saying_what(runtime, saved, tmp_path):
    """The neutral question's recall is kept with the context (neutral_recall.py): its key is checked with the
    record, its tensors with the context's."""
    crafted = edit_record(saved, tmp_path / "crafted.lmiw",
                          lambda record: record["context"].__setitem__("neutral_key", "<script>"))
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    _, said = toasts(lambda: handlers.import_workspace(str(crafted), request("importer")))
    assert said == ["Not imported: crafted.lmiw is damaged or incomplete (record.context.neutral_key is "
                    "'&lt;script&gt;', expected 32 hexadecimal digits)"]
    positions, weights = torch.tensor([3, 7]), torch.tensor([0.5, 0.25], dtype=torch.float64)
    cases = {"the neutral question's recall has a key but no tensors": {NEUTRAL_POSITIONS: positions},
             "not two rows of int64 positions and float64 weights": {NEUTRAL_POSITIONS: positions,
                                                                     NEUTRAL_WEIGHTS: weights.float()},
             "names positions outside the 100-token context, or one twice": {
                 NEUTRAL_POSITIONS: torch.tensor([3, 3]), NEUTRAL_WEIGHTS: weights}}
    for why, tensors in cases.items():
        with pytest.raises(ContextDamaged, match=re.escape(why)):
            checked_neutral_recall("0" * 32, tensors, 100)
    kept = checked_neutral_recall("0" * 32, {NEUTRAL_POSITIONS: positions, NEUTRAL_WEIGHTS: weights}, 100)
    assert kept.tally.totals() == ([3, 7], [0.5, 0.25])


# -- 2. records too large or too deep to parse ---------------------------------------------------------------
def workspace_with_record(path: Path, text: str) -> Path:
    write_tensors({}, {RECORD_KEY: text}, path)
    return path


def _deep_record(depth: int) -> str:
    summary = {"name": "deep", "documents": 0, "tokens": 0, "saved_at": 0.0, "model": "demo"}
    return (f'{{"format": 1, "summary": {json.dumps(summary)}, "session": ' + "[" * depth + "]" * depth
            + ', "context": null}')


def test_a_record_larger_than_a_workspace_can_be_is_refused_from_its_length(runtime, tmp_path):
    text = json.dumps({"format": 1, "summary": {"name": "big", "documents": 0, "tokens": 0, "saved_at": 0.0,
                                                "model": "demo"},
                       "session": {"chat": [], "documents": [], "fed_digests": {"x": "y" * (87 * 2**20)}},
                       "context": None})
    path = workspace_with_record(tmp_path / "big.lmiw", text)
    refusal = r"big.lmiw is damaged or hostile: its record is 87.0 MB, more than the 64.0 MB a workspace's can be"
    started = time.perf_counter()
    with pytest.raises(WorkspaceFileError, match=refusal):
        check_compatible(path, runtime)
    with pytest.raises(WorkspaceFileError, match=refusal):
        read_summary(path)
    assert time.perf_counter() - started < 1.0  # 8 bytes read: nothing of the 87 MB is parsed
    assert MAX_HEADER_BYTES < path.stat().st_size


def test_a_record_nested_200000_deep_is_refused_without_recursion_and_never_breaks_the_page(runtime, tmp_path):
    path = workspace_with_record(tmp_path / "deep.lmiw", _deep_record(200_000))
    refusal = r"deep.lmiw is damaged or hostile: the record is nested 200,001 deep, more than the 32"
    with pytest.raises(WorkspaceFileError, match=refusal):
        check_compatible(path, runtime)
    with pytest.raises(WorkspaceFileError, match=refusal):
        read_summary(path)

    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    _, said = toasts(lambda: handlers.import_workspace(str(path), request("importer")))
    assert said and said[0].startswith("Not imported: deep.lmiw is damaged or hostile: the record is nested")
    # In the user's folder: the page load, the list and Delete all still work.
    workspace_id = new_workspace_id()
    shutil.copyfile(path, handlers.registry.store.path(None, workspace_id))
    shown, said = toasts(lambda: handlers.attach(workspace_id, request("tab")))
    assert shown[0] != workspace_id and any("nested 200,001 deep" in s for s in said), said
    rows = handlers.workspace_panel(request("tab"))[2]
    assert len(rows) == 1 and rows[0][4].startswith("cannot be opened: ") and "nested 200,001 deep" in rows[0][4]
    handlers.delete_workspace(workspace_id, request("tab"))
    assert handlers.workspace_panel(request("tab"))[2] == []


def test_a_record_of_a_workspace_depth_is_read_and_one_past_the_cap_is_not(tmp_path):
    at_cap = workspace_with_record(tmp_path / "ok.lmiw", _deep_record(MAX_DEPTH - 1))  # the record's { is one
    assert read_summary(at_cap).name == "deep"
    with pytest.raises(WorkspaceFileError, match=r"record.session is \[\[\["):  # parsed, refused by its fields
        check_compatible(at_cap, None)
    past = workspace_with_record(tmp_path / "deep.lmiw", _deep_record(MAX_DEPTH))
    with pytest.raises(WorkspaceFileError, match="nested 33 deep"):
        read_summary(past)


def test_brackets_inside_strings_are_not_nesting(tmp_path):
    """A document of code (braces in its text) is no deep record: only structure counts."""
    from app.session.workspace_record import check_shape

    check_shape(json.dumps({"text": "{[(" * 100_000 + 'a \\" [[[[' * 1000}))


def test_a_record_of_too_many_values_is_refused_before_parsing(tmp_path):
    from app.session.workspace_record import MAX_VALUES

    text = _deep_record(1).replace('"session": []', '"session": [' + "0," * MAX_VALUES + "0]")
    with pytest.raises(WorkspaceFileError, match=f"more than {MAX_VALUES:,} values"):
        read_summary(workspace_with_record(tmp_path / "many.lmiw", text))


# -- 3. names longer than a list's line ----------------------------------------------------------------------
def test_an_imported_name_of_five_million_characters_is_cut_saying_so(runtime, tmp_path):
    from app.session.state import Session
    from app.engine.budget import Budget
    from app.cli import AppConfig

    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    session = Session(new_workspace_id(), runtime, AppConfig(model="test"), Budget(1000, "test", 1))
    path = tmp_path / "long-name.lmiw"
    write_workspace(path, session, "N" * 5_000_000)
    _, said = toasts(lambda: handlers.import_workspace(str(path), request("importer")))
    name = handlers.registry.peek("importer").name
    assert len(name) == MAX_NAME_CHARS and name.endswith(" (imported)") and name.startswith("NNN")
    assert any(f"Its name had more than {MAX_NAME_CHARS} characters and was cut." in s for s in said), said
    listed = handlers.workspace_panel(request("importer"))
    assert len(listed[0]) == MAX_NAME_CHARS and len(listed[2][0][0]) <= MAX_NAME_CHARS + 2  # "● " marks this one
    assert len(json.dumps(listed, default=str)) < 5_000  # a refresh sends a line, not megabytes

    # A file dropped in the folder with no name in the index: listed under its own name, cut.
    shutil.copyfile(path, handlers.registry.store.path(None, new_workspace_id()))
    assert all(len(w.name) <= MAX_NAME_CHARS for w in handlers.registry.store.list(None))


def test_a_rename_longer_than_the_cap_is_cut_saying_so(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req = request("tab")
    handlers.attach(None, req)
    view, said = toasts(lambda: handlers.rename("x" * 1_000_000, req))
    assert view[0] == "x" * MAX_NAME_CHARS == handlers.registry.peek("tab").name
    cut = "x" * MAX_NAME_CHARS
    assert said == [f"A workspace name has at most {MAX_NAME_CHARS} characters; it was cut to “{cut}”."]
    _, said = toasts(lambda: handlers.rename("A short name", req))
    assert said == [] and handlers.registry.peek("tab").name == "A short name"


# -- 9. markup in names and files shows as text --------------------------------------------------------------
MARKUP = '<img src="//example.invalid/x.png"> ![x](//example.invalid/y.png) <a href="//example.invalid">z</a>'


def test_markup_in_a_name_shows_as_text_in_the_reopened_toast_and_the_save_note(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    handlers.registry.grace_s = 0
    req = request("saver")
    workspace_id = handlers.attach(None, req)[0]
    ask(handlers, req, "Hello?")
    drain(handlers.queue_save(MARKUP, req))
    view = drain(handlers.run(*SETTINGS, req))
    note = view[4]  # the stop note (gr.Markdown): "Saved “…”: … in … s."
    assert note.startswith('Saved “&lt;img src="//example.invalid/x.png"&gt; \\!\\[x\\]\\(//example.invalid/y.png\\)')
    assert "<" not in note and "![" not in note and "](" not in note
    handlers.unload(req)  # saved and freed

    _, said = toasts(lambda: handlers.attach(workspace_id, request("reloader")))
    assert len(said) == 1 and said[0].startswith("Reopened “&lt;img src=\"//example.invalid/x.png\"&gt; ![x]")
    assert "<" not in said[0]


def test_markup_in_an_uploaded_file_name_shows_as_text_in_the_refusal(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    hostile = tmp_path / "<img src=x onerror=alert(1)>.lmiw"
    hostile.write_text("not a workspace")
    _, said = toasts(lambda: handlers.import_workspace(str(hostile), request("importer")))
    assert said and said[0].startswith("Not imported: &lt;img src=x onerror=alert(1)&gt;.lmiw is not a readable")
    assert "<" not in said[0]


def test_a_removal_note_naming_a_file_shows_it_as_text(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req = request("tab")
    handlers.attach(None, req)
    hostile = make_long_text(tmp_path / "![x](http:__example.invalid_y.png) <b>.txt", 30)
    ask(handlers, req, files=[hostile])
    ask(handlers, req, "And?")
    view = handlers.queue_remove(hostile.name, req)  # the first click says what it costs
    assert view[4].startswith("Removing \\!\\[x\\]\\(http:\\_\\_example.invalid\\_y.png\\) &lt;b&gt;.txt reads")


def test_every_toast_and_error_of_the_web_layer_goes_through_the_escaping_helpers():
    """No gr.Info / gr.Warning / gr.Error is built anywhere else, so no message can skip the escaping."""
    import app.web as web

    for path in Path(web.__file__).parent.glob("*.py"):
        if path.name == "messages.py":
            continue
        text = path.read_text(encoding="utf-8")
        for call in ("gr.Info(", "gr.Warning(", "gr.Error("):
            assert call not in text, f"{path.name} builds {call} itself: use app.web.messages"


# -- 10. lone surrogates at every door -----------------------------------------------------------------------
def test_a_lone_surrogate_in_the_chat_box_and_the_settings_is_cleaned_and_the_workspace_reloads(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    handlers.registry.grace_s = 0
    req = request("tab")
    workspace_id = handlers.attach(None, req)[0]
    view = handlers.submit({"text": "Hi \ud800 there", "files": []}, req)
    sendable(view)
    drain(handlers.read(req))
    sendable(drain(handlers.run("Be brief \udfff.", *SETTINGS[1:], request=req)))
    session = handlers.registry.peek("tab")
    assert session.chat[0].text == "Hi \ufffd there" and session.chat[-1].text
    sendable(handlers.rename("Name \ud800", req))
    assert session.name == "Name \ufffd"
    sendable(drain(handlers.queue_save("Name \ud800", req)))
    drain(handlers.run(*SETTINGS, req))
    handlers.unload(req)
    shown = handlers.attach(workspace_id, request("reload"))  # reloads, and sends
    sendable(shown)
    assert handlers.registry.peek("reload").chat[0].text == "Hi \ufffd there"


def test_a_lone_surrogate_in_an_imported_chat_is_cleaned(runtime, saved, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))

    def edit(record):
        record["session"]["chat"][0]["text"] = "Who \ud800 wrote this? \ud83d\ude00"
        record["summary"]["name"] = "Notes \udc00"

    crafted = edit_record(saved, tmp_path / "surrogate.lmiw", edit)
    assert b"\\ud800" in crafted.read_bytes()  # the file itself is valid UTF-8: JSON escapes carry the surrogate
    shown, _ = toasts(lambda: handlers.import_workspace(str(crafted), request("importer")))
    sendable(shown)
    session = handlers.registry.peek("importer")
    assert session.chat[0].text == "Who \ufffd wrote this? \U0001f600" and session.name == "Notes \ufffd (imported)"
    sendable(handlers.workspace_panel(request("importer")))


# -- 7. guessing passwords -----------------------------------------------------------------------------------
def test_wrong_passwords_make_the_next_try_wait_longer_each_time():
    from fastapi import HTTPException

    from app.web.login import FREE_TRIES, LoginGuard

    now = [0.0]
    guard = LoginGuard([("alice", "right")], first_wait_s=1.0, clock=lambda: now[0])
    for _ in range(FREE_TRIES):
        assert guard("alice", "wrong") is False
    waits = []
    for _ in range(4):
        with pytest.raises(HTTPException) as refused:
            guard("alice", "right")  # even the right password waits
        assert refused.value.status_code == 429 and "try again in" in refused.value.detail
        waits.append(int(refused.value.headers["Retry-After"]))
        now[0] += waits[-1]
        assert guard("alice", "wrong") is False
    assert waits == [1, 2, 4, 8]
    now[0] += 16
    assert guard("alice", "right") is True  # after the wait: logged in, and the count starts again
    assert guard("alice", "wrong") is False and guard("alice", "right") is True
    assert guard("mallory", "right") is False  # an unknown name is just wrong


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_hundred_wrong_passwords_over_http_are_refused_and_the_right_one_works_after_the_wait(runtime,
                                                                                                 tmp_path):
    from app.cli import AppConfig
    from app.engine.budget import Budget
    from app.web.server import build_app, launch

    config = AppConfig(model="test", auth=[("alice", "s3cret")], port=_free_port(), workspaces=str(tmp_path / "ws"))
    demo, _ = build_app(config, runtime, Budget(10_000, "test budget", 1))
    launch(config, demo, block=False)
    try:
        url = f"http://127.0.0.1:{config.port}/login"
        with httpx.Client(timeout=30) as client:
            started = time.monotonic()
            codes = [client.post(url, data={"username": "alice", "password": f"guess-{i}"}).status_code
                     for i in range(200)]
            assert time.monotonic() - started < 60
            checked = codes.count(400)  # a wrong password that was checked; 429: refused unchecked
            assert checked + codes.count(429) == 200 and checked <= 8, codes
            locked = client.post(url, data={"username": "alice", "password": "s3cret"})
            if locked.status_code == 429:  # still waiting: the right password waits too, saying how long
                assert "try again in" in locked.json()["detail"]
                time.sleep(int(locked.headers["Retry-After"]) + 0.2)
            assert client.post(url, data={"username": "alice", "password": "s3cret"}).status_code == 200
    finally:
        demo.close()
