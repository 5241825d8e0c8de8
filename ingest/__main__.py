"""`python -m ingest PATH... [--password P] [--json] [--tokenizer NAME_OR_FOLDER] [--plan]`.

Prints one line per file (what was read, skipped or failed, and why) and
totals.  Exit status 0 even when files were skipped or failed (the report
says so); 2 on usage errors or a tokenizer that cannot be loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import ingest, plan
from .report import format_table, to_json
from .visible import visible


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ingest",
        description="Ingest files (PDF, text, Markdown, code, HTML, Jupyter notebooks; also as .gz, .bz2 or "
                    ".xz), folders, archives "
                    "(.zip, .tar, .tar.gz/.tgz, .tar.bz2, .tar.xz) and https git URLs; print what was read, "
                    "skipped or failed, and why.  Archive and folder entries are shown as "
                    "'<archive or folder name>/<path inside>'.",
        epilog="Token counts are estimates (a Llama-2-style heuristic, typically within 25%) unless "
               "--tokenizer is given; the app counts with its model's tokenizer.  The KV-cache line is a "
               "Llama-2-7B estimate (fp16).")
    p.add_argument("paths", nargs="+", metavar="PATH", help="file, folder, archive or https git URL")
    p.add_argument("--password", help="password for encrypted PDFs")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--chunk-tokens", type=int, default=512, help="target chunk size in tokens (default 512)")
    p.add_argument("--tokenizer", metavar="NAME_OR_FOLDER",
                   help="count tokens exactly with this Hugging Face tokenizer: a hub name or a local folder "
                        "(needs transformers; default: estimated counts)")
    p.add_argument("--no-urls", action="store_true", help="refuse git URLs")
    p.add_argument("--plan", action="store_true",
                   help="only list what would be read, with sizes and an upper bound of tokens per file, "
                        "without reading or tokenising anything (see ingest.plan)")
    return p


def _load_tokenizer(name: str):
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise SystemExit("--tokenizer needs the transformers package")
    try:
        if os.path.isdir(os.path.expanduser(name)):
            return AutoTokenizer.from_pretrained(os.path.expanduser(name), local_files_only=True)
        return AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # noqa: BLE001 - OSError, ValueError, hub errors ...
        print(f"python -m ingest: cannot load tokenizer {name!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise SystemExit(2)


def _print_plan(args) -> None:
    items = plan(args.paths, allow_urls=not args.no_urls)
    if args.json:
        json.dump([item._asdict() for item in items], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    rows = [("BYTES", "TOKENS (max)", "PATH", "NOTE")]
    for item in items:
        rows.append((f"{item.bytes:,}", "?" if item.tokens_upper is None else f"{item.tokens_upper:,}",
                     visible(item.path), visible(item.note)))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join([r[0].rjust(widths[0]), r[1].rjust(widths[1]), r[2].ljust(min(60, widths[2])), r[3]])
              .rstrip())
    known = [i.tokens_upper for i in items if i.tokens_upper is not None]
    print(f"\nat most {sum(known):,} tokens from {len(items)} files"
          + (" (plus sources of unknown size)" if len(known) < len(items) else "")
          + "; an upper bound from sizes, nothing was read")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.chunk_tokens <= 0:
        _parser().error("--chunk-tokens must be positive")
    if args.plan:
        _print_plan(args)
        return 0
    tokenizer = _load_tokenizer(args.tokenizer) if args.tokenizer else None
    corpus = ingest(args.paths, tokenizer=tokenizer, password=args.password, chunk_tokens=args.chunk_tokens,
                    allow_urls=not args.no_urls)
    if args.json:
        json.dump(to_json(corpus, args.tokenizer), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_table(corpus, args.tokenizer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
