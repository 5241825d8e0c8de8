"""The recall-kernel benchmark's machinery at a tiny size (Triton under its interpreter here): the four ways time a
steady decode step's recall and pick the same tokens (two through programs of several blocks), and the table says
so, so a GPU's device time is not spent finding out it does not run."""

import json

import pytest

from benchmarks import recall_kernel as benchmark
from lminfinite import recall_kernel


def test_the_four_ways_recall_the_same_tokens_and_the_table_lists_them(tmp_path, monkeypatch):
    if not recall_kernel.runs_on(benchmark.torch.device("cpu")):
        pytest.skip("needs Triton and TRITON_INTERPRET=1 (conftest.py)")
    from lminfinite import recall_triton

    spans, scan = [], recall_triton.scan
    monkeypatch.setattr(recall_triton, "scan", lambda *args: spans.append(args[7]) or scan(*args))
    benchmark.main(["--device", "cpu", "--middle", "200,300", "--heads", "2", "--head-dim", "32", "--window", "16",
                    "--repeats", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "recall_kernel_cpu.json").read_text())
    ways = ["torch", "triton", "triton-span8", "triton-span32"]
    assert set(spans) == {1, 8, 32} and recall_kernel.SPAN == 1  # each way's span, and the library's kept
    assert [(r["middle"], r["kernel"]) for r in saved["results"]] == [(n, way) for n in (200, 300) for way in ways]
    for row in saved["results"]:  # the torch path rounds each product to bfloat16 before it selects
        if row["kernel"] != "torch":
            assert row["differing_heads"] == 0 and row["heads"] == 2 and 0 <= row["logit_gap"] < 0.05
    assert all(row["eager_s"] > 0 and row["graph_s"] is None for row in saved["results"])
    table = (tmp_path / "recall_kernel_cpu.md").read_text()
    assert "| 300 | triton |" in table and "| 300 | triton-span32 |" in table and "0/2 heads" in table
    spans = [(r["step"], r["rows"], r["kernel"]) for r in saved["window_spans"]]  # the window's kernels beside it
    assert spans == [("steady, with top-k", 26, "cpu-flash"), ("steady, with top-k", 26, "float32"),
                     ("steady, without top-k", 26, "sdpa")] + [
                        (f"filling, {used} rows in use", 16, "sdpa") for used in (2, 8, 15)]
    assert all(r["error"] < 0.02 and r["eager_s"] > 0 for r in saved["window_spans"])  # bfloat16 outputs
    assert "| filling, 8 rows in use | 16 | sdpa |" in table


def test_a_window_kernel_that_fails_is_a_row_saying_so_and_the_tables_are_still_written(tmp_path, monkeypatch):
    from lminfinite import filling

    def fails(*args):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setitem(filling.FILLING_KERNELS, "sdpa", fails)
    benchmark.main(["--device", "cpu", "--middle", "200", "--heads", "2", "--head-dim", "32", "--window", "16",
                    "--repeats", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "recall_kernel_cpu.json").read_text())
    failed = [r for r in saved["window_spans"] if r["failed"]]
    assert [r["step"] for r in failed] == [f"filling, {used} rows in use" for used in (2, 8, 15)]
    assert all("no kernel image" in r["failed"] and r["eager_s"] is None for r in failed)
    assert all(r["error"] < 0.02 for r in saved["window_spans"] if not r["failed"]) and saved["results"]
    assert "| failed (RuntimeError: no kernel image" in (tmp_path / "recall_kernel_cpu.md").read_text()
