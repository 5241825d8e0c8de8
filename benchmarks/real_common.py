"""Shared pieces of the real-model benchmarks: loading SmolLM2, the app's prompt, feeding and greedy decoding.

The app's way of answering, mirrored exactly: the system prompt and the documents are prefilled with top-k
recall off (``topk=0``), in chunks of ``prefill_chunk`` tokens; then the question (the rest of the user turn
and the assistant header) and the answer's decode run with recall on. Because re-enabling LM-Infinite with
another ``topk`` keeps the cache valid (same window and n_starting), one prefill of the documents serves both
"lminfinite" (answer with topk = 0) and "lminfinite_topk": snapshot after the documents, answer, roll back,
answer again with recall on.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

import lminfinite

SYSTEM_PROMPT = "You are a helpful assistant. Answer questions about the document."
N_STARTING = 10
PREFILL_CHUNK = 512


def model_path():
    """SmolLM2-135M-Instruct's converted folder: these benchmarks measured it (docs/smollm2.md)."""
    from app.engine.bundled_model import BUNDLED, bundled_folder

    return bundled_folder(BUNDLED["smollm2"])


def load_real(quantization=None, dtype=None):
    """(tokenizer, model) of the bundled SmolLM2-135M-Instruct, float32 unless ``quantization`` is given."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    kwargs = {"attn_implementation": "sdpa"}
    if quantization is not None:
        kwargs["quantization_config"] = quantization
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()
    return tokenizer, model


# -- the app's prompt --------------------------------------------------------------------------------
@dataclass
class Prompt:
    """The chat prompt split where the documents end: ``context`` ids are prefilled with recall off,
    ``question`` ids (the rest of the user turn and the assistant header) with recall on.

    ``doc_char`` and ``offsets``: where the document text starts in the rendered prompt, and each context
    token's (start, end) character range in it, to map token positions back to document chunks."""

    text: str
    context: list[int]
    question: list[int]
    doc_char: int
    doc_len: int
    offsets: list[tuple[int, int]]

    @property
    def ids(self) -> list[int]:
        return self.context + self.question


def render(tokenizer, document: str, question: str) -> tuple[str, int]:
    """The app's prompt text for one document and question, and where the document starts in it."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": document + "\n\n" + question}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    start = text.find(document)
    if start < 0:
        raise ValueError("the chat template changed the document text")
    return text, start


def build_prompt(tokenizer, document: str, question: str) -> Prompt:
    """Encode the rendered prompt in two pieces (context up to the end of the document; the rest), as the
    app encodes pieces separately, so the context ids do not depend on the question."""
    text, start = render(tokenizer, document, question)
    cut = start + len(document)
    enc = tokenizer(text[:cut], add_special_tokens=False, return_offsets_mapping=True)
    rest = tokenizer.encode(text[cut:], add_special_tokens=False)
    return Prompt(text, list(enc["input_ids"]), list(rest), start, len(document),
                  [tuple(o) for o in enc["offset_mapping"]])


def question_ids(tokenizer, document: str, question: str) -> list[int]:
    """Only the part after the document (same as ``build_prompt(...).question``, without encoding it all)."""
    text, start = render(tokenizer, document, question)
    return list(tokenizer.encode(text[start + len(document):], add_special_tokens=False))


# -- LM-Infinite runs ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    window: int
    n_starting: int = N_STARTING
    topk: int = 5
    topk_from_layer: int = 5
    prefill_chunk: int = PREFILL_CHUNK
    scan_copy: bool = True  # LMInfiniteConfig.recall_scan_copy, for the caches made under these settings

    def config(self, topk: int | None = None, from_layer: int | None = None) -> lminfinite.LMInfiniteConfig:
        return lminfinite.LMInfiniteConfig(window=self.window, n_starting=self.n_starting,
                                           topk=self.topk if topk is None else topk,
                                           topk_from_layer=self.topk_from_layer if from_layer is None else from_layer,
                                           recall_scan_copy=self.scan_copy)


def set_topk(model, settings: Settings, topk: int, from_layer: int | None = None) -> None:
    """Switch recall (0: off) on the patched model; the cache stays valid (same window and n_starting)."""
    wanted = settings.config(topk, from_layer)
    state = lminfinite.get_state(model)
    if state is None or (state.config.topk, state.config.topk_from_layer, state.config.window,
                         state.config.n_starting, state.config.recall_scan_copy) != (
                             wanted.topk, wanted.topk_from_layer, wanted.window, wanted.n_starting,
                             wanted.recall_scan_copy):
        lminfinite.enable(model, wanted)


def new_cache(model, settings: Settings, keep_from_layer: int | None = None) -> lminfinite.InfiniteCache:
    """An empty cache that keeps evicted tokens for layers >= ``keep_from_layer`` (default: the settings'),
    so recall from that layer on can be switched on after the documents."""
    set_topk(model, settings, 0, settings.topk_from_layer if keep_from_layer is None else keep_from_layer)
    cache = lminfinite.InfiniteCache(model, keep_middle=True)
    set_topk(model, settings, 0)
    return cache


@torch.inference_mode()
def feed(model, cache, ids: list[int], chunk: int = PREFILL_CHUNK) -> torch.Tensor | None:
    """Prefill ``ids`` after what ``cache`` holds, ``chunk`` tokens per forward; last token's logits."""
    logits = None
    for lo in range(0, len(ids), chunk):
        piece = torch.tensor([ids[lo : lo + chunk]])
        logits = model(input_ids=piece, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
    return logits


@torch.inference_mode()
def greedy(model, cache, logits: torch.Tensor, eos: int, max_new_tokens: int, stop=None) -> list[int]:
    """Greedy decode from ``logits`` (the prompt's last-token logits); stops at ``eos`` or when
    ``stop(tokens)`` says the answer is complete."""
    out: list[int] = []
    for _ in range(max_new_tokens):
        token = int(logits.argmax())
        if token == eos:
            break
        out.append(token)
        if stop is not None and stop(out):
            break
        logits = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True,
                       logits_to_keep=1).logits[0, -1]
    return out


def default_variants(settings: Settings) -> dict[str, tuple[int, int]]:
    """method name -> (topk, topk_from_layer) answered from one document prefill."""
    return {"lminfinite": (0, settings.topk_from_layer),
            "lminfinite_topk": (settings.topk, settings.topk_from_layer)}


def answer_variants(model, tokenizer, cache, settings: Settings, question: list[int], *, max_new_tokens: int,
                    variants: dict[str, tuple[int, int]] | None = None, stop=None, observers=None,
                    chunk: int | None = None) -> dict[str, str]:
    """From a cache holding the documents (fed with recall off), answer once per variant (name -> (topk,
    topk_from_layer)), rolling back in between: by default "lminfinite" (recall off) and "lminfinite_topk".
    ``observers``: name -> TopKSelection callback, watching that variant's question prefill and decode.
    The cache is left as it came."""
    snap = cache.snapshot()
    answers = {}
    for method, (topk, from_layer) in (variants or default_variants(settings)).items():
        set_topk(model, settings, topk, from_layer)
        callback = (observers or {}).get(method)
        watch = lminfinite.observe_topk(model, callback) if (callback is not None and topk) else None
        try:
            if watch is not None:
                watch.__enter__()
            logits = feed(model, cache, question, chunk or settings.prefill_chunk)
            ids = greedy(model, cache, logits, tokenizer.eos_token_id, max_new_tokens, stop)
        finally:
            if watch is not None:
                watch.remove()
        answers[method] = tokenizer.decode(ids, skip_special_tokens=True)
        cache.rollback(snap)
    set_topk(model, settings, 0)
    return answers


@torch.inference_mode()
def vanilla_answer(model, tokenizer, ids: list[int], *, max_new_tokens: int, stop=None) -> str:
    """The unpatched model on ``ids`` (truncation: the caller passes the last W ids)."""
    from transformers import DynamicCache

    lminfinite.disable(model)
    cache = DynamicCache()
    logits = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
    return tokenizer.decode(greedy(model, cache, logits, tokenizer.eos_token_id, max_new_tokens, stop),
                            skip_special_tokens=True)


class Stopwatch:
    def __init__(self):
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start


def replace(settings: Settings, **changes) -> Settings:
    return dataclasses.replace(settings, **changes)
