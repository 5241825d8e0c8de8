"""Tables as text, written in one place: Markdown for files, aligned columns for a terminal.

markdown_table() writes the pipe tables of chat exports and of benchmark
results spliced into docs/benchmarks.md; text_table() the per-file report of
`python -m ingest`.  Cells arrive as finished strings (or numbers): making
them safe to print (ingest.visible) or human-sized (ingest.units) is the
caller's part, laying them out is this module's.
"""

from __future__ import annotations

from typing import Iterable, Sequence


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub pipe table; a '|' inside a cell is escaped so that it cannot open a new column."""
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(rows: Sequence[Sequence[str]], align: str, widest: int = 60) -> str:
    """Columns two spaces apart, padded to their longest cell: `align` has '<' (left) or '>' (right) per column.

    The last column is never padded (its letter is ignored) and no column
    beyond `widest` characters: one long path overflows its own line
    instead of pushing every row to the right.
    """
    widths = [min(widest, max(len(row[i]) for row in rows)) for i in range(len(align) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(w) if a == "<" else cell.rjust(w) for cell, w, a in zip(row, widths, align)]
        lines.append("  ".join(cells + [row[-1]]).rstrip())
    return "\n".join(lines)
