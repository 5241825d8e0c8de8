"""Evicted keys/values kept once for top-k recall, in a buffer that grows by a quarter at a time."""

from __future__ import annotations

import torch

from .kv_bytes import keeps_scan_copy, row_bytes, scan_copy_row_bytes
from .modes import outside_inference_mode
from .scan_copy import ScanCopy, ScanKeys

# Each growth copies the rows into a buffer this much larger. Doubling left up to as much spare capacity as rows
# (a 16K-row buffer for 8.7K rows); a quarter keeps the spare under a quarter of the rows, for about twice the
# copying (each row is copied four times on average instead of twice, one layer's store at a time).
GROWTH = 1.25


class MiddleStore:
    """Append-only rows at positions ``[n_starting, n_starting + length)``; ``device`` may be the CPU (offload).

    Appends write past ``length`` (or into a fresh, larger buffer: ``GROWTH``), so a prefix view taken earlier never
    changes: that is what makes snapshots and the attention's "before this call" view free.

    Offloaded from a GPU, an append is a copy queued on the GPU's stream straight into the pinned store, not
    waited for; ``view`` and a growth wait for it, so the CPU never reads a row before it has landed.

    ``scan_copy``: whether a bfloat16 copy of the keys for recall's scan (``scan``, scan_copy.py) is wanted; the
    first append decides from the keys' dtype and device whether it is kept (kv_bytes.keeps_scan_copy).
    """

    def __init__(self, device: torch.device | str | None = None, scan_copy: bool = True):
        self.device = None if device is None else torch.device(device)
        self.wants_scan_copy = scan_copy
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.scan: ScanCopy | None = None
        self.length = 0
        self._landing = None  # a torch.cuda.Event after the last queued GPU-to-CPU append

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        n = keys.shape[-2]
        if n == 0:
            return
        device = self.device or keys.device
        needed = self.length + n
        if self.keys is None or needed > self.keys.shape[-2]:
            capacity = max(needed, int(GROWTH * (0 if self.keys is None else self.keys.shape[-2])), 64)
            self._reallocate(keys, values, capacity, device, keys.device)
        self._write(self.keys[..., self.length : needed, :], keys)
        self._write(self.values[..., self.length : needed, :], values)
        if self.scan is not None:
            self.scan.write(self.length, keys)
        self.length = needed

    def restore(self, keys: torch.Tensor, values: torch.Tensor, model_device: torch.device) -> None:
        """Hold exactly these rows (a saved store, already on its device), with a scan copy made anew where
        one is kept for a model on ``model_device``."""
        self.keys = self.values = self.scan = None
        self.length = 0
        self._reallocate(keys, values, keys.shape[-2], keys.device, model_device, take=True)
        if self.scan is not None:
            self.scan.write(0, keys)
        self.length = keys.shape[-2]

    def _reallocate(self, keys, values, capacity: int, device, model_device, take: bool = False) -> None:
        """Buffers for ``capacity`` rows holding the rows in use (``take``: ``keys`` and ``values`` themselves).
        Every buffer is allocated before any replaces the old one: an out-of-memory error here leaves the store
        as it was (``restore`` emptied it first)."""
        scan = self.scan
        if self.keys is None and keeps_scan_copy(self.wants_scan_copy, keys.dtype, model_device.type):
            scan = ScanCopy()
        grown_keys = keys if take else self._grow(self.keys, keys, capacity, device)
        grown_values = values if take else self._grow(self.values, values, capacity, device)
        grown_scan = None if scan is None else scan.grown(keys, capacity, self.length)
        self.keys, self.values, self.scan = grown_keys, grown_values, grown_scan

    def _write(self, rows: torch.Tensor, source: torch.Tensor) -> None:
        if rows.device.type == "cpu" and source.device.type == "cuda":
            rows.copy_(source, non_blocking=True)  # into pinned memory: queued, see the class docstring
            self._landing = torch.cuda.Event()
            self._landing.record(torch.cuda.current_stream(source.device))
        else:
            rows.copy_(source)

    def _settle(self) -> None:
        """Wait until every queued append has landed in CPU memory."""
        if self._landing is not None:
            self._landing.synchronize()
            self._landing = None

    def _grow(self, old: torch.Tensor | None, like: torch.Tensor, capacity: int, device) -> torch.Tensor:
        shape = (*like.shape[:-2], capacity, like.shape[-1])
        pin = device.type == "cpu" and like.device.type == "cuda"
        self._settle()  # the old rows are read below
        with outside_inference_mode():  # appended to in place by later calls, whatever their mode
            new = torch.empty(shape, dtype=like.dtype, device=device, pin_memory=pin)
        if old is not None and self.length:
            new[..., : self.length, :] = old[..., : self.length, :]
        return new

    def view(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.keys is None or self.length == 0:
            return None, None
        self._settle()
        return self.keys[..., : self.length, :], self.values[..., : self.length, :]

    def scan_view(self) -> ScanKeys | None:
        """The scan copy of the rows in use, where the store keeps one (``view`` gives the rows themselves)."""
        if self.scan is None or self.length == 0:
            return None
        return self.scan.view(self.length)

    def truncate(self, length: int) -> None:
        if length > self.length:
            raise ValueError(f"cannot grow the middle store by truncation ({self.length} -> {length})")
        self.length = length

    @property
    def nbytes(self) -> int:
        """Bytes of the rows in use (the capacity beyond them is reusable slack)."""
        if self.keys is None:
            return 0
        batch, kv_heads, _, head_dim = self.keys.shape
        return self.length * batch * row_bytes(kv_heads, head_dim, self.keys.element_size())

    @property
    def scan_bytes(self) -> int:
        """Bytes of the scan copy of the rows in use."""
        if self.scan is None:
            return 0
        batch, kv_heads, _, head_dim = self.keys.shape
        return self.length * batch * scan_copy_row_bytes(kv_heads, head_dim)

    @property
    def allocated_bytes(self) -> int:
        if self.keys is None:
            return 0
        scan = 0 if self.scan is None else self.scan.allocated_bytes
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size() + scan

    @property
    def reserved_bytes(self) -> int:
        """Capacity beyond the rows in use: held, and filled by the next appends before the store grows (and the
        scan copy's per-head maxima, a few bytes)."""
        return self.allocated_bytes - self.nbytes - self.scan_bytes
