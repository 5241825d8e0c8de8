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
    """Replace the text between ``<!-- name:begin -->`` and ``<!-- name:end -->`` (appending them if absent)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = readme.read_text()
    block = f"{begin}\n{body.strip()}\n{end}"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    readme.write_text(text)



def publish(name: str, data, text: str, *, readme: bool, out: Path = RESULTS) -> None:
    """A benchmark's outcome: ``<name>.json`` (the numbers) and ``<name>.md`` (``text``) under ``out``, printed,
    and with ``readme`` spliced into README.md between ``<!-- name:begin/end -->``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / f"{name}.md").write_text(text.strip() + "\n")
    print(text)
    if readme:
        splice_readme(ROOT / "README.md", name, text)
