"""Parent side of PDF extraction: a killable worker process with a timeout.

One long-lived 'spawn' worker serves all PDFs (starting a process per PDF
would cost ~0.5 s each); a lock serialises requests because PyMuPDF is not
thread-safe.  A PDF that hangs MuPDF is killed at limits.pdf_timeout_s, one
that crashes it kills only the worker; either way the next PDF gets a fresh
worker and the pages already received are kept.

A 'spawn' child normally re-runs the parent's __main__ script; an app
script that calls demo.launch() without an `if __name__ == "__main__":`
guard would start a second app inside the worker.  The worker needs nothing
from __main__, so it is hidden while the child is created.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import sys
import threading
import time
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

from .outline import OutlineEntry, read_outline
from .pdf_worker import serve
from .results import IngestCancelled

_POLL_S = 0.1
_MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # a page message larger than this is hostile


@contextmanager
def _main_module_hidden():
    """Make multiprocessing's spawn skip re-importing the parent's __main__."""
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


@dataclass
class PdfPage:
    index: int  # 0-based
    label: str  # page label ('' when the PDF defines none)
    text: str
    has_images: bool  # no text but images: probably a scan


@dataclass
class PdfExtraction:
    """Everything the worker reported about one PDF."""

    pages: list[PdfPage] = field(default_factory=list)
    page_count: int = 0
    repaired: bool = False
    encrypted: bool = False
    failure: str = ""  # '', corrupt, needs_password, wrong_password, crash, timeout, stopped
    message: str = ""
    page_errors: dict[int, str] = field(default_factory=dict)
    outline: tuple[OutlineEntry, ...] = ()  # the bookmarks (outline.py)
    warnings: str = ""
    finished: bool = False  # the worker reached the end of the document


class PdfWorker:
    """A restartable extraction process; use the module-level `extract_pdf`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None
        self._memory_limit: int | None = None

    def _start(self, memory_limit: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=serve, args=(child_conn, memory_limit), daemon=True, name="ingest-pdf-worker")
        with _main_module_hidden():
            proc.start()
        child_conn.close()
        self._proc, self._conn, self._memory_limit = proc, parent_conn, memory_limit

    def stop(self) -> None:
        """Kill the worker (if any); the next request starts a new one."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is not None:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=5)
        if conn is not None:
            conn.close()

    def _send(self, header: dict, data: bytes, memory_limit: int) -> None:
        for attempt in range(2):
            if self._proc is None or not self._proc.is_alive() or self._memory_limit != memory_limit:
                self.stop()
                self._start(memory_limit)
            try:
                self._conn.send_bytes(json.dumps(header).encode())
                self._conn.send_bytes(data)
                return
            except (BrokenPipeError, EOFError, OSError):
                self.stop()
                if attempt:
                    raise

    def extract(self, data: bytes, password: str | None, *, timeout_s: float, memory_limit: int,
                max_pages: int, cancel: Any = None, on_page: Callable[[PdfPage], str | None] | None = None,
                debug: dict | None = None) -> PdfExtraction:
        """Extract all pages of the PDF in `data` (see PdfExtraction).

        `on_page` sees each page as it arrives; returning a sentence stops the
        extraction there (failure 'stopped', message = that sentence).
        """
        result = PdfExtraction()
        options = {"max_pages": max_pages, **(debug or {})}
        with self._lock:
            try:
                self._send({"password": password, "options": options}, data, memory_limit)
            except (BrokenPipeError, EOFError, OSError) as exc:
                result.failure, result.message = "crash", f"could not start the PDF worker: {exc}"
                return result
            return self._collect(result, time.monotonic() + timeout_s, timeout_s, cancel, on_page)

    def _collect(self, result: PdfExtraction, deadline: float, timeout_s: float, cancel: Any,
                 on_page: Callable[[PdfPage], str | None] | None) -> PdfExtraction:
        """Apply the worker's messages to `result` until the document ends, the worker fails or dies,
        time runs out or `on_page` stops it; cancel raises IngestCancelled."""
        while True:
            self._check_cancel(cancel)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._give_up(result, "timeout",
                                     f"PDF extraction took longer than {timeout_s:g} s and was stopped")
            try:
                if not self._conn.poll(min(remaining, _POLL_S)):
                    continue
                raw = self._conn.recv_bytes(_MAX_MESSAGE_BYTES)
                pages_before = len(result.pages)
                done = self._handle(json.loads(raw.decode("utf-8", "surrogatepass")), result)
            except (EOFError, OSError) as exc:
                return self._give_up(result, "crash", self._lost_worker_message(exc))
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                return self._give_up(result, "crash", f"the PDF extractor sent a bad message ({type(exc).__name__})")
            stop_reason = self._page_stop_reason(on_page, result, pages_before)
            if stop_reason:
                return self._give_up(result, "stopped", stop_reason)
            if done:
                return result

    def _check_cancel(self, cancel: Any) -> None:
        if cancel is not None and cancel.is_set():
            self.stop()
            raise IngestCancelled()

    def _give_up(self, result: PdfExtraction, failure: str, message: str) -> PdfExtraction:
        """Kill the worker (it may be stuck or mid-document) and say why the extraction ended early."""
        self.stop()
        result.failure, result.message = failure, message
        return result

    def _lost_worker_message(self, exc: BaseException) -> str:
        """Why the pipe broke: the worker's exit code when it died, else the error seen."""
        code = None
        if self._proc is not None:
            self._proc.join(timeout=2)
            code = self._proc.exitcode
        return (f"the PDF extractor died (exit code {code})" if code is not None
                else f"lost contact with the PDF extractor ({type(exc).__name__})")

    @staticmethod
    def _page_stop_reason(on_page: Callable[[PdfPage], str | None] | None, result: PdfExtraction,
                          pages_before: int) -> str | None:
        """What `on_page` says about a page that just arrived: a sentence to stop at, or None to go on."""
        if on_page is None or len(result.pages) <= pages_before:
            return None
        return on_page(result.pages[-1])

    @staticmethod
    def _handle(message: list, result: PdfExtraction) -> bool:
        """Apply one worker message to `result`; True when the document is finished."""
        kind = message[0]
        if kind == "meta":
            meta = message[1]
            result.page_count = int(meta["page_count"])
            result.repaired = bool(meta["repaired"])
            result.encrypted = bool(meta["encrypted"])
        elif kind == "outline":
            result.outline = read_outline(message[1])
        elif kind == "page":
            page = PdfPage(index=int(message[1]), label=str(message[2]), text=str(message[3]),
                           has_images=bool(message[4]))
            result.pages.append(page)
        elif kind == "page_error":
            result.page_errors[int(message[1])] = str(message[2])
        elif kind == "end":
            result.warnings = str(message[1]["warnings"])
            result.finished = True
            return True
        elif kind == "fail":
            result.failure, result.message = str(message[1]), str(message[2])
            return True
        else:
            raise ValueError(f"unknown message {kind!r}")
        return False


_WORKER = PdfWorker()
atexit.register(_WORKER.stop)


def stop_worker() -> None:
    """Kill the shared worker now (the next PDF starts a new one): what exit does, for a process that replaces
    itself (os.exec*), where exit handlers do not run."""
    _WORKER.stop()


def extract_pdf(data: bytes, password: str | None, *, timeout_s: float, memory_limit: int, max_pages: int,
                cancel: Any = None, on_page: Callable[[PdfPage], str | None] | None = None,
                debug: dict | None = None) -> PdfExtraction:
    """Extract a PDF in the shared worker process (serialised across threads)."""
    return _WORKER.extract(data, password, timeout_s=timeout_s, memory_limit=memory_limit, max_pages=max_pages,
                           cancel=cancel, on_page=on_page, debug=debug)


def shutdown_pdf_worker() -> None:
    """Stop the shared worker now (it restarts on the next PDF)."""
    with _WORKER._lock:
        _WORKER.stop()
