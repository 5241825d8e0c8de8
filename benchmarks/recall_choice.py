"""Which recall way the speed table's cells run with, read from the recall benchmark's table of the same GPU call:
``python -m benchmarks.recall_choice benchmarks/results/recall_kernel_gpu.json`` prints recall_kernel's settings
as JSON (``{}``: the library's own), which ``benchmarks.speed --recall-settings`` applies in its workers.

Why. A GPU is lent to few sessions, for minutes. When the recall step finds a way faster than the library's, the
cells of the same call then time a whole decode step with it, so one call says what the change is worth end to end
instead of waiting for the next GPU. The table states the settings it ran with; the library's defaults change only
in a commit, after the numbers are read.

The rule: the way among Triton's (the library's scan, its spans, the batched product) fastest from a CUDA graph at
the middle size nearest 32K (the decode target's); and if PyTorch's operators are not faster from a graph at the
largest size timed, they are used at no size (GRAPHED_OPERATORS_FROM past any store), else from where the library
uses them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.recall_kernel import WAYS

TARGET_MIDDLE = 32768
NEVER = 1 << 40  # rows of a store's buffer no store reaches: PyTorch's operators at no size


def choose(results: list[dict]) -> dict:
    """recall_kernel settings from the recall benchmark's rows: differing from the library's only where its numbers
    say so (module docstring)."""
    timed = [r for r in results if not r.get("failed") and r.get("graph_s")]
    if not timed:
        return {}
    sizes = sorted({r["middle"] for r in timed})
    nearest = min(sizes, key=lambda n: abs(n - TARGET_MIDDLE))
    ways = [r for r in timed if r["middle"] == nearest and r["kernel"] in WAYS]
    if not ways:
        return {}
    fastest = min(ways, key=lambda r: r["graph_s"])
    settings = dict(WAYS[fastest["kernel"]])
    largest = [r for r in timed if r["middle"] == sizes[-1]]
    way_there = next((r for r in largest if r["kernel"] == fastest["kernel"]), None)
    operators_there = next((r for r in largest if r["kernel"] == "torch"), None)
    if way_there is not None and operators_there is not None and way_there["graph_s"] <= operators_there["graph_s"]:
        settings["GRAPHED_OPERATORS_FROM"] = NEVER
    return settings


def main(argv: list[str] | None = None) -> None:
    path = Path((argv if argv is not None else sys.argv[1:])[0])
    print(json.dumps(choose(json.loads(path.read_text())["results"])))


if __name__ == "__main__":
    main()
