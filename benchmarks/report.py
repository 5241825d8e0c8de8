"""Markdown tables for benchmark results, and splicing them into README.md between markers."""

from __future__ import annotations

import re
from pathlib import Path


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


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


def mib(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:,.1f}"
