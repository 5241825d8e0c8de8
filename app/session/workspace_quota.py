"""Each user's disk for saved workspaces (--workspace-quota): a save or an import that would cross it is refused.

A save is checked before it is written, by the size it will write (the cache's rows in use, the token stream),
so a refused save leaves the previous one whole; the workspace's own earlier file does not count, as the save
replaces it.
"""

from __future__ import annotations

from ingest.units import human_bytes

from .state import Session
from .workspace_sources import sources_bytes
from .workspace_store import WorkspaceStore

TOKEN_ID_BYTES = 8  # the token stream is saved as int64


class QuotaExceeded(OSError):
    """The user's saved workspaces would take more than --workspace-quota; the message says how much."""


def save_size(session: Session) -> int:
    """About the bytes saving ``session`` writes: the cache's rows in use (the middle store in 2-byte floats when
    --save-middle says so), the token stream and the kept uploads (workspace_sources.py); the JSON record is small
    beside them."""
    held = session.engine.memory() if session.engine is not None else {}
    middle = held.get("middle", 0)
    if session.config.save_middle != "exact":  # stored in 2-byte floats, whatever the cache's dtype
        middle = middle * 2 // session.runtime.dtype.itemsize
    return (held.get("starting", 0) + held.get("window", 0) + middle + session.context_tokens * TOKEN_ID_BYTES
            + sources_bytes(session))


def check_quota(store: WorkspaceStore, owner: str | None, workspace_id: str | None, adding: int,
                quota: int | None, doing: str) -> None:
    """QuotaExceeded when ``adding`` bytes (``workspace_id``'s new file, replacing its old one) would take the
    user's workspaces over ``quota``; ``doing`` ("saving it", "importing it") is what the message says."""
    if quota is None:
        return
    used = store.used(owner, but=workspace_id)
    if used + adding <= quota:
        return
    whose = f"{owner}'s" if owner else "the"
    raise QuotaExceeded(f"{whose} saved workspaces would take {human_bytes(used + adding)} with {doing}, more "
                        f"than the {human_bytes(quota)} each user may keep (--workspace-quota). Delete saved "
                        "workspaces in the Workspaces tab to make room")
