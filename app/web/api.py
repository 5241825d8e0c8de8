"""The one-call API: ``/ask`` adds files to the caller's session context, asks, and answers in JSON.

Each gradio_client ``Client`` is its own session, so a script can add a PDF once and ask several
questions of it; the answer's sources are the passages top-k recall attended to while reading the question.
"""

from __future__ import annotations

from ..engine.citations import Citation
from ..session.uploads import DocumentRow
from ..session.state import ChatItem


def source_json(citation: Citation) -> dict:
    """One cited passage: where it is, what it says, and its share of the relevance above the neutral question."""
    where = citation.where
    found: dict = {"file": where.source, "label": where.label()}
    if where.page is not None:
        found.update(page=where.page, page_label=where.page_label)
    elif where.line_start is not None:
        found["lines"] = [where.line_start, where.line_end]
    return {**found, "snippet": citation.snippet, "weight": round(citation.share, 4)}


def answer_json(answer: ChatItem | None, rows: list[DocumentRow], context_tokens: int, model: str) -> dict:
    """The reply of ``/ask``; ``error`` says why there is no answer (stopped, refused, failed)."""
    reply = {
        "answer": answer.text if answer is not None else "",
        "sources": [source_json(c) for c in answer.citations] if answer is not None else [],
        "context_tokens": context_tokens,
        "documents": [{"file": r.path, "status": r.status, "pages": r.pages, "tokens": r.tokens, "reason": r.reason}
                      for r in rows],
        "model": model,
        "in_context": bool(answer is not None and answer.in_context),
        "stats": dict(answer.stats) if answer is not None else {},
        "recall_note": answer.recall_note if answer is not None else "",
    }
    if answer is None or not answer.in_context:
        reply["error"] = (answer.text if answer is not None and answer.text.startswith("⚠") else
                          "stopped: the question was not answered" if answer is not None and answer.stopped else
                          "no answer: no question was given, or the documents could not be added")
    return reply
