"""Hostile use, round 2 (issue 31), item 6: ``--dtype auto`` is decided by what the CPU is (whether it multiplies
bfloat16 in hardware), the same at every start (a speed test at each start flipped between bfloat16 and float32 on a loaded
machine), and a workspace saved in another dtype is reopened by converting its cache, not refused."""

from __future__ import annotations

import time

import torch

from app_fixtures import make_long_text, model_dir
from handler_fixtures import make_handlers, request
from test_app_hostile_round2 import ask, toasts

from app import cli
from app.engine import model_loading


def test_auto_dtype_on_the_cpu_follows_its_flags_and_times_nothing(tmp_path, monkeypatch):
    from app.engine import cpu_dtype

    def no_timing():
        raise AssertionError("--dtype auto timed a product")

    monkeypatch.setattr(time, "perf_counter", no_timing)
    amx = tmp_path / "amx"
    amx.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_bf16 amx_tile\n\n"
                   "processor\t: 1\nflags\t\t: fpu sse avx512f avx512_bf16 amx_bf16 amx_tile\n")
    zen4 = tmp_path / "zen4"
    zen4.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n")
    plain = tmp_path / "plain"
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n")
    assert cpu_dtype.default_cpu_dtype(cpu_dtype.cpu_flags(str(amx))) == (
        torch.bfloat16, "amx_bf16: this CPU multiplies bfloat16 in hardware")
    assert cpu_dtype.default_cpu_dtype(cpu_dtype.cpu_flags(str(zen4))) == (
        torch.bfloat16, "avx512_bf16: this CPU multiplies bfloat16 in hardware")
    assert cpu_dtype.default_cpu_dtype(cpu_dtype.cpu_flags(str(plain))) == (
        torch.float32, "this CPU does not multiply bfloat16 in hardware: no amx_bf16 or avx512_bf16")
    assert cpu_dtype.cpu_flags(str(tmp_path / "absent")) == frozenset()  # not Linux: float32
    chosen = {model_loading.resolve_dtype(cli.AppConfig(), on_cuda=False) for _ in range(20)}
    assert len(chosen) == 1 and chosen == {cpu_dtype.default_cpu_dtype()}  # the same at every start


def test_a_workspace_saved_in_float32_reopens_in_bfloat16_and_back(runtime, tmp_path):
    from app.engine.model_loading import ModelChoice, load_runtime

    directory = str(model_dir())
    bf16 = load_runtime(cli.AppConfig(model=directory, cpu_threads=1, dtype="bfloat16"), ModelChoice(directory, "test"))
    assert runtime.dtype == torch.float32 and bf16.dtype == torch.bfloat16 and runtime.name == bf16.name

    def saved_by(rt, folder):
        handlers = make_handlers(rt, workspaces=str(tmp_path / folder))
        req = request("maker")
        workspace_id = handlers.attach(None, req)[0]
        ask(handlers, req, "What is this about?", [make_long_text(tmp_path / "notes.txt", 30)])
        tokens = handlers.registry.peek("maker").context_tokens
        handlers.registry.save_now(handlers.registry.peek("maker"))
        return workspace_id, tokens

    for saver, opener, folder in ((runtime, bf16, "f32"), (bf16, runtime, "bf16")):
        workspace_id, tokens = saved_by(saver, folder)
        handlers = make_handlers(opener, workspaces=str(tmp_path / folder))
        shown, said = toasts(lambda: handlers.attach(workspace_id, request("opener")))
        assert shown[0] == workspace_id and said[0].startswith("Reopened"), said
        session = handlers.registry.peek("opener")
        assert session.context_tokens == tokens and session.engine.cache.layers[0].ring_k.dtype == opener.dtype
        ask(handlers, request("opener"), "And then?")
        assert session.chat[-1].text and session.chat[-1].in_context
