"""The reading step: ingest parses an action's files off the model queue, with live progress.

ingest.ingest blocks, so it runs in a thread while the generator shows its progress every quarter second;
if the browser goes away mid-read, the action is cancelled and marked read so it never blocks the queue.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

import ingest
from ingest import IngestCancelled
from ingest.git_url import looks_like_url

from ..cli import AppConfig
from ..engine.runtime import ModelRuntime
from .uploads import (DocumentRow, RowStatus, limits_for, plural, progress_line, read_sources, row_from_report,
                        rows_summary)
from .source_files import keep_uploads
from .state import Session, Stage, Work

log = logging.getLogger(__name__)
POLL_S = 0.25
CANCEL_GRACE_S = 0.75  # after Stop, the reading thread has this long to notice; then the step ends without it
BYTES_PER_TOKEN_MAX = 8  # a token of text covers at most ~8 bytes: bytes / 8 is a lower estimate of its tokens


class CancellableTokenizer:
    """The ingest tokenizer, checking the cancel flag before every encode.

    ingest checks its flag between files, pages and chunks, but splitting one large text measures many
    pieces with the tokenizer before its first chunk exists; this makes Stop land within one encode.
    """

    def __init__(self, tokenizer, cancel):
        self._tokenizer = tokenizer
        self._cancel = cancel

    def encode(self, text, *args, **kwargs):
        if self._cancel.is_set():
            raise IngestCancelled()
        return self._tokenizer.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def lower_token_estimate(source: str, limits) -> int | None:
    """At least about this many tokens would ``source``'s text files add (from sizes only, nothing read);
    None when it cannot be told (a git URL, PDFs only count 0 here: their bytes say little about text)."""
    if looks_like_url(source):
        return None
    try:
        items = ingest.plan([source], limits=limits, allow_urls=False)
    except Exception:  # noqa: BLE001 - ingest itself will report what is wrong with the source
        log.debug("planning %s failed", source, exc_info=True)
        return None
    return sum(item.bytes // BYTES_PER_TOKEN_MAX for item in text_items(items))


def text_items(items):
    """Plan items that will be read as text (not skipped, not PDFs, whose bound is a heuristic)."""
    return [i for i in items if i.tokens_upper and not i.note.startswith("PDF")]


@dataclass
class ReadOutcome:
    """What reading an action's sources came to (a corpus, Stop, or an error), and the sources refused unread."""

    corpus: object = None  # ingest.Corpus, once read whole
    cancelled: bool = False  # Stop, or the client went away
    error: Exception | None = None
    refused: dict[str, DocumentRow] = field(default_factory=dict)  # by source: too big to fit (Reader._screen)


class Reader:
    def __init__(self, runtime: ModelRuntime, config: AppConfig):
        self.runtime = runtime
        self.config = config
        self._orphan: threading.Thread | None = None  # a stopped reading thread that has not ended yet

    def _screen(self, session: Session, work: Work) -> dict[str, DocumentRow]:
        """Refuse, before reading, sources whose text alone cannot fit the session's free budget.

        ``ingest.plan`` sizes a source from stat / archive directories without reading it. Its token bound
        can be 3-4x the real count, so the test here is a lower estimate (bytes / 8 of every file it would
        read as text): only a source that cannot fit even then is refused; the exact count comes after
        reading (documents.fit_budget). Returns the refused rows by source, and drops those sources.
        """
        free = session.room_for_documents
        used_with_recall = free == session.free_tokens and session.recall_kept
        hint = " (a new context reads it without recall)" if used_with_recall else ""
        limits = limits_for(self.config)
        refused: dict[str, DocumentRow] = {}
        for source in list(work.sources):
            lower = lower_token_estimate(source, limits)
            if lower is not None and lower > free:
                name = os.path.basename(source.rstrip("/")) or source
                refused[source] = DocumentRow(name, RowStatus.REFUSED, reason=(
                    f"holds at least about {lower:,} tokens of text, more than the {max(free, 0):,} left in the "
                    f"context budget; not read{hint}"))
                work.sources.remove(source)
        return refused

    def read(self, session: Session, work: Work):
        """Generator: ingest the action's files in a thread, yielding while it reads (the web layer sends each
        tab its own view)."""
        work.reading = True
        names = [os.path.basename(p.rstrip("/")) or p for p in work.sources]
        placeholders = [DocumentRow(name, RowStatus.READING) for name in names]
        session.add_rows(placeholders)
        stats = session.stats
        stats.reading = "starting"
        started = time.monotonic()
        too_big = self._screen(session, work)
        outcome = ReadOutcome(refused=too_big)
        if not work.sources:  # every source was refused from its size alone: nothing to read
            stats.reading = ""
            self._finish(session, work, names, placeholders, outcome)
            return
        tokenizer = CancellableTokenizer(self.runtime.ingest_tokenizer, work.cancel)
        orphan = self._orphan  # a stopped read still winding down: the tokenizer must not serve two threads

        def on_progress(event) -> None:
            rate = event.tokens_done / max(time.monotonic() - started, 1e-6)
            stats.reading = f"{progress_line(event)} · {rate:,.0f} tok/s"
            if work.status_item is not None:
                work.status_item.text = stats.reading

        def target() -> None:
            try:
                if orphan is not None:
                    orphan.join()
                outcome.corpus = read_sources(work.sources, tokenizer=tokenizer,
                                                 config=self.config, cancel=work.cancel, progress=on_progress)
            except IngestCancelled:
                outcome.cancelled = True
            except Exception as exc:  # noqa: BLE001 - shown to the user; the session stays usable
                log.exception("reading %s failed", work.sources)
                outcome.error = exc

        thread = threading.Thread(target=target, name=f"read-{session.workspace_id[:8]}", daemon=True)
        thread.start()
        stopped_at = None
        try:
            while thread.is_alive():
                thread.join(POLL_S)
                if work.cancel.is_set():
                    stopped_at = stopped_at or time.monotonic()
                    if thread.is_alive() and time.monotonic() - stopped_at > CANCEL_GRACE_S:
                        break  # Stop answers now; the thread ends at its next check, its result unused
                yield
        finally:
            if thread.is_alive():  # the client went away mid-read, or Stop: stop reading, do not block the queue
                work.cancel.set()
                self._orphan = thread
                outcome = ReadOutcome(cancelled=True, refused=too_big)
            stats.reading = ""
            self._finish(session, work, names, placeholders, outcome)

    def _finish(self, session: Session, work: Work, names: list[str], placeholders: list[DocumentRow],
                outcome: ReadOutcome) -> None:
        work.stage = Stage.READ
        if work not in session.pending:  # "New context" discarded this action while it was being read
            return
        refused = list(outcome.refused.values())
        read_names = [n for n in names if n not in {r.path for r in refused}]
        if outcome.corpus is not None:
            work.corpus = outcome.corpus
            keep_uploads(session.sources, work.sources, work.corpus.reports)
        rows = refused + rows_after_reading(outcome, read_names)
        session.replace_rows(placeholders, rows)
        work.rows = rows
        if work.status_item is not None:
            ready = sum(1 for r in rows if r.status == RowStatus.QUEUED)
            read = f"Read {plural(len(names), 'upload')}: {plural(ready, 'file')} to add"
            work.status_item.title = "■ Reading stopped: nothing was added" if outcome.cancelled else read
            work.status_item.text = rows_summary(rows)


def rows_after_reading(outcome: ReadOutcome, names: list[str]) -> list[DocumentRow]:
    """The Files table's rows for what reading ``names`` came to: a corpus, Stop, or an error."""
    if outcome.corpus is not None:
        rows = [row_from_report(r) for r in outcome.corpus.reports]
        for row in rows:
            row.wait_for_model()
        return rows
    if outcome.cancelled:
        return [DocumentRow(name, RowStatus.CANCELLED, reason="stopped while reading; nothing was added")
                for name in names]
    if outcome.error is not None:
        return [DocumentRow(name, RowStatus.ERROR, reason=f"could not be read: {outcome.error}")
                for name in names]
    return []
