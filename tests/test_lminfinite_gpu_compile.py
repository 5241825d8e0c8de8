"""The library's Triton kernels build for an H100/H200 (sm_90) without spilling registers, checked on a machine
without a GPU (tests/gpu_compile.py says why): the interpreter's tests say what they compute, this that a GPU can
build them."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (requirements-dev.txt)")
def test_every_recall_kernel_compiles_for_sm90_in_each_dtype(tmp_path):
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu_compile.py"), "90"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    kernels = {"_scan_blocks", "_scan_spans", "_select_blocks", "_gather_rows", "_merge_rows", "_rotate_rows"}
    # The scan for 1 and 4 query rows and for the most it takes (a question read with recall); the scan over spans of
    # blocks for 1 and 2 rows (FEW_ROWS: it takes no more); the selection once, over float32 products.
    assert {line.split()[0] for line in lines} == kernels and len(lines) == 3 * 8 + 1  # 8 in each dtype
    assert [line.split()[1] for line in lines if line.startswith("_select_blocks")] == ["fp32:"]
    assert any(line.startswith("_scan_blocks bf16 rows=64:") for line in lines)
    assert {line.split()[1].rstrip(":") for line in lines} == {"bf16", "fp16", "fp32"}
    spilled = [line for line in lines if not line.endswith(" 0 bytes spilled")]
    assert not spilled, spilled  # a kernel that spills registers reads and writes local memory on every pass
