"""One layer's recall in a steady decode step, through PyTorch's operators and through Triton's kernels
(lminfinite/recall_kernel.py), side by side: eager, and replayed from a CUDA graph where the device has one. Each
way scans the store, picks the k best and merges them into the window's output (kernel.py's _merge_into).

    python -m benchmarks.recall_kernel --readme          # on a GPU: Llama-2-7B's heads, 4K to 128K middle tokens

The store is a fixed-shape one (a GPU's default: the whole buffer, an eighth of it spare, a count of the rows in
use on the device), the query one token's 32 heads of 128 in bfloat16, k = 5 (the app's). The GB/s column counts
the middle keys in use once: what a scan must read at least. Both ways must recall the same tokens, up to
near-ties: the table says how many picks differ and by how much their logits do. ``triton-span8`` and
``triton-span32`` scan the keys 8 and 32 blocks a program with a running k best (recall_triton._scan_spans) where
``triton`` selects each block's k best in k passes (the library's, SPAN = 1); ``products`` scores every key in one
batched product (cuBLAS, float32 out) and selects each 1,024's k best in Triton (recall_kernel.SCORES), so one GPU
run says which pays. A way that fails is a row saying so. The
keys are random normal numbers, not a model's. A second table times the same step's window through each kernel
that can attend it, and a step's before the window is full (decode_span.py).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime

import torch

from benchmarks import decode_span
from benchmarks.call_timing import timed, timed_graph
from benchmarks.measure import set_recall
from benchmarks.report import add_publish_arguments, publish
from ingest.tables import markdown_table
from lminfinite import recall_kernel
from lminfinite.kernel import _merge_into
from lminfinite.key_context import KeyContext
from lminfinite.recall import recall_topk

N_STARTING = decode_span.N_STARTING
# The ways beside PyTorch's operators ("torch"), each with the recall_kernel settings it runs with: "triton" the
# library's; 8 and 32 blocks of 128 keys a program of the scan (SPAN); a batched product and a selection (SCORES)
WAYS = {"triton": {}, "triton-span8": dict(SPAN=8), "triton-span32": dict(SPAN=32),
        "products": dict(SCORES="products")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--window", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--middle", default="4096,32768,131072", help="middle tokens in use, comma-separated")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--recall-layers", type=int, default=27, help="for the per-token column (Llama-2-7B, h = 5)")
    add_publish_arguments(p)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    kernels = ["torch"] + (list(WAYS) if recall_kernel.runs_on(device) else [])
    results = []
    for middle in (int(n) for n in args.middle.split(",")):
        step_args, step_kwargs = decode_step(args, middle, device, dtype)
        out = torch.zeros(1, args.heads, 1, args.head_dim, device=device)  # the window's output, merged in place
        lse = torch.zeros(1, args.heads, 1, device=device)
        picked = {}
        for kernel in kernels:
            def run(fused=kernel != "torch", call=step_args, settings=WAYS.get(kernel, {})):
                with library_settings(settings):  # read as the step is recorded
                    recalled = recall_topk(*call, **step_kwargs, fused=fused)
                _merge_into(out, lse, [recalled.logits], [], recalled, 0, step_args[1], None, 1)
                return recalled

            row = dict(middle=middle, kernel=kernel, key_bytes=middle * args.heads * args.head_dim * dtype.itemsize)
            try:
                picked[kernel] = run()
                row.update(eager_s=timed(run, device, args.repeats),
                           graph_s=timed_graph(run, args.repeats) if device.type == "cuda" else None)
            except RuntimeError as exc:  # a way this build cannot run or a graph cannot record: a row says so
                row["failed"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            if kernel != "torch" and kernel in picked:
                row.update(agreement(picked["torch"], picked[kernel]))
            results.append(row)
            print(row, flush=True)
    write_results(args, device, results, decode_span.measure(args, device, dtype))


@contextlib.contextmanager
def library_settings(settings: dict):
    """recall_kernel's module settings (SPAN, SCORES) set to ``settings`` inside, as they were after."""
    before = {name: getattr(recall_kernel, name) for name in settings}
    set_recall(settings)
    try:
        yield
    finally:
        set_recall(before)


def decode_step(args, middle: int, device, dtype) -> tuple:
    """recall_topk's arguments for the query of a steady decode step after ``middle`` evicted tokens."""
    generator = torch.Generator().manual_seed(middle)
    shape = (1, args.heads)
    capacity = middle + middle // 8

    def normal(*rest):
        return torch.randn(*shape, *rest, generator=generator).to(device, dtype)

    position = N_STARTING + middle + args.window - 1
    ctx = KeyContext(
        recent_k=normal(args.window, args.head_dim), recent_v=normal(args.window, args.head_dim),
        recent_start=position - args.window + 1, frame=0,
        start_k=normal(N_STARTING, args.head_dim), start_v=normal(N_STARTING, args.head_dim),
        middle_k=normal(capacity, args.head_dim), middle_v=normal(capacity, args.head_dim),
        middle_live=torch.tensor(middle, device=device),
    )
    query = normal(1, 1, args.head_dim)
    return (query, torch.tensor([position], device=device), position, ctx, None), dict(
        k=args.k, n_starting=N_STARTING, window=args.window, scale=args.head_dim ** -0.5)


def agreement(torch_way, triton_way) -> dict:
    """Picks the two ways differ in (as sets per query head), and the largest gap between their logits."""
    a, b = torch_way.positions.sort(-1).values, triton_way.positions.sort(-1).values
    return dict(differing_heads=int((a != b).any(-1).sum()), heads=int(a[..., 0].numel()),
                logit_gap=float((torch_way.logits - triton_way.logits).abs().max()))


def write_results(args, device, results: list[dict], window_spans: list[dict]) -> None:
    name = "recall_kernel_gpu" if device.type == "cuda" else "recall_kernel_cpu"
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    on_cuda = device.type == "cuda"

    def row(r):
        if r.get("failed"):
            return [f"{r['middle']:,}", r["kernel"], f"failed ({r['failed']})"] + [""] * (4 if on_cuda else 3)
        best = r["graph_s"] or r["eager_s"]
        same = (f"{r['differing_heads']}/{r['heads']} heads, logits ≤ {r['logit_gap']:.1e}"
                if "heads" in r else "")
        return ([f"{r['middle']:,}", r["kernel"], f"{r['eager_s'] * 1e3:,.3f}"]
                + ([f"{r['graph_s'] * 1e3:,.3f}"] if on_cuda else [])
                + [f"{r['key_bytes'] / best / 1e9:,.0f}", f"{best * args.recall_layers * 1e3:,.1f}", same])

    table = markdown_table(
        ["middle tokens", "recall", "eager ms"] + (["graph ms"] if on_cuda else [])
        + ["GB/s (keys)", f"ms per token (× {args.recall_layers} layers)", "picks ≠ torch's"],
        [row(r) for r in results],
    )
    heading = (f"{datetime.date.today()}, {where}, torch {torch.__version__}: one layer's recall in a steady decode "
               f"step, {args.heads} heads of {args.head_dim}, {args.dtype}, k = {args.k}, a fixed-shape store; "
               f"median of {args.repeats}.")
    spans = (f"The same step's window in one layer, {N_STARTING} + {args.window:,} keys, through each "
             "kernel that can attend it (benchmarks/decode_span.py), and a step's before the window is full:")
    publish(name, dict(device=where, heads=args.heads, head_dim=args.head_dim, dtype=args.dtype, k=args.k,
                       results=results, window_spans=window_spans),
            "\n\n".join((heading, table, spans, decode_span.table(window_spans, on_cuda))), readme=args.readme,
            out=args.out)


if __name__ == "__main__":
    main()
