"""A workspace's kept uploads: saved with it, so that a reopened workspace's citations open their PDF page or
their lines again (issue "What a user sees": they did not, as workspaces kept the context and not the uploads).

Only the uploads of documents still in the context are saved, each as its bytes (one uint8 tensor), and they count
toward the save's size (the quota, the note before saving). A file's uploads are as untrusted as an upload: they are
kept as ``SourceFiles.keep`` keeps one (a PDF opened by the browser's viewer, anything else shown as escaped lines).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .state import Session

log = logging.getLogger(__name__)
PREFIX = "sources."  # the tensors' names: beside the cache's ("cache.") and the token stream's


class SourcesDamaged(ValueError):
    """A saved upload that cannot be one: a tensor of another name, type or shape."""


def saved_sources(session: Session) -> list[tuple[str, Path]]:
    """The kept uploads a save carries: those of documents still in the context, by display path."""
    return session.sources.originals(r.path for r in session.documents if r.status.in_context)


def sources_bytes(session: Session) -> int:
    return sum(path.stat().st_size for _, path in saved_sources(session))


def source_tensors(session: Session) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The saved uploads as tensors, and the record that names them."""
    tensors, record = {}, []
    for index, (display, path) in enumerate(saved_sources(session)):
        name = f"{PREFIX}{index}"
        tensors[name] = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)
        record.append({"file": display, "tensor": name})
    return tensors, record


def read_sources(tensors, record: list[dict]) -> list[tuple[str, bytes]]:
    """Each saved upload's display path and bytes; SourcesDamaged for a tensor that cannot be an upload's bytes."""
    out = []
    for entry in record:
        name = entry["tensor"]
        if not name.startswith(PREFIX):
            raise SourcesDamaged(f"session.sources names {name!r}, not one of its uploads")
        tensor = tensors[name]
        if tensor.dtype != torch.uint8 or tensor.dim() != 1:
            raise SourcesDamaged(f"{name} is not a file's bytes ({tensor.dtype}, {tuple(tensor.shape)})")
        out.append((entry["file"], tensor.numpy().tobytes()))
    return out


def restore_sources(session: Session, uploads: list[tuple[str, bytes]]) -> None:
    """Keep the reopened workspace's uploads for its citations. One that cannot be written (a full disk) leaves
    its citations unlinked, as before workspaces carried them: the context, the chat and the rest reopen."""
    for display, data in uploads:
        try:
            session.sources.restore(display, data)
        except OSError:
            log.warning("a reopened workspace's upload %r could not be kept; its citations are not linked", display,
                        exc_info=True)
