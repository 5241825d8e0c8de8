"""One measurement in a fresh process: prefill a context, then decode, reporting time and memory.

A fresh process per (method, context) gives a clean peak-memory reading (CUDA max allocated, or the
process's peak RSS) that earlier runs' allocator caches cannot distort.
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


def run(job: dict) -> dict:
    """Entry point for the worker process (``job`` is a plain dict so it pickles trivially)."""
    torch.set_num_threads(job["threads"])
    try:
        return asdict(_measure(**{k: v for k, v in job.items() if k != "threads"}))
    except torch.OutOfMemoryError:
        return asdict(Measurement(job["method"], job["context"], 0, 0, 0, 0, 0, error="OOM"))


def _measure(method, context, model_spec, window, device, dtype, load_in_4bit, decode_tokens, prefill_chunk,
             n_starting, topk) -> Measurement:
    import lminfinite
    from benchmarks.models import build_model

    model = build_model(model_spec, window=window, device=device, dtype=getattr(torch, dtype),
                        load_in_4bit=load_in_4bit)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(context)).to(device)
    if method.startswith("lminfinite"):
        config = lminfinite.LMInfiniteConfig(n_starting=n_starting, topk=topk if method.endswith("topk") else 0,
                                             offload_middle=device != "cpu" and method.endswith("topk"))
        lminfinite.enable(model, config)
        new_cache, chunk = (lambda: lminfinite.InfiniteCache(model)), prefill_chunk
    else:
        new_cache, chunk = (lambda: DynamicCache(config=model.config)), context
        if method == "truncate":
            ids = ids[:, -window:]
    _warm_up(model, device, vocab)
    baseline = _memory_now(device)
    _reset_peak(device)

    timings = []
    with torch.no_grad():
        # Short prefills are repeated (fresh cache each time) and the fastest kept: one run of a second
        # or two is at the mercy of the scheduler; long ones are measured once.
        while not timings or (len(timings) < PREFILL_REPEATS and sum(t for t, _ in timings) < REPEAT_BUDGET_S):
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
        prefill_s, half_prefill_s = min(timings)
        token = out.logits[:, -1:].argmax(-1)
        steps = []
        for _ in range(decode_tokens):
            t0 = time.perf_counter()
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            _sync(device)
            steps.append(time.perf_counter() - t0)
    kv = sum(cache.memory().values()) if hasattr(cache, "memory") else _dynamic_bytes(cache)
    return Measurement(method, context, prefill_s, context / prefill_s, 1000 * statistics.median(steps),
                       _peak(device) - baseline, kv, half_prefill_s=half_prefill_s)


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
