"""Tiny random RoPE models for the lminfinite tests: Llama (multi-head), Llama-GQA, Mistral, Qwen2 (q/k/v biases)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

WINDOW = 16
VOCAB = 101

_COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
    num_attention_heads=4, max_position_embeddings=WINDOW, attn_implementation="sdpa",
)

FAMILIES = {
    "llama-mha": (LlamaForCausalLM, lambda: LlamaConfig(num_key_value_heads=4, **_COMMON)),
    "llama-gqa": (LlamaForCausalLM, lambda: LlamaConfig(num_key_value_heads=2, **_COMMON)),
    "mistral-gqa": (MistralForCausalLM, lambda: MistralConfig(num_key_value_heads=2, sliding_window=None, **_COMMON)),
    "qwen2-gqa": (Qwen2ForCausalLM, lambda: Qwen2Config(num_key_value_heads=1, **_COMMON)),
}


def tiny_model(family: str = "llama-mha", dtype: torch.dtype = torch.float32, seed: int = 0):
    model_cls, make_config = FAMILIES[family]
    torch.manual_seed(seed)
    model = model_cls(make_config()).eval()
    if family.startswith("qwen2"):  # Qwen2 initialises its q/k/v biases to zero; make them matter
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    return model.to(dtype)


def random_ids(n: int, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (1, n), generator=generator)


def feed_in_chunks(model, ids: torch.Tensor, chunk: int, cache) -> torch.Tensor:
    """Logits for every position, feeding ``chunk`` tokens per forward call into ``cache``."""
    outs = []
    with torch.no_grad():
        for lo in range(0, ids.shape[1], chunk):
            outs.append(model(input_ids=ids[:, lo : lo + chunk], past_key_values=cache, use_cache=True).logits)
    return torch.cat(outs, dim=1)


def held_bytes(root) -> int:
    """Bytes of every tensor storage reachable from ``root`` through attributes, lists, tuples and dicts, each
    storage once: what an object really keeps alive, whatever it reports about itself."""
    seen, storages, pending = set(), {}, [root]
    while pending:
        obj = pending.pop()
        if id(obj) in seen or isinstance(obj, (type, torch.nn.Module)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            storages[storage.data_ptr(), storage.nbytes()] = storage.nbytes()
        elif isinstance(obj, dict):
            pending.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            pending.extend(obj)
        elif hasattr(obj, "__dict__"):
            pending.extend(vars(obj).values())
    return sum(storages.values())
