"""Persisting an InfiniteCache (lminfinite/persist.py): exact round trips, a smaller middle store, refusals of
another model or a damaged file, and saves that a failure or a kill cannot half-write."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch

import lminfinite
from lminfinite import tensor_file
from lminfinite import (CacheFileError, CacheMismatch, LMInfiniteConfig, cache_state, load_cache, restore_cache,
                        save_cache)
from lminfinite.layer_state import POSITIONS
from lminfinite.persist import INFO_KEY
from lminfinite_models import FAMILIES, WINDOW, feed_in_chunks, random_ids, tiny_model

N_STARTING = 4
PREFIX = 150  # over 9 windows: the ring wraps and the frame re-bases several times
RECALL = {"topk": 4, "topk_from_layer": 1}


def enabled(family="llama-gqa", **config):
    return lminfinite.enable(tiny_model(family), LMInfiniteConfig(**{"n_starting": N_STARTING, **config}))


def filled(model, **cache_kwargs):
    """A cache fed PREFIX tokens in uneven chunks, then 3 one at a time (steady decoding); and its last logits."""
    cache = lminfinite.InfiniteCache(model, **cache_kwargs)
    feed_in_chunks(model, random_ids(PREFIX), 37, cache)
    logits = feed_in_chunks(model, random_ids(3, seed=2), 1, cache)[:, -1]
    layer = cache.layers[-1]
    assert layer.frame > WINDOW and layer.win_start > N_STARTING + WINDOW  # wrapped and re-based
    return cache, logits


def greedy(model, cache, logits, steps=20):
    """Greedy decoding on from ``logits``: the tokens fed, and the next-token logits after each."""
    tokens, after = [], []
    with torch.no_grad():
        for _ in range(steps):
            token = logits.argmax(-1, keepdim=True)
            logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1]
            tokens.append(int(token))
            after.append(logits)
    return tokens, after


def assert_same_decoding(model, original, restored, logits):
    expected_tokens, expected = greedy(model, original, logits)
    tokens, got = greedy(model, restored, logits)
    assert tokens == expected_tokens
    for step, (new, old) in enumerate(zip(got, expected)):
        assert torch.equal(new, old), f"step {step}: logits differ by up to {(new - old).abs().max():.3g}"


# -- exact round trips ------------------------------------------------------------------------------
CASES = {
    "plain-mha": ("llama-mha", {}, {}),
    "plain-mistral-gqa": ("mistral-gqa", {}, {}),
    "recall-gqa": ("llama-gqa", RECALL, {}),
    "recall-qwen2-gqa": ("qwen2-gqa", RECALL, {}),
    "recall-offloaded": ("llama-gqa", RECALL, {"offload_middle": True}),
    "recall-own-topk": ("llama-gqa", {**RECALL, "topk": 0}, {"keep_middle": True, "topk": 3}),
}


@pytest.mark.parametrize("family, config, cache_kwargs", CASES.values(), ids=CASES.keys())
def test_a_loaded_cache_decodes_exactly_like_the_saved_one(tmp_path, family, config, cache_kwargs):
    model = enabled(family, **config)
    cache, logits = filled(model, **cache_kwargs)
    path = tmp_path / "context.safetensors"
    save_cache(cache, path, metadata={"model": family})
    restored, metadata = load_cache(model, path)
    assert metadata == {"model": family}
    assert restored.topk == cache.topk and restored.get_seq_length() == cache.get_seq_length()
    assert [l.middle is None for l in restored.layers] == [l.middle is None for l in cache.layers]
    middles = [(l.middle.length, l.middle.device) for l in restored.layers if l.middle is not None]
    assert middles == [(l.middle.length, l.middle.device) for l in cache.layers if l.middle is not None]
    if cache.keeps_middle:
        assert all(length > 0 for length, _ in middles)  # recall has evicted tokens to choose from
    if cache_kwargs.get("offload_middle"):
        assert all(device == torch.device("cpu") for _, device in middles)
    assert_same_decoding(model, cache, restored, logits)


def test_a_cache_rolled_back_before_saving_keeps_only_its_rows(tmp_path):
    model = enabled(**RECALL)
    cache, logits = filled(model)
    snap = cache.snapshot()
    feed_in_chunks(model, random_ids(3 * WINDOW + 5, seed=3), 9, cache)  # an abandoned branch, re-based again
    branch_rows = cache.layers[1].middle.length
    cache.rollback(snap)
    path = tmp_path / "context.safetensors"
    save_cache(cache, path)
    with safetensors.safe_open(str(path), "pt") as file:  # the store still holds the branch's rows: not saved
        assert file.get_slice("layers.1.middle_k").get_shape()[-2] == cache.layers[1].middle.length < branch_rows
    restored, _ = load_cache(model, path)
    assert_same_decoding(model, cache, restored, logits)


def test_an_empty_cache_round_trips(tmp_path):
    model = enabled(**RECALL)
    save_cache(lminfinite.InfiniteCache(model), tmp_path / "empty.safetensors")
    restored, _ = load_cache(model, tmp_path / "empty.safetensors")
    fresh = lminfinite.InfiniteCache(model)
    ids = random_ids(2 * WINDOW)
    assert torch.equal(feed_in_chunks(model, ids, 7, restored), feed_in_chunks(model, ids, 7, fresh))


def test_state_is_cpu_copies_and_json_and_restores_under_inference_mode():
    """cache_state never aliases the live cache; a cache restored under inference_mode still decodes under
    no_grad afterwards (tensors it keeps are written in place)."""
    model = enabled(**RECALL)
    cache, logits = filled(model)
    tensors, info = cache_state(cache)
    assert json.loads(json.dumps(info)) == info
    assert info["identity"] == {"n_starting": N_STARTING, "window": WINDOW, "topk_from_layer": 1, "topk_distance": 8,
                                "num_layers": 3, "num_kv_heads": 2, "head_dim": 16, "dtype": "float32"}
    assert all(t.device.type == "cpu" and t.is_contiguous() for t in tensors.values())
    assert tensors["layers.0.ring_k"].data_ptr() != cache.layers[0].ring_k.data_ptr()
    assert tensors["layers.1.middle_k"].shape[-2] == cache.layers[1].middle.length
    with torch.inference_mode():
        restored = restore_cache(model, tensors, info)
    assert not restored.layers[1].ring_k.is_inference() and not restored.layers[1].middle.keys.is_inference()
    assert_same_decoding(model, cache, restored, logits)


# -- a smaller middle store -------------------------------------------------------------------------
# Measured with llama-gqa: at most 0.019 over 20 steps (its logits reach 0.6; 1e-4 on most steps, more where a
# rounded key changes which middle tokens recall selects). qwen2-gqa: 0.0014, llama-mha: 0.008.
BF16_MAX_LOGIT_DIFF = 0.05


def test_a_bf16_middle_store_is_smaller_and_close(tmp_path):
    model = enabled(**RECALL)
    cache, logits = filled(model)
    exact_path, small_path = tmp_path / "exact.safetensors", tmp_path / "small.safetensors"
    save_cache(cache, exact_path)
    save_cache(cache, small_path, middle_dtype=torch.bfloat16)
    middle_bytes = sum(layer.middle.nbytes for layer in cache.layers if layer.middle is not None)  # float32 rows
    saved = exact_path.stat().st_size - small_path.stat().st_size
    assert abs(saved - middle_bytes // 2) < 256  # half of every middle row; the headers differ by a few bytes
    exact, _ = load_cache(model, exact_path)
    small, _ = load_cache(model, small_path)
    assert small.layers[1].middle.keys.dtype == torch.float32  # back in the cache's dtype
    tokens, expected = greedy(model, exact, logits)
    with torch.no_grad():  # the same tokens through the bf16-middle cache
        got = [model(input_ids=torch.tensor([[t]]), past_key_values=small).logits[:, -1] for t in tokens]
    diff = max(float((a - b).abs().max()) for a, b in zip(got, expected))
    assert 0 < diff < BF16_MAX_LOGIT_DIFF, diff  # recall reads the rounded middle, and barely notices
    again, _ = load_cache(model, small_path)
    small_tokens, _ = greedy(model, again, logits)
    assert small_tokens == tokens


# -- another model: refused, naming what differs ----------------------------------------------------
@pytest.fixture(scope="module")
def saved_file(tmp_path_factory):
    """A recall cache (llama-gqa, float32, window 16, n_starting 4, recall from layer 1) on disk."""
    model = enabled(**RECALL)
    cache, _ = filled(model)
    path = tmp_path_factory.mktemp("persist") / "context.safetensors"
    save_cache(cache, path, metadata={"note": "fixture"})
    return path


def two_layer_model():
    model_cls, make_config = FAMILIES["llama-gqa"]
    config = make_config()
    config.num_hidden_layers = 2
    torch.manual_seed(0)
    return lminfinite.enable(model_cls(config).eval(), LMInfiniteConfig(n_starting=N_STARTING, **RECALL))


MISMATCHES = {
    "window": (lambda: enabled(**RECALL, window=8), "window=16.*window=8"),
    "n_starting": (lambda: enabled(**RECALL, n_starting=2), "n_starting=4.*n_starting=2"),
    "topk_from_layer": (lambda: enabled(topk=4, topk_from_layer=2), "topk_from_layer=1.*topk_from_layer=2"),
    "topk_distance": (lambda: enabled(**RECALL, topk_distance=4), "topk_distance=8.*topk_distance=4"),
    "num_layers": (two_layer_model, "num_layers=3.*num_layers=2"),
    "kv_heads": (lambda: enabled("llama-mha", **RECALL), "num_kv_heads=2.*num_kv_heads=4"),
    "dtype": (lambda: enabled(**RECALL).to(torch.bfloat16), "dtype='float32'.*dtype='bfloat16'"),
    "model_topk": (lambda: enabled(topk=2, topk_from_layer=1), "topk=4.*topk=2"),  # the cache follows the model's k
}


@pytest.mark.parametrize("make_model, message", MISMATCHES.values(), ids=MISMATCHES.keys())
def test_another_model_is_refused_naming_the_field(saved_file, make_model, message):
    with pytest.raises(CacheMismatch, match=message):
        load_cache(make_model(), saved_file)


def test_a_cache_with_its_own_topk_loads_into_a_model_with_another(tmp_path):
    model = enabled(**RECALL)
    cache, _ = filled(model, topk=3)
    save_cache(cache, tmp_path / "own.safetensors")
    restored, _ = load_cache(enabled(topk=2, topk_from_layer=1), tmp_path / "own.safetensors")
    assert restored.topk == 3


# -- damaged files: CacheFileError saying what is wrong ---------------------------------------------
def rewrite(source: Path, target: Path, edit) -> Path:
    """``source`` with ``edit(tensors, metadata)`` applied, saved as a valid safetensors file."""
    with safetensors.safe_open(str(source), "pt") as file:
        metadata, tensors = file.metadata(), {name: file.get_tensor(name) for name in file.keys()}
    edit(tensors, metadata)
    safetensors.torch.save_file(tensors, str(target), metadata=metadata)
    return target


def edit_info(change):
    def edit(tensors, metadata):
        info = json.loads(metadata[INFO_KEY])
        change(info)
        metadata[INFO_KEY] = json.dumps(info)
    return edit


def _set(key, value):
    return lambda info: info.__setitem__(key, value)


def _shorter_middles(tensors, metadata):
    """Middle stores one token short, their tensors and records in step: a count the layers' counters contradict."""
    for i in (1, 2):
        for name in (f"layers.{i}.middle_k", f"layers.{i}.middle_v"):
            tensors[name] = tensors[name][..., 1:, :].clone()
    edit_info(lambda info: [info["layers"][i].update(middle=133) for i in (1, 2)])(tensors, metadata)


EDITS = {
    "tensor-removed": (lambda t, m: t.pop("layers.1.ring_v"), "missing tensor layers.1.ring_v"),
    "tensor-added": (lambda t, m: t.__setitem__("extra", torch.zeros(1)), "unexpected tensor extra"),
    "wrong-shape": (lambda t, m: t.__setitem__("layers.2.middle_k", t["layers.2.middle_k"][..., 1:, :].clone()),
                    r"layers.2.middle_k is \(1, 2, 133, 16\) float32, expected \(1, 2, 134, 16\)"),
    "wrong-dtype": (lambda t, m: t.__setitem__("layers.0.start_k", t["layers.0.start_k"].double()),
                    "layers.0.start_k is .* float64, expected .* float32"),
    "unknown-version": (edit_info(_set("version", 7)), "unsupported cache format version 7"),
    "field-missing": (edit_info(lambda info: info["layers"][1].pop("frame")), "layer 1: missing field 'frame'"),
    "bad-counter": (edit_info(lambda info: info["layers"][2].__setitem__("seen", -1)),
                    "'seen' has an invalid value -1"),
    "layers-short": (edit_info(lambda info: info["layers"].pop()), "2 layer records for num_layers=3"),
    "layers-disagree-on-seen": (edit_info(lambda info: info["layers"][2].update(seen=100, win_start=100, frame=100)),
                                r"the layers disagree on 'seen': \[153, 153, 100\]"),
    "layers-disagree-on-frame": (edit_info(lambda info: info["layers"][0].update(frame=0)),
                                 "the layers disagree on 'frame'"),
    "win-start-off-by-one": (edit_info(lambda info: [layer.update(win_start=137) for layer in info["layers"]]),
                             r"win_start 137 does not follow from seen=153, n_starting=4 and window=16 \(expected 138\)"),
    "middle-shorter-than-seen": (lambda t, m: _shorter_middles(t, m), "layer 1: a middle store of 133 tokens, expected 134"),
    "bad-json": (lambda t, m: m.__setitem__(INFO_KEY, "{not json"), "not valid JSON"),
    "no-info": (lambda t, m: m.pop(INFO_KEY), "no LM-Infinite cache"),
}


@pytest.mark.parametrize("edit, message", EDITS.values(), ids=EDITS.keys())
def test_a_malformed_file_is_refused_saying_what_is_wrong(saved_file, tmp_path, edit, message):
    damaged = rewrite(saved_file, tmp_path / "damaged.safetensors", edit)
    with pytest.raises(CacheFileError, match=message):
        load_cache(enabled(**RECALL), damaged)


@pytest.mark.parametrize("damage", ["truncated", "random-bytes", "empty"])
def test_a_truncated_or_random_file_is_refused(saved_file, tmp_path, damage):
    data = saved_file.read_bytes()
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes({"truncated": data[: len(data) - 100], "random-bytes": random.Random(0).randbytes(4096),
                         "empty": b""}[damage])
    with pytest.raises(CacheFileError, match="damaged.safetensors is truncated or corrupt"):
        load_cache(enabled(**RECALL), damaged)


def test_malformed_state_is_refused_without_a_traceback_from_inside():
    model = enabled(**RECALL)
    tensors, info = cache_state(filled(model)[0])
    with pytest.raises(CacheFileError, match="cache info: missing field 'layers'"):
        restore_cache(model, tensors, {k: v for k, v in info.items() if k != "layers"})
    with pytest.raises(CacheFileError, match="not an LM-Infinite cache"):
        restore_cache(model, tensors, ["not", "a", "dict"])


def test_save_refuses_bad_metadata_and_middle_dtype(tmp_path):
    cache = lminfinite.InfiniteCache(enabled())
    with pytest.raises(ValueError, match="may not use the key"):
        save_cache(cache, tmp_path / "c", metadata={INFO_KEY: "mine"})
    with pytest.raises(ValueError, match="must map str to str"):
        save_cache(cache, tmp_path / "c", metadata={"steps": 3})
    with pytest.raises(TypeError, match="floating-point torch.dtype"):
        save_cache(cache, tmp_path / "c", middle_dtype=torch.int8)
    assert not os.listdir(tmp_path)


# -- atomic saves -----------------------------------------------------------------------------------
def _partial_write(real):
    def write_pieces(file, tensor):
        real(file, tensor)
        file.flush()
        raise OSError("no space left on device (simulated)")  # after the first tensor's bytes
    return write_pieces


def _fail_after_write(real):
    calls = []

    def write_pieces(file, tensor):
        real(file, tensor)
        calls.append(tensor)
        if len(calls) == 3:
            raise OSError("write failed after the data (simulated)")
    return write_pieces


@pytest.mark.parametrize("failure", ["partial-write", "after-write", "rename"])
def test_a_failed_save_leaves_the_previous_file_whole(tmp_path, monkeypatch, failure):
    model = enabled(**RECALL)
    cache, _ = filled(model)
    path = tmp_path / "context.safetensors"
    save_cache(cache, path, metadata={"version": "old"})
    before = path.read_bytes()
    feed_in_chunks(model, random_ids(WINDOW, seed=4), 5, cache)  # the newer state whose save fails
    if failure == "rename":
        def fail_replace(src, dst):
            raise OSError("rename failed (simulated)")
        monkeypatch.setattr(os, "replace", fail_replace)
    else:
        wrap = _partial_write if failure == "partial-write" else _fail_after_write
        monkeypatch.setattr(tensor_file, "_write_pieces", wrap(tensor_file._write_pieces))
    with pytest.raises(OSError, match="simulated"):
        save_cache(cache, path, metadata={"version": "new"})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["context.safetensors"]  # no temporary file left behind
    restored, metadata = load_cache(model, path)
    assert metadata == {"version": "old"} and restored.get_seq_length() == PREFIX + 3


KILLED_SAVER = r"""
import sys, torch
from lminfinite.persist import save_cache
cache = torch.load(sys.argv[1], weights_only=False)
save_cache(cache, sys.argv[2], metadata={"save": "0"})
print("saved", flush=True)
sys.stdin.readline()  # go
for i in range(1, 10**9):
    save_cache(cache, sys.argv[2], metadata={"save": str(i)})
"""


def folder_state(folder: Path) -> dict | None:
    """Names, sizes and times of the folder's files; None when one vanished while listed (a rename)."""
    try:
        return {entry.name: (entry.stat().st_size, entry.stat().st_mtime_ns) for entry in os.scandir(folder)}
    except FileNotFoundError:
        return None


def kill_while_writing(saver, folder: Path, delay_ms: float) -> None:
    """SIGKILL ``saver`` ``delay_ms`` after the folder first changes: inside a save, whatever writes it does."""
    before = folder_state(folder)
    saver.stdin.write("go\n")
    saver.stdin.flush()
    deadline = time.monotonic() + 5
    while folder_state(folder) == before and time.monotonic() < deadline:
        time.sleep(0.0002)
    time.sleep(delay_ms / 1000)
    saver.send_signal(signal.SIGKILL)
    saver.wait()


def test_a_save_killed_at_a_random_moment_leaves_a_loadable_file(tmp_path):
    """Real crashes: processes saving a 32 MB cache over and over, each killed (SIGKILL) a random 0-40 ms after
    a save started touching its folder; the file then holds one save or a later one, whole. Temporary files
    may remain. (A writer that truncates the file and writes it in place fails here: the kill lands mid-write.)"""
    model = enabled(**RECALL)
    cache, _ = filled(model)
    rows = 2**16  # bulk the middle store: each save then takes long enough to be killed in the middle
    for layer in cache.layers:  # as if that many more tokens had passed the window: counters that still agree
        if layer.middle is not None:
            layer.middle.append(torch.randn(1, 2, rows, 16), torch.randn(1, 2, rows, 16))
        for name in POSITIONS:
            setattr(layer, name, getattr(layer, name) + rows)
    pickled = tmp_path / "cache.pt"
    torch.save(cache, pickled)
    root = Path(lminfinite.__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    folders = [tmp_path / f"run-{i}" for i in range(4)]
    savers = []
    for folder in folders:
        folder.mkdir()
        savers.append(subprocess.Popen([sys.executable, "-c", KILLED_SAVER, str(pickled), str(folder / "context")],
                                       cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    delays = [random.uniform(0, 40) for _ in savers]
    try:
        for saver, folder, delay in zip(savers, folders, delays):
            assert saver.stdout.readline() == "saved\n", "the saver died before its first save"
            kill_while_writing(saver, folder, delay)
            try:
                restored, metadata = load_cache(model, folder / "context")  # never a torn file
            except CacheFileError as error:
                pytest.fail(f"killed {delay:.1f} ms into a save: {error}")
            assert metadata["save"].isdigit()
            assert restored.layers[1].middle.length == cache.layers[1].middle.length
            # What the kill may leave beside the file: temporary files (ours, safetensors' own ".tmp…").
            assert all(name.startswith((".context.", ".tmp")) for name in os.listdir(folder) if name != "context")
    finally:
        for saver in savers:
            saver.kill()
            saver.wait()


def test_the_file_is_standard_safetensors_written_from_views_without_copying_them(tmp_path):
    """write_tensors writes a non-contiguous view (a middle store's rows in use) piece by piece; safetensors'
    own reader gets exactly the tensors, and cache_state(copy=False) hands over the cache's own storage."""
    from safetensors.torch import load_file

    buffer = torch.randn(2, 3, 50, 8)
    tensors = {"rows": buffer[..., :37, :], "bf16": torch.randn(4, 5).to(torch.bfloat16),
               "ids": torch.arange(7), "empty": torch.zeros(0, 3)}
    assert not tensors["rows"].is_contiguous()
    tensor_file.write_tensors(tensors, {"note": "x"}, tmp_path / "t.safetensors")
    loaded = load_file(str(tmp_path / "t.safetensors"))
    assert set(loaded) == set(tensors) and all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    with safetensors.safe_open(str(tmp_path / "t.safetensors"), framework="pt") as handle:
        assert handle.metadata() == {"note": "x"}

    model = enabled(**RECALL)
    cache, _ = filled(model)
    shared, _ = cache_state(cache, copy=False)
    copied, _ = cache_state(cache)
    layer = next(i for i, l in enumerate(cache.layers) if l.middle is not None and l.middle.length)
    assert shared[f"layers.{layer}.middle_k"].data_ptr() == cache.layers[layer].middle.keys.data_ptr()
    assert copied[f"layers.{layer}.middle_k"].data_ptr() != cache.layers[layer].middle.keys.data_ptr()
    assert all(torch.equal(shared[k], copied[k]) for k in copied)
