"""Quality and speed of the real model (the bundled SmolLM2-135M-Instruct, L = 8192) with LM-Infinite, on CPU.

    python -m benchmarks.real_model --passkey --windows 1024,2048 --samples 6
    python -m benchmarks.real_model --docqa --window 2048
    python -m benchmarks.real_model --nll --nll-tokens 32768
    python -m benchmarks.real_model --speed --context 32768
    python -m benchmarks.real_model --readme          # tables from the saved results into docs/smollm2.md

Every part appends its raw records to benchmarks/results/real_*.jsonl / .json as it goes (a long run can be
stopped and resumed part by part); ``--readme`` (or any run) rebuilds benchmarks/results/real_model.md from
what is saved and, with --readme, splices it between the quality_real / speed_real markers (in docs/smollm2.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

import torch

from benchmarks import real_common as rc
from benchmarks.report import NEW_BLOCKS_PAGE, markers, page_holding, splice_readme

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
L = 8192  # SmolLM2's max_position_embeddings

PASSKEY_VARIANTS = {  # name -> (topk, topk_from_layer); the first two are the app's methods
    "lminfinite": (0, 5),
    "lminfinite_topk": (5, 5),
    "topk k=10 from 5": (10, 5),
    "topk k=5 from 2": (5, 2),
    "topk k=5 from 10": (5, 10),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passkey", action="store_true")
    p.add_argument("--docqa", action="store_true")
    p.add_argument("--nll", action="store_true")
    p.add_argument("--speed", action="store_true")
    p.add_argument("--readme", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--window", type=int, default=1024, help="the chosen window (docqa, nll, speed)")
    p.add_argument("--chunk", type=int, default=rc.PREFILL_CHUNK, help="prefill chunk (tokens per forward)")
    # pass key
    p.add_argument("--windows", default="1024,2048", help="pass-key window sweep")
    p.add_argument("--lengths", default="4096,8192,16384", help="pass-key prompt lengths (tokens)")
    p.add_argument("--samples", type=int, default=6, help="pass-key prompts per length")
    p.add_argument("--subset", type=int, default=None,
                   help="only the first N prompts per length of the --samples set (same prompts, fewer)")
    p.add_argument("--keys", default=None, help="only the prompts with these pass keys (comma-separated)")
    p.add_argument("--vanilla-samples", default="4096:4,8192:4,16384:2", help="length:count for vanilla")
    p.add_argument("--no-vanilla", action="store_true")
    p.add_argument("--no-truncate", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    # nll / speed
    p.add_argument("--nll-tokens", type=int, default=4 * L)
    p.add_argument("--nll-windows", default="1024,8192")
    p.add_argument("--nll-limits", default="vanilla:16384,lminfinite W=8192:24576",
                   help="name:tokens, methods measured only this far (vanilla and W = L are the slow ones)")
    p.add_argument("--skip-vanilla-nll", action="store_true")
    p.add_argument("--skip-window-nll", action="store_true")
    p.add_argument("--context", type=int, default=4 * L, help="speed: context length")
    p.add_argument("--speed-chunks", default=None, help="speed: prefill chunks to compare (default: --chunk)")
    p.add_argument("--speed-from-layers", default=None, help="speed: top-k from these layers (default 5)")
    p.add_argument("--speed-dtypes", default=None, help="speed: weights of the long-context runs (default float32)")
    p.add_argument("--quant", default="float32,int8,nf4-fp32,nf4-bf16", help="speed/NLL of these weight formats (4K tokens)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.passkey:
        run_passkey(args)
    if args.docqa:
        from benchmarks import docqa

        docqa.run(args, RESULTS)
    if args.nll:
        from benchmarks import real_nll

        real_nll.run(args, RESULTS)
    if args.speed:
        from benchmarks import real_speed

        real_speed.run(args, RESULTS)
    write_report(args.readme)


# -- pass key ---------------------------------------------------------------------------------------------
def run_passkey(args) -> None:
    from benchmarks import real_passkey as rp

    tokenizer, model = rc.load_real()
    cases, all_cases = passkey_cases(args, tokenizer)
    save = jsonl_appender(RESULTS / "real_passkey.jsonl")
    for window in [int(w) for w in args.windows.split(",") if w]:
        settings = rc.Settings(window=window, prefill_chunk=args.chunk)
        clock = rc.Stopwatch()
        rp.run_lminfinite(model, tokenizer, cases, settings, PASSKEY_VARIANTS, save=save)
        print(f"W={window}: lminfinite chain {clock():.0f} s", flush=True)
        if not args.no_truncate:
            save(rp.run_truncate(model, tokenizer, all_cases, window))
    if not args.no_vanilla:
        chosen = vanilla_cases(all_cases, args.vanilla_samples)
        clock = rc.Stopwatch()
        rp.run_vanilla(model, tokenizer, chosen, args.chunk, save=save)
        print(f"vanilla {clock():.0f} s", flush=True)


def passkey_cases(args, tokenizer) -> tuple[list, list]:
    """(cases for LM-Infinite, all cases): --subset trims the set per length for every method; --keys narrows
    only the LM-Infinite runs (truncation and vanilla keep the whole set)."""
    from benchmarks import real_passkey as rp

    lengths = [int(x) for x in args.lengths.split(",")]
    cases = rp.make_cases(tokenizer, rp.pieces(tokenizer), lengths, args.samples, args.seed)
    if args.subset is not None:
        cases = [c for n in lengths for c in [c for c in cases if c.length == n][: args.subset]]
    all_cases = cases
    if args.keys:
        cases = [c for c in cases if c.key in args.keys.split(",")]
    return cases, all_cases


def vanilla_cases(all_cases: list, samples: str) -> list:
    """The first `count` cases of each length in 'length:count,...': vanilla is too slow for them all."""
    wanted = dict(tuple(int(v) for v in item.split(":")) for item in samples.split(","))
    return [c for length, n in wanted.items() for c in [c for c in all_cases if c.length == length][:n]]


def jsonl_appender(out: Path):
    """save(records): append records to `out` as they come, so a stopped run keeps what it measured."""

    def save(records) -> None:
        with out.open("a") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")

    return save


def load_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def passkey_section() -> str | None:
    from ingest.tables import markdown_table

    records = load_jsonl(RESULTS / "real_passkey.jsonl")
    if not records:
        return None
    # The latest record wins for a (method, window, length, key) repeated across runs.
    latest = {(r["method"], r["window"], r["length"], r["key"]): r for r in records}
    lengths = sorted({r["length"] for r in latest.values()})
    rows_by = {}
    for (method, window, length, _), r in latest.items():
        rows_by.setdefault((method, window), {}).setdefault(length, []).append(r["correct"])
    order = ["vanilla", "truncate"] + list(PASSKEY_VARIANTS)
    header = ["method", "W"] + [f"{n // 1024}K ({n / L:g}·L)" for n in lengths]
    rows = []
    for (method, window), per in sorted(rows_by.items(), key=lambda kv: (kv[0][1] or 0, order.index(kv[0][0])
                                                                           if kv[0][0] in order else 99)):
        cells = []
        for n in lengths:
            hits = per.get(n)
            cells.append("–" if not hits else f"{100 * sum(hits) / len(hits):.0f}% ({sum(hits)}/{len(hits)})")
        rows.append([method, "–" if window is None else f"{window:,}"] + cells)
    return markdown_table(header, rows)


# -- report -------------------------------------------------------------------------------------------------
def write_report(readme: bool) -> None:
    quality, speed = [], []
    stamp = (f"Measured {datetime.date.today()} on CPU (a 2-vCPU VM shared with other jobs; quality runs on 1 "
             f"thread, speed on 2); model "
             f"SmolLM2-135M-Instruct (float32, L = {L:,}, 30 layers), n_starting = {rc.N_STARTING}, "
             f"prefill chunk {rc.PREFILL_CHUNK}; documents prefilled with top-k off, question and answer with "
             "each method's recall, greedy decoding, as in the app.")
    section = passkey_section()
    if section:
        quality.append("**Pass-key retrieval** (app prompt; question \"What is the pass key? Answer with the "
                       "number only.\"), key at a uniform random depth, correct iff the first integer of the "
                       "answer is the key. Cells: accuracy (hits/prompts). Truncation runs only prompts whose "
                       "key lies in the last W tokens (the rest are misses by construction):\n\n" + section)
    try:
        from benchmarks import docqa

        section = docqa.section(RESULTS)
        if section:
            quality.append(section)
    except ImportError:
        pass
    try:
        from benchmarks import real_nll

        section = real_nll.section(RESULTS)
        if section:
            quality.append(section)
    except ImportError:
        pass
    try:
        from benchmarks import real_speed

        section = real_speed.section(RESULTS)
        if section:
            speed.append(section)
    except ImportError:
        pass
    notes = RESULTS / "real_model_notes.md"
    body_q = "\n\n".join([stamp] + quality + ([notes.read_text().strip()] if notes.is_file() else []))
    body_s = "\n\n".join(speed)
    (RESULTS / "real_model.md").write_text(body_q + "\n\n" + body_s + "\n")
    if readme:  # the per-question tables stay in benchmarks/results/real_model.md
        import re

        brief = re.sub(r"\n*<details>.*?</details>", "\n\nPer-question answers and citations: "
                       "[benchmarks/results/real_model.md](benchmarks/results/real_model.md).", body_q, flags=re.S)
        splice_readme_after(ROOT / "README.md", "quality_real", brief)
        if body_s:
            splice_readme_after(ROOT / "README.md", "speed_real", body_s)
    print(body_q + "\n\n" + body_s)


TITLES = {"quality_real": "### Quality beyond the training length (SmolLM2-135M-Instruct)",
          "speed_real": "### Speed at 32K tokens (SmolLM2-135M-Instruct, CPU)"}


def splice_readme_after(readme: Path, name: str, body: str,
                        anchor: str = "## Quality beyond the training length (demo model)") -> None:
    """Like report.splice_readme, but markers no page holds yet go after the quality_real block (wherever it
    lives: docs/smollm2.md now), or after the demo model's quality section of docs/benchmarks.md (before the
    next heading), not at the end of a page."""
    if page_holding(readme, name) is None:
        previous = page_holding(readme, "quality_real")
        if name != "quality_real" and previous is not None:
            place_markers_after_block(previous, "quality_real", name)
        else:
            place_markers_after_heading(readme.parent / NEW_BLOCKS_PAGE, anchor, name)
    splice_readme(readme, name, body)


def place_markers_after_block(page: Path, block: str, name: str) -> None:
    """Empty ``name`` markers (speed_real under its title) right after ``block``'s end marker on ``page``."""
    text, (begin, end), block_end = page.read_text(), markers(name), markers(block)[1]
    cut = text.find(block_end) + len(block_end)
    title = TITLES["speed_real"] if name == "speed_real" else ""
    page.write_text(text[:cut] + f"\n\n{title}\n\n{begin}\n{end}" + text[cut:])


def place_markers_after_heading(page: Path, anchor: str, name: str) -> None:
    """Empty ``name`` markers under their title at the end of ``anchor``'s section of ``page`` (after any
    speed/quality_real blocks already placed there); nothing when the page has no such heading."""
    text, (begin, end) = page.read_text(), markers(name)
    at = text.find(anchor)
    if at < 0:
        return
    nxt = text.find("\n## ", at + len(anchor))
    nxt3 = text.find("\n### ", at + len(anchor))
    cut = min([x for x in (nxt, nxt3) if x >= 0] or [len(text)])
    page.write_text(text[:cut].rstrip() + f"\n\n{TITLES.get(name, '')}\n\n{begin}\n{end}\n" + text[cut:])


if __name__ == "__main__":
    main()
