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
<pre> keeps its whitespace, and entities are decoded.  Markup still open
at the end of the file (a tag, comment or declaration never closed) shows
nothing, as in browsers.
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


# Languages whose line comments are not '#': the cell markers must read as comments.
_LINE_COMMENTS = (
    ("//", ("js", "ts", "java", "cpp", "rust", "go", "kotlin", "csharp", "scala")),
    ("--", ("haskell", "lua")),
)
_READ_CELL_KINDS = ("code", "markdown", "raw", "heading")  # others (unknown types) are skipped


def _line_comment(language: str) -> str:
    for marker, languages in _LINE_COMMENTS:
        if language in languages:
            return marker
    return "#"


def _parse_notebook(text: str) -> dict | None:
    """The notebook's JSON object, or None when `text` is not a JSON object."""
    try:
        nb = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return nb if isinstance(nb, dict) else None


def _notebook_cells(nb: dict) -> list | None:
    """The cell list: 'cells' (nbformat 4), else every worksheet's cells (nbformat 3); None when there is no
    list of cells where the format puts one (the file is then read as plain text)."""
    cells = nb.get("cells")
    if cells is None and isinstance(nb.get("worksheets"), list):  # nbformat 3
        sheets = nb["worksheets"]
        if not all(isinstance(ws, dict) and isinstance(ws.get("cells"), list) for ws in sheets):
            return None
        cells = [cell for ws in sheets for cell in ws["cells"]]
    return cells if isinstance(cells, list) else None


def _cell_kind(cell) -> str | None:
    """The cell's type when its source is read, else None (not a cell, or a type we do not know)."""
    if not isinstance(cell, dict):
        return None
    kind = cell.get("cell_type")
    return kind if kind in _READ_CELL_KINDS else None


def _output_count(cell: dict, kind: str) -> int:
    """Outputs of a code cell, which are left out but counted for the report."""
    return len(cell["outputs"]) if kind == "code" and isinstance(cell.get("outputs"), list) else 0


def _cell_text(cell: dict, kind: str, number: int, comment: str) -> str | None:
    """A marker line ('# %% [code] cell 3') and the cell's source; None for a blank cell."""
    source = _cell_source(cell, "input" if kind == "code" and "input" in cell else "source")  # nbformat 3 code
    if not source.strip():
        return None
    label = "markdown" if kind == "heading" else kind
    return f"{comment} %% [{label}] cell {number}\n{source.rstrip()}\n"


def notebook_to_text(text: str) -> Converted | None:
    """Cells of a notebook as text, or None when `text` is not a notebook."""
    nb = _parse_notebook(text)
    if nb is None:
        return None
    cells = _notebook_cells(nb)
    if cells is None:
        return None
    language = _NOTEBOOK_LANGUAGES.get(_notebook_language(nb), "text")
    comment = _line_comment(language)
    parts: list[str] = []
    outputs = 0
    for number, cell in enumerate(cells, 1):
        kind = _cell_kind(cell)
        if kind is None:
            continue
        outputs += _output_count(cell, kind)
        part = _cell_text(cell, kind, number, comment)
        if part is not None:
            parts.append(part)
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


def _is_heading(tag: str) -> bool:
    return tag[0] == "h" and tag[1:].isdigit()


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
        if self._hidden_start(tag):
            return
        if tag == "br":
            self._line_break()
            return
        if tag in _BLOCK:
            self.flush(blank=tag in ("p", "pre", "table", "blockquote") or _is_heading(tag))
        opener = self._OPENERS.get(tag)
        if opener is not None:
            opener(self, tag, attrs)

    def _hidden_start(self, tag: str) -> bool:
        """True when `tag` shows nothing: inside a dropped element or the title, or opening one of them."""
        if self.drop_tag:
            if tag == self.drop_tag[-1] and tag not in _VOID:  # the same element nested: count it
                self.drop_tag.append(tag)
            return True
        if tag == "title":
            self.in_title = True
            return True
        if self.in_title:
            return True
        if tag in _DROP:
            self.drop_tag.append(tag)
            return True
        return False

    def _line_break(self) -> None:
        """<br>: a newline inside <pre>, a new line elsewhere."""
        if self.pre:
            self.current.append("\n")
        else:
            self.flush()

    def _open_list(self, tag: str, attrs) -> None:
        self.list_depth += 1

    def _open_item(self, tag: str, attrs) -> None:
        self.current.append("  " * max(0, self.list_depth - 1) + "- ")

    def _open_heading(self, tag: str, attrs) -> None:
        self.current.append("#" * int(tag[1]) + " ")

    def _open_pre(self, tag: str, attrs) -> None:
        self.pre += 1

    def _open_cell(self, tag: str, attrs) -> None:
        if self.current:  # not the row's first cell
            self.current.append(" | ")

    def _open_image(self, tag: str, attrs) -> None:
        alt = dict(attrs).get("alt")
        if alt:
            self.current.append(f"[image: {alt}]")

    # What an opening tag writes once any line break is made (tags not listed write nothing).
    _OPENERS = {"ul": _open_list, "ol": _open_list, "li": _open_item, "pre": _open_pre, "td": _open_cell,
                "th": _open_cell, "img": _open_image,
                **dict.fromkeys(("h1", "h2", "h3", "h4", "h5", "h6"), _open_heading)}

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
            self.flush(blank=tag in ("p", "table", "blockquote") or _is_heading(tag))

    def parse_marked_section(self, i: int, report: int = 1) -> int:
        """``<![`` with a keyword html.parser does not know (``<![foo``) is a bogus comment up to the next '>',
        as browsers read it; html.parser raises instead, and the rest of the page would be lost."""
        try:
            return super().parse_marked_section(i, report)
        except AssertionError:
            end = self.rawdata.find(">", i + 3)
            return -1 if end < 0 else end + 1

    def finish(self) -> None:
        """End the input as browsers do: a tag, comment or declaration still open at the end runs to the end
        and shows nothing.  (close() alone reads its '<' as text and retries at every later '<', each time
        scanning to the end: quadratic, 80 KB of '<a ' took 55 s.)"""
        if len(self.rawdata) > 1 and self.rawdata.startswith("<"):  # what feed() could not finish
            self.rawdata = ""
        self.close()

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
        parser.finish()
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
