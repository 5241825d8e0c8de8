"""A text or code file as a page with an anchor on every line, so that a citation of lines 40-88 opens the file at line
40 with that line marked (``#L40``); plain text has no line anchors (issue "What a user sees", item 11).

The page is written by us from the file's text, every character escaped, and forbids scripts and every outside
resource in its own Content-Security-Policy: whatever the file holds shows as text. Lines are numbered as ingest
numbers them (the same decoding, ``\\r\\n`` and ``\\r`` read as line ends), so a citation's lines are the page's.
"""

from __future__ import annotations

import html

from ingest.text import decode_text

SUFFIX = ".html"
MAX_BYTES = 8 * 1024 * 1024  # larger files are linked as plain text: the page would be several times their size

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ margin: 0; font: 13px/1.5 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; color: #1f2328; }}
h1 {{ font: 600 14px/1.4 system-ui, sans-serif; margin: 0; padding: 8px 12px; background: #f6f8fa;
      border-bottom: 1px solid #d0d7de; position: sticky; top: 0; }}
ol {{ margin: 0; padding: 4px 12px 4px 5.5em; }}
li {{ white-space: pre-wrap; overflow-wrap: anywhere; scroll-margin-top: 40vh; }}
li::marker {{ color: #8c959f; }}
li:target {{ background: #fff8c5; outline: 1px solid #d4a72c; }}
</style></head>
<body><h1>{title}</h1>
<ol>
{lines}</ol>
</body></html>
"""


def line_page(title: str, data: bytes) -> str:
    """The page for a file named ``title`` holding ``data``: each line an item ``L<n>``, 1-based."""
    text = decode_text(data, max_line_chars=0).text
    lines = text.split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()  # the file's last line end opens no line
    items = "".join(f'<li id="L{n}">{html.escape(line) or " "}</li>\n' for n, line in enumerate(lines, 1))
    return _PAGE.format(title=html.escape(title), lines=items)


def line_anchor(line: int | None) -> str:
    return f"#L{line}" if line else ""
