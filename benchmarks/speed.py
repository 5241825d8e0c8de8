"""Speed and memory, side by side in one run: vanilla transformers, truncation to the last L tokens,
LM-Infinite, and LM-Infinite + top-k, at contexts L, 2L, 4L ... (paper App. F; issue targets in docs/benchmarks.md).

    python -m benchmarks.speed                       # CPU: random Llama with d = L = 512, 8 layers
    python -m benchmarks.speed --model random-7b --device cuda --load-in-4bit --window 4096 --max-context 131072
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import platform
import statistics
import time
from pathlib import Path

import torch

from benchmarks import measure
from benchmarks.report import splice_readme
from ingest.tables import markdown_table
from ingest.units import mib

ROOT = Path(__file__).resolve().parent.parent
NO_TIME = "no time"  # a cell the deadline left out: not a failure, and any round that ran it replaces it


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="random", help="random | random-7b | a checkpoint path or hub id")
    p.add_argument("--window", type=int, default=512, help="L: the (random) model's max_position_embeddings")
    p.add_argument("--max-context", type=int, default=None, help="largest context (default 64·L)")
    p.add_argument("--contexts", default=None,
                   help="comma-separated contexts instead of the ladder L, 2L, ... --max-context (a short GPU lease)")
    p.add_argument("--methods", default=",".join(measure.METHODS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="float32 on CPU, bfloat16 on CUDA by default")
    p.add_argument("--load-in-4bit", action="store_true")
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--prefill-chunk", type=int, default=None, help="LM-Infinite prefill chunk (default 4·L)")
    p.add_argument("--n-starting", type=int, default=10)
    p.add_argument("--topk", type=int, default=5)
    p.add_argument("--recall-prefill", choices=("on", "off"), default=None,
                   help="lminfinite-topk recalls while reading the context too (default: on for CPU; off for CUDA, "
                        "where the app reads documents without recall)")
    p.add_argument("--recall-settings", type=recall_settings, default={},
                   help="lminfinite.recall_kernel's settings the cells run with, as JSON, e.g. '{\"SPAN\": 8}' "
                        "(benchmarks/recall_choice.py prints them from the recall benchmark's table)")
    p.add_argument("--vanilla-budget-s", type=float, default=240.0,
                   help="skip vanilla/truncation once a prefill is predicted to take longer than this")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="start no cell after this many seconds; the rest get a 'no time' row and the table is "
                        "written anyway (a GPU machine lent for ten minutes at a time)")
    p.add_argument("--repeat-budget-s", type=float, default=60.0,
                   help="repeat a short prefill (fastest kept) while its runs took less than this in all")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--rounds", type=int, default=1,
                   help="sweep everything this many times (fresh processes) and keep each cell's fastest prefill "
                        "and decode: on a shared machine one process can run 10-30 %% slow throughout")
    p.add_argument("--extend", action="store_true",
                   help="add --rounds rounds to those already saved under --out (<tag>_rounds.json)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--tag", default=None, help="results file stem (default speed_<device>)")
    p.add_argument("--readme", action="store_true", help="write the summary table into docs/benchmarks.md")
    return p.parse_args(argv)


def recall_settings(text: str) -> dict:
    """``--recall-settings``: a JSON object of recall_kernel's module settings that a cell may set."""
    settings = json.loads(text)
    unknown = set(settings) - set(measure.RECALL_SETTINGS) if isinstance(settings, dict) else {text}
    if unknown:
        raise argparse.ArgumentTypeError(f"not one of {', '.join(measure.RECALL_SETTINGS)}: {', '.join(unknown)}")
    return settings


def main(argv=None) -> None:
    args = parse_args(argv)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    contexts = [int(n) for n in args.contexts.split(",")] if args.contexts else \
        context_ladder(args.window, args.max_context or 64 * args.window)
    methods = [m for m in args.methods.split(",") if m]
    saved = rounds_path(args)
    rounds: list[list[dict]] = json.loads(saved.read_text()) if args.extend and saved.is_file() else []
    stop_at = stops_in(rounds, args.vanilla_budget_s)
    args.out.mkdir(parents=True, exist_ok=True)
    spawn = multiprocessing.get_context("spawn")
    deadline = time.monotonic() + args.deadline_s if args.deadline_s else None
    for _ in range(args.rounds):
        rounds.append(run_round(args, dtype, contexts, methods, stop_at, spawn, deadline))
        saved.write_text(json.dumps(rounds))
    write_results(args, best_of_rounds(rounds), dtype, len(rounds))


def stops_in(rounds: list[list[dict]], vanilla_budget_s: float) -> dict[str, int]:
    """method -> the smallest context it is no longer run at (failed, or too slow), from the rounds so far."""
    stop_at: dict[str, int] = {}
    for row in (row for results in rounds for row in results):
        note_stop(stop_at, row, vanilla_budget_s)
    return stop_at


def context_ladder(window: int, largest: int) -> list[int]:
    """L, 2L, 4L ... up to `largest`."""
    contexts, n = [], window
    while n <= largest:
        contexts.append(n)
        n *= 2
    return contexts


def run_round(args, dtype: str, contexts: list[int], methods: list[str], stop_at: dict[str, int], spawn,
              deadline: float | None = None) -> list[dict]:
    """One sweep, methods interleaved per context so that ratios come from the same conditions; a method
    past its stop point gets a 'too slow' row instead of a run, and every cell after ``deadline`` (monotonic
    seconds) a 'no time' row."""
    results = []
    keep_model = args.device.startswith("cuda")  # one worker keeps the model; CPU cells get fresh processes
    pool = spawn.Pool(1) if keep_model else None
    try:
        for context in contexts:
            for method in methods:
                skipped = "too slow" if method in stop_at and context >= stop_at[method] else (
                    NO_TIME if deadline is not None and time.monotonic() > deadline else "")
                if skipped:
                    results.append(measure.Measurement(method, context, 0, 0, 0, 0, 0, error=skipped).__dict__)
                    continue
                job = speed_job(args, dtype, method, context)
                row = pool.apply(measure.run, (job,)) if keep_model else measure_in_fresh_process(spawn, job)
                results.append(row)
                print(json.dumps(row), flush=True)
                note_stop(stop_at, row, args.vanilla_budget_s)
    finally:
        if pool is not None:
            pool.terminate()
    return results


def speed_job(args, dtype: str, method: str, context: int) -> dict:
    """measure.run's arguments for one (method, context) cell."""
    return dict(method=method, context=context, model_spec=args.model, window=args.window,
                device=args.device, dtype=dtype, load_in_4bit=args.load_in_4bit,
                decode_tokens=args.decode_tokens, prefill_chunk=args.prefill_chunk or 4 * args.window,
                n_starting=args.n_starting, topk=args.topk, threads=args.threads,
                recall_prefill=recall_prefill(args),
                repeat_budget_s=args.repeat_budget_s, recall_settings=args.recall_settings)


def recall_prefill(args) -> bool:
    return (args.recall_prefill or ("off" if args.device.startswith("cuda") else "on")) == "on"


def measure_in_fresh_process(spawn, job: dict) -> dict:
    """Each cell in a fresh process, so that no cell inherits another's memory peak or warm state."""
    with spawn.Pool(1) as pool:
        return pool.apply(measure.run, (job,))


def results_stem(args) -> str:
    return args.tag or f"speed_{args.device.split(':')[0]}"


def rounds_path(args) -> Path:
    """Every round's raw rows, so that ``--extend`` can add rounds later."""
    return args.out / f"{results_stem(args)}_rounds.json"


def note_stop(stop_at: dict[str, int], row: dict, vanilla_budget_s: float) -> None:
    """After a failure, later rounds skip that context too (the first round's error is kept); vanilla stops
    where its quadratic prefill is predicted to exceed the budget."""
    if row["error"] == NO_TIME:
        return
    if row["error"]:
        stop_at.setdefault(row["method"], row["context"])
    elif row["method"] == "vanilla" and row["prefill_s"] * 4.2 > vanilla_budget_s:
        stop_at.setdefault(row["method"], 2 * row["context"])


def best_of_rounds(rounds: list[list[dict]]) -> list[dict]:
    """One row per (method, context): the fastest prefill and decode seen, the largest peak memory.

    A cell that failed or was skipped in any round keeps that error; one the deadline left out ("no time")
    takes any round's run of it instead."""
    rows = [row for results in rounds for row in results]
    ran = {(row["method"], row["context"]) for row in rows if row["error"] != NO_TIME}
    merged = {}
    for row in rows:
        key = (row["method"], row["context"])
        if row["error"] == NO_TIME and key in ran:
            continue
        best = merged.setdefault(key, dict(row))
        if best["error"] or row["error"]:
            best["error"] = best["error"] or row["error"]
            continue
        if row["prefill_s"] < best["prefill_s"]:
            best.update(prefill_s=row["prefill_s"], prefill_tok_s=row["prefill_tok_s"],
                        half_prefill_s=row.get("half_prefill_s", 0.0))
        best["decode_ms"] = min(best["decode_ms"], row["decode_ms"])
        if row.get("graph_decode_ms"):
            best["graph_decode_ms"] = min(best.get("graph_decode_ms") or row["graph_decode_ms"], row["graph_decode_ms"])
        best["peak_bytes"] = max(best["peak_bytes"], row["peak_bytes"])
    return list(merged.values())


def write_results(args, results, dtype, n_rounds: int) -> None:
    stem = results_stem(args)
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    table = summary_table(results, args.window)
    notes = " ".join(note for note in (scaling_note(results, args.window), recall_note(results)) if note)
    table += f"\n\n{notes}" if notes else ""
    hardware = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{platform.processor() or 'CPU'}, {args.threads} threads"
    header = (f"Measured {datetime.date.today()} on {hardware}; model `{args.model}` (L = {args.window}, {dtype}"
              f"{', 4-bit NF4' if args.load_in_4bit else ''}), n_starting = {args.n_starting}, top-k = {args.topk}. "
              f"Top-k recall {'while reading and ' if recall_prefill(args) else 'only '}while decoding"
              f"{' (middle store on the GPU up to 80 % of its free memory, then pinned CPU pages)' if args.device.startswith('cuda') else ''}"
              f"{f'; recall_kernel set to {json.dumps(args.recall_settings)} for these cells' if args.recall_settings else ''}. "
              f"{n_rounds} round(s), each cell's best. Decode: median of {args.decode_tokens} tokens; vanilla@L is the median decode of vanilla at L and of "
              f"every truncation run (transformers with the last L tokens cached)"
              f"{'; CUDA graph: the same decode through lminfinite.GraphedDecoder, after the step that records it' if args.device.startswith('cuda') else ''}. Peak: "
              f"{'CUDA max allocated' if args.device.startswith('cuda') else 'process RSS'} above the loaded model.")
    (args.out / f"{stem}.md").write_text(header + "\n\n" + table + "\n")
    plot(results, args.out / f"{stem}.png", args.window)
    if args.readme:
        splice_readme(ROOT / "README.md", stem, header + "\n\n" + table + f"\n\n![{stem}](benchmarks/results/{stem}.png)")
    print(table)


def summary_table(results, window) -> str:
    """One row per cell. Speed-ups are vanilla's time at the same context over the row's; with CUDA-graph decodes
    (lminfinite on CUDA, lminfinite.GraphedDecoder), two more columns give theirs."""
    by = {(r["method"], r["context"]): r for r in results}
    base_decode = vanilla_decode_at_window(results, window)
    graphs = any(r.get("graph_decode_ms") for r in results)
    rows = []
    for r in results:
        if r["error"]:
            rows.append([r["method"], f"{r['context']:,}", r["error"]] + [""] * (8 if graphs else 6))
            continue
        vanilla = by.get(("vanilla", r["context"]))
        vanilla = vanilla if vanilla and not vanilla["error"] else None
        faster = lambda key: f"{vanilla[key] / r[key]:.2f}×" if vanilla else "–"  # noqa: E731
        decode_ratio = f"{r['decode_ms'] / base_decode:.2f}" if base_decode else "–"
        row = [r["method"], f"{r['context']:,}", f"{r['prefill_tok_s']:,.0f}", faster("prefill_s"),
               f"{r['decode_ms']:.2f}", decode_ratio, faster("decode_ms")]
        if graphs:
            graph_ms = r.get("graph_decode_ms") or 0.0
            row += [f"{graph_ms:.2f}", f"{vanilla['decode_ms'] / graph_ms:.2f}×" if vanilla else "–"] if graph_ms \
                else ["", ""]
        rows.append(row + [mib(r["peak_bytes"]), mib(r["kv_bytes"])])
    header = ["method", "context", "prefill tok/s", "prefill speed-up vs vanilla", "decode ms/token",
              "decode ÷ vanilla@L", "decode speed-up vs vanilla"]
    header += ["decode ms/token, CUDA graph", "CUDA-graph decode speed-up vs vanilla"] if graphs else []
    return markdown_table(header + ["peak MiB", "KV-cache MiB"], rows)


def scaling_note(results, window) -> str:
    """t(n) / t(n/2) read inside one chunked prefill (the fastest run), at each method's largest context:
    linear prefill gives 2, and no other process's luck enters the ratio."""
    parts = []
    for method in dict.fromkeys(r["method"] for r in results):
        rows = [r for r in results if r["method"] == method and not r["error"] and r.get("half_prefill_s")]
        if rows:
            row = max(rows, key=lambda r: r["context"])
            parts.append(f"{method} {row['prefill_s'] / row['half_prefill_s']:.2f} at {row['context'] // window}·L")
    return f"Prefill scaling inside one prefill, t(n) / t(n/2): {', '.join(parts)}." if parts else ""


def recall_note(results) -> str:
    """What recall costs against LM-Infinite without it, at each context both ran: decode and prefill ratios."""
    by = {(r["method"], r["context"]): r for r in results if not r["error"]}
    parts = []
    for context in sorted({c for m, c in by if m == "lminfinite-topk" and ("lminfinite", c) in by}):
        plain, recall = by["lminfinite", context], by["lminfinite-topk", context]
        graphs = ""
        if recall.get("graph_decode_ms") and plain.get("graph_decode_ms"):
            graphs = f" ({recall['graph_decode_ms'] / plain['graph_decode_ms']:.2f}× through CUDA graphs)"
        parts.append(f"at {context:,} a token decodes in {recall['decode_ms'] / plain['decode_ms']:.2f}× the time"
                     f"{graphs} and the prefill runs at {plain['prefill_s'] / recall['prefill_s']:.2f}× the speed")
    if not parts:
        return ""
    return "LM-Infinite with recall against without: " + "; ".join(parts) + "."


def vanilla_decode_at_window(results, window) -> float | None:
    """Vanilla decode ms/token at context L: the median over the vanilla row at L and every truncation
    row, each of which decodes with transformers' own cache holding the last L tokens. One process's
    decode speed swings by 10-20 % on a shared machine; the median of several is a steadier yardstick."""
    samples = [r["decode_ms"] for r in results if not r["error"] and r["decode_ms"] > 0
               and (r["method"] == "truncate" or (r["method"] == "vanilla" and r["context"] == window))]
    return statistics.median(samples) if samples else None


def plot(results, path: Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for method in dict.fromkeys(r["method"] for r in results):
        rows = sorted((r for r in results if r["method"] == method and not r["error"]),
                      key=lambda r: r["context"])
        xs = [r["context"] / window for r in rows]
        for ax, key, scale in zip(axes, ("prefill_s", "decode_ms", "kv_bytes"), (1, 1, 2**-20)):
            ax.plot(xs, [r[key] * scale for r in rows], marker="o", label=method)
    for ax, title in zip(axes, ("prefill seconds (truncate encodes only the last L)", "decode ms/token", "KV cache MiB")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context / L")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
