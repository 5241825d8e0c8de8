"""The files a session's citations open: each uploaded PDF, and each plain-text or code file, kept as it was
uploaded so that a cited page opens in the browser's PDF viewer at that page (``#page=N``), and a cited file opens.

A session's files are in a folder of its own under this server's temporary folder (temp_folders.py), named by a
random token: Gradio serves that root as it is (``gr.set_static_paths``) and a URL can be neither guessed nor
listed, so only the session that was sent it can open it. A PDF is a hard link to the upload (no copy); a text or
code file becomes a page of its lines, each with an anchor (line_view.py), so that a citation opens it at its first
line, or, when larger than ``line_view.MAX_BYTES``, a hard link served as ``.txt``. Gradio serves a static file
inline whatever its type, so only types a browser shows without running them are linked (an uploaded HTML page
opened from our address could run its scripts there; the line pages are ours, escaped, and forbid scripts). The
folder goes when the session is freed, and the whole root when the server stops.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path
from urllib.parse import quote

from ingest.results import INGESTED, PARTIAL, FileReport, Provenance

from . import line_view
from .temp_folders import server_temp_root

ROOT = "sources"
PRIVATE = "source-originals"  # the uploads' own bytes, not served
FILE_ROUTE = "gradio_api/file="  # Gradio's route for static files; relative, so a proxy's path prefix is kept
PDF = ".pdf"
NOT_AS_TEXT = {".html", ".htm", ".xhtml", ".svg", ".xml", ".ipynb"}  # read as text, but served as text they mislead
COMPRESSED = {".gz", ".bz2", ".xz", ".zip", ".tar", ".tgz", ".tbz2", ".txz"}  # citations name the files inside


def served_root() -> Path:
    """The folder Gradio serves the sessions' source files from (made on first use)."""
    root = server_temp_root() / ROOT
    root.mkdir(mode=0o700, exist_ok=True)
    return root


def openable(upload: Path) -> bool:
    """Whether a citation of ``upload`` may link to it: a regular file, neither compressed nor HTML-like."""
    suffix = upload.suffix.lower()
    return upload.is_file() and suffix not in COMPRESSED and suffix not in NOT_AS_TEXT


class SourceFiles:
    """One session's kept uploads, by the display path its citations name (ingest's: the file name).

    Each is kept twice at most: what a citation opens (in the served folder) and the upload's own bytes (a hard
    link, in a private folder beside it that is not served; the same file for a PDF), which a saved workspace
    carries so that a reopened one's citations open again (``originals``, ``restore``)."""

    def __init__(self):
        self._folder: Path | None = None  # served: what citations open
        self._private: Path | None = None  # not served: the uploads' bytes
        self._files: dict[str, Path] = {}
        self._originals: dict[str, Path] = {}
        self._count = 0  # numbers the kept files: two uploads whose names clean alike never share a file

    def keep(self, display: str, upload: Path) -> None:
        """Link ``upload`` under ``display`` (a newer upload of the same name replaces the older)."""
        if not openable(upload):
            return
        if self._folder is None:
            token = secrets.token_hex(16)
            self._folder = served_root() / token
            self._folder.mkdir(mode=0o700)
            self._private = private_root() / token
            self._private.mkdir(mode=0o700)
        self._count += 1
        stem = f"{self._count}-{safe_name(display)}"
        kept = self._folder / stem
        self.drop(display)
        if upload.suffix.lower() == PDF:
            _link(upload, kept)
            original = kept
        else:
            original = self._private / stem
            _link(upload, original)
            if upload.stat().st_size <= line_view.MAX_BYTES:
                kept = kept.with_name(kept.name + line_view.SUFFIX)
                kept.write_text(line_view.line_page(display, original.read_bytes()), encoding="utf-8")
            else:
                kept = kept.with_name(kept.name + ".txt")
                _link(original, kept)
        self._files[display], self._originals[display] = kept, original

    def drop(self, display: str) -> None:
        for held in (self._files, self._originals):
            kept = held.pop(display, None)
            if kept is not None:
                kept.unlink(missing_ok=True)

    def url(self, where: Provenance) -> str | None:
        """Where the citation ``where`` opens: its PDF at its page, its file's page of lines at its first line, or
        its file; None when it was not kept."""
        kept = self._files.get(where.source)
        if kept is None or not kept.exists():
            return None
        if kept.suffix == PDF:
            anchor = f"#page={where.page}" if where.page is not None else ""
        else:
            anchor = line_view.line_anchor(where.line_start) if kept.suffix == line_view.SUFFIX else ""
        return f"{FILE_ROUTE}{quote(str(kept))}{anchor}"

    def originals(self, displays) -> list[tuple[str, Path]]:
        """The kept uploads' own files among ``displays`` (the documents a workspace saves), by display path."""
        return [(d, self._originals[d]) for d in displays if d in self._originals and self._originals[d].exists()]

    def restore(self, display: str, data: bytes) -> None:
        """Keep ``data``, an upload's bytes a saved workspace carried, under ``display`` as ``keep`` keeps an
        upload: a PDF opens in the browser's viewer, anything else as its page of lines (escaped; an imported
        workspace's bytes are as untrusted as an upload)."""
        with tempfile.TemporaryDirectory(dir=private_root()) as scratch:
            upload = Path(scratch) / safe_name(display)
            upload.write_bytes(data)
            self.keep(display, upload)

    def release(self) -> None:
        """The session is freed: its files go."""
        for folder in (self._folder, self._private):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        self._folder = self._private = None
        self._files, self._originals = {}, {}


def private_root() -> Path:
    """The folder the kept uploads' own bytes are in: beside the served one, never served."""
    root = server_temp_root() / PRIVATE
    root.mkdir(mode=0o700, exist_ok=True)
    return root


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem: one copy
        shutil.copyfile(source, target)


def keep_uploads(files: SourceFiles, sources: list[str], reports: list[FileReport]) -> None:
    """Keep each source that is one file ingest read (its display path is its name), for its citations."""
    read = {report.path for report in reports if report.status in (INGESTED, PARTIAL)}
    for source in sources:
        path = Path(source)
        if path.name in read:
            files.keep(path.name, path)


def safe_name(display: str) -> str:
    """A file name from a display path: its last part, without characters a URL or a shell would trip on."""
    name = Path(display).name or "source"
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:120]
