"""The window-span kernels side by side, one layer's prefill chunk of c = 4·L queries (issue 12's target: the
fused kernel >= 3x the float32 fallback), each checked against float64 on sampled query rows.

    python -m benchmarks.window_span --readme                                  # CPU, L = 512, 8 heads of 64
    python -m benchmarks.window_span --device cuda --window 4096 --heads 32 --head-dim 128 --readme

The keys are a steady-state chunk's: the L - 1 before it and its own c, as in a long prefill. ``flex`` on the CPU
is PyTorch's dense eager reference (a test path, O(c·m) memory) and is left out there unless --kernels names it.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import torch

from benchmarks.report import add_publish_arguments, publish
from ingest.tables import markdown_table
from ingest.units import mib
from lminfinite.key_context import KeyContext
from lminfinite.fused import supports
from lminfinite.window import WHOLE_SPAN_KERNELS, band_size, window_attention

ALL_KERNELS = ("float32", "cpu-flash", "efficient", "flash", "flex")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--chunk", type=int, default=None, help="queries per call (default 4·L)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads (multi-head, as Llama-2-7B)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--kernels", default=None, help="comma-separated (default: every one this device runs)")
    p.add_argument("--bands", default=None,
                   help="queries per band for the band kernels, comma-separated (default: the library's band_size; "
                        "on CUDA also L/4, where fewer, larger calls may fill the GPU better)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sample-rows", type=int, default=64, help="query rows checked against float64")
    add_publish_arguments(p)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    chunk = args.chunk or 4 * args.window
    query, ctx = steady_state_chunk(args, chunk, device, dtype)
    scale = args.head_dim**-0.5
    rows = torch.linspace(0, chunk - 1, args.sample_rows).long()
    expected = float64_window(query, ctx, args.window, scale, rows)
    results = []
    for kernel, band in candidates(args, device, dtype):
        def step():
            return window_attention(query, ctx, args.window, scale, kernel, band)

        seconds, peak = timed(step, args.repeats, device)
        out, lse = step()
        results.append(dict(kernel=kernel, band=band, seconds=seconds, peak_bytes=peak, tokens_per_s=chunk / seconds,
                            out_error=(out[:, :, rows].double() - expected[0]).abs().max().item(),
                            lse_error=(lse[:, :, rows].double() - expected[1]).abs().max().item()))
        print(f"{kernel:>10} {band or '':>5}: {seconds * 1e3:9.2f} ms  peak {mib(peak)} MiB  errors "
              f"{results[-1]['out_error']:.2e} {results[-1]['lse_error']:.2e}", flush=True)
    write_results(args, chunk, device, dtype, results)


def candidates(args, device, dtype) -> list[tuple[str, int | None]]:
    """(kernel, band) pairs to time; the whole-span kernels (flash, flex) have no bands (None)."""
    kernels = args.kernels.split(",") if args.kernels else [
        k for k in ALL_KERNELS if supports(k, device, dtype) and not (k == "flex" and device.type == "cpu")]
    if args.bands:
        bands = [int(b) for b in args.bands.split(",")]
    else:
        bands = sorted({band_size(args.window)} | ({args.window // 4} if device.type == "cuda" else set()))
    return [(k, b) for k in kernels for b in ([None] if k in WHOLE_SPAN_KERNELS else bands)]


def steady_state_chunk(args, chunk: int, device, dtype):
    """Queries of one chunk and a KeyContext holding the L - 1 keys before it and the chunk's own."""
    generator = torch.Generator().manual_seed(0)
    kv_heads = args.kv_heads or args.heads
    keys = args.window - 1 + chunk

    def normal(*shape):
        return torch.randn(*shape, generator=generator).to(device, dtype)

    query = normal(1, args.heads, chunk, args.head_dim)
    recent_k, recent_v = normal(1, kv_heads, keys, args.head_dim), normal(1, kv_heads, keys, args.head_dim)
    empty = recent_k[..., :0, :]
    return query, KeyContext(recent_k, recent_v, recent_start=0, frame=0, start_k=empty, start_v=empty)


def float64_window(query, ctx: KeyContext, window: int, scale: float, rows: torch.Tensor):
    """Output and log-sum-exp of the sampled query rows, in float64 from the definition."""
    heads, kv_heads = query.shape[1], ctx.recent_k.shape[1]
    keys = ctx.recent_k.double().repeat_interleave(heads // kv_heads, 1)
    values = ctx.recent_v.double().repeat_interleave(heads // kv_heads, 1)
    logits = query[:, :, rows].double() @ keys.transpose(-1, -2) * scale
    distance = (ctx.end - query.shape[-2] + rows.to(query.device))[:, None] - torch.arange(ctx.end, device=query.device)
    logits = logits.masked_fill(~((distance >= 0) & (distance < window)), float("-inf"))
    lse = torch.logsumexp(logits, -1)
    return torch.softmax(logits, -1) @ values, lse


def timed(step, repeats: int, device) -> tuple[float, int]:
    """Median seconds of ``step`` after a warm-up (which also compiles), and its peak extra CUDA memory."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() - base if device.type == "cuda" else 0
    return statistics.median(times), peak


def fallback_seconds(results: list[dict], window: int) -> float | None:
    """The float32 kernel's time at the library's own band size: what runs where no fused kernel does."""
    float32 = [r for r in results if r["kernel"] == "float32"]
    own = [r for r in float32 if r["band"] == band_size(window)]
    return (own or float32)[0]["seconds"] if float32 else None


def write_results(args, chunk: int, device, dtype, results: list[dict]) -> None:
    name = "window_span_gpu" if device.type == "cuda" else "window_span_cpu"
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    baseline = fallback_seconds(results, args.window)
    on_cuda = device.type == "cuda"
    table = markdown_table(
        ["kernel", "band", "ms per layer", "× float32", "queries/s", "max error (out)", "max error (lse)"]
        + (["peak extra MiB"] if on_cuda else []),
        [[r["kernel"], r["band"] or "one call", f"{r['seconds'] * 1e3:,.2f}",
          f"{baseline / r['seconds']:.2f}" if baseline else "—", f"{r['tokens_per_s']:,.0f}",
          f"{r['out_error']:.1e}", f"{r['lse_error']:.1e}"] + ([mib(r["peak_bytes"])] if on_cuda else [])
         for r in results],
    )
    heading = (f"{datetime.date.today()}, {where}, torch {torch.__version__}: one layer's window span for a chunk of "
               f"{chunk:,} queries (4·L, L = {args.window:,}), {args.heads} heads of {args.head_dim}, {args.dtype}; "
               f"median of {args.repeats}; errors against float64 on {args.sample_rows} sampled rows.")
    data = dict(chunk=chunk, window=args.window, heads=args.heads, head_dim=args.head_dim, dtype=args.dtype,
                device=where, results=results)
    publish(name, data, heading + "\n\n" + table, readme=args.readme, out=args.out)


if __name__ == "__main__":
    main()
