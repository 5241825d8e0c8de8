"""The JSON record in a workspace file: its size and shape before it is parsed, then field by field (types and
shapes), so workspace_file.py refuses a damaged or hostile file, saying where, before any of it reaches a
session or a view."""

from __future__ import annotations

import math
import re

import numpy as np

from ..engine.chat_format import TurnState
from ..engine.neutral_recall import KEY_BYTES
from ..engine.spans import SpanKind
from .uploads import RowStatus
from .state import ItemKind


class Malformed(Exception):
    """Where in the record a field is missing, unknown or of the wrong type, or how it is too large."""


# -- before parsing: what json.loads would cost -------------------------------------------------------------
# A record is the chat, the documents table and the text of the documents read (to read them again later):
# a million-token context of English text is about 5 MB, of any script under 16 MB (JSON escapes each
# non-ASCII character in 6 bytes). Parsing costs far more than the text (a Python object per value: 87 MB of
# small values took 2.1 GB and 12 s) and nests by recursion, so these bounds are checked on the text first.
MAX_HEADER_BYTES = 64 * 2**20  # the file's whole JSON header (the record, escaped once more, and its tensors)
MAX_DEPTH = 32  # a record nests about 8 deep (record.session.chat[i].citations[j].where.page)
MAX_VALUES = 4_000_000  # values in the record: an answer's token is one, a document's row about ten
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included ("unrolled": one match each)
_DEPTH_STEP = np.zeros(256, dtype=np.int64)
_DEPTH_STEP[[ord("["), ord("{")]], _DEPTH_STEP[[ord("]"), ord("}")]] = 1, -1
_CHUNK = 1 << 22  # bytes scanned at once for the depth: bounded scratch memory whatever the record's size


def check_shape(text: str) -> None:
    """Refuse a record whose parsing alone would be costly: too many values or nested too deep. The text's
    size is bounded before (workspace_file reads the header's length first)."""
    if text.count('"') > 2 * MAX_VALUES:  # each string is a value: refused before the strings are even scanned
        raise Malformed(f"the record holds more than {MAX_VALUES:,} values")
    structure = _STRING.sub("", text)  # outside strings: brackets, commas, colons, numbers, literals
    values = structure.count(",") + structure.count("[") + structure.count("{") + 1
    if values > MAX_VALUES:
        raise Malformed(f"the record holds more than {MAX_VALUES:,} values")
    depth = _deepest(structure.encode("ascii", "replace"))
    if depth > MAX_DEPTH:
        raise Malformed(f"the record is nested {depth:,} deep, more than the {MAX_DEPTH} a workspace needs")


def _deepest(structure: bytes) -> int:
    """The deepest nesting of brackets in ``structure`` (strings taken out), chunk by chunk."""
    deepest = level = 0
    for start in range(0, len(structure), _CHUNK):
        piece = np.frombuffer(structure, dtype=np.uint8, count=min(_CHUNK, len(structure) - start), offset=start)
        levels = np.cumsum(_DEPTH_STEP[piece]) + level
        deepest, level = max(deepest, int(levels.max())), int(levels[-1])
    return deepest


def _is(test, expected: str):
    """A single value that ``test`` accepts (JSON types: a bool is no number here)."""
    def check(value, where: str) -> None:
        if not test(value):
            raise Malformed(f"{where} is {_shown(value)}, expected {expected}")
    return check


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _maybe(check):
    """``check``'s value, or null."""
    def maybe(value, where: str) -> None:
        if value is not None:
            check(value, where)
    return maybe


def _list_of(check):
    def each(value, where: str) -> None:
        if not isinstance(value, list):
            raise Malformed(f"{where} is {_shown(value)}, expected a list")
        for i, item in enumerate(value):
            check(item, f"{where}[{i}]")
    return each


def _row(*checks):
    """A list of exactly ``len(checks)`` values, each of its own kind (a span: start, end, kind, place)."""
    def row(value, where: str) -> None:
        if not isinstance(value, list) or len(value) != len(checks):
            raise Malformed(f"{where} is {_shown(value)}, expected a list of {len(checks)}")
        for i, (item, check) in enumerate(zip(value, checks)):
            check(item, f"{where}[{i}]")
    return row


def _fields(required: dict, optional: dict | None = None):
    """An object with every ``required`` field, maybe some ``optional`` ones, and no other."""
    optional = optional or {}
    def fields(value, where: str) -> None:
        if not isinstance(value, dict):
            raise Malformed(f"{where} is {_shown(value)}, expected an object")
        missing = [name for name in required if name not in value]
        unknown = [name for name in value if name not in required and name not in optional]
        if missing or unknown:
            raise Malformed(f"{where}: " + (f"missing field {missing[0]!r}" if missing else f"unknown field {unknown[0]!r}"))
        for name, item in value.items():
            (required.get(name) or optional[name])(item, f"{where}.{name}")
    return fields


def _by_key(key: str, with_key, without_key):
    """One of two shapes, told apart by ``key`` as the reader tells them (a history entry: documents fed, or a
    question and its answer)."""
    def either(value, where: str) -> None:
        (with_key if isinstance(value, dict) and key in value else without_key)(value, where)
    return either


_text = _is(lambda v: isinstance(v, str), "text")
_count = _is(lambda v: type(v) is int and v >= 0, "a count")
_number = _is(lambda v: type(v) in (int, float) and math.isfinite(v), "a number")
_flag = _is(lambda v: isinstance(v, bool), "true or false")
_object = _is(lambda v: isinstance(v, dict), "an object")  # checked further by what reads it (below)
_digests = _is(lambda v: isinstance(v, dict) and all(isinstance(x, str) for pair in v.items() for x in pair),
               "an object of texts")


def _one_of(values):
    names = sorted(str(v.value) for v in values)
    return _is(lambda v: isinstance(v, str) and v in names, "one of " + ", ".join(names))


SUMMARY = _fields({"name": _text, "documents": _count, "tokens": _count, "saved_at": _number, "model": _text},
                  {"questions": _count, "last_question": _text})  # optional: files saved before they were kept
_PLACE = _fields({"source": _text, "page": _maybe(_count), "page_label": _maybe(_text),
                  "line_start": _maybe(_count), "line_end": _maybe(_count)},
                 {"heading": _maybe(_text),  # optional: files saved before chunks had headings
                  "listing": _flag})  # or before contents and index pages were told apart (ingest/listing.py)
_CITATION = _fields({"where": _PLACE, "share": _number, "snippet": _text})
_ANSWER_STATS = _fields({}, {"ttft_s": _maybe(_number), "decode_tps": _number, "prefill_tps": _number,
                             "tokens": _count, "finish": _text, "question_tokens": _count, "sampling": _text,
                             "quoted": _flag, "quoted_sources": _count, "while_feeding": _flag, "guess": _text})
_CHAT_ITEM = _fields({"role": _text, "kind": _one_of(ItemKind), "text": _text, "title": _maybe(_text),
                      "pending": _flag, "files": _list_of(_text), "citations": _list_of(_CITATION),
                      "recall_note": _text, "stats": _ANSWER_STATS, "stopped": _flag, "in_context": _flag})
_DOCUMENT = _fields({"path": _text, "status": _one_of(RowStatus), "pages": _count, "tokens": _count,
                     "reason": _text, "outcome": _maybe(_one_of(RowStatus))})
_HISTORY_ENTRY = _by_key("documents", _fields({"documents": _list_of(_fields({"text": _text, "where": _PLACE}))}),
                         _fields({"question": _text, "answer_ids": _list_of(_count)}))
_NEUTRAL_KEY = re.compile(f"[0-9a-f]{{{2 * KEY_BYTES}}}")  # the neutral question's documents_key (context_file.py)
_CONTEXT = _fields({
    "format": _is(lambda v: type(v) is int, "a format number"),  # which one: reopen_context says
    "identity": _object,  # compared with this server's model (check_identity)
    "cache": _object,  # checked field by field by lminfinite.restore_cache
    "system_prompt": _text,
    "spans": _list_of(_row(_count, _count, _one_of(SpanKind), _maybe(_PLACE))),
    "state": _one_of(TurnState),
    "carry": _fields({"pending": _text, "tail": _text, "started": _flag}),
    "tokens_fed": _count,
    "history": _list_of(_HISTORY_ENTRY),
}, {"neutral_key": _is(lambda v: isinstance(v, str) and _NEUTRAL_KEY.fullmatch(v) is not None,  # optional
                        f"{2 * KEY_BYTES} hexadecimal digits")})
RECORD = _fields({
    "format": _is(lambda v: type(v) is int, "a format number"),  # which one: workspace_file._header says
    "summary": SUMMARY,
    "session": _fields({"chat": _list_of(_CHAT_ITEM), "documents": _list_of(_DOCUMENT), "fed_digests": _digests},
                       {"switched_off": _list_of(_text),  # documents not answered from (answer_from.py)
                        "sources": _list_of(_fields({"file": _text, "tensor": _text}))}),  # workspace_sources.py
    "context": _maybe(_CONTEXT),
})
