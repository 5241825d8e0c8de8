"""Pass-key retrieval on the real model (paper Table 2; Mohtashami & Jaggi's filler), in the app's prompt.

The haystack is the document, "What is the pass key?" the question; the document is prefilled with top-k
recall off, the question and answer run with each method's recall setting. All prompts of a run share one
chain of prefills: their documents differ only in where the key sits, so with the prompts sorted by the
number of fillers before the key, the common filler prefix is fed once and each prompt adds only its key,
the fillers after it and the question (cache snapshot / rollback; for vanilla, ``DynamicCache.crop``).
Chunked prefill is exact, so this gives the answers a fresh prefill of each prompt would give.

Truncation (the unpatched model on the last W tokens) is run only for prompts whose key lies inside those
W tokens; the others are scored wrong without running the model (the key is not in its input).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import torch

from benchmarks import real_common as rc
from training.tasks import PASSKEY_FILLER, PASSKEY_INTRO, passkey_sentence

MAX_NEW_TOKENS = 16
# The paper's question plus an instruction: with the bare "What is the pass key?" the 135M model often
# explains what a pass key is instead of reading it (1 of 4 prompts at 800 tokens, 3 of 3 at 4K, vanilla).
QUESTION = "What is the pass key? Answer with the number only."


@dataclass
class Case:
    length: int  # target prompt length in tokens
    key: str
    depth: float
    before: int  # fillers before the key
    after: int


@dataclass
class Pieces:
    head: list[int]  # system turn, user header, intro
    filler: list[int]
    tail: list[int]  # "\n\nWhat is the pass key?" + end of turn + assistant header

    def key(self, tokenizer, key: str) -> list[int]:
        return tokenizer.encode(" " + passkey_sentence(key), add_special_tokens=False)

    def ids(self, tokenizer, case: Case) -> list[int]:
        return (self.head + self.filler * case.before + self.key(tokenizer, case.key) + self.filler * case.after
                + self.tail)

    def key_span(self, tokenizer, case: Case) -> tuple[int, int]:
        start = len(self.head) + len(self.filler) * case.before
        return start, start + len(self.key(tokenizer, case.key))


def pieces(tokenizer) -> Pieces:
    document = PASSKEY_INTRO + " " + PASSKEY_FILLER
    text, start = rc.render(tokenizer, document, QUESTION)
    head = tokenizer.encode(text[:start] + PASSKEY_INTRO, add_special_tokens=False)
    filler = tokenizer.encode(" " + PASSKEY_FILLER, add_special_tokens=False)
    tail = tokenizer.encode(text[start + len(document):], add_special_tokens=False)
    return Pieces(head, filler, tail)


def make_cases(tokenizer, p: Pieces, lengths: list[int], samples: int, seed: int) -> list[Case]:
    """``samples`` prompts per length, key at a uniform random depth (5-digit keys)."""
    rng = random.Random(seed)
    cases = []
    for length in lengths:
        for _ in range(samples):
            key, depth = str(rng.randint(10000, 99999)), rng.random()
            overhead = len(p.head) + len(p.key(tokenizer, key)) + len(p.tail)
            fillers = max(1, (length - overhead) // len(p.filler))
            before = round(depth * fillers)
            cases.append(Case(length, key, depth, before, fillers - before))
    return cases


def first_integer(text: str) -> str | None:
    found = re.search(r"\d+", text)
    return None if found is None else found.group(0)


def is_correct(text: str, key: str) -> bool:
    return first_integer(text) == key


def integer_complete(tokenizer):
    """Stop decoding once the first integer of the answer is complete (a digit run followed by a non-digit)."""
    def stop(ids: list[int]) -> bool:
        return re.search(r"\d+\D", tokenizer.decode(ids, skip_special_tokens=True)) is not None
    return stop


def run_lminfinite(model, tokenizer, cases: list[Case], settings: rc.Settings, variants: dict, log=print,
                   save=None) -> list[dict]:
    """Every case, every variant (name -> (topk, topk_from_layer)), one chain of document prefills.
    ``save(records)`` is called after each prompt with its records (a long chain keeps what it measured)."""
    p = pieces(tokenizer)
    stop = integer_complete(tokenizer)
    keep_from = min([fl for k, fl in variants.values() if k] or [settings.topk_from_layer])
    cache = rc.new_cache(model, settings, keep_from_layer=keep_from)
    rc.feed(model, cache, p.head, settings.prefill_chunk)
    fed_fillers, records = 0, []
    for i, case in enumerate(sorted(cases, key=lambda c: c.before)):
        clock = rc.Stopwatch()
        rc.feed(model, cache, p.filler * (case.before - fed_fillers), settings.prefill_chunk)
        fed_fillers = case.before
        snap = cache.snapshot()
        rc.feed(model, cache, p.key(tokenizer, case.key) + p.filler * case.after, settings.prefill_chunk)
        answers = rc.answer_variants(model, tokenizer, cache, settings, p.tail, max_new_tokens=MAX_NEW_TOKENS,
                                     variants=variants, stop=stop)
        cache.rollback(snap)
        new = [dict(method=method, window=settings.window, length=case.length, depth=case.depth, key=case.key,
                    answer=text, correct=is_correct(text, case.key)) for method, text in answers.items()]
        records += new
        if save is not None:
            save(new)
        log(f"  W={settings.window} {case.length} depth {case.depth:.2f} key {case.key}: "
            + ", ".join(f"{m}={'ok' if is_correct(t, case.key) else repr(t[:20])}" for m, t in answers.items())
            + f"  ({clock():.0f} s, {i + 1}/{len(cases)})")
    return records


@torch.inference_mode()
def run_vanilla(model, tokenizer, cases: list[Case], chunk: int = rc.PREFILL_CHUNK, log=print, save=None) -> list[dict]:
    """The unpatched model on whole prompts, one chain of prefills (DynamicCache cropped back)."""
    import lminfinite
    from transformers import DynamicCache

    lminfinite.disable(model)
    p = pieces(tokenizer)
    stop = integer_complete(tokenizer)
    cache = DynamicCache()
    rc.feed(model, cache, p.head, chunk)
    fed_fillers, records = 0, []
    for case in sorted(cases, key=lambda c: c.before):
        rc.feed(model, cache, p.filler * (case.before - fed_fillers), chunk)
        fed_fillers = case.before
        mark = cache.get_seq_length()
        logits = rc.feed(model, cache, p.key(tokenizer, case.key) + p.filler * case.after + p.tail, chunk)
        text = tokenizer.decode(rc.greedy(model, cache, logits, tokenizer.eos_token_id, MAX_NEW_TOKENS, stop),
                                skip_special_tokens=True)
        cache.crop(mark - cache.get_seq_length())
        records.append(dict(method="vanilla", window=None, length=case.length, depth=case.depth, key=case.key,
                            answer=text, correct=is_correct(text, case.key)))
        if save is not None:
            save(records[-1:])
        log(f"  vanilla {case.length} depth {case.depth:.2f}: {'ok' if is_correct(text, case.key) else repr(text[:20])}")
    return records


def run_truncate(model, tokenizer, cases: list[Case], window: int, log=print) -> list[dict]:
    """The unpatched model on the last ``window`` tokens; keys outside them are scored wrong unrun."""
    p = pieces(tokenizer)
    stop = integer_complete(tokenizer)
    records = []
    for case in cases:
        ids = p.ids(tokenizer, case)
        start, _ = p.key_span(tokenizer, case)
        if start >= len(ids) - window:
            text = rc.vanilla_answer(model, tokenizer, ids[-window:], max_new_tokens=MAX_NEW_TOKENS, stop=stop)
            ran = True
        else:
            text, ran = "", False
        records.append(dict(method="truncate", window=window, length=case.length, depth=case.depth, key=case.key,
                            answer=text, correct=is_correct(text, case.key), ran=ran))
    log(f"  truncate W={window}: {sum(r['correct'] for r in records)}/{len(records)}")
    return records
