"""Splicing benchmark results between markers into the docs pages (README.md is a front door; the tables live
under docs/, new ones in docs/benchmarks.md).

The tables themselves are written by ingest.tables.markdown_table and sizes
by ingest.units, like every other table and size in the project.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NEW_BLOCKS_PAGE = Path("docs") / "benchmarks.md"  # where a block that no page holds yet goes, from the root
_NOT_FROM_ROOT = re.compile(r"[a-z][a-z0-9+.-]*:|#|/|\.\./")  # a URL, an anchor, an absolute or page-relative path


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def pages(readme: Path) -> list[Path]:
    """Where blocks may live: README.md, then the pages under docs/ beside it."""
    return [readme, *sorted((readme.parent / "docs").glob("*.md"))]


def page_holding(readme: Path, name: str) -> Path | None:
    """The page that holds ``name``'s markers, if one does."""
    begin, end = markers(name)
    for page in pages(readme):
        text = page.read_text()
        if begin in text and end in text:
            return page
    return None


def relative_to_page(body: str, page: Path, root: Path) -> str:
    """Benchmarks write their links from the repository's root (``benchmarks/results/speed_cpu.png``); a page
    under docs/ needs them from where it is (``../benchmarks/results/speed_cpu.png``)."""
    def from_page(match: re.Match) -> str:
        target = match.group(1)
        if _NOT_FROM_ROOT.match(target):
            return match.group(0)
        return f"]({Path(os.path.relpath(root / target, page.parent)).as_posix()})"

    return re.sub(r"\]\(([^)\s]+)\)", from_page, body)


def splice_readme(readme: Path, name: str, body: str) -> None:
    """Replace the text between ``<!-- name:begin -->`` and ``<!-- name:end -->`` in whichever of ``readme`` and
    the pages under ``docs/`` beside it holds those markers; a block no page holds yet is appended to
    docs/benchmarks.md (README is a front door: depth lives under docs/). Links in ``body`` are written from the
    repository's root and made relative to the page they land on."""
    begin, end = markers(name)
    page = page_holding(readme, name) or readme.parent / NEW_BLOCKS_PAGE
    text = page.read_text() if page.is_file() else ""
    block = f"{begin}\n{relative_to_page(body, page, readme.parent).strip()}\n{end}"
    if begin in text and end in text:
        page.write_text(re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S))
    else:
        page.write_text((text.rstrip() + "\n\n" if text.strip() else "") + block + "\n")


def add_publish_arguments(parser) -> None:
    """``--out`` and ``--readme``, what :func:`publish` takes from a benchmark's command line."""
    parser.add_argument("--out", type=Path, default=RESULTS, help="where <name>.json and <name>.md go")
    parser.add_argument("--readme", action="store_true", help="splice the table into the docs page that holds it")


def publish(name: str, data, text: str, *, readme: bool, out: Path = RESULTS) -> None:
    """A benchmark's outcome: ``<name>.json`` (the numbers) and ``<name>.md`` (``text``) under ``out``, printed,
    and with ``readme`` spliced between ``<!-- name:begin/end -->`` into the page that holds them
    (docs/benchmarks.md for a new block; see splice_readme)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / f"{name}.md").write_text(text.strip() + "\n")
    print(text)
    if readme:
        splice_readme(ROOT / "README.md", name, text)
