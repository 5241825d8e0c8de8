"""The median time of one call of a kernel, eager and replayed from a CUDA graph: the kernel benchmarks' clock
(recall_kernel.py, decode_span.py)."""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.measure import _sync
from lminfinite.graphed import CudaGraph


def timed(run, device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _sync(device.type)
        start = time.perf_counter()
        run()
        _sync(device.type)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def timed_graph(run, repeats: int) -> float:
    """Median time of one replay of ``run`` recorded into a CUDA graph (ten replays timed at once, so the launch
    of one does not count)."""
    graph = CudaGraph()  # the library's own recording (graphed.py): captured on a side stream
    graph.record(run)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / 10)
    return statistics.median(times)
