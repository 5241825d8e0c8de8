"""Sizes and tables: one writer each, for the ingest CLI, the app and the benchmarks."""

from __future__ import annotations

import pytest

from ingest.tables import markdown_table, text_table
from ingest.units import GiB, KiB, MiB, human_bytes, mib, parse_size


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1023 B"), (KiB, "1.0 KB"), (int(1.5 * MiB), "1.5 MB"),
                                     (200 * MiB, "200.0 MB"), (3 * GiB, "3.0 GB"), (2048 * GiB, "2.0 TB")])
def test_human_bytes_reads_back_with_parse_size(n, text):
    assert human_bytes(n) == text
    assert parse_size(text) == n


def test_parse_size_units_and_refusals():
    assert parse_size("10KiB") == 10 * KiB and parse_size("5000") == 5000 and parse_size(" 2 gb ") == 2 * GiB
    with pytest.raises(ValueError, match="not a size: 'x'"):
        parse_size("x")
    assert mib(3 * MiB + MiB // 2) == "3.5" and mib(2000 * MiB) == "2,000.0"


def test_markdown_table_escapes_pipes():
    table = markdown_table(["File", "Pages"], [["a|b.pdf", 3], ["c.md", ""]])
    assert table.splitlines() == ["| File | Pages |", "| --- | --- |", "| a\\|b.pdf | 3 |", "| c.md |  |"]


def test_text_table_pads_all_but_the_last_column():
    rows = [("STATUS", "N", "PATH", "WHY"), ("ok", "12", "x" * 9, ""), ("skipped", "3", "y", "lock file")]
    assert text_table(rows, align="<><<", widest=7).splitlines() == [  # the long path overflows its column
        "STATUS    N  PATH     WHY", "ok       12  xxxxxxxxx", "skipped   3  y        lock file"]
