"""Hostile use, round 2 (issue 31), item 16 (downloads): a workspace download is served from the disk as it is,
not copied into Gradio's cache (an 89 MB workspace took 178 MB of temp after one download, 267 after two)."""

from __future__ import annotations

import os
from pathlib import Path

import gradio as gr
from gradio import processing_utils, utils

from handler_fixtures import make_handlers, request
from test_app_hostile_round2 import ask


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


def test_a_download_is_a_link_to_the_saved_file_that_gradio_serves_without_a_copy(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req = request("tab")
    workspace_id = handlers.attach(None, req)[0]
    ask(handlers, req, "Hello?")
    session = handlers.registry.peek("tab")
    session.name = "Report"
    handlers.registry.save_now(session)
    saved = handlers.registry.store.path(None, workspace_id)

    block = gr.File()
    cache = Path(block.GRADIO_CACHE)
    before = _files(cache)
    served = []
    for _ in range(2):
        update = handlers.download_workspace(None, req)
        assert update["visible"] is True
        path = Path(update["value"])
        value = block.postprocess(str(path)).model_dump()
        assert path.name == "Report.lmiw" and os.path.samefile(path, saved)  # a link: no bytes copied
        assert utils.is_static_file(str(path)) and workspace_id not in str(path)  # the URL names no workspace
        sent = processing_utils.move_files_to_cache(value, block, postprocess=True)  # what the reply does
        served.append((Path(sent["path"]), path))
    assert all(sent == linked for sent, linked in served) and _files(cache) == before  # nothing copied
    assert _files(path.parent.parent) == {path}  # one link per session: a second download replaced the first

    handlers.registry.grace_s = 0
    handlers.unload(req)  # the session is freed: its link goes (it would keep a replaced save's bytes on disk)
    assert not path.exists() and saved.exists()
