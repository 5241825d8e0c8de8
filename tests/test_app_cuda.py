"""The app on an NVIDIA GPU (skipped without one; scripts/gpu_check.sh runs it there).

A Llama-2-7B-shaped random model (4 of its 32 layers, the demo model's tokenizer and chat template), loaded as
``python app.py --model DIR --load-in-4bit`` loads it: it reads a document beyond its window and answers; the live
panel's card shows CUDA allocated, reserved and peak memory; a real CUDA out-of-memory (a blocker tensor holds the
free memory) rolls the context back and the next feed works; answers, with recall or without, quoted (read in a
short context) or not, decode through CUDA graphs and say what the model's own forward says. Where Gradio is
installed, the launched app itself answers on CUDA (the GPU machine's image has no Gradio, so gpu_check.sh runs the
engine tests).
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import json
import shutil

import pytest
import torch

from app.cli import AppConfig
from app.engine.context import ContextEngine
from app.engine.context_records import AnswerResult, ContextOutOfMemory
from app.engine.generation import GenerationSettings
from app.engine.metrics import device_memory
from app.engine.model_loading import ModelChoice, load_runtime
from app.web.views import panel_html
from app_fixtures import model_dir
from benchmarks.models import LLAMA2_7B, random_checkpoint
from test_app_engine import code_file, pdf_like, run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (scripts/gpu_check.sh)")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
SETTINGS = GenerationSettings(temperature=0.0, max_new_tokens=8, recall=True, topk=5)
MiB = 1 << 20


@pytest.fixture(scope="module")
def llama2_shaped(tmp_path_factory):
    """A folder as a user would pass to --model: config, bf16 safetensors, tokenizer and chat template."""
    from transformers import LlamaConfig

    folder = tmp_path_factory.mktemp("llama2-shaped")
    demo = json.loads((model_dir() / "config.json").read_text())
    ids = {key: demo[key] for key in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")}
    weights = random_checkpoint(LlamaConfig(**{**LLAMA2_7B, "num_hidden_layers": 4, **ids}))
    for name in ("config.json", "model.safetensors"):
        (folder / name).symlink_to(weights / name)
    for name in TOKENIZER_FILES:
        shutil.copy(model_dir() / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def runtime(llama2_shaped):
    config = AppConfig(model=str(llama2_shaped), quantization="4bit", device="cuda")
    return load_runtime(config, ModelChoice(str(llama2_shaped), "test: Llama-2-7B shape, 4 layers"))


def new_engine(runtime) -> ContextEngine:
    return ContextEngine(runtime, system_prompt="Answer from the document.", budget=1_000_000)


def test_a_4bit_llama2_shape_reads_beyond_its_window_answers_and_the_panel_shows_gpu_memory(runtime):
    import bitsandbytes as bnb

    assert runtime.device_type == "cuda" and runtime.window == 4096
    assert sum(isinstance(m, bnb.nn.Linear4bit) for m in runtime.model.modules()) == 4 * 7
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like(pages=60)))  # 28K byte-level tokens: almost seven windows
    assert engine.length > 6 * 4096 and engine.cache.get_seq_length() == engine.length
    fed = engine.length
    result = run(engine.ask("What is the pass key?", SETTINGS))
    assert isinstance(result, AnswerResult) and engine.length > fed
    memory = device_memory(runtime.device_type)
    assert memory.kind == "cuda" and 0 < memory.allocated <= memory.reserved and memory.peak >= memory.allocated
    card = panel_html(engine.stats, memory, 1_000_000, None)
    assert "GPU memory" in card and "reserved" in card and "peak" in card


# This 4-bit model's own forward is not bitwise reproducible (test_lminfinite_cuda.py's 4-bit test: two caches fed
# the same ids differ by up to 0.039 at |logit| = 5), so greedy may pick either of two logits closer than this.
NEAR_TIE = 0.125


def test_answers_without_recall_decode_through_cuda_graphs_and_say_the_same(runtime, monkeypatch):
    """An answer without recall replays one recorded CUDA graph per question (runtime.decoder_for); the answer is
    --no-cuda-graphs' token for token, up to a near-tie (NEAR_TIE) where the two contexts part, and so is the middle
    store recall reads later. On 2026-11-28 (H200) the graphed answer took the other side of such a tie at its
    4th token, then came back to the same tokens (196 → 111 or 86): what this test now tells apart."""
    no_graphs = dataclasses.replace(runtime, graph_recorder=None)
    # quote=False: a quoted answer is read in a fresh short context (reader.py), inside the window, never steady
    settings = dataclasses.replace(SETTINGS, recall=False, quote=False, max_new_tokens=16)
    engines, answers, scores = [new_engine(no_graphs), new_engine(runtime)], [], _scores_seen(monkeypatch)
    for engine in engines:
        run(engine.feed_documents(pdf_like(pages=12)))  # beyond the 4,096-token window: steady decoding
        answers.append([])
        for question in ("What is the pass key?", "Who wrote it?"):
            scores.clear()
            answers[-1].append((run(engine.ask(question, settings)).answer_ids, list(scores)))
    plain, graphed = engines
    assert graphed._decoder.recordings == 2 and not graphed._decoder.unrecordable
    if _same_up_to_a_near_tie(answers[0], answers[1]):
        for kept, replayed in zip(plain.cache.layers, graphed.cache.layers):
            assert (kept.middle is None) == (replayed.middle is None)  # layers below topk_from_layer keep none
            if kept.middle is not None:
                for a, b in zip(kept.middle.view(), replayed.middle.view()):
                    torch.testing.assert_close(b, a, atol=2**-5, rtol=2**-5)  # a wrong row is off by far more
    for engine in engines:
        engine.close()


def test_quoted_answers_decode_through_cuda_graphs_and_say_the_same(runtime, monkeypatch):
    """A quoted answer (the default) is drawn in a reader's short context, inside the window (reader.py): its steps
    before the window is full replay one recording too (decode_step.py's filling steps), where they once ran
    eagerly at 71-98 ms a token against 7-8 through a graph (H200, 2026-11-29). The answer is --no-cuda-graphs'
    up to a near-tie."""
    decoders, make = [], type(runtime).decoder_for

    def decoder_for(self, cache):
        decoders.append(make(self, cache))
        return decoders[-1]

    monkeypatch.setattr(type(runtime), "decoder_for", decoder_for)
    no_graphs = dataclasses.replace(runtime, graph_recorder=None)
    settings = dataclasses.replace(SETTINGS, quote=True, max_new_tokens=16)
    engines, answers, scores = [new_engine(no_graphs), new_engine(runtime)], [], _scores_seen(monkeypatch)
    for engine in engines:
        run(engine.feed_documents(pdf_like(pages=12)))
        scores.clear()
        result = run(engine.ask("What is the pass key?", settings))
        assert result.quoted
        answers.append([(result.answer_ids, list(scores))])
    readers = [decoder for decoder in decoders if decoder is not None and decoder.cache is not engines[1].cache]
    assert readers and sum(decoder.recordings for decoder in readers) >= 1
    assert not any(decoder.unrecordable for decoder in readers)
    _same_up_to_a_near_tie(*answers)
    for engine in engines:
        engine.close()


def _scores_seen(monkeypatch) -> list[torch.Tensor]:
    """The logits every greedy choice of an answer is made from, in order (a copy: a replay rewrites its buffer)."""
    from app.engine import context

    seen, choose = [], context.next_token

    def next_token(logits, *args, **kwargs):
        seen.append(logits.detach().float().cpu().clone())
        return choose(logits, *args, **kwargs)

    monkeypatch.setattr(context, "next_token", next_token)
    return seen


def _same_up_to_a_near_tie(plain: list, graphed: list) -> bool:
    """Each answer's tokens and logits (within NEAR_TIE) are the same until the two take different sides of a
    near-tie, after which their contexts differ and nothing more is compared; whether they never parted."""
    for (plain_ids, plain_scores), (graphed_ids, graphed_scores) in zip(plain, graphed):
        for step, (a, b) in enumerate(zip(plain_ids, graphed_ids)):
            if a != b:
                gap = float(plain_scores[step][a] - plain_scores[step][b])
                assert gap < NEAR_TIE, f"step {step}: the graph chose {b} over {a}, {gap} behind"
                return False
            assert float((plain_scores[step] - graphed_scores[step]).abs().max()) < NEAR_TIE, f"step {step}"
        assert plain_ids == graphed_ids
    return True


def test_a_real_cuda_out_of_memory_rolls_back_and_the_next_feed_works(runtime):
    engine = new_engine(runtime)
    run(engine.feed_documents(pdf_like(pages=12)))
    length = engine.length
    blocker = _take_free_gpu_memory()
    try:
        with pytest.raises(ContextOutOfMemory, match="rolled back"):
            run(engine.feed_documents(pdf_like(pages=40)))
        assert engine.length == length and engine.cache.get_seq_length() == length
    finally:
        del blocker
        gc.collect()
        torch.cuda.empty_cache()
    run(engine.feed_documents(code_file()))
    assert engine.length > length and engine.cache.get_seq_length() == engine.length
    assert isinstance(run(engine.ask("What does function_3 return?", SETTINGS)), AnswerResult)


def _take_free_gpu_memory() -> torch.Tensor:
    """One tensor over all but a sliver of the GPU's free memory, so the next real allocation fails."""
    gc.collect()
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info()[0]
    for margin in (2 * MiB, 16 * MiB, 64 * MiB, 256 * MiB):
        try:
            return torch.empty(free - margin, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            continue
    pytest.fail(f"could not hold {free / MiB:,.0f} MiB of free GPU memory")


@pytest.mark.skipif(importlib.util.find_spec("gradio") is None, reason="Gradio is not installed")
def test_the_launched_app_reads_and_answers_on_cuda_in_4bit(llama2_shaped, tmp_path):
    from app_client import AppClient
    from app_fixtures import make_long_text
    from benchmarks.launched_app import start_app

    server = start_app("--model", str(llama2_shaped), "--load-in-4bit", "--device", "cuda", timeout_s=300)
    try:
        client = AppClient(server.url)
        client.ask("What is the pass key?", files=[make_long_text(tmp_path / "notes.txt", sentences=400)])
        assert client.context_tokens > 4096 and client.chat[-1]["role"] == "assistant" and client.last_answer()
        memory = client.panel()["memory"]
        assert memory["kind"] == "cuda" and memory["allocated"] > 0 and memory["reserved"] >= memory["allocated"]
    finally:
        server.stop()
