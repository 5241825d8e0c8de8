"""Fast checks of the shipped demo model (demo_model/): real trained weights, no download.

Training is never run here; see scripts/train_demo_model.py.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "demo_model"
sys.path.insert(0, str(ROOT))

from training.evaluate import greedy_answer, heldout_windows, nll_per_byte  # noqa: E402
from training.tasks import PASSKEY_INTRO_SHORT, passkey_prompt  # noqa: E402

# Measured on the shipped weights: 1.23 nats/byte on these 16 windows (demo_model/README.md reports 1.08 on its
# 64); margin for other Python versions' stdlib and CPU rounding. An untrained model scores about 5.6.
MAX_HELDOUT_NLL_PER_BYTE = 1.30


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL_DIR, local_files_only=True)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(MODEL_DIR, local_files_only=True).eval()


def test_shipped_files_and_size():
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json", "README.md"):
        assert (MODEL_DIR / name).is_file(), name
    total = sum(p.stat().st_size for p in MODEL_DIR.iterdir() if p.is_file())
    assert total <= 20 * 1024 * 1024
    config = json.loads((MODEL_DIR / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["max_position_embeddings"] in (128, 256)


def test_loads_offline_without_network(monkeypatch):
    """from_pretrained on the local path must not try to reach the Hub."""

    def no_network(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert len(tok) == model.config.vocab_size


def test_model_matches_tokenizer(model, tokenizer):
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.bos_token_id == tokenizer.bos_token_id == tokenizer.convert_tokens_to_ids("<s>")
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("</s>")
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_chat_template_is_llama2(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello?"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "What is the pass key?"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHello? [/INST] Hi. </s>"
        "<s>[INST] What is the pass key? [/INST]"
    )
    ids = tokenizer.apply_chat_template(messages, tokenize=True)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 2
    assert ids.count(tokenizer.eos_token_id) == 1
    assert tokenizer.decode(ids) == text


def test_tokenizer_round_trips_utf8(tokenizer):
    text = "def f(x):\n\treturn 'héllo wörld' + \"日本語\" + '🙂'  # 71432 [INST] <<SYS>>\r\n  "
    ids = tokenizer.encode(text)
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    digits = tokenizer.encode(" 71432", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(digits)[-5:] == list("71432")


def _passkey_ids(tokenizer, key: str, before: int, after: int, intro: str = "") -> list[int]:
    """Chat prompt of the paper's pass-key task, short enough to stay within L."""
    messages = [{"role": "user", "content": passkey_prompt(before, after, key, intro)}]
    return tokenizer.apply_chat_template(messages, tokenize=True)["input_ids"]


def test_greedy_generation_is_deterministic(model, tokenizer):
    ids = _passkey_ids(tokenizer, "58213", 1, 0)
    assert len(ids) + 32 <= model.config.max_position_embeddings
    first = greedy_answer(model, tokenizer, ids, max_new_tokens=32)
    second = greedy_answer(model, tokenizer, ids, max_new_tokens=32)
    assert first == second
    assert first  # says something


def test_heldout_nll_per_byte(model, tokenizer):
    windows = heldout_windows(tokenizer, model.config.max_position_embeddings, n_windows=16)
    result = nll_per_byte(model, tokenizer, windows)
    assert result["nll_per_byte"] < MAX_HELDOUT_NLL_PER_BYTE, result


def test_answers_pass_key_questions_within_its_training_length(model, tokenizer):
    """The skill LM-Infinite's top-k recall stretches beyond L must exist within L first."""
    rng = random.Random(5)
    hits = []
    for _ in range(10):
        key = str(rng.randrange(10000, 100000))
        if rng.random() < 0.5:  # the first two sentences of the paper's intro, or one filler sentence
            ids = _passkey_ids(tokenizer, key, 0, 0, intro=PASSKEY_INTRO_SHORT)
        else:
            before = rng.randint(0, 1)
            ids = _passkey_ids(tokenizer, key, before, 1 - before)
        assert len(ids) + 24 <= model.config.max_position_embeddings
        hits.append(greedy_answer(model, tokenizer, ids, max_new_tokens=24).startswith(f"The pass key is {key}."))
    assert sum(hits) >= 9, hits  # measured: 10 of 10
