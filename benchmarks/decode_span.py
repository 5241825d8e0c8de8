"""A decode step's window in one layer, through each kernel that can attend it, side by side: what a step costs
besides its recall (benchmarks/recall_kernel.py prints this table under its own, so one GPU call times both).

Three steps, at the recall benchmark's shape (one token's heads over n_starting + window keys):
  - steady, with top-k: the window's output and log-sum-exp, which recall's tokens merge into
    (fused.attend_with_lse, no mask): the memory-efficient kernel and FlashAttention-2's call with no window;
  - steady, without top-k: scaled_dot_product_attention over the same keys, what a step without recall runs;
  - filling (before the window is full), an eighth, a half and all but one of the window's rows in use
    (filling.py): the masked call over every row, and FlashAttention-2's variable-length call over the rows in use.
Each row says how far its output lies from float64's. The keys are random normal numbers, not a model's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.call_timing import timed, timed_graph
from ingest.tables import markdown_table
from lminfinite import filling
from lminfinite.fused import attend_with_lse, supports

N_STARTING = 10
WITH_TOPK = ("efficient", "flash", "cpu-flash", "float32")


def measure(args, device, dtype) -> list[dict]:
    """Rows of (step, rows read, kernel, eager_s, graph_s, error) at ``args``' heads, head size and window."""
    generator = torch.Generator().manual_seed(0)
    query, keys, values = (torch.randn(1, args.heads, rows, args.head_dim, generator=generator).to(device, dtype)
                           for rows in (1, N_STARTING + args.window, N_STARTING + args.window))
    scale = args.head_dim ** -0.5
    results = []

    def add(step: str, rows: int, kernel: str, run, seen: tuple[torch.Tensor, torch.Tensor]) -> None:
        """``seen``: the keys and values the step attends to, which float64 attends to as well. A kernel that fails
        (a PyTorch build without it, a call a graph cannot record) is a row saying so: the recall table beside
        this one is still written."""
        row = dict(step=step, rows=rows, kernel=kernel, eager_s=None, graph_s=None, error=None, failed=None)
        try:
            expected = float64_attention(query, *seen, scale)
            row["error"] = float((run().double().cpu().reshape(expected.shape) - expected).abs().max())
            row["eager_s"] = timed(run, device, args.repeats)
            row["graph_s"] = timed_graph(run, args.repeats) if device.type == "cuda" else None
        except RuntimeError as exc:
            row["failed"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        results.append(row)
        print(row, flush=True)

    everything = keys.shape[-2]
    for kernel in (name for name in WITH_TOPK if supports(name, device, dtype)):
        add("steady, with top-k", everything, kernel,
            lambda kernel=kernel: attend_with_lse(query, keys, values, None, scale, kernel)[0], (keys, values))
    add("steady, without top-k", everything, "sdpa",
        lambda: F.scaled_dot_product_attention(query, keys, values, scale=scale), (keys, values))
    ring_k, ring_v = keys[..., N_STARTING:, :], values[..., N_STARTING:, :]  # a filling step's window rows
    for used in sorted({args.window // 8, args.window // 2, args.window - 1}):
        rows = filling.FilledRows.allocate(args.window, device)
        rows.fill(used)
        for kernel in (name for name in filling.FILLING_KERNELS if filling.supports(name, device, dtype)):
            add(f"filling, {used:,} rows in use", args.window if kernel == "sdpa" else used, kernel,
                lambda kernel=kernel, rows=rows: filling.FILLING_KERNELS[kernel](query, ring_k, ring_v, rows, scale),
                (ring_k[..., :used, :], ring_v[..., :used, :]))
    return results


def float64_attention(query, keys, values, scale: float) -> torch.Tensor:
    q, k, v = (t.double().cpu() for t in (query, keys, values))
    return torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1) @ v


def table(results: list[dict], on_cuda: bool) -> str:
    def ms(seconds):
        return "" if seconds is None else f"{seconds * 1e3:,.3f}"

    def row(r):
        error = f"failed ({r['failed']})" if r["failed"] else f"{r['error']:.1e}"
        return ([r["step"], f"{r['rows']:,}", r["kernel"], ms(r["eager_s"])]
                + ([ms(r["graph_s"])] if on_cuda else []) + [error])

    return markdown_table(["decode step", "rows read", "kernel", "eager ms"] + (["graph ms"] if on_cuda else [])
                          + ["max |out − float64|"], [row(r) for r in results])
