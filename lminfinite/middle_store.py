"""Evicted keys/values kept once for top-k recall: on the model's device while they fit its budget, then in
pinned CPU pages of fixed size.

Where the rows go. The first ones live in one *primary* buffer on the model's device (the GPU, or the CPU for
a CPU model), which grows by an eighth at a time (GROWTH), so recall scans them in one batched product per layer where
they live. On a GPU the primary holds at most ``device_budget`` bytes (InfiniteCache sets it from the memory
free when the cache is made); the rows beyond it, and every row of an offloaded store, go to pages of
``PAGE_ROWS`` rows in pinned CPU memory. A page is allocated once and never grown, so its pinning is paid once
(a growing pinned buffer was re-pinned at every growth: a 32K-token prefill ran at a fifth of its speed).
"""

from __future__ import annotations

import torch

from .kv_bytes import keeps_scan_copy, row_bytes, scan_copy_row_bytes
from .modes import outside_inference_mode
from .rotary import rotate_into
from .scan_copy import ScanCopy, ScanKeys

# Each growth copies the primary's rows into a buffer this much larger, and at most MAX_SPARE_ROWS larger. Doubling
# left up to as much spare capacity as rows (a 16K-row buffer for 8.7K rows). Growing by a quarter made a cache with
# recall larger than a full one (issue "What a user sees": 6.4 GB where a full cache holds 5.3 GB at 124K tokens):
# its spare outweighed the layers below ``topk_from_layer``, which keep no middle rows (5 of Qwen2.5-1.5B's 28, 18 %
# of a full cache). An eighth, and never more than 8,192 rows, keeps the spare under that, for more copying: each
# row is copied about eight times instead of four, one layer's store at a time (under 1 % of a long prefill's time).
GROWTH = 1.125
MAX_SPARE_ROWS = 8192
# Rows per pinned CPU page: 4,096 rows of a Llama-2-7B layer are 64 MiB of keys and values in bfloat16.
PAGE_ROWS = 4096


class MiddleStore:
    """Append-only rows at positions ``[n_starting, n_starting + length)``: the primary's first, then the pages'.

    Appends write past ``length`` (or into a fresh, larger primary: ``GROWTH``; or into a new page), so a prefix
    view taken earlier never changes: that is what makes snapshots and the attention's "before this call" view
    free.

    ``offload``: a GPU model's rows all go to pinned CPU pages (GPU memory stays flat); ``device_budget``: bytes
    the primary may hold on a GPU before rows spill to pages (None: no bound). A CPU model's rows all stay in the
    primary. A copy into a page is queued on the GPU's stream, not waited for; reading the pages and growing wait
    for it, so the CPU never reads a row before it has landed.

    ``scan_copy``: whether a bfloat16 copy of the primary's keys for recall's scan (``scan``, scan_copy.py) is
    wanted; the first append decides from the keys' dtype and device whether it is kept (kv_bytes.keeps_scan_copy).

    ``fixed_shapes``: whether a steady decode step reads the primary through ``fixed_view`` (None: on a GPU).
    """

    def __init__(self, offload: bool = False, device_budget: int | None = None, scan_copy: bool = True,
                 fixed_shapes: bool | None = None):
        self.offload, self.device_budget, self.wants_scan_copy = offload, device_budget, scan_copy
        self.fixed_shapes = fixed_shapes
        self._live: torch.Tensor | None = None  # ``length`` on the primary's device, once fixed_view was asked for
        self.keys: torch.Tensor | None = None  # the primary's buffers, rows [0, primary_rows) in use
        self.values: torch.Tensor | None = None
        self.scan: ScanCopy | None = None
        self.pages: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.primary_cap: int | None = None  # rows the primary may hold (None: any), fixed at the first append
        self.pinned_pages = False  # pages of a GPU model's store are pinned, so copies into them are queued
        self.length = 0
        self._landing = None  # a torch.cuda.Event after the last queued GPU-to-CPU copy

    @property
    def length(self) -> int:
        """Rows in use."""
        return self._length

    @length.setter
    def length(self, rows: int) -> None:
        self._length = rows
        if self._live is not None:
            self._live.fill_(rows)  # a kernel with the number as its argument: queued, no sync

    @property
    def device(self) -> torch.device | None:
        """The CPU for an offloaded store, else None: its rows follow the model's (persist.py records it)."""
        return torch.device("cpu") if self.offload else None

    @property
    def primary_rows(self) -> int:
        return self.length if self.primary_cap is None else min(self.length, self.primary_cap)

    def append(self, keys: torch.Tensor, values: torch.Tensor,
               rotation: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Rows after the last; ``rotation`` (cos, sine half-negated: rotary.rotate_into's) rotates the keys as
        they are written into the primary, where a copy would have followed a rotation (a decode step's evicted key)."""
        n = keys.shape[-2]
        if n == 0:
            return
        if self.keys is None and not self.pages:
            self._place(keys, keys.device)
        into_primary = n if self.primary_cap is None else max(0, min(n, self.primary_cap - self.length))
        if rotation is not None and into_primary < n:  # a page takes rotated rows
            rotated = torch.empty_like(keys)
            rotate_into(rotated, keys, *rotation)
            keys, rotation = rotated, None
        if into_primary:
            self._append_primary(keys[..., :into_primary, :], values[..., :into_primary, :], rotation)
        if into_primary < n:
            self._append_pages(keys[..., into_primary:, :], values[..., into_primary:, :])

    def _place(self, like: torch.Tensor, model_device: torch.device, dtype: torch.dtype | None = None) -> None:
        """Fix the primary's row cap for rows shaped like ``like`` (in ``dtype``, default theirs) of a model on
        ``model_device``: none for a CPU model, 0 for an offloaded GPU store, else the budget's rows."""
        self.pinned_pages = model_device.type == "cuda"
        batch, kv_heads, _, head_dim = like.shape
        if model_device.type == "cpu" and (self.device_budget is None or self.offload):
            self.primary_cap = None
        elif self.offload:
            self.primary_cap = 0
        elif self.device_budget is None:
            self.primary_cap = None
        else:
            itemsize = (dtype or like.dtype).itemsize
            self.primary_cap = self.device_budget // (batch * row_bytes(kv_heads, head_dim, itemsize))

    def _append_primary(self, keys: torch.Tensor, values: torch.Tensor,
                        rotation: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        needed = self.length + keys.shape[-2]
        if self.keys is None or needed > self.keys.shape[-2]:
            held = 0 if self.keys is None else self.keys.shape[-2]
            grown = max(needed, min(int(GROWTH * held), held + MAX_SPARE_ROWS), 64)
            capacity = grown if self.primary_cap is None else min(grown, self.primary_cap)
            self._reallocate(keys, values, capacity, keys.device)
        rows = self.keys[..., self.length : needed, :]
        if rotation is None:
            rows.copy_(keys)
        else:
            rotate_into(rows, keys, *rotation)
        self.values[..., self.length : needed, :] = values
        if self.scan is not None:
            self.scan.write(self.length, rows)
        self.length = needed

    def _append_pages(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Rows past the primary's cap, page by page; each page is allocated (pinned, from a GPU) when first reached."""
        done, n = 0, keys.shape[-2]
        while done < n:
            row = self.length - self.primary_cap  # the next row's place among the paged rows
            page, offset = divmod(row, PAGE_ROWS)
            if page == len(self.pages):
                self.pages.append((self._page_like(keys), self._page_like(values)))
            take = min(n - done, PAGE_ROWS - offset)
            for buffer, source in zip(self.pages[page], (keys, values)):
                self._write(buffer[..., offset : offset + take, :], source[..., done : done + take, :])
            done += take
            self.length += take

    def _page_like(self, like: torch.Tensor) -> torch.Tensor:
        shape = (*like.shape[:-2], PAGE_ROWS, like.shape[-1])
        with outside_inference_mode():  # written in place by later calls, whatever their mode
            return torch.empty(shape, dtype=like.dtype, device="cpu", pin_memory=self.pinned_pages)

    def restore(self, keys: torch.Tensor, values: torch.Tensor, model_device, dtype: torch.dtype) -> None:
        """Hold exactly these rows (a saved store, wherever it was read to) in ``dtype``: one copy on the model's
        device, taken as the primary, when they all belong there; else the primary's share copied there and the
        rest into pages. A scan copy is made anew where one is kept."""
        model_device = torch.device(model_device)
        self.__init__(self.offload, self.device_budget, self.wants_scan_copy, self.fixed_shapes)
        self._place(keys, model_device, dtype)
        n = keys.shape[-2]
        into_primary = n if self.primary_cap is None else min(n, self.primary_cap)
        if into_primary == n:
            keys, values = (t.to(model_device, dtype, copy=True) for t in (keys, values))
            self._reallocate(keys, values, n, model_device, take=True)
            if self.scan is not None:
                self.scan.write(0, keys)
            self.length = n
            return
        if into_primary:
            self._append_primary(keys[..., :into_primary, :].to(model_device, dtype),
                                 values[..., :into_primary, :].to(model_device, dtype))
        self._append_pages(keys[..., into_primary:, :].to(dtype=dtype), values[..., into_primary:, :].to(dtype=dtype))

    def _reallocate(self, keys, values, capacity: int, device, take: bool = False) -> None:
        """Primary buffers for ``capacity`` rows holding the rows in use (``take``: ``keys`` and ``values``
        themselves). Every buffer is allocated before any replaces the old one: an out-of-memory error here leaves
        the store as it was (``restore`` emptied it first)."""
        scan = self.scan
        if self.keys is None and keeps_scan_copy(self.wants_scan_copy, keys.dtype, device.type):
            scan = ScanCopy()
        grown_keys = keys if take else self._grow(self.keys, keys, capacity, device)
        grown_values = values if take else self._grow(self.values, values, capacity, device)
        grown_scan = None if scan is None else scan.grown(keys, capacity, self.primary_rows)
        self.keys, self.values, self.scan = grown_keys, grown_values, grown_scan

    def _grow(self, old: torch.Tensor | None, like: torch.Tensor, capacity: int, device) -> torch.Tensor:
        shape = (*like.shape[:-2], capacity, like.shape[-1])
        with outside_inference_mode():  # appended to in place by later calls, whatever their mode
            new = torch.empty(shape, dtype=like.dtype, device=device)
        rows = self.primary_rows
        if old is not None and rows:
            new[..., :rows, :] = old[..., :rows, :]
        return new

    def _write(self, rows: torch.Tensor, source: torch.Tensor) -> None:
        if source.device.type == "cuda":
            rows.copy_(source, non_blocking=True)  # into pinned memory: queued, see the class docstring
            self._landing = torch.cuda.Event()
            self._landing.record(torch.cuda.current_stream(source.device))
        else:
            rows.copy_(source)

    def _settle(self) -> None:
        """Wait until every queued copy into a page has landed in CPU memory."""
        if self._landing is not None:
            self._landing.synchronize()
            self._landing = None

    def view(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Every row in use, as one tensor each: the primary's rows themselves when nothing is paged, else a copy
        on the CPU joining the primary and the pages (for saving)."""
        if self.length == 0:
            return None, None
        primary_k, primary_v, pages = self.attention_view()
        if not pages:
            return primary_k, primary_v
        parts = ([(primary_k.cpu(), primary_v.cpu())] if primary_k is not None else []) + list(pages)
        return torch.cat([k for k, _ in parts], dim=-2), torch.cat([v for _, v in parts], dim=-2)

    def attention_view(self):
        """(primary keys, primary values, pages): the rows in use where they live, as KeyContext takes them."""
        rows = self.primary_rows
        primary = (self.keys[..., :rows, :], self.values[..., :rows, :]) if rows else (None, None)
        paged = self.length - rows
        if not paged:
            return (*primary, ())
        self._settle()
        pages = []
        for keys, values in self.pages:
            take = min(paged, PAGE_ROWS)
            if take <= 0:
                break
            pages.append((keys[..., :take, :], values[..., :take, :]))
            paged -= take
        return (*primary, tuple(pages))

    def fixed_view(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(keys, values, live): the primary's whole buffers, and on their device the number of rows in use (rows
        from it on are not). What a steady decode step reads of it is then the same tensors at every step until the
        store grows, with the count changing in place, so one CUDA graph can stand for the step (graphed.py). None
        where the store offers no such view: not asked for (``fixed_shapes``; by default only on a GPU, where the
        graph pays for scanning the spare rows), nothing held yet, rows in pages, or a scan copy."""
        wanted = self.fixed_shapes if self.fixed_shapes is not None else (
            self.keys is not None and self.keys.device.type == "cuda")
        if not wanted or self.keys is None or self.pages or self.scan is not None:
            return None
        if self._live is None:
            with outside_inference_mode():  # written in place at every append, whatever the caller's mode
                self._live = torch.full((), self._length, dtype=torch.long, device=self.keys.device)
        return self.keys, self.values, self._live

    def scan_view(self) -> ScanKeys | None:
        """The scan copy of the primary's rows in use, where the store keeps one."""
        if self.scan is None or self.primary_rows == 0:
            return None
        return self.scan.view(self.primary_rows)

    def truncate(self, length: int) -> None:
        if length > self.length:
            raise ValueError(f"cannot grow the middle store by truncation ({self.length} -> {length})")
        self.length = length

    def _row_bytes(self) -> int:
        buffer = self.keys if self.keys is not None else self.pages[0][0]
        batch, kv_heads, _, head_dim = buffer.shape
        return batch * row_bytes(kv_heads, head_dim, buffer.element_size())

    @property
    def nbytes(self) -> int:
        """Bytes of the rows in use (the capacity beyond them is reusable slack)."""
        if self.keys is None and not self.pages:
            return 0
        return self.length * self._row_bytes()

    @property
    def paged_bytes(self) -> int:
        """Bytes of the rows in use that live in CPU pages (part of ``nbytes``)."""
        if not self.pages:
            return 0
        return (self.length - self.primary_rows) * self._row_bytes()

    @property
    def scan_bytes(self) -> int:
        """Bytes of the copy of the rows in use that recall scans (the scan copy)."""
        if self.scan is None:
            return 0
        batch, kv_heads, _, head_dim = self.keys.shape
        return self.primary_rows * batch * scan_copy_row_bytes(kv_heads, head_dim)

    @property
    def allocated_bytes(self) -> int:
        tensors = [t for pair in self.pages for t in pair]
        if self.keys is not None:
            tensors += [self.keys, self.values]
        scan = 0 if self.scan is None else self.scan.allocated_bytes
        return sum(t.numel() * t.element_size() for t in tensors) + scan

    @property
    def reserved_bytes(self) -> int:
        """Capacity beyond the rows in use: held, and filled by the next appends before the store grows (and the
        scan copy's per-head maxima, a few bytes)."""
        return self.allocated_bytes - self.nbytes - self.scan_bytes
