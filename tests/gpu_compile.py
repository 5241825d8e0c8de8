"""Compile the library's Triton kernels for an NVIDIA GPU, without one: ``python tests/gpu_compile.py [sm]``.

Triton's interpreter (the CPU tests) runs a kernel's Python, not its compilation: a kernel can pass every test here
and fail to build on the GPU, where a session's few minutes of device time would find it out. Triton's wheel holds
the whole toolchain (ptxas included), so each kernel is compiled here as a GPU would build it (sm_90: an H100 or
H200), for every dtype it is launched with and the shapes of Llama-2-7B's heads. Run without TRITON_INTERPRET:
under it, triton.jit makes kernels that only the interpreter runs.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lminfinite import recall_kernel, recall_triton

I64, I32, F32 = "i64", "i32", "fp32"


def kernels(dtype: str) -> list[tuple]:
    """(kernel, its arguments' types in order, its constexprs, and its launch's options where it sets any) for
    queries and keys of ``dtype``."""
    half = dtype != "*fp32"
    scan = dict(HAS_LIVE=True, ROWS=16, DIM=128, BLOCK=128)
    return [
        *((recall_triton._scan_blocks,
           [dtype, dtype, "*i64", "*fp32", "*i64", I32, I32, I32, I32, F32, I32] + [I64] * 4,
           dict(scan, ROWS=recall_triton.padded_rows(rows), K=5, IEEE=not half, DOT=rows > recall_kernel.FEW_ROWS),
           dict(num_warps=recall_triton.scan_warps(rows, torch.bfloat16 if half else torch.float32)))
          for rows in (1, 4, recall_kernel.MAX_ROWS)),
        *((recall_triton._scan_spans,
           [dtype, dtype, "*i64", "*fp32", "*i64"] + [I32] * 6 + [F32, I32] + [I64] * 4,
           dict(scan, ROWS=recall_triton.padded_rows(rows), K=5, SLOTS=8))
          for rows in (1, recall_kernel.FEW_ROWS)),
        *([(recall_triton._select_blocks, ["*fp32", "*i64", "*fp32", "*i64", I32, F32, I32],
            dict(HAS_LIVE=True, BLOCK=recall_kernel.SELECT_BLOCK, K=5))] if not half else []),  # float32 products
        (recall_triton._gather_rows, ["*i64", "*fp32", dtype, dtype, I32, I32, I32, I32, I32] + [I64] * 4,
         dict(K=8, DIM=128)),
        (recall_triton._merge_rows, ["*fp32", "*fp32", "*fp32", "*i64", dtype, I32, I32, I32, I32, I32] + [I64] * 8,
         dict(K=8, DIM=128)),
        (recall_triton._rotate_rows, [dtype, "*fp32", "*fp32", dtype, I32, I32], dict(DIM=128)),
    ]


def compile_all(capability: int = 90) -> list[str]:
    """Each kernel compiled for ``capability``; a line per kernel, dtype and query rows: its registers per thread
    and the bytes it spills to local memory, as ptxas reports them (an error raises). The kernels compile side by
    side, one process per CPU."""
    jobs = [(capability, dtype, index) for dtype in ("*bf16", "*fp16", "*fp32") for index in range(len(kernels(dtype)))]
    context = multiprocessing.get_context("fork")  # nothing has compiled yet; the workers import nothing anew
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(4, os.cpu_count() or 1), mp_context=context) as pool:
        return list(pool.map(_compile_one, *zip(*jobs)))


def _compile_one(capability: int, dtype: str, index: int) -> str:
    kernel, types, constants, *options = kernels(dtype)[index]
    names = [name for name in kernel.arg_names if name not in constants]
    if len(names) != len(types):
        raise ValueError(f"{kernel.__name__}: {len(types)} types for {len(names)} arguments")
    signature = dict(zip(names, types)) | {name: "constexpr" for name in constants}
    compiled = triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", capability, 32),
                              options=options[0] if options else None)
    registers, spilled = _registers(compiled.asm["ptx"])
    shape = f" rows={constants['ROWS']}" if "ROWS" in constants else ""
    return f"{kernel.__name__} {dtype[1:]}{shape}: {registers} registers, {spilled} bytes spilled"


def _registers(ptx: str) -> tuple[int, int]:
    """(registers per thread, bytes of spill stores) of one kernel's PTX and the functions it calls, from ptxas -v."""
    arch = re.search(r"^\.target (\w+)", ptx, re.M).group(1)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "kernel.ptx")
        with open(source, "w") as file:
            file.write(ptx)
        report = subprocess.run([ptxas, f"-arch={arch}", "-v", source, "-o", os.path.join(folder, "kernel.cubin")],
                                capture_output=True, text=True, check=True).stderr
    return (max(int(n) for n in re.findall(r"Used (\d+) registers", report)),
            sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", report)))  # a called function's too


if __name__ == "__main__":
    print("\n".join(compile_all(int(sys.argv[1]) if len(sys.argv) > 1 else 90)))
