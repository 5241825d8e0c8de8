"""The one-call API: ``/ask`` adds files to the caller's session context, asks, and answers in JSON.

Each gradio_client ``Client`` is its own session, so a script can add a PDF once and ask several
questions of it; the answer's sources are the passages top-k recall attended to while reading the question.
"""

from __future__ import annotations

from ..engine.citations import Citation
from ..engine.metrics import LiveStats
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
    if where.heading:
        found["heading"] = where.heading  # the document outline's heading over the passage's snippet
    return {**found, "snippet": citation.snippet, "weight": round(citation.share, 4)}


def feed_json(stats: LiveStats) -> dict:
    """How far the feed under way has got: tokens fed of all planned, and the seconds it should still take."""
    return {"fed_tokens": stats.done, "tokens": stats.total,
            "eta_s": round(stats.eta_s, 1) if stats.eta_s is not None else None}


def answer_json(answer: ChatItem | None, rows: list[DocumentRow], context_tokens: int, model: str,
                feed: dict | None = None) -> dict:
    """The reply of ``/ask``; ``error`` says why there is no answer (stopped, refused, failed). An answer given
    while its documents were still fed is not in the context yet (``in_context`` false, no error): ``feed`` says
    how far the feed has got, and the context reads the exchange once the feed is over."""
    beside_feed = answer is not None and bool(answer.stats.get("while_feeding")) and not answer.stopped
    reply = {
        "answer": answer.text if answer is not None else "",
        "sources": [source_json(c) for c in answer.citations] if answer is not None else [],
        "context_tokens": context_tokens,
        "documents": [{"file": r.path, "status": r.status, "pages": r.pages, "tokens": r.tokens, "reason": r.reason}
                      for r in rows],
        "model": model,
        "in_context": bool(answer is not None and answer.in_context and not (beside_feed and feed is not None)),
        "stats": dict(answer.stats) if answer is not None else {},
        "recall_note": answer.recall_note if answer is not None else "",
    }
    if feed is not None:
        reply["feed"] = feed
    if answer is None or not (answer.in_context or beside_feed):
        reply["error"] = (answer.text if answer is not None and answer.text.startswith("⚠") else
                          "stopped: the question was not answered" if answer is not None and answer.stopped else
                          "no answer: no question was given, or the documents could not be added")
    return reply
