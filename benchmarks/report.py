"""Splicing benchmark results into README.md between markers.

The tables themselves are written by ingest.tables.markdown_table and sizes
by ingest.units, like every other table and size in the project.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def splice_readme(readme: Path, name: str, body: str) -> None:
    """Replace the text between ``<!-- name:begin -->`` and ``<!-- name:end -->`` in ``readme``, or in the page under
    ``docs/`` beside it that holds those markers (README is a front door: depth lives under docs/); appended to
    ``readme`` when no page has them."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    for page in (readme, *sorted((readme.parent / "docs").glob("*.md"))):
        text = page.read_text()
        if begin in text and end in text:
            page.write_text(re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S))
            return
    readme.write_text(readme.read_text().rstrip() + "\n\n" + block + "\n")


def publish(name: str, data, text: str, *, readme: bool, out: Path = RESULTS) -> None:
    """A benchmark's outcome: ``<name>.json`` (the numbers) and ``<name>.md`` (``text``) under ``out``, printed,
    and with ``readme`` spliced into README.md between ``<!-- name:begin/end -->``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / f"{name}.md").write_text(text.strip() + "\n")
    print(text)
    if readme:
        splice_readme(ROOT / "README.md", name, text)
