"""The Stop benchmark's machinery on the tiny test model: both ways pressed at the same points, each Stop rolled
back, and the report written where it says."""

import re

import torch

from app_fixtures import model_dir
from benchmarks import stop_latency


def test_both_ways_are_pressed_at_each_point_and_every_stop_leaves_the_context_empty(tmp_path):
    threads = torch.get_num_threads()
    try:
        text = stop_latency.main(["--model", str(model_dir()), "--context", "4096", "--threads", "1",
                                  "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / f"stop_latency_{model_dir().name}.md").read_text() == text + "\n"
    rows = [line for line in text.splitlines() if re.match(r"\| \d+\.\d\d s \(\d+% into", line)]
    assert [re.search(r"\((\d+)% into", row).group(1) for row in rows] == ["10", "30", "50", "70", "90"]
    cells = [cell.strip() for row in rows for cell in row.split("|")[2:4]]
    assert all(re.fullmatch(r"\d+\.\d\d s|– \(the feed ended first\)", cell) for cell in cells), cells
    assert "4 decoder layers" in text and "context left" not in text
