"""One measurement: prefill a context, then decode, reporting time and memory.

On the CPU each (method, context) runs in a fresh process, whose peak RSS earlier runs cannot distort. On CUDA
one worker process keeps the loaded model across cells (loading a 7B model in 4-bit takes longer than most cells)
and reads each cell's peak from the allocator's counters, reset per cell; ``enable``/``disable`` switch the model
between LM-Infinite and vanilla attention.
"""

from __future__ import annotations

import gc
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import torch
from transformers import DynamicCache

METHODS = ("vanilla", "truncate", "lminfinite", "lminfinite-topk")
PREFILL_REPEATS = 5
REPEAT_BUDGET_S = 60.0


@dataclass
class Measurement:
    method: str
    context: int
    prefill_s: float
    prefill_tok_s: float
    decode_ms: float
    peak_bytes: int
    kv_bytes: int
    error: str = ""
    # Chunked prefills: seconds to the first half of the context within the fastest run, so that
    # scaling (t(n) / t(n/2)) is read from one prefill, free of process-to-process noise.
    half_prefill_s: float = 0.0
    # LM-Infinite on CUDA, with recall too: the same decode through lminfinite.GraphedDecoder (a CUDA graph per token).
    graph_decode_ms: float = 0.0


def run(job: dict) -> dict:
    """Entry point for the worker process (``job`` is a plain dict so it pickles trivially)."""
    torch.set_num_threads(job["threads"])
    set_recall(job.get("recall_settings") or {})
    try:
        return asdict(_measure(**{k: v for k, v in job.items() if k not in ("threads", "recall_settings")}))
    except torch.OutOfMemoryError:
        pass  # freed below, once the exception (and the frames holding the cell's tensors) is gone
    gc.collect()
    torch.cuda.empty_cache()
    return asdict(Measurement(job["method"], job["context"], 0, 0, 0, 0, 0, error="OOM"))


# lminfinite.recall_kernel's module settings a cell may run with (speed.py's --recall-settings)
RECALL_SETTINGS = ("SPAN", "SCORES", "GRAPHED_OPERATORS_FROM")


def set_recall(settings: dict) -> None:
    """Set recall_kernel's module settings in this worker, for the cells it runs from now on."""
    from lminfinite import recall_kernel

    for name, value in settings.items():
        if name not in RECALL_SETTINGS:
            raise ValueError(f"recall setting {name!r} is not one of {', '.join(RECALL_SETTINGS)}")
        setattr(recall_kernel, name, value)


_loaded: dict[tuple, torch.nn.Module] = {}  # the worker's model, kept across cells (one spec per worker)


def _model(model_spec, window, device, dtype, load_in_4bit):
    from benchmarks.models import build_model

    key = (model_spec, window, device, dtype, load_in_4bit)
    if key not in _loaded:
        _loaded.clear()
        _loaded[key] = build_model(model_spec, window=window, device=device, dtype=getattr(torch, dtype),
                                   load_in_4bit=load_in_4bit)
    return _loaded[key]


def _measure(method, context, model_spec, window, device, dtype, load_in_4bit, decode_tokens, prefill_chunk,
             n_starting, topk, recall_prefill=True, repeat_budget_s=REPEAT_BUDGET_S) -> Measurement:
    import lminfinite

    model = lminfinite.disable(_model(model_spec, window, device, dtype, load_in_4bit))
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(context)).to(device)
    ids, new_cache, chunk = _set_up(model, method, ids, window, n_starting, topk, recall_prefill, prefill_chunk)
    _warm_up(model, device, vocab)
    _reset_peak(device)
    baseline = _memory_now(device)  # after the reset: the peak counts from a moment no later, so it is not below

    with torch.no_grad():
        cache, token, (prefill_s, half_prefill_s) = _fastest_prefill(model, ids, new_cache, chunk, device,
                                                                     repeat_budget_s)
        if isinstance(cache, lminfinite.InfiniteCache):
            cache.topk = None  # the model's k: recall on for the lminfinite-topk method's decoding
        token, steps = _decode(model, cache, token, decode_tokens, device)
        graph_ms = _graph_decode_ms(model, cache, token, decode_tokens) if method.startswith("lminfinite") and \
            device.startswith("cuda") else 0.0
    kv = sum(cache.memory().values()) if hasattr(cache, "memory") else _dynamic_bytes(cache)
    return Measurement(method, context, prefill_s, context / prefill_s, 1000 * statistics.median(steps),
                       _above(_peak(device), baseline), kv, half_prefill_s=half_prefill_s, graph_decode_ms=graph_ms)


def _set_up(model, method, ids, window, n_starting, topk, recall_prefill, prefill_chunk):
    """The model switched to ``method``: (the ids it reads, a new cache for each prefill, the prefill's chunk)."""
    import lminfinite

    recall = topk if method.endswith("topk") else 0
    if method.startswith("lminfinite"):
        # On a GPU the middle store stays there up to its budget (80 % of the free memory), then pinned pages.
        lminfinite.enable(model, lminfinite.LMInfiniteConfig(n_starting=n_starting, topk=recall))
        # Documents are read without recall where the app reads them so (recall_prefill off); decoding recalls.
        new_cache = lambda: lminfinite.InfiniteCache(model, topk=None if recall_prefill else 0)  # noqa: E731
        return ids, new_cache, prefill_chunk
    context = ids.shape[1]  # vanilla and truncated attention read it in one forward
    if method == "truncate":
        ids = ids[:, -window:]
    return ids, (lambda: DynamicCache(config=model.config)), context


def _fastest_prefill(model, ids, new_cache, chunk: int, device: str, repeat_budget_s: float):
    """(cache, the next token, (seconds, seconds to the first half)) of the fastest prefill of ``ids``.

    Short prefills are repeated (fresh cache each time) and the fastest kept: one run of a second or two is at
    the mercy of the scheduler; long ones are measured once."""
    timings = []
    while not timings or (len(timings) < PREFILL_REPEATS and sum(t for t, _ in timings) < repeat_budget_s):
        cache = out = None  # the last run's cache must not count towards this one's peak
        gc.collect()
        cache = new_cache()
        start, half = time.perf_counter(), 0.0
        for lo in range(0, ids.shape[1], chunk):
            if lo and lo == ids.shape[1] // 2:
                _sync(device)
                half = time.perf_counter() - start
            out = model(input_ids=ids[:, lo : lo + chunk], past_key_values=cache, use_cache=True, logits_to_keep=1)
        _sync(device)
        timings.append((time.perf_counter() - start, half))
    return cache, out.logits[:, -1:].argmax(-1), min(timings)


def _decode(model, cache, token, decode_tokens: int, device: str):
    """(the next token, seconds per step) of ``decode_tokens`` greedy steps from ``token``."""
    steps = []
    for _ in range(decode_tokens):
        t0 = time.perf_counter()
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        _sync(device)
        steps.append(time.perf_counter() - t0)
    return token, steps


def _graph_decode_ms(model, cache, token, decode_tokens: int) -> float:
    """Median ms per token through a GraphedDecoder, after the step that records its graph."""
    import lminfinite

    decoder = lminfinite.GraphedDecoder(model, cache)
    steps = []
    for _ in range(decode_tokens + 2):  # the first runs the model and records; the second is the first replay
        t0 = time.perf_counter()
        token = decoder(token).argmax(-1)
        torch.cuda.synchronize()
        steps.append(time.perf_counter() - t0)
    if decoder.unrecordable:
        print(f"no CUDA-graph decode: {decoder.unrecordable}", flush=True)
        return 0.0
    if not 1 <= decoder.recordings <= 2:  # with recall, a middle store may grow into a new buffer once meanwhile
        raise RuntimeError(f"{decoder.recordings} CUDA graph recordings for {decode_tokens} steady steps (expected 1)")
    return 1000 * statistics.median(steps[2:])


def _warm_up(model, device, vocab):
    with torch.no_grad():
        model(input_ids=torch.randint(0, vocab, (1, 16), device=device), use_cache=False)
    gc.collect()


def _dynamic_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if t is not None)


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _above(peak: int, baseline: int) -> int:
    """Peak memory above the baseline. Linux counts RSS per thread and folds it in late (up to 64 pages a thread),
    so a run that allocates little can read a peak a few hundred KiB below its baseline: that is none."""
    return max(0, peak - baseline)


def _memory_now(device) -> int:
    if device.startswith("cuda"):
        return torch.cuda.memory_allocated()
    return psutil.Process(os.getpid()).memory_info().rss


class _RssPeak:
    """Peak resident memory from now on. Linux keeps it (VmHWM) and lets a process reset it, which costs
    nothing while the model runs; elsewhere a thread samples RSS every few milliseconds."""

    def __init__(self):
        self.peak, self._stop, self._thread = 0, threading.Event(), None
        if not _reset_high_water_mark():
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()

    def _sample(self):
        process = psutil.Process(os.getpid())
        while not self._stop.is_set():
            self.peak = max(self.peak, process.memory_info().rss)
            self._stop.wait(0.002)

    def stop(self) -> int:
        if self._thread is None:
            return _high_water_mark()
        self._stop.set()
        self._thread.join()
        return max(self.peak, psutil.Process(os.getpid()).memory_info().rss)


def _reset_high_water_mark() -> bool:
    """Linux >= 4.0: writing 5 to clear_refs resets the process's peak RSS to its current RSS."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _high_water_mark() > 0
    except OSError:
        return False


def _high_water_mark() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


_rss: _RssPeak | None = None


def _reset_peak(device):
    global _rss
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    else:
        _rss = _RssPeak()


def _peak(device) -> int:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated()
    return _rss.stop()
