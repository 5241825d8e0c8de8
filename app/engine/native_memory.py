"""Memory the model's kernels and the C allocator keep outside torch's tensors, bounded so that a long session
stays flat (issue "Right answers": memory flat across 50 questions).

Measured with heaptrack on Qwen2.5-Coder-0.5B: the process grew about 40 MB a question while torch's live
tensors and Python's objects stayed flat. Two causes, one remedy each:

- oneDNN compiles a primitive for each matmul shape it meets and keeps up to 1,024 of them, and torch's ideep
  layer keeps as many primitive descriptors in a cache of its own. Every question brings new shapes (its length,
  the reader's prompt, the key count at each step): about 9 and 4 MB a question, until those caps. A capacity of
  ``KERNEL_CACHE_CAPACITY`` still holds every shape a decode step or a prefill chunk reuses. Both read their
  capacity once, at their first matmul: ``bound_kernel_caches`` must run before the model does (``load_runtime``
  calls it first).
- glibc keeps the pages an answer freed (its reader's cache, the question's temporaries) in its arenas, where
  fragmentation keeps them from ever being reused whole; ``trim_heap`` hands them back after each operation.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

KERNEL_CACHE_CAPACITY = 64
CAPACITY_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's; torch's ideep layer's


def bound_kernel_caches() -> None:
    """Cap oneDNN's and ideep's caches of compiled matmuls, unless the user set a variable (their value wins)."""
    for variable in CAPACITY_VARIABLES:
        os.environ.setdefault(variable, str(KERNEL_CACHE_CAPACITY))


def _glibc():
    """glibc, for malloc_trim; None on other C libraries (musl, macOS), where there is nothing to trim."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _glibc()


def trim_heap() -> None:
    """Return the C heap's free pages to the system (a few milliseconds; nothing on a non-glibc system)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
