"""Human and JSON views of a Corpus's per-file reports (CLI, app, debugging).

Names and reasons come from uploads and archive entries, so the table
escapes control characters (ANSI sequences, carriage returns, bidi
overrides) before printing them: a hostile entry name cannot clear the
terminal or fake a status line.
"""

from __future__ import annotations

from dataclasses import asdict

from .corpus import Corpus
from .kv_memory import LLAMA2_7B_DIMS
from .tables import text_table
from .units import human_bytes
from .visible import visible

# LM-Infinite defaults for Llama-2: 10 starting tokens + the 4k pretraining window.
CLI_WINDOW = 4096
CLI_STARTING = 10

ESTIMATE_NOTE = ("(est.) token counts are estimates (a Llama-2-style heuristic, typically within 25%); "
                 "the app counts with its model's tokenizer. Pass --tokenizer NAME_OR_FOLDER for exact counts.")


def _kv_line(corpus: Corpus) -> str:
    kv = corpus.estimate_kv_bytes(**LLAMA2_7B_DIMS, window=CLI_WINDOW, n_starting=CLI_STARTING)
    basis = "" if corpus.tokens_exact else ", from estimated token counts"
    return (f"KV cache, Llama-2-7B estimate (fp16{basis}): vanilla {human_bytes(kv['full_bytes'])}, "
            f"LM-Infinite {CLI_STARTING}+{CLI_WINDOW} window {human_bytes(kv['lminfinite_bytes'])}")


def summary_lines(corpus: Corpus, tokenizer_name: str | None = None) -> list[str]:
    t = corpus.totals()
    if t["tokens_exact"]:
        kind = f"tokens (counted with {visible(tokenizer_name)})" if tokenizer_name else "tokens"
    else:
        kind = "tokens (estimated)"
    return [
        f"{t['files']} files: {t['ingested']} ingested, {t['partial']} partial, {t['skipped']} skipped, "
        f"{t['error']} errors",
        f"{t['pages']} pages, {t['chars']:,} characters, {t['tokens']:,} {kind}, {t['chunks']} chunks, "
        f"{human_bytes(t['bytes'])} read",
        _kv_line(corpus),
    ]


def format_table(corpus: Corpus, tokenizer_name: str | None = None) -> str:
    """One line per file (status, pages, tokens, size, language, path, reason) and totals.

    Without a tokenizer the TOKENS column is headed 'TOKENS (est.)' and a
    footnote says the counts are estimates.  Paths and reasons are printed
    through visible() (control characters escaped).
    """
    tokens_head = "TOKENS" if corpus.tokens_exact else "TOKENS (est.)"
    rows = [("STATUS", "PAGES", tokens_head, "SIZE", "LANG", "PATH", "REASON")]
    rows += [(visible(r.status), str(r.pages) if r.pages else "-", f"{r.tokens:,}" if r.tokens else "-",
              human_bytes(r.bytes) if r.bytes else "-", visible(r.language or "-"), visible(r.path),
              visible(r.reason)) for r in corpus.reports]
    lines = [text_table(rows, align="<>>><<<"), "", *summary_lines(corpus, tokenizer_name)]
    if not corpus.tokens_exact:
        lines.append(ESTIMATE_NOTE)
    return "\n".join(lines)


def to_json(corpus: Corpus, tokenizer_name: str | None = None) -> dict:
    """Reports and totals as plain JSON-serialisable data.

    totals.tokens_exact says whether counts are estimates; kv_cache_llama2_7b
    is a Llama-2-7B estimate (fp16, LM-Infinite 10 + 4096 window).
    """
    kv = corpus.estimate_kv_bytes(**LLAMA2_7B_DIMS, window=CLI_WINDOW, n_starting=CLI_STARTING)
    return {"reports": [asdict(r) for r in corpus.reports], "totals": corpus.totals(),
            "token_counts": f"exact ({tokenizer_name})" if corpus.tokens_exact and tokenizer_name
            else "exact" if corpus.tokens_exact else "estimated",
            "kv_cache_llama2_7b": {**kv, "model": "Llama-2-7B", "estimate": True, "dtype_bytes": 2,
                                   "window": CLI_WINDOW, "n_starting": CLI_STARTING}}
