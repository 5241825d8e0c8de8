"""Pass-key retrieval (paper Table 2; Mohtashami & Jaggi's prompt): a 5-digit key at a random depth in
filler text; correct iff the first integer of the greedy answer equals the key."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import torch

import lminfinite
from benchmarks.methods import Variants
from training.tasks import PASSKEY_FILLER, passkey_prompt


@dataclass
class PasskeyCase:
    ids: list[int]
    key: str
    depth: float


def make_case(tokenizer, rng: random.Random, target_tokens: int) -> PasskeyCase:
    """A chat-format pass-key prompt of about ``target_tokens`` tokens, key at a uniform random depth."""
    key, depth = str(rng.randint(10000, 99999)), rng.random()
    per_filler = len(tokenizer.encode(" " + PASSKEY_FILLER, add_special_tokens=False))
    overhead = len(_prompt_ids(tokenizer, passkey_prompt(0, 0, key)))
    fillers = max(1, (target_tokens - overhead) // per_filler)
    before = round(depth * fillers)
    return PasskeyCase(_prompt_ids(tokenizer, passkey_prompt(before, fillers - before, key)), key, depth)


def _prompt_ids(tokenizer, user_message: str) -> list[int]:
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": user_message}], tokenize=True)
    return list(encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded)


@torch.no_grad()
def answer(variants: Variants, method: str, case: PasskeyCase, tokenizer, max_new_tokens: int = 32) -> str:
    model = variants.model_for(method)
    device = next(model.parameters()).device
    ids = case.ids[-variants.window :] if method == "truncate" else case.ids
    prompt = torch.tensor([ids], device=device)
    kwargs = {"past_key_values": lminfinite.InfiniteCache(model)} if variants.uses_infinite_cache(method) else {}
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         **kwargs)
    return tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)


def is_correct(text: str, key: str) -> bool:
    first = re.search(r"\d+", text)
    return first is not None and first.group(0) == key
