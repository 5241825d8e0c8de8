"""Human and JSON views of a Corpus's per-file reports (CLI, app, debugging)."""

from __future__ import annotations

from dataclasses import asdict

from .corpus import Corpus
from .kv_memory import LLAMA2_7B_DIMS
from .limits import human_bytes

# LM-Infinite defaults for Llama-2: 10 starting tokens + the 4k pretraining window.
CLI_WINDOW = 4096
CLI_STARTING = 10


def _kv_line(corpus: Corpus) -> str:
    kv = corpus.estimate_kv_bytes(**LLAMA2_7B_DIMS, window=CLI_WINDOW, n_starting=CLI_STARTING)
    return (f"KV cache (Llama-2-7B, fp16): vanilla {human_bytes(kv['full_bytes'])}, "
            f"LM-Infinite {CLI_STARTING}+{CLI_WINDOW} window {human_bytes(kv['lminfinite_bytes'])}")


def summary_lines(corpus: Corpus) -> list[str]:
    t = corpus.totals()
    kind = "tokens" if t["tokens_exact"] else "tokens (estimated)"
    return [
        f"{t['files']} files: {t['ingested']} ingested, {t['partial']} partial, {t['skipped']} skipped, "
        f"{t['error']} errors",
        f"{t['pages']} pages, {t['chars']:,} characters, {t['tokens']:,} {kind}, {t['chunks']} chunks, "
        f"{human_bytes(t['bytes'])} read",
        _kv_line(corpus),
    ]


def format_table(corpus: Corpus) -> str:
    """One line per file (status, pages, tokens, size, language, path, reason) and totals."""
    rows = [("STATUS", "PAGES", "TOKENS", "SIZE", "LANG", "PATH", "REASON")]
    for r in corpus.reports:
        rows.append((r.status, str(r.pages) if r.pages else "-", f"{r.tokens:,}" if r.tokens else "-",
                     human_bytes(r.bytes) if r.bytes else "-", r.language or "-", r.path, r.reason))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    path_width = min(60, max(len(row[5]) for row in rows))
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].rjust(widths[1]), row[2].rjust(widths[2]),
                 row[3].rjust(widths[3]), row[4].ljust(widths[4]), row[5].ljust(path_width)]
        lines.append("  ".join(cells + [row[6]]).rstrip())
    lines.append("")
    lines.extend(summary_lines(corpus))
    return "\n".join(lines)


def to_json(corpus: Corpus) -> dict:
    """Reports and totals as plain JSON-serialisable data."""
    kv = corpus.estimate_kv_bytes(**LLAMA2_7B_DIMS, window=CLI_WINDOW, n_starting=CLI_STARTING)
    return {"reports": [asdict(r) for r in corpus.reports], "totals": corpus.totals(),
            "kv_cache_llama2_7b": kv}
