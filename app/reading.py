"""The reading step: ingest parses an action's files off the model queue, with live progress.

ingest.ingest blocks, so it runs in a thread while the generator shows its progress every quarter second;
if the browser goes away mid-read, the action is cancelled and marked read so it never blocks the queue.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from ingest import IngestCancelled

from . import views
from .cli import AppConfig
from .documents import DocumentRow, progress_line, read_sources, replace_rows, row_from_report
from .runtime import ModelRuntime
from .sessions import Session, Work

log = logging.getLogger(__name__)
POLL_S = 0.25


class Reader:
    def __init__(self, runtime: ModelRuntime, config: AppConfig, view):
        self.runtime = runtime
        self.config = config
        self.view = view  # session -> component values

    def read(self, session: Session, work: Work):
        """Generator: ingest the action's files in a thread, yielding the session's view while it reads."""
        work.reading = True
        names = [os.path.basename(p.rstrip("/")) or p for p in work.sources]
        placeholders = [DocumentRow(name, "reading") for name in names]
        session.documents.extend(placeholders)
        stats = session.stats
        stats.reading = "starting"
        outcome: dict = {}
        started = time.monotonic()

        def on_progress(event) -> None:
            rate = event.tokens_done / max(time.monotonic() - started, 1e-6)
            stats.reading = f"{progress_line(event)} · {rate:,.0f} tok/s"
            if work.status_item is not None:
                work.status_item.text = stats.reading

        def target() -> None:
            try:
                outcome["corpus"] = read_sources(work.sources, tokenizer=self.runtime.ingest_tokenizer,
                                                 config=self.config, cancel=work.cancel, progress=on_progress)
            except IngestCancelled as exc:
                outcome["cancelled"] = exc
            except Exception as exc:  # noqa: BLE001 - shown to the user; the session stays usable
                log.exception("reading %s failed", work.sources)
                outcome["error"] = exc

        thread = threading.Thread(target=target, name=f"read-{session.hash[:8]}", daemon=True)
        thread.start()
        try:
            while thread.is_alive():
                thread.join(POLL_S)
                yield self.view(session)
        finally:
            if thread.is_alive():  # the client went away mid-read: stop reading, and do not block the queue
                work.cancel.set()
                outcome = {"cancelled": True}
            stats.reading = ""
            self._finish(session, work, names, placeholders, outcome)

    def _finish(self, session: Session, work: Work, names: list[str], placeholders: list[DocumentRow],
                     outcome: dict) -> None:
        work.stage = "read"
        if work not in session.pending:  # "New context" discarded this action while it was being read
            return
        if "corpus" in outcome:
            work.corpus = outcome["corpus"]
            rows = [row_from_report(r) for r in work.corpus.reports]
            for row in rows:
                if row.status in ("ingested", "partial"):
                    row.outcome, row.status = row.status, "queued"
        elif "cancelled" in outcome:
            rows = [DocumentRow(name, "cancelled", reason="stopped while reading; nothing was added")
                    for name in names]
        else:
            rows = [DocumentRow(name, "error", reason=f"could not be read: {outcome.get('error')}") for name in names]
        replace_rows(session.documents, placeholders, rows)
        work.rows = rows
        if work.status_item is not None:
            ready = sum(1 for r in rows if r.status == "queued")
            read = f"Read {views.plural(len(names), 'upload')}: {views.plural(ready, 'file')} to add"
            work.status_item.title = "■ Reading stopped: nothing was added" if "cancelled" in outcome else read
            work.status_item.text = "\n".join(f"{r.path}: {views.status_line(r)}" for r in rows)
