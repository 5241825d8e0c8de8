"""One workspace, one file: a session's context, chat and documents in a single safetensors file.

Tensors: the cache's (lminfinite.cache_state), the token stream, and the uploads citations open
(workspace_sources.py). Everything else (the chat with its
citations, the documents table, and the engine's record with its history, to clear the chat or remove a
document later) is one JSON document in the file's metadata, so listing workspaces reads headers only. One file makes a save atomic
(written beside, then renamed over the old one) and a workspace one download. Every field of the JSON is
checked when a file is read (workspace_record.py): a damaged or hostile file is refused, saying where, before
any of it reaches a session or a view.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ingest import Provenance
from ingest.units import human_bytes
from lminfinite import CacheFileError
from lminfinite.tensor_file import TensorFile, write_tensors

from ..engine.citations import Citation
from ..engine.context_file import ContextDamaged, ContextMismatch, check_identity, context_record, reopen_context
from .uploads import DocumentRow, RowStatus
from .state import ChatItem, ItemKind, Session
from .text import clean_strings
from .workspace_record import MAX_HEADER_BYTES, RECORD, SUMMARY, Malformed, check_shape
from .workspace_sources import SourcesDamaged, read_sources, restore_sources, source_tensors

RECORD_KEY = "lminfinite-chat.workspace"
FORMAT = 1
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # how JSON writes a surrogate (or half a pair)


class WorkspaceFileError(ValueError):
    """The file is not a workspace this app can open; the message says why (for the user)."""


@dataclass(frozen=True)
class Summary:
    """What the workspace list shows, read from a file's header alone."""

    name: str
    documents: int
    tokens: int
    saved_at: float
    model: str
    questions: int = 0  # answered and kept in the context; files saved before these two were kept have neither
    last_question: str = ""  # the newest of them (cut to LAST_QUESTION_CHARS): what the conversation is about


LAST_QUESTION_CHARS = 200


def conversation_summary(session: Session) -> tuple[int, str]:
    """How many questions the context holds answered, and the newest of them, as the list shows them."""
    count, question, last = 0, None, ""
    for item in session.chat:
        if item.kind == ItemKind.QUESTION:
            question = item
        elif item.kind == ItemKind.ANSWER and item.in_context and question is not None:
            count, last, question = count + 1, question.text, None
    return count, " ".join(last.split())[:LAST_QUESTION_CHARS]


def _chat_item(item: ChatItem) -> dict:
    data = asdict(item)
    del data["progress"]  # what a pending answer was reading: a saved answer is never pending
    data["citations"] = [{"where": asdict(c.where), "share": c.share, "snippet": c.snippet} for c in item.citations]
    return data


def _chat_item_from(data: dict) -> ChatItem:
    citations = [Citation(Provenance(**c["where"]), c["share"], c["snippet"]) for c in data.pop("citations")]
    return ChatItem(**{**data, "kind": ItemKind(data["kind"]), "pending": False}, citations=citations)


NOT_IN_CONTEXT_YET = (RowStatus.READING, RowStatus.QUEUED, RowStatus.FEEDING)  # rows a save leaves out


def session_record(session: Session) -> dict:
    """The session's chat, documents and their digests as JSON-ready data (the engine is saved beside it).

    Only what the context holds an outcome for: questions still queued and files still being read or waiting
    for the model are left out (a reopened workspace would show them as asked and never answer them)."""
    waiting = session.queued_items()
    return {
        "chat": [_chat_item(c) for c in session.chat if id(c) not in waiting],
        "documents": [asdict(r) for r in session.documents if r.status not in NOT_IN_CONTEXT_YET],
        "fed_digests": session.fed_digests,
        "switched_off": sorted(session.switched_off),
    }


def write_workspace(path: Path, session: Session, name: str, *, middle_dtype: torch.dtype | None = None) -> int:
    """Save ``session`` (idle: no model step running) to ``path`` atomically; returns the file's size."""
    tensors, context = ({}, None) if session.engine is None else context_record(session.engine, middle_dtype=middle_dtype)
    uploads, sources = source_tensors(session)  # the uploads citations open (workspace_sources.py)
    summary = Summary(name, sum(1 for r in session.documents if r.status.in_context),
                      session.context_tokens, time.time(), session.runtime.name, *conversation_summary(session))
    record = {"format": FORMAT, "summary": asdict(summary),
              "session": {**session_record(session), "sources": sources}, "context": context}
    tensors = {**tensors, **uploads}
    write_tensors(tensors, {RECORD_KEY: json.dumps(record)}, Path(path))
    return Path(path).stat().st_size


def _header(path: Path) -> dict:
    """The file's workspace record, parsed only once its size and shape are known to be a workspace's (a
    record of 87 MB, or one nested 200,000 deep, is refused from its text alone: workspace_record.check_shape);
    every string in it cleaned of what UTF-8 cannot hold (text.clean_text)."""
    name = Path(path).name
    _check_header_size(path)
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as exc:
        raise WorkspaceFileError(f"{name} is not a readable workspace file ({exc})") from exc
    text = metadata.get(RECORD_KEY)
    if not isinstance(text, str):
        raise WorkspaceFileError(f"{name} is a safetensors file but not a workspace")
    try:
        check_shape(text)
    except Malformed as exc:
        raise WorkspaceFileError(f"{name} is damaged or hostile: {exc}") from None
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise WorkspaceFileError(f"{name} is a safetensors file but not a workspace") from exc
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise WorkspaceFileError(f"{name} has an unknown workspace format")
    return clean_strings(record) if _ESCAPED_SURROGATE.search(text) else record


def _check_header_size(path: Path) -> None:
    """Refuse a file whose JSON header is larger than a workspace's can be, from its first 8 bytes (the
    header's length, as safetensors begins): nothing of it is read or parsed."""
    try:
        with open(path, "rb") as file:
            prefix = file.read(8)
            length = os.fstat(file.fileno()).st_size
    except OSError as exc:
        raise WorkspaceFileError(f"{Path(path).name} is not a readable workspace file ({exc})") from exc
    size = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else length
    if size > length - 8:  # text, or anything else that does not begin as safetensors does
        raise WorkspaceFileError(f"{Path(path).name} is not a readable workspace file (not a safetensors file)")
    if size > MAX_HEADER_BYTES:
        raise WorkspaceFileError(f"{Path(path).name} is damaged or hostile: its record is {human_bytes(size)}, "
                                 f"more than the {human_bytes(MAX_HEADER_BYTES)} a workspace's can be")


def check_compatible(path: Path, runtime) -> Summary:
    """An imported file: a workspace (its whole record well formed) made with this server's model and
    LM-Infinite settings. Its tensors are checked when it is opened."""
    record = _checked(path, _header(path), RECORD, "record")
    if record["context"] is not None:
        try:
            check_identity(record["context"]["identity"], runtime)
        except ContextMismatch as exc:
            raise WorkspaceFileError(str(exc)) from exc
    return Summary(**record["summary"])


def read_summary(path: Path) -> Summary:
    """The list's line of a workspace file (header only: cheap however large the context)."""
    return Summary(**_checked(path, _header(path).get("summary"), SUMMARY, "summary"))


def read_workspace(path: Path, session: Session) -> None:
    """Fill a new, empty ``session`` from ``path``: chat, documents, chunks, and the context on its model.

    Everything is read and checked before the session changes, so a bad file leaves it empty and usable.
    """
    record = _checked(path, _header(path), RECORD, "record")
    try:
        chat = [_chat_item_from(dict(c)) for c in record["session"]["chat"]]
        rows = [DocumentRow(**r) for r in record["session"]["documents"]]
        digests = dict(record["session"]["fed_digests"])
        switched_off = set(record["session"].get("switched_off", ()))  # older files have none
        engine, uploads = None, []
        with TensorFile(path) as tensors:  # one tensor at a time: never the file's tensors and the cache at once
            if record["context"] is not None:
                engine = reopen_context(session.runtime, tensors, record["context"], budget=session.budget.tokens,
                                        stats=session.stats)
            uploads = read_sources(tensors, record["session"].get("sources", ()))  # older files have none
    except WorkspaceFileError:
        raise
    except (ContextDamaged, CacheFileError, SourcesDamaged) as exc:  # made by no model run: a token, a NaN, counts
        raise WorkspaceFileError(f"{Path(path).name} is damaged or hostile: {exc}") from exc
    except (SafetensorError, KeyError, TypeError, OverflowError) as exc:
        raise WorkspaceFileError(f"{Path(path).name} is damaged or incomplete ({type(exc).__name__}: {exc})") from exc
    except ValueError as exc:  # a model or setting mismatch, or parts that disagree: the message says which
        raise WorkspaceFileError(f"{Path(path).name} cannot be opened here: {exc}") from exc
    session.restore(chat, rows)
    restore_sources(session, uploads)
    session.fed_digests.update(digests)
    session.switched_off = switched_off
    session.engine = engine
    session.system_prompt = record["context"]["system_prompt"] if engine is not None else None


def _checked(path: Path, value, check, where: str):
    """``value`` once ``check`` accepts it; else the file is damaged (WorkspaceFileError saying where)."""
    try:
        check(value, where)
    except Malformed as exc:
        raise WorkspaceFileError(f"{Path(path).name} is damaged or incomplete ({exc})") from None
    return value
