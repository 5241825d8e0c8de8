"""Speed of the real model on CPU: a 32K-token prefill with top-k off, then decoding with top-k on, as the app runs;
and float32 against bitsandbytes int8 / nf4 weights (speed, memory, NLL on 4K tokens of real text).

Every measurement runs in a fresh process (``python -m benchmarks.real_speed ...``), so memory is the
process's own and one configuration's allocator state does not leak into the next.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time

import torch

import lminfinite
from benchmarks import real_common as rc
from ingest.units import MiB

QUESTION = "What does the text say about the assert statement?"


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / MiB


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@torch.inference_mode()
def long_context(window: int, context: int, chunk: int, threads: int, decode_tokens: int = 32,
                 topk_from_layer: int = 5, rounds: int = 3, dtype: str = "float32") -> dict:
    """Prefill ``context`` real tokens with recall off, then decode with recall on (k = 5) and off.

    With float32 weights, recall on is timed twice, side by side from the same prefill: scanning the middle
    store's bfloat16 copy (the default, scan_copy.py) and scanning its float32 keys (a copy of the cache restored
    without one), in alternating rounds; both must decode the same tokens. bfloat16 weights keep no copy."""
    from benchmarks.real_nll import real_text_ids

    torch.set_num_threads(threads)
    tokenizer, model = rc.load_real(dtype=getattr(torch, dtype))
    settings = rc.Settings(window=window, prefill_chunk=chunk, topk_from_layer=topk_from_layer)
    ids = real_text_ids(tokenizer, context)
    rss_loaded = rss_mib()
    cache = rc.new_cache(model, settings)
    times = []
    for lo in range(0, len(ids), chunk):
        start = time.perf_counter()
        rc.feed(model, cache, ids[lo : lo + chunk], chunk)
        times.append(time.perf_counter() - start)
    prefill_s = sum(times)
    last = max(1, len(times) // 4)
    result = dict(window=window, context=context, chunk=chunk, threads=threads, topk_from_layer=topk_from_layer,
                  dtype=dtype,
                  prefill_s=round(prefill_s, 2),
                  prefill_tps=round(len(ids) / prefill_s, 1),
                  prefill_tps_last_quarter=round(last * chunk / sum(times[-last:]), 1),
                  rss_loaded_mib=round(rss_loaded, 1), kv_mib={k: round(v / MiB, 1) for k, v in cache.memory().items()})
    result["peak_rss_mib"] = round(peak_mib(), 1)  # before the comparison's second cache
    q_ids = rc.question_ids(tokenizer, "x", QUESTION)
    runs = {"topk": (cache, settings, 5), "no_topk": (cache, settings, 0)}
    if cache.memory()["middle_scan"]:
        without_copy = rc.Settings(window=window, prefill_chunk=chunk, topk_from_layer=topk_from_layer,
                                   scan_copy=False)
        rc.set_topk(model, without_copy, 0)
        plain = lminfinite.restore_cache(model, *lminfinite.cache_state(cache, copy=False))
        result["kv_mib_no_scan_copy"] = {k: round(v / MiB, 1) for k, v in plain.memory().items()}
        runs["topk_no_scan_copy"] = (plain, without_copy, 5)
    steps: dict[str, list[float]] = {name: [] for name in runs}
    questions: dict[str, list[float]] = {name: [] for name in runs}
    tokens: dict[str, list[int]] = {}
    for _ in range(rounds):
        for name, (run_cache, run_settings, topk) in runs.items():
            snap = run_cache.snapshot()
            rc.set_topk(model, run_settings, topk)
            start = time.perf_counter()
            logits = rc.feed(model, run_cache, q_ids, chunk)
            questions[name].append(time.perf_counter() - start)
            decoded = []
            for _ in range(decode_tokens):
                decoded.append(int(logits.argmax()))
                start = time.perf_counter()
                logits = model(input_ids=torch.tensor([[decoded[-1]]]), past_key_values=run_cache, use_cache=True,
                               logits_to_keep=1).logits[0, -1]
                steps[name].append(time.perf_counter() - start)
            tokens[name] = decoded
            run_cache.rollback(snap)
    for name, measured in steps.items():
        median = statistics.median(measured)
        result[f"decode_{name}_ms"] = round(1000 * median, 1)
        result[f"decode_{name}_tps"] = round(1 / median, 1)
        result[f"question_{name}_s"] = round(statistics.median(questions[name]), 2)
    if "topk_no_scan_copy" in tokens:
        result["scan_copy_same_tokens"] = tokens["topk"] == tokens["topk_no_scan_copy"]
    return result


@torch.inference_mode()
def weight_format(fmt: str, window: int, tokens: int, chunk: int, threads: int, decode_tokens: int = 16) -> dict:
    """Load with ``fmt`` weights; NLL and prefill rate (all logits) over ``tokens`` real tokens with LM-Infinite
    at ``window`` (recall off), then decode with recall on; process memory."""
    import torch.nn.functional as F
    from transformers import BitsAndBytesConfig

    from benchmarks.real_nll import real_text_ids

    torch.set_num_threads(threads)
    quant = {
        "float32": None,
        "bfloat16": None,
        "int8": BitsAndBytesConfig(load_in_8bit=True),
        "nf4-fp32": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32),
        "nf4-bf16": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16),
    }[fmt]
    rss0 = rss_mib()
    start = time.perf_counter()
    tokenizer, model = rc.load_real(quantization=quant, dtype=torch.bfloat16 if fmt == "bfloat16" else None)
    load_s = time.perf_counter() - start
    rss_loaded = rss_mib()
    settings = rc.Settings(window=window, prefill_chunk=chunk)
    ids = real_text_ids(tokenizer, tokens + 1)
    cache = rc.new_cache(model, settings)
    total, start = 0.0, time.perf_counter()
    for lo in range(0, tokens, chunk):
        hi = min(lo + chunk, tokens)
        logits = model(input_ids=torch.tensor([ids[lo:hi]]), past_key_values=cache, use_cache=True).logits[0]
        total += float(F.cross_entropy(logits.float(), torch.tensor(ids[lo + 1 : hi + 1]), reduction="sum"))
    prefill_s = time.perf_counter() - start
    rc.set_topk(model, settings, 5)
    token, steps = int(logits[-1].argmax()), []
    for _ in range(decode_tokens):
        start = time.perf_counter()
        out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        steps.append(time.perf_counter() - start)
        token = int(out.logits[0, -1].argmax())
    median = statistics.median(steps)
    return dict(format=fmt, window=window, tokens=tokens, threads=threads, load_s=round(load_s, 1),
                weights_rss_mib=round(rss_loaded - rss0, 1), peak_rss_mib=round(peak_mib(), 1),
                nll=round(total / tokens, 4), prefill_tps=round(tokens / prefill_s, 1),
                decode_topk_ms=round(1000 * median, 1), decode_topk_tps=round(1 / median, 1))


def _subprocess(kind: str, **kw) -> dict:
    code = (f"import json, benchmarks.real_speed as s; "
            f"print('RESULT', json.dumps(s.{kind}(**{kw!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (out.stderr or out.stdout).strip().splitlines()[-1][:300] if (out.stderr or out.stdout) else "?"}


def run(args, results) -> None:
    """Every long-context configuration asked for, then every weight format, each in a fresh process; each
    result saved to results/real_speed.json as it comes."""
    path = results / "real_speed.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    for key, kind, kw in [*_long_context_runs(args), *_format_runs(args)]:
        print(f"speed: {key}", flush=True)
        saved[key] = _subprocess(kind, **kw)
        print(saved[key], flush=True)
        path.write_text(json.dumps(saved, indent=1))


def _long_context_runs(args) -> list[tuple[str, str, dict]]:
    """(key, "long_context", its arguments) per prefill chunk, top-k start layer and weights' dtype asked for."""
    chunks = [int(c) for c in str(getattr(args, "speed_chunks", None) or args.chunk).split(",") if int(c) > 0]
    from_layers = [int(x) for x in str(getattr(args, "speed_from_layers", None) or 5).split(",")]
    dtypes = str(getattr(args, "speed_dtypes", None) or "float32").split(",")
    return [(_long_key(args.window, chunk, from_layer, dtype), "long_context",
             dict(window=args.window, context=args.context, chunk=chunk, threads=args.threads,
                  topk_from_layer=from_layer, dtype=dtype))
            for chunk, from_layer, dtype in [(c, f, d) for c in chunks for f in from_layers for d in dtypes]]


def _long_key(window: int, chunk: int, from_layer: int, dtype: str) -> str:
    """'long W=2048 chunk=512', with the start layer and dtype only where they are not the defaults."""
    return (f"long W={window} chunk={chunk}" + (f" from={from_layer}" if from_layer != 5 else "")
            + (f" {dtype}" if dtype != "float32" else ""))


def _format_runs(args) -> list[tuple[str, str, dict]]:
    """(key, "weight_format", its arguments) per weight format asked for (--quant)."""
    return [(f"format {fmt}", "weight_format", dict(fmt=fmt, window=args.window, tokens=4096, chunk=args.chunk,
                                                    threads=args.threads))
            for fmt in [f for f in args.quant.split(",") if f]]


def section(results) -> str | None:
    from ingest.tables import markdown_table

    path = results / "real_speed.json"
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    parts = []
    longs = [v for k, v in saved.items() if k.startswith("long") and "error" not in v]
    if longs:
        def decode(r, name):
            return f"{r[f'decode_{name}_tps']:.1f} ({r[f'decode_{name}_ms']:.0f} ms)" if f"decode_{name}_ms" in r else "–"

        def kv(memory):
            if not memory:
                return "–"
            copy = f" + scan copy {memory['middle_scan']:,.0f}" if memory.get("middle_scan") else ""
            return f"{sum(memory.values()):,.0f} (middle {memory['middle']:,.0f}{copy})"

        def same_tokens(runs):
            compared = [r for r in runs if "scan_copy_same_tokens" in r]
            differ = [str(r.get("topk_from_layer", 5)) for r in compared if not r["scan_copy_same_tokens"]]
            if differ:
                return "the two scans decoded different tokens from layer " + ", ".join(differ)
            return f"the two scans decoded the same tokens in all {len(compared)} runs"

        rows = [[r.get("dtype", "float32"), f"{r['context']:,}", f"{r['window']:,}", str(r["chunk"]),
                 str(r.get("topk_from_layer", 5)),
                 f"{r['prefill_tps']:,.0f}", f"{r['prefill_tps_last_quarter']:,.0f}", decode(r, "topk"),
                 decode(r, "topk_no_scan_copy"), decode(r, "no_topk"), kv(r["kv_mib"]),
                 kv(r.get("kv_mib_no_scan_copy")), f"{r['peak_rss_mib']:,.0f}"]
                for r in longs]
        parts.append("**Long context, CPU, 2 threads**: the documents prefilled with top-k off, then the "
                     "answer decoded with top-k on (k = 5), as in the app. With float32 weights recall scans the "
                     "middle keys' bfloat16 copy (the default, `lminfinite/scan_copy.py`) and, from a copy of the "
                     "same cache without one, the float32 keys; bfloat16 weights scan their own keys and keep no "
                     "copy. Then top-k off. Decode: median of 3 alternating rounds of 32 tokens "
                     f"each; {same_tokens(longs)}. Peak RSS: after the prefill.\n\n" + markdown_table(
                         ["weights", "context", "W", "chunk", "top-k from layer", "prefill tok/s", "prefill tok/s, last quarter",
                          "decode tok/s, top-k on", "decode tok/s, top-k on, float32 scan", "decode tok/s, top-k off",
                          "KV cache MiB", "KV cache MiB, no scan copy", "peak RSS MiB"], rows))
    fmts = [v for k, v in saved.items() if k.startswith("format")]
    if fmts:
        rows = []
        for r in fmts:
            if "error" in r:
                rows.append([r.get("format", "?"), "error: " + r["error"].replace("|", "\\|"), "", "", ""])
                continue
            rows.append([r["format"], f"{r['nll']:.3f}", f"{r['prefill_tps']:,.0f}",
                         f"{r['decode_topk_tps']:.1f}", f"{r['peak_rss_mib']:,.0f}"])
        w = fmts[0].get("window", "?")
        parts.append(f"**Weight formats on CPU** (4,096 tokens of the same text, LM-Infinite W = {w}, 2 threads; "
                     "prefill here computes logits at every position for the NLL; decode: median of 16 tokens with "
                     "top-k on; memory: the process's peak RSS):\n\n" + markdown_table(
                         ["weights", "NLL (nats)", "prefill tok/s", "decode tok/s", "peak RSS MiB"], rows))
    return "\n\n".join(parts) if parts else None


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--window", type=int, default=2048)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--chunk", type=int, default=rc.PREFILL_CHUNK)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quant", default="float32,int8,nf4-fp32,nf4-bf16")
    p.add_argument("--speed-chunks", default=None)
    p.add_argument("--speed-from-layers", default=None)
    p.add_argument("--speed-dtypes", default=None, help="weights of the long-context runs (default float32)")
    from pathlib import Path

    run(p.parse_args(), Path(__file__).resolve().parent / "results")
