"""Fixture builders for the ingest tests: PDFs, zips, repositories, a tokenizer.

Everything is generated on the fly in temporary folders; nothing is
downloaded.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pymupdf


def make_pdf(path: Path, pages: list[str | None], *, labels: list[dict] | None = None,
             user_pw: str | None = None, scanned: set[int] = frozenset(), toc: list | None = None) -> Path:
    """Write a PDF with one page per entry (None -> blank page).

    Text is written line by line so the extracted text is predictable;
    pages in `scanned` get only an image (no text layer); `toc`: bookmarks
    as [level, title, 1-based page] (PyMuPDF's set_toc).
    """
    doc = pymupdf.open()
    for index, text in enumerate(pages):
        page = doc.new_page(width=595, height=842)
        if index in scanned:
            pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 64, 64), 0)
            pix.clear_with(200)
            page.insert_image(pymupdf.Rect(72, 72, 400, 400), pixmap=pix)
            continue
        if text:
            y = 72
            for line in text.split("\n"):
                page.insert_text((72, y), line, fontsize=10)
                y += 14
    if labels:
        doc.set_page_labels(labels)
    if toc:
        doc.set_toc(toc)
    kwargs = {}
    if user_pw:
        kwargs = dict(encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw=user_pw, owner_pw=user_pw + "-owner")
    path.write_bytes(doc.tobytes(garbage=0, deflate=False, **kwargs))
    doc.close()
    return path


def page_text(n: int, words: int = 40) -> str:
    """Distinct, recognisable page content: 'p7w0 p7w1 ...' on short lines."""
    tokens = [f"p{n}w{i}" for i in range(words)]
    return "\n".join(" ".join(tokens[i:i + 8]) for i in range(0, len(tokens), 8))


def make_zip(path: Path, entries: dict[str, bytes | str], *, compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


def write_tree(root: Path, files: dict[str, bytes | str]) -> Path:
    """Create files (and parent folders) under root from {relative path: content}."""
    for rel, content in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            target.write_text(content, encoding="utf-8")
        else:
            target.write_bytes(content)
    return root


class WordTokenizer:
    """Deterministic stand-in for a Hugging Face tokenizer: one id per word,
    punctuation mark or newline."""

    _TOKEN = re.compile(r"\w+|[^\w\s]|\n")

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.calls += 1
        ids = [hash(t) % 32000 for t in self._TOKEN.findall(text)]
        return ([1] + ids) if add_special_tokens else ids


class Flag:
    """threading.Event-like flag that sets itself after `after` checks."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.checks = 0

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks > self.after


def report_for(corpus, path: str):
    matches = [r for r in corpus.reports if r.path == path]
    assert len(matches) == 1, f"{path!r} not reported once: {[r.path for r in corpus.reports]}"
    return matches[0]
