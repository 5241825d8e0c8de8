"""Structured text formats turned into readable context text: notebooks and HTML.

Jupyter notebooks (.ipynb) are JSON: their code and Markdown cells become
text with one marker line per cell ('# %% [code] cell 3', the 'percent'
format editors understand), outputs are left out (images, tracebacks and
data dumps only burn context).  Line numbers of a notebook (and of HTML)
refer to the produced text, as it appears in the context after the file's
header, and the cell markers say which cell a line belongs to.

HTML is reduced to readable text with the standard library's html.parser:
script, style, template and similar elements are dropped, block elements
become line breaks, headings become '#' lines and list items '- ' lines,
<pre> keeps its whitespace, and entities are decoded.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

NOTEBOOK_EXTENSIONS = {".ipynb"}
HTML_EXTENSIONS = {".html", ".htm", ".xhtml"}


@dataclass
class Converted:
    """Text produced from a structured file, plus notes for its report."""

    text: str
    language: str  # language of the produced text (splitter and header)
    notes: list[str] = field(default_factory=list)


# -- notebooks ----------------------------------------------------------------------------------
def _cell_source(cell: dict, key: str = "source") -> str:
    source = cell.get(key, "")
    if isinstance(source, list):
        source = "".join(s for s in source if isinstance(s, str))
    return source if isinstance(source, str) else ""


def _notebook_language(nb: dict) -> str:
    meta = nb.get("metadata") if isinstance(nb.get("metadata"), dict) else {}
    for holder, key in ((meta.get("language_info"), "name"), (meta.get("kernelspec"), "language")):
        if isinstance(holder, dict) and isinstance(holder.get(key), str):
            return holder[key].strip().lower()
    return "python"


_NOTEBOOK_LANGUAGES = {"python": "python", "python3": "python", "r": "r", "julia": "julia", "scala": "scala",
                       "javascript": "js", "typescript": "ts", "java": "java", "c++": "cpp", "cpp": "cpp",
                       "rust": "rust", "go": "go", "ruby": "ruby", "kotlin": "kotlin", "csharp": "csharp",
                       "c#": "csharp", "haskell": "haskell", "lua": "lua", "perl": "perl"}


def notebook_to_text(text: str) -> Converted | None:
    """Cells of a notebook as text, or None when `text` is not a notebook."""
    try:
        nb = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(nb, dict):
        return None
    cells = nb.get("cells")
    if cells is None and isinstance(nb.get("worksheets"), list):  # nbformat 3
        cells = [c for ws in nb["worksheets"] if isinstance(ws, dict) for c in ws.get("cells", []) or []]
    if not isinstance(cells, list):
        return None
    language = _NOTEBOOK_LANGUAGES.get(_notebook_language(nb), "text")
    comment = "//" if language in ("js", "ts", "java", "cpp", "rust", "go", "kotlin", "csharp", "scala") else \
        "--" if language in ("haskell", "lua") else "#"
    parts: list[str] = []
    outputs = 0
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict):
            continue
        kind = cell.get("cell_type")
        if kind not in ("code", "markdown", "raw", "heading"):
            continue
        source = _cell_source(cell, "input" if kind == "code" and "input" in cell else "source")
        if kind == "code" and isinstance(cell.get("outputs"), list):
            outputs += len(cell["outputs"])
        if not source.strip():
            continue
        label = "markdown" if kind == "heading" else kind
        parts.append(f"{comment} %% [{label}] cell {number}\n{source.rstrip()}\n")
    notes = [f"cell outputs not read ({outputs})"] if outputs else []
    return Converted(text="\n".join(parts), language=language, notes=notes)


# -- HTML ---------------------------------------------------------------------------------------
_DROP = {"script", "style", "template", "noscript", "svg", "math", "iframe", "object", "canvas", "select"}
_BLOCK = {"p", "div", "section", "article", "main", "header", "footer", "nav", "aside", "blockquote", "figure",
          "figcaption", "table", "thead", "tbody", "tfoot", "tr", "ul", "ol", "dl", "dt", "dd", "form", "fieldset",
          "address", "details", "summary", "hr", "body", "html", "caption", "center", "li", "pre",
          "h1", "h2", "h3", "h4", "h5", "h6", "title"}
_VOID = {"br", "hr", "img", "input", "meta", "link", "area", "base", "col", "embed", "param", "source", "track", "wbr"}
_SPACES = re.compile(r"[ \t\r\n\f\v]+")


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self.current: list[str] = []
        self.drop_depth = 0
        self.drop_tag: list[str] = []
        self.pre = 0
        self.title = ""
        self.in_title = False
        self.list_depth = 0

    def flush(self, blank: bool = False) -> None:
        line = "".join(self.current)
        if not self.pre:
            line = _SPACES.sub(" ", line).strip()
        if line == "-" and not self.pre:  # a list marker waiting for its item's first block
            return
        if line:
            self.lines.append(line)
        self.current = []
        if blank and self.lines and self.lines[-1] != "":
            self.lines.append("")

    def handle_starttag(self, tag: str, attrs) -> None:
        if self.drop_tag:
            if tag == self.drop_tag[-1] and tag not in _VOID:
                self.drop_tag.append(tag)
            return
        if tag == "title":
            self.in_title = True
            return
        if self.in_title:
            return
        if tag in _DROP:
            self.drop_tag.append(tag)
            return
        if tag == "br":
            if self.pre:
                self.current.append("\n")
            else:
                self.flush()
            return
        if tag in _BLOCK:
            self.flush(blank=tag in ("p", "pre", "table", "blockquote") or tag[0] == "h" and tag[1:].isdigit())
        if tag in ("ul", "ol"):
            self.list_depth += 1
        elif tag == "li":
            self.current.append("  " * max(0, self.list_depth - 1) + "- ")
        elif len(tag) == 2 and tag[0] == "h" and tag[1] in "123456":
            self.current.append("#" * int(tag[1]) + " ")
        elif tag == "pre":
            self.pre += 1
        elif tag in ("td", "th") and self.current:
            self.current.append(" | ")
        elif tag == "img":
            alt = dict(attrs).get("alt")
            if alt:
                self.current.append(f"[image: {alt}]")

    def handle_endtag(self, tag: str) -> None:
        if self.drop_tag:
            if tag == self.drop_tag[-1]:
                self.drop_tag.pop()
            return
        if tag == "title":
            self.in_title = False
            return
        if self.in_title:
            return
        if tag == "pre" and self.pre:
            self.flush(blank=True)
            self.pre -= 1
            return
        if tag in ("ul", "ol") and self.list_depth:
            self.list_depth -= 1
        if tag in _BLOCK:
            self.flush(blank=tag in ("p", "table", "blockquote") or tag[0] == "h" and tag[1:].isdigit())

    def handle_data(self, data: str) -> None:
        if self.drop_tag:
            return
        if self.in_title:
            self.title += data
            return
        if self.pre:
            lines = data.split("\n")
            self.current.append(lines[0])
            for more in lines[1:]:
                line = "".join(self.current).rstrip()
                if line or (self.lines and self.lines[-1] != ""):
                    self.lines.append(line)
                self.current = [more]
        else:
            self.current.append(data)


def html_to_text(html: str) -> Converted:
    """Readable text of an HTML document (see module docstring)."""
    parser = _TextExtractor()
    try:
        parser.feed(html)
        parser.close()
    except (AssertionError, ValueError):  # html.parser is lenient; be safe anyway
        pass
    parser.flush()
    lines = parser.lines
    title = _SPACES.sub(" ", parser.title).strip()
    if title and (not lines or lines[0].lstrip("# ") != title):
        lines = [f"# {title}", ""] + lines
    while lines and lines[-1] == "":
        lines.pop()
    text = "\n".join(lines)
    return Converted(text=text + "\n" if text else "", language="markdown")


_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)


def html_declared_charset(data: bytes) -> str | None:
    """The charset an HTML file declares in a <meta> tag within its first 4 KB, if any."""
    m = _META_CHARSET.search(data[:4096])
    return m.group(1).decode("ascii").lower() if m else None
