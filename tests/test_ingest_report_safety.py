"""The CLI table never prints control characters from names or reasons."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ingest
from ingest.visible import visible
from ingest_fixtures import make_zip

REPO_ROOT = Path(__file__).resolve().parents[1]
EVIL = "clear\x1b[2J\rfake.txt"  # clears the screen, then overwrites the line


def _evil_zip(tmp_path: Path) -> Path:
    return make_zip(tmp_path / "evil.zip", {
        EVIL: "payload\n",
        "ok \x1b[31mred\x1b[0m.txt": "other payload\n",
        "dup.txt": "same\n", "dup\r 2 files: 9 ingested.txt": "same\n",
        "bidi\u202etxt.exe": "x\n",
    })


def test_cli_table_escapes_control_characters(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ingest", str(_evil_zip(tmp_path))], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
    assert "evil.zip/clear\\x1b[2J\\rfake.txt" in out
    assert "evil.zip/ok \\x1b[31mred\\x1b[0m.txt" in out
    assert "evil.zip/bidi\\u202etxt.exe" in out
    # the duplicate's reason names the first copy, escaped too, and nothing fakes a summary line
    assert "evil.zip/dup\\r 2 files: 9 ingested.txt" in out
    assert [line for line in out.splitlines() if " files: " in line and line.endswith("errors")] == [
        "5 files: 3 ingested, 0 partial, 2 skipped, 0 errors"]  # dup and .exe skipped


def test_table_and_headers_escape_but_reports_keep_the_real_name(tmp_path):
    corpus = ingest.ingest([_evil_zip(tmp_path)])
    assert any(r.path == "evil.zip/" + EVIL for r in corpus.reports)  # data keeps the true name
    table = ingest.format_table(corpus)
    assert "\x1b" not in table and "\r" not in table
    assert "### evil.zip/clear\\x1b[2J\\rfake.txt\n" in corpus.text  # the header is one safe line
    assert visible("tab\there\nnl\x00\x7f\x9b") == "tab\\there\\nnl\\x00\\x7f\\x9b"
    assert visible("ordinary name é 日本.txt") == "ordinary name é 日本.txt"
