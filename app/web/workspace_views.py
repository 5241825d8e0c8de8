"""The Workspaces tab's values: the current workspace's line and the user's saved workspaces."""

from __future__ import annotations

import time

from ingest.units import human_bytes

from ..session.state import Session
from ..session.workspace_quota import save_size
from ..session.workspace_store import SavedWorkspace

WORKSPACE_HEADERS = ["Conversation", "Files", "Tokens", "Size", "Saved"]  # short headers: the panel is narrow
WORKSPACE_COLUMN_WIDTHS = ["44%", "10%", "14%", "12%", "20%"]
SHOWN_QUESTION_CHARS = 80


def when(timestamp: float) -> str:
    """'14:03' today, else '2026-11-21 14:03'."""
    local = time.localtime(timestamp)
    today = time.localtime()
    return time.strftime("%H:%M" if local[:3] == today[:3] else "%Y-%m-%d %H:%M", local)


def conversation(w: SavedWorkspace, current_id: str) -> str:
    """A list line that reads like a conversation's: its name, then the last question asked and how many were."""
    name = ("● " if w.id == current_id else "") + w.name
    summary = w.summary
    if summary is None or not summary.questions:
        return name
    question = summary.last_question
    if len(question) > SHOWN_QUESTION_CHARS:
        question = question[:SHOWN_QUESTION_CHARS - 1].rstrip() + "…"
    asked = f"{summary.questions} questions" if summary.questions > 1 else "1 question"
    return f"{name} — “{question}” ({asked})"


def workspace_rows(saved: list[SavedWorkspace], current_id: str, running_model: str | None = None) -> list[list]:
    """The list, newest first (``WorkspaceStore.list``): a row clicked is chosen (``chosen_row``). A workspace
    read by another model than ``running_model`` says which: it opens only under that model (model_switch.py)."""
    rows = []
    for w in saved:
        name = conversation(w, current_id)
        if w.summary is None:
            rows.append([name, "", "", human_bytes(w.size), f"cannot be opened: {w.problem}"])
        else:
            other = running_model is not None and w.summary.model != running_model
            rows.append([name, w.summary.documents, f"{w.summary.tokens:,}", human_bytes(w.size),
                         when(w.modified) + (f" · read by {w.summary.model}" if other else "")])
    return rows


def chosen_row(saved: list[SavedWorkspace], row: int | None, shown: str) -> str | None:
    """The id of the workspace in list row ``row`` whose line reads ``shown`` (the table the user clicked), or
    None when the list changed since (another tab saved, renamed or deleted one)."""
    if row is None or not 0 <= row < len(saved):
        return None
    w = saved[row]
    return w.id if shown in (conversation(w, ""), conversation(w, w.id)) else None


def workspace_choices(saved: list[SavedWorkspace]) -> list[tuple[str, str]]:
    return [(f"{w.name} · {when(w.modified)}", w.id) for w in saved]


def workspace_note(session: Session, saved: SavedWorkspace | None) -> str:
    """Where this workspace stands on disk, and what a save would write (the cache's bytes, before saving)."""
    to_write = save_size(session)  # rows in use, not spare room
    if saved is not None and not session.unsaved:
        return f"Saved at {when(saved.modified)} · {human_bytes(saved.size)} on disk · opens again on reload."
    if session.pristine:
        return "Empty: nothing to save yet."
    before = f"Last saved at {when(saved.modified)}. " if saved is not None else "Not saved yet. "
    return (before + f"Saving writes about {human_bytes(to_write)} ({session.context_tokens:,} tokens); "
            "it happens by itself when you leave or reload the page.")


def reopening_chat(saved: SavedWorkspace) -> list[dict]:
    """The chat while a saved workspace is read back (a minute for 124K tokens on a loaded machine): which one,
    and how big, where an empty workspace was shown before and looked like lost work."""
    tokens = f"{saved.summary.tokens:,} tokens · " if saved.summary else ""
    return [{"role": "assistant", "content": f"Reading {human_bytes(saved.size)} back into memory…",
             "metadata": {"title": f"Reopening “{saved.name}” ({tokens}saved {when(saved.modified)})",
                          "status": "pending"}}]
