"""Quality far beyond the training length, side by side (paper Fig. 5 / Table 1 and Table 2).

    python -m benchmarks.quality                               # the bundled demo model, CPU
    python -m benchmarks.quality --model meta-llama/Llama-2-7b-chat-hf --device cuda --topk-from-layer 5 \
        --passkey-mults 2,4 --no-ablations                     # the paper's setting on a GPU

NLL per position bucket for vanilla / window / Λ-only / ceiling-only / LM-Infinite / LM-Infinite + top-k,
and pass-key accuracy at 2L … 64L for vanilla / truncation / LM-Infinite / LM-Infinite + top-k, with a
depth × length heatmap. Results go to benchmarks/results/quality_*.{md,json,png} (and docs/benchmarks.md with --readme).
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import lminfinite
from benchmarks import nll as nll_bench
from benchmarks import passkey as passkey_bench
from benchmarks.methods import NLL_METHODS, PASSKEY_METHODS, Variants
from benchmarks.report import splice_readme
from ingest.tables import markdown_table

ROOT = Path(__file__).resolve().parent.parent
DEPTH_BINS = 5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "demo_model"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n-starting", type=int, default=10)
    p.add_argument("--topk", type=int, default=5)
    p.add_argument("--topk-from-layer", type=int, default=None, help="default: lminfinite.suggested_topk_from_layer (5 for 32 layers, 1 for 4)")
    p.add_argument("--nll-mult", type=int, default=32, help="NLL sequences of this many × L tokens")
    p.add_argument("--nll-sequences", type=int, default=4)
    p.add_argument("--no-ablations", action="store_true", help="skip the dense Λ-only / ceiling-only (O(n²) memory)")
    p.add_argument("--passkey-mults", default="2,4,8,16,32,64")
    p.add_argument("--samples", type=int, default=50, help="pass-key prompts per length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-nll", action="store_true")
    p.add_argument("--skip-passkey", action="store_true")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--jobs", type=int, default=1,
                   help="pass-key lengths measured in this many processes at once (each with --threads)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--readme", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer, variants = load_variants(args.model, args.device, args.n_starting, args.topk, args.topk_from_layer)
    layers = variants.model.config.num_hidden_layers
    topk_from = variants.topk_config.topk_from_layer
    L = variants.window
    stamp = (f"Measured {datetime.date.today()}; model `{Path(args.model).name}` (L = {L}, {layers} layers), "
             f"n_starting = {args.n_starting}, top-k = {args.topk} from layer {topk_from}, "
             f"top-k distance L/2.")
    args.out.mkdir(parents=True, exist_ok=True)
    sections = [stamp]
    # With --jobs the pass-key workers start first and run while this process measures NLL.
    passkey_section = None if args.skip_passkey else start_passkey(args, tokenizer, variants, L)
    if not args.skip_nll:
        sections.append(run_nll(args, tokenizer, variants, L))
    if passkey_section is not None:
        sections.append(passkey_section())
    body = "\n\n".join(sections)
    (args.out / "quality.md").write_text(body + "\n")
    if args.readme:
        splice_readme(ROOT / "README.md", "quality", body)
    print(body)


def run_nll(args, tokenizer, variants: Variants, L: int) -> str:
    sequences = nll_bench.heldout_sequences(tokenizer, args.nll_mult * L, args.nll_sequences)
    methods = [m for m in NLL_METHODS if not (args.no_ablations and m in ("lambda_only", "ceiling_only"))]
    curves = {m: nll_bench.nll_by_position(variants, m, sequences) for m in methods}
    spans = nll_bench.buckets(sequences.shape[1] - 1, L)
    header = ["method"] + [f"{lo // L}–{-(-hi // L)} L" if lo else "< L" for lo, hi in spans]
    rows = [[m] + [f"{v:.3f}" for v in nll_bench.bucket_means(c, spans)] for m, c in curves.items()]
    (args.out / "quality_nll.json").write_text(json.dumps({m: c.tolist() for m, c in curves.items()}))
    _plot_nll(curves, L, args.out / "quality_nll.png")
    return (f"**NLL per token (nats) by position bucket**, {args.nll_sequences} held-out stdlib sequences of "
            f"{args.nll_mult}·L tokens:\n\n" + markdown_table(header, rows)
            + "\n\n![NLL by position](benchmarks/results/quality_nll.png)")


def start_passkey(args, tokenizer, variants: Variants, L: int):
    """Start the pass-key runs (in worker processes with --jobs); returns a function that finishes them."""
    mults = [int(m) for m in args.passkey_mults.split(",")]
    rng = random.Random(args.seed)
    cases = {m: [passkey_bench.make_case(tokenizer, rng, m * L) for _ in range(args.samples)] for m in mults}
    if args.jobs <= 1:
        return lambda: passkey_table(args, L, mults, {m: _passkey_at_length(variants, tokenizer, m, cases[m])
                                                       for m in mults})
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    settings = (args.model, args.device, args.threads, args.n_starting, args.topk, variants.topk_config.topk_from_layer)
    pool = ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"))
    # Longest first, so the slowest length is not the one left running alone at the end.
    futures = {m: pool.submit(_passkey_worker, settings, m, cases[m]) for m in sorted(mults, reverse=True)}

    def finish() -> str:
        with pool:
            return passkey_table(args, L, mults, {m: futures[m].result() for m in mults})

    return finish


def passkey_table(args, L: int, mults: list[int], per_length: dict) -> str:
    hits = {method: {m: per_length[m][method] for m in mults} for method in PASSKEY_METHODS}
    header = ["method"] + [f"{m}·L ({m * L:,} tok)" for m in mults] + ["average"]
    rows = []
    for method in PASSKEY_METHODS:
        accs = [100 * sum(h for _, h in hits[method][m]) / len(hits[method][m]) for m in mults]
        rows.append([method] + [f"{a:.0f}%" for a in accs] + [f"{sum(accs) / len(accs):.0f}%"])
    (args.out / "quality_passkey.json").write_text(json.dumps(
        {method: {str(m): v for m, v in per.items()} for method, per in hits.items()}))
    _plot_heatmap(hits, mults, args.out / "quality_passkey.png")
    return (f"**Pass-key retrieval**, {args.samples} prompts per length, key at a uniform random depth:\n\n"
            + markdown_table(header, rows) + "\n\n![pass-key depth × length](benchmarks/results/quality_passkey.png)")


def _passkey_at_length(variants: Variants, tokenizer, mult: int, cases) -> dict:
    """(depth, correct) per prompt for every method, methods interleaved at one length."""
    hits = {}
    for method in PASSKEY_METHODS:
        hits[method] = [(case.depth, passkey_bench.is_correct(passkey_bench.answer(variants, method, case, tokenizer),
                                                              case.key)) for case in cases]
        print(f"passkey {mult}L {method}: {sum(h for _, h in hits[method]) / len(cases):.0%}", flush=True)
    return hits


def _passkey_worker(settings, mult: int, cases) -> dict:
    """One pass-key length in its own process (``--jobs``): load the model, then as above."""
    model_path, device, threads, n_starting, topk, topk_from = settings
    torch.set_num_threads(threads)
    tokenizer, variants = load_variants(model_path, device, n_starting, topk, topk_from)
    return _passkey_at_length(variants, tokenizer, mult, cases)


def load_variants(model_path, device, n_starting: int, topk: int, topk_from_layer: int | None):
    """Tokenizer and model, with recall from ``topk_from_layer`` (None: lminfinite's suggestion)."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, device_map=device, attn_implementation="sdpa").eval()
    if topk_from_layer is None:
        topk_from_layer = lminfinite.suggested_topk_from_layer(model.config.num_hidden_layers)
    return tokenizer, Variants(model, lminfinite.LMInfiniteConfig(n_starting=n_starting), topk, topk_from_layer)


def _plot_nll(curves, L, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for method, curve in curves.items():
        smooth = torch.nn.functional.avg_pool1d(curve[None, None].float(), max(1, L // 4), stride=max(1, L // 4))[0, 0]
        xs = (torch.arange(len(smooth)) + 0.5) * max(1, L // 4) / L
        ax.plot(xs, smooth, label=method)
    ax.axvline(1, color="grey", ls="--", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position / L (training length)")
    ax.set_ylabel("NLL (nats)")
    ax.set_ylim(top=min(12, ax.get_ylim()[1]))
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_heatmap(hits, mults, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(hits), figsize=(4 * len(hits), 3.6), sharey=True)
    for ax, (method, per) in zip(axes, hits.items()):
        grid = torch.full((DEPTH_BINS, len(mults)), float("nan"))
        for col, m in enumerate(mults):
            for b in range(DEPTH_BINS):
                inside = [h for d, h in per[m] if min(int(d * DEPTH_BINS), DEPTH_BINS - 1) == b]
                if inside:
                    grid[b, col] = sum(inside) / len(inside)
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="lower")
        ax.set_xticks(range(len(mults)), [f"{m}L" for m in mults])
        ax.set_yticks(range(DEPTH_BINS), [f"{b / DEPTH_BINS:.1f}" for b in range(DEPTH_BINS)])
        ax.set_title(method)
        ax.set_xlabel("context length")
    axes[0].set_ylabel("key depth")
    fig.colorbar(image, ax=axes, fraction=0.02)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    main()
