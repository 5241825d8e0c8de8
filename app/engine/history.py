"""What a context was built from, in order: documents fed, and questions with the answers they got.

The cache cannot forget a passage in its middle, but a context can be built again from its history without
it: that is how "Clear chat" drops the conversation when a rollback cannot, and how a document is removed
(replay.py). The engine appends an entry when an operation commits and truncates the list when it rolls back,
so the history is always exactly what the cache holds. It is also saved with a workspace (context_file.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ingest import Provenance


@dataclass(frozen=True)
class FedChunk:
    """A document chunk as the engine reads it: its text and where it came from (what ingest's Chunk has)."""

    text: str
    where: Provenance


@dataclass(frozen=True)
class DocumentsFed:
    chunks: tuple  # of chunks with .text and .where (ingest.Chunk, or FedChunk once reopened)


@dataclass(frozen=True)
class Exchange:
    question: str
    answer_ids: tuple[int, ...]  # the answer's tokens as sampled, without the template's end of turn


def history_record(history: list) -> list[dict]:
    """JSON-ready entries."""
    out = []
    for entry in history:
        if isinstance(entry, DocumentsFed):
            out.append({"documents": [{"text": c.text, "where": asdict(c.where)} for c in entry.chunks]})
        else:
            out.append({"question": entry.question, "answer_ids": list(entry.answer_ids)})
    return out


def history_from(record: list[dict]) -> list:
    entries = []
    for entry in record:
        if "documents" in entry:
            entries.append(DocumentsFed(tuple(FedChunk(c["text"], Provenance(**c["where"])) for c in entry["documents"])))
        else:
            entries.append(Exchange(entry["question"], tuple(int(i) for i in entry["answer_ids"])))
    return entries
