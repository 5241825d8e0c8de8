"""NLL by position on long real text, far beyond SmolLM2's L = 8192 (paper Fig. 3 / Table 1, real model).

The text: Python's Language Reference as the standard library ships it for ``pydoc`` (``pydoc_data.topics``,
every topic in its stored order), one sequence of ``--nll-tokens`` tokens. Methods, each fed in prefill
chunks with logits for every position (chunked prefill is exact, and holding one chunk's logits avoids the
n × vocabulary matrix of a one-shot forward):

- vanilla: the unpatched model (DynamicCache; its attention is O(n²), so it may stop earlier: ``--vanilla-tokens``);
- window: Λ-mask without starting tokens (``n_starting = 0``), at the chosen W;
- lminfinite: n_starting = 10, at W = 8192 (= L) and at the chosen W.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from benchmarks import real_common as rc

L = 8192


def real_text_ids(tokenizer, n_tokens: int) -> list[int]:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics.values())
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < n_tokens:
        raise ValueError(f"the text has only {len(ids)} tokens")
    return ids[:n_tokens]


STRIDE = 4  # NLL at every 4th position: the lm_head (49,152 × 576) and the loss on a quarter of the tokens


@torch.inference_mode()
def nll_curve(model, ids: list[int], cache, chunk: int = rc.PREFILL_CHUNK, log=None, stride: int = STRIDE) -> torch.Tensor:
    """NLL (nats) of predicting token t+1 at positions t = 0, stride, 2·stride, ... (NaN elsewhere), fed chunk
    by chunk into ``cache``; ``logits_to_keep`` picks the scored positions."""
    out = torch.full((len(ids) - 1,), float("nan"), dtype=torch.float64)
    clock = rc.Stopwatch()
    for lo in range(0, len(ids) - 1, chunk):
        hi = min(lo + chunk, len(ids) - 1)
        keep = torch.arange((-lo) % stride, hi - lo, stride)
        logits = model(input_ids=torch.tensor([ids[lo:hi]]), past_key_values=cache, use_cache=True,
                       logits_to_keep=keep).logits[0]
        targets = torch.tensor(ids[lo + 1 : hi + 1])[keep]
        out[lo + keep] = F.cross_entropy(logits.float(), targets, reduction="none").double()
        if log is not None and (hi // chunk) % 16 == 0:
            log(f"    {hi:,} tokens, {clock():.0f} s")
    return out


def mean(curve: torch.Tensor) -> float:
    return float(curve[~torch.isnan(curve)].mean())


def curve_for(model, method: str, window: int, ids: list[int], chunk: int, log=print) -> torch.Tensor:
    import lminfinite
    from transformers import DynamicCache

    if method == "vanilla":
        lminfinite.disable(model)
        return nll_curve(model, ids, DynamicCache(), chunk, log)
    n_starting = 0 if method == "window" else rc.N_STARTING
    lminfinite.enable(model, lminfinite.LMInfiniteConfig(window=window, n_starting=n_starting, topk=0))
    cache = lminfinite.InfiniteCache(model, keep_middle=False)
    return nll_curve(model, ids, cache, chunk, log)


def buckets(length: int) -> list[tuple[int, int]]:
    spans, lo, hi = [], 0, L
    while lo < length:
        spans.append((lo, min(hi, length)))
        lo, hi = hi, hi * 2
    return spans


def run(args, results) -> None:
    torch.set_num_threads(args.threads)
    tokenizer, model = rc.load_real()
    ids = real_text_ids(tokenizer, args.nll_tokens + 1)
    path = results / "real_nll.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    for method, window in nll_plan(args):
        name = method if window is None else f"{method} W={window}"
        n = min(len(ids), token_limit(args.nll_limits, name, len(ids) - 1) + 1)
        clock = rc.Stopwatch()
        print(f"NLL {name}: {n - 1:,} tokens", flush=True)
        curve = curve_for(model, method, window or L, ids[:n], args.chunk)
        saved[name] = {"nll": [None if x != x else round(float(x), 4) for x in curve.tolist()],
                       "seconds": round(clock(), 1), "stride": STRIDE}
        path.write_text(json.dumps(saved))
        spans = buckets(len(curve))
        print(f"  {name}: " + ", ".join(f"{mean(curve[lo:hi]):.3f}" for lo, hi in spans)
              + f"  ({clock():.0f} s)", flush=True)
    plot(saved, results / "real_nll.png")


def nll_plan(args) -> list[tuple[str, int | None]]:
    """(method, window) pairs to measure, cheap ones first: a long run that is stopped keeps what it measured."""
    plan = [("window", args.window), *[("lminfinite", int(w)) for w in args.nll_windows.split(",")],
            ("vanilla", None)]
    skipped = {"vanilla": getattr(args, "skip_vanilla_nll", False), "window": getattr(args, "skip_window_nll", False)}
    return [(method, window) for method, window in plan if not skipped.get(method)]


def token_limit(limits: str | None, name: str, default: int) -> int:
    """The tokens `name` is measured to, from 'name:tokens,...' (the slow methods stop early)."""
    table = dict(item.rsplit(":", 1) for item in (limits or "").split(",") if item)
    return int(table.get(name, default))


def plot(saved: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    step = 512
    for name, entry in saved.items():
        curve = _tensor(entry["nll"])
        n = len(curve) // step * step
        smooth = curve[:n].view(-1, step).nanmean(1)
        ax.plot((torch.arange(len(smooth)) + 0.5) * step / L, smooth, label=name)
    ax.axvline(1, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("position / L (L = 8192)")
    ax.set_ylabel("NLL (nats), mean per 512 tokens")
    ax.set_ylim(bottom=0, top=min(10, ax.get_ylim()[1]))
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _tensor(values) -> torch.Tensor:
    return torch.tensor([float("nan") if v is None else v for v in values], dtype=torch.float64)


def section(results) -> str | None:
    from ingest.tables import markdown_table

    path = results / "real_nll.json"
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    longest = max(len(e["nll"]) for e in saved.values())
    spans = buckets(longest)
    header = ["method"] + [f"{lo // L}–{hi / L:g}·L" for lo, hi in spans] + ["2–4·L ÷ 0–L"]
    rows = []
    order = lambda name: (not name.startswith("vanilla"), not name.startswith("window"), name)  # noqa: E731
    for name, entry in sorted(saved.items(), key=lambda kv: order(kv[0])):
        curve = _tensor(entry["nll"])
        cells = [f"{mean(curve[lo:hi]):.3f}" if hi <= len(curve) + 1 else
                 (f"{mean(curve[lo:]):.3f} (to {len(curve) / L:.1f}·L)" if lo < len(curve) else "–")
                 for lo, hi in spans]
        ratio = "–"
        if len(spans) >= 3 and spans[2][0] < len(curve):
            ratio = f"{mean(curve[spans[2][0]:spans[2][1]]) / mean(curve[:L]):.2f}×"
        label = name.replace("window W=", "window (n_starting = 0) W=")
        rows.append([label] + cells + [ratio])
    return (f"**NLL per token (nats) by position**, one sequence of {longest:,} tokens of Python's Language "
            f"Reference (`pydoc_data.topics`, shipped with the interpreter), fed in chunks of 512, scored at every "
            f"{STRIDE}th position; methods stop where the table says:\n\n"
            + markdown_table(header, rows) + "\n\n![NLL by position, real model](benchmarks/results/real_nll.png)")
