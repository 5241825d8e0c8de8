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
from pathlib import Path
from urllib.parse import quote

from ingest.results import INGESTED, PARTIAL, FileReport, Provenance

from . import line_view
from .temp_folders import server_temp_root

ROOT = "sources"
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
    """One session's kept uploads, by the display path its citations name (ingest's: the file name)."""

    def __init__(self):
        self._folder: Path | None = None
        self._files: dict[str, Path] = {}

    def keep(self, display: str, upload: Path) -> None:
        """Link ``upload`` under ``display`` (a newer upload of the same name replaces the older)."""
        if not openable(upload):
            return
        if self._folder is None:
            self._folder = served_root() / secrets.token_hex(16)
            self._folder.mkdir(mode=0o700)
        kept = self._folder / f"{len(self._files)}-{safe_name(display)}"
        if upload.suffix.lower() != PDF and upload.stat().st_size <= line_view.MAX_BYTES:
            kept = kept.with_name(kept.name + line_view.SUFFIX)
            kept.write_text(line_view.line_page(display, upload.read_bytes()), encoding="utf-8")
        else:
            if upload.suffix.lower() != PDF:
                kept = kept.with_name(kept.name + ".txt")
            try:
                os.link(upload, kept)
            except OSError:  # another filesystem: one copy
                shutil.copyfile(upload, kept)
        self.drop(display)
        self._files[display] = kept

    def drop(self, display: str) -> None:
        kept = self._files.pop(display, None)
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

    def release(self) -> None:
        """The session is freed: its files go."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        self._folder, self._files = None, {}


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
