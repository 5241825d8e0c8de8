"""Models for the benchmarks: a random Llama shaped like the real thing, or any checkpoint."""

from __future__ import annotations

import copy
import hashlib
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

# Llama-2-7B's shape; with random weights it costs exactly what the real weights cost.
LLAMA2_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096)


# Llama-2-7B's 32 layers at a size where the host's work is nearly all there is: what a layer launches and the
# Python around it, which a GPU's host must keep ahead of (benchmarks/profile_prefill.py).
HOST_BOUND = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=32, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=1000, max_position_embeddings=4096)


def cpu_default_shape(window: int) -> dict:
    """Hidden size equal to L: attention is the same share of the work as Llama-2-7B's at L = 4096."""
    return dict(hidden_size=window, intermediate_size=int(window * 11008 / 4096), num_hidden_layers=8,
                num_attention_heads=window // 64, num_key_value_heads=window // 64, vocab_size=32000,
                max_position_embeddings=window)


def build_model(spec: str, *, window: int, device: str, dtype: torch.dtype, load_in_4bit: bool = False):
    """``random`` (CPU default shape), ``random-7b`` (Llama-2-7B shape), ``random-host`` (its layers, tiny) or a
    checkpoint path / hub id."""
    quantization = None
    if load_in_4bit:
        quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
    if spec in ("random", "random-7b", "random-host"):
        shape = {"random": cpu_default_shape(window), "random-7b": LLAMA2_7B, "random-host": HOST_BOUND}[spec]
        config = LlamaConfig(**shape, attn_implementation="sdpa")
        if quantization is None:
            torch.manual_seed(0)
            with torch.device(device):
                return LlamaForCausalLM(config).to(dtype).eval()
        spec = str(random_checkpoint(config))  # bitsandbytes quantizes on load
    return AutoModelForCausalLM.from_pretrained(
        spec, dtype=dtype, device_map=device, quantization_config=quantization, attn_implementation="sdpa"
    ).eval()


def random_checkpoint(config: LlamaConfig) -> Path:
    """A saved random Llama of this config, made once per machine (on the GPU when there is one: a 7B model's
    initialisation takes minutes on a CPU) and found again by every later worker."""
    digest = hashlib.sha256(config.to_json_string(use_diff=False).encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"lminfinite-random-llama-{digest}"
    if (folder / "config.json").is_file():
        return folder
    building = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        LlamaForCausalLM(copy.deepcopy(config)).to(torch.bfloat16).save_pretrained(building)  # init edits its config
    try:
        building.rename(folder)  # whole or absent: a concurrent builder's copy wins, ours is dropped
    except OSError:
        shutil.rmtree(building, ignore_errors=True)
    return folder
