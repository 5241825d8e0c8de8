"""A context as tensors and a JSON-ready record, and back: what a saved workspace holds of its engine.

The cache itself is the library's business (``lminfinite.cache_state`` / ``restore_cache``: every layer's
start, window ring and middle store, its counters and frame, checked against the model on the way back).
Here is what the engine adds around it: the token stream, the spans with their provenance, where the chat
template stands (turn state and carry), and which model it was made with. Reopened, the engine is the
engine that was saved, so its next answer is token for token the one it would have given (tests).

Not kept: the undo points of past turns (``turns``), which are cache snapshots of their own. A reopened
context answers, clears and grows as before; only "regenerate" of an answer given before the save is gone. Kept
beside the cache: the neutral question's recall (neutral_recall.py), which ranks the next question's sources as
it would have without the save.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict

import torch

import lminfinite
from ingest import Provenance

from .budget import WITHOUT_RECALL
from .chat_format import Carry, TurnState
from .citations import RecallTally
from .context import ContextEngine
from .history import history_from, history_record
from .metrics import LiveStats
from .neutral_recall import NeutralRecall
from .runtime import ModelRuntime
from .spans import Span, SpanKind

TOKEN_IDS = "context.token_ids"
NEUTRAL_POSITIONS, NEUTRAL_WEIGHTS = "context.neutral_positions", "context.neutral_weights"
CACHE = "cache."  # the prefix of the cache's own tensors (lminfinite.cache_state names them)
FORMAT = 1


class ContextMismatch(ValueError):
    """The saved context belongs to another model or another LM-Infinite setting. The message says which."""


class ContextDamaged(ValueError):
    """The saved context holds what no model run could have made (a token outside the vocabulary); opened, it
    would fail at every question. The message says what and where."""


def model_identity(runtime: ModelRuntime) -> dict:
    """What must match for a saved cache to mean the same thing: the model (name and a fingerprint of its
    weights' first embedding rows and its config, in its dtype and in any: ``weights``), and the LM-Infinite
    settings that shape attention."""
    embedding = runtime.model.get_input_embeddings().weight
    digest = hashlib.sha256(runtime.model.config.to_json_string(use_diff=False).encode())
    digest.update(embedding[:4].detach().float().cpu().numpy().tobytes())
    config = runtime.lm_config
    return {"model": runtime.name, "dtype": str(runtime.dtype).removeprefix("torch."),
            "fingerprint": digest.hexdigest()[:32], "weights": weights_fingerprint(runtime),
            "window": config.window_, "n_starting": config.n_starting, "topk_from_layer": config.topk_from_layer}


def weights_fingerprint(runtime: ModelRuntime) -> str:
    """The model whatever dtype it runs in: its config less its dtype, and its first embedding rows rounded to
    bfloat16 (a model loaded in float32 or bfloat16 from the same weights gives the same)."""
    config = {k: v for k, v in runtime.model.config.to_dict().items() if k not in ("dtype", "torch_dtype")}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    embedding = runtime.model.get_input_embeddings().weight
    digest.update(embedding[:4].detach().to(torch.bfloat16).float().cpu().numpy().tobytes())
    return digest.hexdigest()[:32]


def converts_dtype(saved: dict, runtime: ModelRuntime) -> bool:
    """The context was saved by the same model running in another dtype: its cache is converted on reopening
    (a server whose --dtype changed, or a workspace from another machine, opens it rather than refusing it)."""
    current = model_identity(runtime)
    return ("dtype" in saved and saved["dtype"] != current["dtype"]
            and saved.get("weights") == current["weights"] and saved.get("model") == current["model"])


def check_identity(saved: dict, runtime: ModelRuntime) -> None:
    """Refuse a context made with another model or setting, naming what differs (another dtype is converted)."""
    current = model_identity(runtime)
    converted = converts_dtype(saved, runtime)
    for key, value in current.items():
        if key in ("dtype", "weights") and key not in saved:  # saved before it was recorded: the fingerprint tells
            continue
        if converted and key in ("dtype", "fingerprint"):  # the same weights in another dtype
            continue
        if saved.get(key) != value:
            if key == "dtype":
                raise ContextMismatch(f"this context was made with the model in {saved[key]}, this server runs it "
                                      f"in {value}; open it on a server started with --dtype {saved[key]}")
            what = "model" if key in ("model", "fingerprint") else f"LM-Infinite setting {key}"
            also = " (or the same model in another dtype: --dtype)" if key == "fingerprint" else ""
            switch = " (Settings → Model switches a bundled one)" if key == "model" else ""
            raise ContextMismatch(f"this context was made with another {what}{also} ({saved.get(key)!r}, this "
                                  f"server runs {value!r}); open it on a server running the same model and "
                                  f"settings{switch}")


class Prefixed(Mapping):
    """The tensors of ``tensors`` whose names start with ``prefix``, under the rest of their names; read only
    when asked for (``tensors`` may be an open file: lminfinite.tensor_file.TensorFile)."""

    def __init__(self, tensors: Mapping, prefix: str):
        self._tensors, self._prefix = tensors, prefix

    def __getitem__(self, name: str):
        return self._tensors[self._prefix + name]

    def __iter__(self):
        return (name[len(self._prefix):] for name in self._tensors if name.startswith(self._prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Converted(Mapping):
    """The tensors of ``tensors`` in ``dtype`` where they are in ``saved`` (the rings and starting tokens; the
    middle store keeps the dtype it was saved in, and the cache widens it as it would a bfloat16 save)."""

    def __init__(self, tensors: Mapping, saved: torch.dtype, dtype: torch.dtype):
        self._tensors, self._saved, self._dtype = tensors, saved, dtype

    def __getitem__(self, name: str):
        tensor = self._tensors[name]
        is_middle = name.endswith(("middle_k", "middle_v"))
        if isinstance(tensor, torch.Tensor) and tensor.dtype == self._saved and not is_middle:
            return tensor.to(self._dtype)
        return tensor

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def in_dtype(tensors: Mapping, info: dict, dtype: torch.dtype) -> tuple[Mapping, dict]:
    """A saved cache (its tensors and the library's record of them) as if saved by the model in ``dtype``."""
    saved = getattr(torch, str(info["identity"].get("dtype")), None)
    if not isinstance(saved, torch.dtype):
        return tensors, info  # holds no tensors yet (or a damaged record: restore_cache says which)
    identity = {**info["identity"], "dtype": str(dtype).removeprefix("torch.")}
    return Converted(tensors, saved, dtype), {**info, "identity": identity}


def context_record(engine: ContextEngine, *, middle_dtype: torch.dtype | None = None) -> tuple[dict, dict]:
    """The engine as (tensors, record); ``middle_dtype`` stores recall's middle tokens smaller (not exact)."""
    # The cache's own tensors, not copies: they are written out at once (a long context's cache is gigabytes).
    cache_tensors, cache_info = lminfinite.cache_state(engine.cache, middle_dtype=middle_dtype, copy=False)
    tensors = {CACHE + name: tensor for name, tensor in cache_tensors.items()}
    tensors[TOKEN_IDS] = torch.tensor(engine.token_ids, dtype=torch.int64)
    record = {
        "format": FORMAT,
        "identity": model_identity(engine.runtime),
        "cache": cache_info,
        "system_prompt": engine.system_prompt,
        "spans": [[s.start, s.end, s.kind.value, asdict(s.where) if s.where else None] for s in engine.spans],
        "state": engine.state.value,
        "carry": asdict(engine.carry),
        "tokens_fed": engine.tokens_fed,
        "history": history_record(engine.history),
    }
    if engine.neutral_recall is not None:
        positions, weights = engine.neutral_recall.tally.totals()
        tensors[NEUTRAL_POSITIONS] = torch.tensor(positions, dtype=torch.int64)
        tensors[NEUTRAL_WEIGHTS] = torch.tensor(weights, dtype=torch.float64)
        record["neutral_key"] = engine.neutral_recall.key.hex()
    return tensors, record


def reopen_context(runtime: ModelRuntime, tensors: dict, record: dict, *, budget: int,
                   stats: LiveStats | None = None) -> ContextEngine:
    """The engine ``context_record`` saved, on ``runtime``'s model (checked to be the same model first)."""
    if record.get("format") != FORMAT:
        raise ValueError(f"unknown context format {record.get('format')!r}")
    check_identity(record["identity"], runtime)
    vocabulary = vocabulary_size(runtime)
    ids = checked_token_ids(tensors[TOKEN_IDS], vocabulary)  # before the cache: a cheap refusal first
    history = history_from(record["history"])
    _check_answer_ids(history, vocabulary)
    engine = ContextEngine(runtime, system_prompt=record["system_prompt"], budget=budget,
                           stats=stats or LiveStats())
    cache_tensors, cache_info = Prefixed(tensors, CACHE), record["cache"]
    if converts_dtype(record["identity"], runtime):
        cache_tensors, cache_info = in_dtype(cache_tensors, cache_info, runtime.dtype)
    engine.use_cache(lminfinite.restore_cache(runtime.model, cache_tensors, cache_info))
    if not engine.keeps_recall:  # saved as keep_recall(False) left it: its budget is the text's
        engine.budget = max(budget, WITHOUT_RECALL)
    engine.token_ids.extend(ids)
    for start, end, kind, where in record["spans"]:
        engine.spans.append(Span(start, end, SpanKind(kind), Provenance(**where) if where else None))
    if engine.spans.end != len(ids) or engine.cache.get_seq_length() != len(ids):
        raise ValueError(f"the context's parts disagree: {len(ids)} tokens, spans to {engine.spans.end}, "
                         f"cache of {engine.cache.get_seq_length()}")
    engine.state, engine.carry = TurnState(record["state"]), Carry(**record["carry"])
    engine.tokens_fed = int(record["tokens_fed"])
    engine.history[:] = history
    if "neutral_key" in record:
        engine.neutral_recall = checked_neutral_recall(record["neutral_key"], tensors, len(ids))
    engine.stats.context_tokens = engine.length
    engine.stats.set_kv(engine.memory())
    return engine


def vocabulary_size(runtime: ModelRuntime) -> int:
    """How many tokens the model can read: its embedding's rows (an id past them fails in every forward)."""
    return int(runtime.model.get_input_embeddings().weight.shape[0])


def checked_token_ids(tensor, vocabulary: int) -> list[int]:
    """The saved token stream, refused (ContextDamaged) unless it is what ``context_record`` writes: one row of
    int64, each a token of the model (an id of 2**64-1 stored as U64, or past the vocabulary, is not)."""
    if not isinstance(tensor, torch.Tensor):
        raise ContextDamaged(f"the token ids are a {type(tensor).__name__}, not a tensor")
    if tensor.dtype != torch.int64 or tensor.dim() != 1:
        dtype = str(tensor.dtype).removeprefix("torch.")
        raise ContextDamaged(f"the token ids are {dtype} of shape {tuple(tensor.shape)}, expected one row of int64")
    outside = ((tensor < 0) | (tensor >= vocabulary)).nonzero()
    if len(outside):
        position = int(outside[0, 0])
        raise ContextDamaged(f"token id {int(tensor[position])} at position {position:,} is outside this model's "
                             f"vocabulary of {vocabulary:,} tokens")
    return tensor.tolist()


def checked_neutral_recall(key: str, tensors: Mapping, length: int) -> NeutralRecall:
    """The neutral question's recall as ``context_record`` writes it, refused (ContextDamaged) unless it could be
    one: distinct positions in the context, each with a finite weight above zero."""
    if NEUTRAL_POSITIONS not in tensors or NEUTRAL_WEIGHTS not in tensors:
        raise ContextDamaged("the neutral question's recall has a key but no tensors")
    positions, weights = tensors[NEUTRAL_POSITIONS], tensors[NEUTRAL_WEIGHTS]
    shapes_ok = (isinstance(positions, torch.Tensor) and isinstance(weights, torch.Tensor)
                 and positions.dtype == torch.int64 and weights.dtype == torch.float64
                 and positions.dim() == weights.dim() == 1 and positions.shape == weights.shape)
    if not shapes_ok:
        raise ContextDamaged("the neutral question's recall is not two rows of int64 positions and float64 weights "
                             "of one length")
    if len(positions) and (int(positions.min()) < 0 or int(positions.max()) >= length
                           or len(positions.unique()) != len(positions)):
        raise ContextDamaged(f"the neutral question's recall names positions outside the {length:,}-token context, "
                             "or one twice")
    if not bool(torch.isfinite(weights).all()) or bool((weights <= 0).any()):
        raise ContextDamaged("the neutral question's recall holds a weight that is not a finite number above zero")
    return NeutralRecall(bytes.fromhex(key), RecallTally.of_totals(positions, weights))


def _check_answer_ids(history: list, vocabulary: int) -> None:
    """An answer's tokens are read again when the context is rebuilt (Clear chat, Remove): each must be one."""
    for number, entry in enumerate(history):
        bad = next((i for i in getattr(entry, "answer_ids", ()) if i >= vocabulary), None)
        if bad is not None:
            raise ContextDamaged(f"the answer of history entry {number} holds token id {bad}, outside this model's "
                                 f"vocabulary of {vocabulary:,} tokens")
