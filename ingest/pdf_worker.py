"""Child-process side of PDF extraction (the only module that imports PyMuPDF).

PyMuPDF is not thread-safe and MuPDF can hang or crash on hostile files, so
extraction runs here, in a separate process the parent can kill.  The worker
streams one message per page so that the parent keeps the pages it got when
it has to kill a stuck worker, and can check its cancel flag between pages.

Messages are JSON (never pickle) in both directions, so a worker that a
hostile PDF has compromised cannot make the parent execute anything.
Request: a JSON header {"password", "options"} followed by the PDF bytes.
Messages sent to the parent, as JSON arrays:
  ["meta", {...}]                          after the document opened
  ["outline", [[level, title, page], ...]] its bookmarks (empty when it has none or they cannot be read)
  ["page", index, label, text, has_images] one per page read
  ["page_error", index, message]           a page MuPDF could not read
  ["end", {"warnings": str}]               document done
  ["fail", kind, message]                  kind: corrupt | needs_password | wrong_password | crash
"""

from __future__ import annotations

import json
import os
import re
import time

from .outline import MAX_OUTLINE_ENTRIES, clean_title
from .pdf_labels import decode_pdf_string, page_labels

_HYPHEN_BREAK = re.compile(r"(\w)-\n(\w)")


def dehyphenate(text: str) -> str:
    """Join words hyphenated across a line break ('exam-\\nple' -> 'example').

    Only when the next line continues in lower case, so 'ISO-\\n9001' and list
    dashes survive.  MuPDF's own TEXT_DEHYPHENATE flag is also set, this
    catches what it leaves.
    """

    def join(m: re.Match) -> str:
        before, after = m.group(1), m.group(2)
        if before.isalpha() and after.islower():
            return before + after
        return m.group(0)

    return _HYPHEN_BREAK.sub(join, text)


def _page_text(pymupdf, page) -> str:
    """Text blocks in reading (content-stream) order, paragraphs separated by a blank line."""
    flags = pymupdf.TEXTFLAGS_TEXT | pymupdf.TEXT_DEHYPHENATE
    blocks = page.get_text("blocks", flags=flags)
    paragraphs = []
    for block in blocks:
        if block[6] != 0:  # image block
            continue
        text = block[4].strip()
        if text:
            paragraphs.append(text)
    return dehyphenate("\n\n".join(paragraphs))


def _labels(doc, page_count: int) -> list[str] | None:
    """Every page's label, decoded ('' without /PageLabels); None to fall back to Page.get_label().

    PyMuPDF's own label parser returns raw PDF strings ('<FEFF0031>' for
    '1'), so the rules are read with Document._get_page_labels() and
    formatted by ingest.pdf_labels.
    """
    try:
        rules = doc._get_page_labels()
    except Exception:  # noqa: BLE001 - private API or a broken /PageLabels tree
        rules = None
    if rules is None:
        try:
            return None if doc.get_page_labels() else [""] * page_count
        except Exception:  # noqa: BLE001
            return [""] * page_count
    try:
        return page_labels(list(rules), page_count)
    except Exception:  # noqa: BLE001 - a malformed rule must not cost the pages
        return None


def _send(conn, *message) -> None:
    conn.send_bytes(json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def _extract(conn, pymupdf, data: bytes, password: str | None, options: dict) -> None:
    doc = _open(conn, pymupdf, data)
    if doc is None:
        return
    with doc:
        if not _unlock(conn, doc, password):
            return
        page_count = doc.page_count
        repaired = bool(doc.is_repaired)
        labels = _labels(doc, page_count)
        _send(conn, "meta", {"page_count": page_count, "repaired": repaired,
                             "encrypted": bool(doc.is_encrypted or password)})
        _send(conn, "outline", _outline(doc))
        delay = float(options.get("debug_delay_s", 0))  # tests simulate a hanging PDF
        for index in range(min(page_count, int(options.get("max_pages", page_count)))):
            _simulate_trouble(options, index, delay)
            _send_page(conn, pymupdf, doc, index, repaired, labels)
        warnings = pymupdf.TOOLS.mupdf_warnings(reset=True)
        _send(conn, "end", {"warnings": warnings[-2000:]})


def _outline(doc) -> list:
    """The bookmarks as [level, title, page] (1-based page, -1 when it points nowhere), at most
    MAX_OUTLINE_ENTRIES, titles cut short: an outline that cannot be read costs the headings, not the document."""
    try:
        entries = doc.get_toc(simple=True)[:MAX_OUTLINE_ENTRIES]
    except Exception:  # noqa: BLE001 - MuPDF raises several types for a broken outline
        return []
    return [[int(level), clean_title(str(title)), int(page)] for level, title, page in entries]


def _open(conn, pymupdf, data: bytes):
    """The opened document, or None after telling the parent the file is corrupt."""
    try:
        return pymupdf.open(stream=data, filetype="pdf")
    except Exception as exc:  # noqa: BLE001 - MuPDF raises several types for bad files
        _send(conn, "fail", "corrupt", str(exc) or type(exc).__name__)
        return None


def _unlock(conn, doc, password: str | None) -> bool:
    """True when the document can be read; otherwise the parent is told which password problem stops it."""
    if not doc.needs_pass:
        return True
    if not password:
        _send(conn, "fail", "needs_password", "PDF is encrypted")
        return False
    if not doc.authenticate(password):
        _send(conn, "fail", "wrong_password", "wrong password")
        return False
    return True


def _simulate_trouble(options: dict, index: int, delay: float) -> None:
    """Test hooks: a slow page (a hanging PDF) and a hard exit at one page (a MuPDF crash)."""
    if delay:
        time.sleep(delay)
    if options.get("debug_crash_at") == index:
        os._exit(70)


def _send_page(conn, pymupdf, doc, index: int, repaired: bool, labels: list[str] | None) -> None:
    """One 'page' message, or a 'page_error' when MuPDF cannot read the page."""
    try:
        page = doc.load_page(index)
        if repaired:  # a page whose object did not survive the repair reads as blank
            doc.xref_object(page.xref)
        text = _page_text(pymupdf, page)
        has_images = not text and bool(page.get_images(full=False))
    except Exception as exc:  # noqa: BLE001
        _send(conn, "page_error", index, str(exc) or type(exc).__name__)
        return
    _send(conn, "page", index, _page_label(page, index, labels), text, has_images)


def _page_label(page, index: int, labels: list[str] | None) -> str:
    """The decoded label, from `labels` when read, else from PyMuPDF; '' when it cannot be read."""
    try:
        return labels[index] if labels is not None else decode_pdf_string(page.get_label())
    except Exception:  # noqa: BLE001 - a bad label costs the label, not the page
        return ""


def serve(conn, memory_limit: int) -> None:
    """Worker main loop: one extraction request at a time until the pipe closes."""
    if memory_limit:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
        except (ImportError, ValueError, OSError):
            pass
    import pymupdf

    pymupdf.TOOLS.mupdf_display_errors(False)
    pymupdf.TOOLS.mupdf_display_warnings(False)
    while True:
        try:
            header = json.loads(conn.recv_bytes())
            data = conn.recv_bytes()
        except (EOFError, OSError, ValueError):
            return
        try:
            _extract(conn, pymupdf, data, header.get("password"), header.get("options", {}))
        except MemoryError:
            _send(conn, "fail", "crash", f"out of memory (worker limit {memory_limit} bytes)")
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            _send(conn, "fail", "crash", f"{type(exc).__name__}: {exc}")
