"""`python -m ingest PATH... [--password P] [--json]`: per-file report and totals.

Exit status 0 even when files were skipped or failed (the report says so);
2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import ingest
from .report import format_table, to_json


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ingest",
                                description="Ingest files, folders, .zip archives and https git URLs; "
                                            "print what was read, skipped or failed, and why.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="file, folder, .zip or https git URL")
    p.add_argument("--password", help="password for encrypted PDFs")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--chunk-tokens", type=int, default=512, help="target chunk size in tokens (default 512)")
    p.add_argument("--tokenizer", help="Hugging Face tokenizer name or folder (needs transformers; "
                                       "default: estimated counts)")
    p.add_argument("--no-urls", action="store_true", help="refuse git URLs")
    return p


def _load_tokenizer(name: str):
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise SystemExit("--tokenizer needs the transformers package")
    return AutoTokenizer.from_pretrained(name)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.chunk_tokens <= 0:
        _parser().error("--chunk-tokens must be positive")
    tokenizer = _load_tokenizer(args.tokenizer) if args.tokenizer else None
    corpus = ingest(args.paths, tokenizer=tokenizer, password=args.password, chunk_tokens=args.chunk_tokens,
                    allow_urls=not args.no_urls)
    if args.json:
        json.dump(to_json(corpus), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_table(corpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
