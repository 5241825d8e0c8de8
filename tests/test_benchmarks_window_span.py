"""The window-span benchmark's machinery at a tiny size: every kernel it times agrees with float64, and the
table it writes names them, with the float32 kernel as the 1.00 baseline."""

import json

from benchmarks import window_span


def test_the_kernel_table_lists_each_cpu_kernel_with_its_error_against_float64(tmp_path):
    window_span.main(["--device", "cpu", "--window", "48", "--heads", "4", "--kv-heads", "2", "--head-dim", "32",
                      "--repeats", "1", "--sample-rows", "16", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "window_span_cpu.json").read_text())
    assert saved["chunk"] == 4 * 48 and [r["kernel"] for r in saved["results"]] == ["float32", "cpu-flash"]
    for row in saved["results"]:
        assert row["out_error"] < 1e-2 and row["lse_error"] < 1e-2 and row["seconds"] > 0
    table = (tmp_path / "window_span_cpu.md").read_text()
    assert "| float32 |" in table and "| 1.00 |" in table and "| cpu-flash |" in table


def test_a_kernel_that_gets_the_band_wrong_shows_a_large_error(tmp_path, monkeypatch):
    from lminfinite import window

    def band_too_wide(query, ctx, width, scale, kernel, band):
        return window.window_attention(query, ctx, width + 8, scale, kernel, band)

    monkeypatch.setattr(window_span, "window_attention", band_too_wide)
    window_span.main(["--device", "cpu", "--window", "48", "--heads", "2", "--head-dim", "32", "--repeats", "1",
                      "--kernels", "float32", "--out", str(tmp_path)])
    row = json.loads((tmp_path / "window_span_cpu.json").read_text())["results"][0]
    assert row["out_error"] > 0.05 or row["lse_error"] > 0.05
