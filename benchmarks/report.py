"""Splicing benchmark results into README.md between markers.

The tables themselves are written by ingest.tables.markdown_table and sizes
by ingest.units, like every other table and size in the project.
"""

from __future__ import annotations

import re
from pathlib import Path


def splice_readme(readme: Path, name: str, body: str) -> None:
    """Replace the text between ``<!-- name:begin -->`` and ``<!-- name:end -->`` (appending them if absent)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = readme.read_text()
    block = f"{begin}\n{body.strip()}\n{end}"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    readme.write_text(text)

