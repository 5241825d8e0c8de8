"""The chat as Markdown (to read) and JSON (to process), with documents, sources and timings."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

from ingest.tables import markdown_table

from .uploads import DocumentRow
from .state import ChatItem


def export_data(*, model: str, system_prompt: str | None, documents: list[DocumentRow], chat: list[ChatItem],
                context_tokens: int) -> dict:
    return {
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": model,
        "system_prompt": system_prompt,
        "context_tokens": context_tokens,
        "documents": [asdict(d) for d in documents],
        "messages": [
            {"role": c.role, "kind": c.kind, "text": c.text, "title": c.title, "files": c.files,
             "citations": [citation.as_dict() for citation in c.citations], "stats": c.stats, "stopped": c.stopped, "in_context": c.in_context}
            for c in chat
        ],
    }


def to_markdown(data: dict) -> str:
    lines = [f"# Chat export ({data['exported_at']})", "", f"- Model: `{data['model']}`",
             f"- Context: {data['context_tokens']:,} tokens"]
    if data["system_prompt"]:
        lines.append(f"- System prompt: {data['system_prompt']}")
    if data["documents"]:
        lines += ["", "## Documents", "", markdown_table(
            ["File", "Status", "Pages", "Tokens", "Note"],
            [[d["path"], d["status"], d["pages"] or "", d["tokens"] or "", d["reason"]] for d in data["documents"]])]
    lines += ["", "## Conversation"]
    for message in data["messages"]:
        lines += message_markdown(message)
    return "\n".join(lines) + "\n"


def message_markdown(m: dict) -> list[str]:
    """One exported chat item's lines: a question, an answer with its sources, or a status block."""
    if m["kind"] == "question":
        attached = f" (attached: {', '.join(m['files'])})" if m["files"] else ""
        return ["", f"**You**{attached}:", "", m["text"] or "*(documents only)*"]
    if m["kind"] == "answer":
        lines = ["", "**Assistant:**", "", m["text"]]
        if m["citations"]:
            lines += ["", "Sources (share of the question's recall beyond a neutral question's): " + "; ".join(
                f"{c['label']} ({c['share']:.0%})" for c in m["citations"])]
        if m["stopped"]:
            lines += ["", "*Stopped; not kept in the context.*"]
        return lines
    return ["", f"> {m['title'] or ''}"] + [f"> {t}" for t in (m["text"] or "").splitlines() if t.strip()]


def write_exports(data: dict, directory: str) -> list[str]:
    """Write chat.md and chat.json under ``directory``; returns both paths."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    md_path = os.path.join(directory, f"chat-{stamp}.md")
    json_path = os.path.join(directory, f"chat-{stamp}.json")
    with open(md_path, "w", encoding="utf-8") as f:
        f.write(to_markdown(data))
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
    return [md_path, json_path]
