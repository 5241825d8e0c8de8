"""The recall-kernel benchmark's machinery at a tiny size (Triton under its interpreter here): the five ways time a
steady decode step's recall and pick the same tokens (two through programs of several blocks, one through a product
and a selection), and the table says so, so a GPU's device time is not spent finding out it does not run."""

import json

import pytest

from benchmarks import recall_kernel as benchmark
from lminfinite import recall_kernel


def needs_triton():
    if not recall_kernel.runs_on(benchmark.torch.device("cpu")):
        pytest.skip("needs Triton and TRITON_INTERPRET=1 (conftest.py)")


def test_the_five_ways_recall_the_same_tokens_and_the_table_lists_them(tmp_path, monkeypatch):
    needs_triton()
    from lminfinite import recall_triton

    spans, scan, select = [], recall_triton.scan, recall_triton.select
    monkeypatch.setattr(recall_triton, "scan", lambda *args: spans.append(args[7]) or scan(*args))
    monkeypatch.setattr(recall_triton, "select", lambda *args: spans.append("select") or select(*args))
    benchmark.main(["--device", "cpu", "--middle", "200,300", "--heads", "2", "--head-dim", "32", "--window", "16",
                    "--repeats", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "recall_kernel_cpu.json").read_text())
    ways = ["torch", "triton", "triton-span8", "triton-span32", "products"]
    # each way's span or selection, and the library's settings kept
    assert set(spans) == {1, 8, 32, "select"} and (recall_kernel.SPAN, recall_kernel.SCORES) == (1, "kernel")
    assert [(r["middle"], r["kernel"]) for r in saved["results"]] == [(n, way) for n in (200, 300) for way in ways]
    for row in saved["results"]:  # the torch path rounds each product to bfloat16 before it selects
        if row["kernel"] != "torch":
            assert row["differing_heads"] == 0 and row["heads"] == 2 and 0 <= row["logit_gap"] < 0.05
    assert all(row["eager_s"] > 0 and row["graph_s"] is None for row in saved["results"])
    table = (tmp_path / "recall_kernel_cpu.md").read_text()
    assert "| 300 | triton |" in table and "| 300 | products |" in table and "0/2 heads" in table
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


def test_a_recall_way_that_fails_is_a_row_saying_so_and_the_others_are_timed(tmp_path, monkeypatch):
    """A build whose batched product cannot write float32 (bmm's out_dtype), say: the products way is a row that
    says so, and the library's settings are as they were."""
    needs_triton()

    def fails(*args):
        raise RuntimeError("Could not run 'aten::bmm.dtype' with arguments from the 'CUDA' backend")

    monkeypatch.setattr(recall_kernel, "products", fails)
    benchmark.main(["--device", "cpu", "--middle", "200", "--heads", "2", "--head-dim", "32", "--window", "16",
                    "--repeats", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "recall_kernel_cpu.json").read_text())
    failed = [r for r in saved["results"] if r.get("failed")]
    assert [r["kernel"] for r in failed] == ["products"] and "aten::bmm.dtype" in failed[0]["failed"]
    assert all(r["eager_s"] > 0 for r in saved["results"] if r["kernel"] != "products")
    assert recall_kernel.SCORES == "kernel"
    assert "| 200 | products | failed (RuntimeError: Could not run" in (tmp_path / "recall_kernel_cpu.md").read_text()
