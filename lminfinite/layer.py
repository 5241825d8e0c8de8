"""InfiniteLayer: one layer's bounded cache, and the update contract LM-Infinite keeps with transformers.

The contract. transformers' attention modules call ``keys, values = past_key_values.update(k, v, layer_idx)``
and hand both results to the attention function as its ``key`` and ``value``: a cache layer returns what
attention attends to. For LM-Infinite that is not two tensors but one structure, a :class:`KeyContext` (the
recent keys in the layer's frame, the unrotated start keys, the middle store, the decode rows), so ``update``
returns that context in both places, ``(ctx, ctx)``. Only LM-Infinite's attention function reads it; any other
attention given an InfiniteCache fails on its first tensor operation instead of attending to the wrong keys.

What a layer keeps: the first n_starting tokens (unrotated) and the last window - 1 tokens (the token being
computed completes the window) in a ring buffer, rotated into the layer's *frame*: key j is stored as
R(j - frame)·k_j. ``update`` receives keys rotated into the frame by the model's own rotary embedding
(forward_rotation.py), or else as projected and rotates them itself; queries are rotated by i - frame the same way
(or by KeyContext.rotate_queries), so scores depend on i - j only. The frame moves forward when it falls
``rebase_interval`` behind (``rebase_if_due``, before a forward; a re-base rotates the ring once, in place),
which bounds every rotation offset and with it the model's rotation tables (rotary.lookup_rows). Steady
decoding writes one row and reads the buffer as it is: no per-token rotation or copy of the window; what
depends on its position comes in a DecodeStep (decode_step.py), so every step runs the same kernels; where asked
(``fixed_window``, on a GPU by default), a one-token call before the window is full does too, over the ring's
rows in use, a prefix counted on the device (``StepKind.FILLING``, filling.py), so a CUDA graph can stand for it. Layers
that do top-k recall also keep every evicted token once, unrotated, in a MiddleStore. Everything kept across
calls is allocated outside inference mode, so a cache filled under ``torch.inference_mode`` goes on under
``no_grad`` (``generate``) and back.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import CacheLayerMixin

from .config import LMInfiniteConfig
from .key_context import KeyContext
from .decode_step import DecodeStep, StepKind
from .kv_bytes import row_bytes
from .layer_state import MIDDLE_TENSORS, POSITIONS, TENSORS, LayerCounters, LayerState
from .middle_store import MiddleStore
from .modes import outside_inference_mode
from .rotary import Rope, apply_rotation, rotate_into


def rebase_interval(window: int) -> int:
    """Tokens the frame may fall behind the next position before the ring is re-rotated: 2·window.

    A re-base moves the frame to the oldest window token, window - 1 behind, so it comes every window + 2
    tokens at most: one rotation of n_starting + window rows per layer, about one row per token. In
    exchange every offset stays below 2·window (plus the call's chunk), which bounds the rotation tables.
    """
    return 2 * window


def window_start(seen: int, n_starting: int, window: int) -> int:
    """The oldest position the ring holds after ``seen`` tokens: the last window - 1 (the next token completes
    the window), never the starting tokens; those before it, past the start, are in the middle store."""
    return max(min(n_starting, seen), seen - (window - 1))


class InfiniteLayer(CacheLayerMixin):
    """One layer's bounded cache; ``update`` stores the call's keys and returns its KeyContext (see above)."""

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(self, config: LMInfiniteConfig, rope: Rope, keep_middle: bool, offload: bool = False,
                 device_budget: int | None = None, fixed_shapes: bool | None = None,
                 fixed_window: bool | None = None):
        super().__init__()
        self.config, self.rope = config, rope
        self.fixed_window = fixed_window  # filling steps over fixed-shape buffers (None: on a GPU)
        self.middle = (MiddleStore(offload, device_budget, config.recall_scan_copy, fixed_shapes) if keep_middle
                       else None)
        self.start_k = self.start_v = None  # unrotated, positions [0, min(seen, n_starting))
        # Rows [0, n_starting): start keys placed for the current decode step; then the ring, slot(p) below.
        self.ring_k = self.ring_v = None
        self.win_start = 0  # the ring holds positions [win_start, seen)
        self.seen = 0
        self.frame = 0
        self.shared = False  # a snapshot references the ring: copy it before writing

    # -- transformers' layer contract -------------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate the ring for a first call of ``key_states``' tokens: zeros in every row but the slots that call
        fills (clearing them first would write the ring twice: 2 × 33 MB per layer for a 4K prefill at
        Llama-2-7B's shape). No row is left as the allocator found it, so a saved ring holds nothing else."""
        n_starting, window = self.config.n_starting, self.config.window_
        shape = (*key_states.shape[:2], n_starting + window, key_states.shape[-1])
        with outside_inference_mode():
            self.ring_k = torch.empty(shape, dtype=key_states.dtype, device=key_states.device)
            self.ring_v = torch.empty(shape, dtype=value_states.dtype, device=value_states.device)
            self.start_k, self.start_v = self.ring_k[..., :0, :], self.ring_v[..., :0, :]  # none yet: _commit fills
        tokens = key_states.shape[-2]
        kept_from = window_start(tokens, n_starting, window)  # the first call keeps [kept_from, tokens) in the ring
        empty = [(0, n_starting)] + [(n_starting + slot, n_starting + slot + count)
                                     for slot, count in self._runs(tokens, kept_from + window)]
        for lo, hi in _merged(empty):
            self.ring_k[..., lo:hi, :].zero_()
            self.ring_v[..., lo:hi, :].zero_()
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, step: DecodeStep | None = None,
        advance: bool = True, rotated: bool = False,
    ) -> tuple[KeyContext, KeyContext]:
        """Keep what later calls need of the new keys (as projected, or ``rotated`` into the frame already, with the
        call's queries, by the model's rotary embedding: forward_rotation.py) and values; return what this call
        attends to.

        A one-token step (``step_kind``) reads ``step``, loaded for its position; ``advance=False`` leaves the
        counters to whoever replays a recorded step (graphed.py)."""
        kind = self.step_kind if key_states.shape[-2] == 1 else None
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if kind is not None:
            decode = self._decode_step if kind is StepKind.STEADY else self._filling_step
            ctx = decode(key_states, value_states, step, rotated)
            if advance:
                self.advance(step)
        else:
            keys = key_states if rotated else self.rope.rotate_from(key_states, self.seen - self.frame)
            ctx = self._prefill(keys, value_states)
        ctx.queries_rotated = rotated
        return ctx, ctx

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        middle = self.middle
        self.__init__(self.config, self.rope, middle is not None, middle is not None and middle.offload,
                      None if middle is None else middle.device_budget, None if middle is None else middle.fixed_shapes,
                      self.fixed_window)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("InfiniteCache does not support beam search")

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("InfiniteCache cannot crop (assisted or prompt-lookup decoding): tokens evicted "
                                  "from the window are not kept in order to go back; use snapshot() and rollback()")

    @property
    def steady(self) -> bool:
        """The window is full: a one-token call is a steady decode step."""
        return self.seen >= self.config.n_starting + self.config.window_ - 1

    @property
    def step_kind(self) -> StepKind | None:
        """What a one-token call is now: STEADY once the window is full; FILLING before, where this layer keeps
        fixed window shapes, its start keys are complete and the token's every key lies within its window (so no
        key is at the distance ceiling: position < window); None (a one-token prefill) otherwise, and before the
        first call (no ring yet, no step loaded)."""
        if not self.is_initialized:
            return None
        if self.steady:
            return StepKind.STEADY
        fixed = self.fixed_window if self.fixed_window is not None else self.ring_k.device.type == "cuda"
        if fixed and self.config.n_starting <= self.seen < self.config.window_:
            return StepKind.FILLING
        return None

    def load_step(self, step: DecodeStep, evicts: bool) -> None:
        """Fill ``step`` for this layer's next token, of ``step_kind`` (every layer of a cache is at the same
        position and frame); ``evicts``: whether some layer's middle store takes the oldest token after it."""
        if self.step_kind is StepKind.FILLING:
            step.load_filling(self.rope, position=self.seen, frame=self.frame, slot=self._slot(self.seen),
                              n_starting=self.config.n_starting)
            return
        step.load(self.rope, position=self.seen, frame=self.frame, slot=self._slot(self.seen),
                  window=self.config.window_, recall_distance=self.config.topk_distance, evicts=evicts)

    def rebase_if_due(self) -> None:
        if self.seen - self.frame > rebase_interval(self.config.window_):
            self._rebase(self.win_start)

    def advance(self, step: DecodeStep) -> None:
        """Count a decode step: one more token seen and, in a steady one, the oldest out of the window (into the
        middle store, if this layer keeps one). Python's part of the step, so a replayed step does it too
        (graphed.py). The oldest key is unrotated by the row of the ``step`` it was loaded for as the store writes
        it: 6 launches, where a rotation by a table row and a copy are 13, after every replay in every recall
        layer."""
        if not self.steady:
            self.seen += 1
            return
        oldest = self.win_start  # at distance window - 1 from the step's token, beyond the window from the next on
        if self.middle is not None:
            old = self._slot(oldest)
            self.middle.append(self.ring_k[..., old : old + 1, :], self.ring_v[..., old : old + 1, :],
                               rotation=(step.evict_cos, step.evict_sin))
        self.win_start += 1
        self.seen += 1

    # -- its state: snapshots and rollbacks, saved files (layer_state.py) ------------------------------
    def counters(self) -> LayerCounters:
        return LayerCounters(initialized=bool(self.is_initialized), **{name: getattr(self, name) for name in POSITIONS},
                             middle=None if self.middle is None else self.middle.length)

    def tensors(self) -> tuple:
        """The values of TENSORS (None before the first call), the layer's own."""
        return tuple(getattr(self, name) for name in TENSORS)

    def snapshot(self) -> LayerState:
        """O(1): references to the current tensors; the next write to the ring copies it first."""
        self.shared = True
        return LayerState(self.counters(), self.tensors())

    def rollback(self, state: LayerState) -> None:
        """Return exactly to ``state``, this layer's snapshot; the middle store drops the rows appended since."""
        self.is_initialized = state.counters.initialized
        self._set_positions(state.counters)
        for name, tensor in zip(TENSORS, state.tensors):
            setattr(self, name, tensor)
        self.shared = True
        if self.middle is not None:
            self.middle.truncate(state.counters.middle)

    def export(self) -> tuple[LayerCounters, dict[str, torch.Tensor]]:
        """Everything that rebuilds this layer: its counters, and its tensors by name, the layer's own (views,
        maybe on a GPU): TENSORS once it holds any, then MIDDLE_TENSORS where its middle store holds rows (only
        the rows in use)."""
        counters, tensors = self.counters(), {}
        if self.is_initialized:
            tensors.update(zip(TENSORS, self.tensors()))
        if counters.middle:
            tensors.update(zip(MIDDLE_TENSORS, self.middle.view()))
        return counters, tensors

    def restore(self, counters: LayerCounters, read, dtype: torch.dtype, device: torch.device) -> None:
        """Become the layer ``export`` described: ``read(name, rows)`` gives each of its tensors (of ``rows``
        positions; checked by the caller, persist.py), copied to ``device`` and ``dtype``; the middle store's
        rows are placed as its appends would place them."""
        self._set_positions(counters)
        if not counters.initialized:
            return
        n_starting = self.config.n_starting
        start, ring = min(counters.seen, n_starting), n_starting + self.config.window_
        for name in TENSORS:
            tensor = read(name, start if name.startswith("start_") else ring)
            setattr(self, name, tensor.to(device, dtype, copy=True))
        self.dtype, self.device, self.is_initialized = dtype, device, True
        if counters.middle:
            keys, values = (read(name, counters.middle) for name in MIDDLE_TENSORS)
            self.middle.restore(keys, values, device, dtype)  # one copy each

    def _set_positions(self, counters: LayerCounters) -> None:
        for name in POSITIONS:
            setattr(self, name, getattr(counters, name))

    # -- the two phases ---------------------------------------------------------------------------
    def _decode_step(self, key_states, value_states, step: DecodeStep, rotated_already: bool) -> KeyContext:
        """One token once the window is full: write it into the free slot (``advance`` evicts the oldest). Its
        slot and rotations come from ``step``, so these are the same operations at every position."""
        n_starting = self.config.n_starting
        self._writable()
        rotated = key_states if rotated_already else apply_rotation(key_states, step.cos, step.sin)  # R(p - frame)·k_p
        self.ring_k.index_copy_(-2, step.slot, rotated.detach())
        self.ring_v.index_copy_(-2, step.slot, value_states.detach())
        # Start keys at exactly distance `window` from this query: the distance ceiling.
        rotate_into(self.ring_k[..., :n_starting, :], self.start_k, step.start_cos, step.start_sin)
        self.ring_v[..., :n_starting, :] = self.start_v
        fixed = None if self.middle is None else self.middle.fixed_view()
        middle = self._middle_view() if fixed is None else (fixed[0], fixed[1], None, ())
        return KeyContext(
            rotated, value_states, self.seen, self.frame, self.start_k, self.start_v, *middle,
            # copied now: the count as it is before this step's ``advance`` (below in ``update``, after a replay)
            middle_live=None if fixed is None else fixed[2].clone(),
            decode_keys=self.ring_k, decode_values=self.ring_v, decode_rotation=(step.cos, step.sin),
            decode_recall_rotation=(step.recall_cos, step.recall_sin),
        )

    def _filling_step(self, key_states, value_states, step: DecodeStep, rotated_already: bool) -> KeyContext:
        """One token before the window is full, as a steady step is made (decode_step.py): into its slot, with the
        start keys placed in their own slots at their own distances (positions 0.. in the frame; those slots hold
        nothing else until the ring wraps), and the ring's window rows read up to the token's
        (``step.filled``). Nothing lies beyond the window: no recall."""
        n_starting = self.config.n_starting
        self._writable()
        rotated = key_states if rotated_already else apply_rotation(key_states, step.cos, step.sin)
        self.ring_k.index_copy_(-2, step.slot, rotated.detach())
        self.ring_v.index_copy_(-2, step.slot, value_states.detach())
        own_slots = slice(n_starting, 2 * n_starting)  # positions 0 .. n_starting - 1: _slot(p) = n_starting + p
        rotate_into(self.ring_k[..., own_slots, :], self.start_k, step.placed_cos, step.placed_sin)
        self.ring_v[..., own_slots, :] = self.start_v
        return KeyContext(
            rotated, value_states, self.seen, self.frame, self.start_k, self.start_v,
            decode_keys=self.ring_k[..., n_starting:, :], decode_values=self.ring_v[..., n_starting:, :],
            decode_rotation=(step.cos, step.sin), decode_filled=step.filled,
        )

    def _prefill(self, rotated, value_states) -> KeyContext:
        """Any chunk: lay out [start?, window, chunk] in position order, then keep what the future needs."""
        first, c = self.seen, rotated.shape[-2]
        ordered_k, ordered_v = self._in_order(self.win_start, first)
        if self.win_start == self.start_k.shape[-2]:  # nothing evicted yet: [0, seen) is all here
            ctx = self._contiguous_context(rotated, value_states, ordered_k, ordered_v)
        else:
            ctx = KeyContext(
                _join(ordered_k, rotated), _join(ordered_v, value_states), self.win_start, self.frame,
                self.start_k, self.start_v, *self._middle_view(),
            )
        self._commit(ctx, rotated, value_states, first + c)
        return ctx

    def _contiguous_context(self, rotated, value_states, ordered_k, ordered_v) -> KeyContext:
        """[0, seen + c) all at hand: recent starts at position 0, and the start keys may still be filling."""
        n_starting, first = self.config.n_starting, self.seen
        placed = self.rope.rotate_range(self.start_k, -self.frame, 1) if self.start_k.shape[-2] else self.start_k
        recent_k = _join(placed, ordered_k, rotated)
        recent_v = _join(self.start_v, ordered_v, value_states)
        filling = max(0, n_starting - first)  # the start keys this chunk completes (the start holds min(first, n))
        start_k = _join(self.start_k, self._unrotate(rotated[..., :filling, :], first, keep_rows=True))
        start_v = _join(self.start_v, value_states[..., :filling, :])
        return KeyContext(recent_k, recent_v, 0, self.frame, start_k, start_v, *self._middle_view())

    def _commit(self, ctx: KeyContext, rotated, value_states, end: int) -> None:
        """Keep what the next query (position ``end``) needs: the start, and keys at [end - window + 1, end)."""
        n_starting, window = self.config.n_starting, self.config.window_
        first = self.seen
        if ctx.recent_start == 0 and self.start_k.shape[-2] < n_starting:  # the start keys were still filling
            with outside_inference_mode():
                self.start_k, self.start_v = ctx.start_k.detach().clone(), ctx.start_v.detach().clone()
        keep_from = window_start(end, n_starting, window)
        evict_from = max(ctx.recent_start, n_starting)
        if self.middle is not None and keep_from > evict_from:
            lo, hi = evict_from - ctx.recent_start, keep_from - ctx.recent_start
            self.middle.append(self._unrotate(ctx.recent_k[..., lo:hi, :], evict_from).detach(),
                               ctx.recent_v[..., lo:hi, :].detach())
        new_from = max(keep_from, first)
        if end > new_from:
            self._writable()
            # Detached: under autograd the ring would chain every chunk's graph to the next, memory unbounded.
            self._write_ring(new_from, end, rotated[..., new_from - first :, :].detach(),
                             value_states[..., new_from - first :, :].detach())
        self.win_start, self.seen = keep_from, end

    # -- helpers ----------------------------------------------------------------------------------
    def _middle_view(self):
        if self.middle is None:
            return None, None, None, ()
        keys, values, pages = self.middle.attention_view()
        return keys, values, self.middle.scan_view(), pages

    def _in_order(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ring's keys and values of positions [lo, hi) in position order: a view while they lie in one turn of
        the ring (always, until the window first wraps), else its two runs joined; no index tensor. Callers join it
        with the chunk's own keys, a copy, so nothing they keep aliases the ring that ``_commit`` then writes."""
        n_starting = self.config.n_starting
        runs = [(n_starting + slot, count) for slot, count in self._runs(lo, hi)] or [(n_starting, 0)]
        parts_k = [self.ring_k.narrow(-2, row, count) for row, count in runs]
        parts_v = [self.ring_v.narrow(-2, row, count) for row, count in runs]
        return _join(*parts_k), _join(*parts_v)

    def _write_ring(self, lo: int, hi: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Positions [lo, hi) into their slots: a copy into each run of the ring they fill (two at most)."""
        done = 0
        for slot, count in self._runs(lo, hi):
            row = self.config.n_starting + slot
            self.ring_k.narrow(-2, row, count).copy_(keys.narrow(-2, done, count))
            self.ring_v.narrow(-2, row, count).copy_(values.narrow(-2, done, count))
            done += count

    def _runs(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The window slots of positions [lo, hi) (at most a window of them) as runs of (first slot, count): one
        while they lie in one turn of the ring, two where they wrap. Indexing by runs needs no index tensor."""
        window = self.config.window_
        runs, position = [], lo
        while position < hi:
            slot = position % window
            count = min(hi - position, window - slot)
            runs.append((slot, count))
            position += count
        return runs

    def _slot(self, position):
        return self.config.n_starting + position % self.config.window_

    def _unrotate(self, keys: torch.Tensor, first_position: int, keep_rows: bool = False) -> torch.Tensor:
        """``keep_rows``: the start keys, which every layer of a first prefill unrotates alike (Rope.rotate_range)."""
        if not keys.shape[-2]:  # a later chunk's start keys: none to unrotate, nothing to launch
            return keys
        if keys.shape[-2] == 1:  # a chunk's one evicted token: one table row (a steady step's goes by its DecodeStep)
            return self.rope.rotate_by(keys, self.frame - first_position)
        return self.rope.rotate_range(keys, self.frame - first_position, -1, keep=keep_rows)

    def _writable(self) -> None:
        if self.shared:
            with outside_inference_mode():
                self.ring_k, self.ring_v = self.ring_k.clone(), self.ring_v.clone()
            self.shared = False

    def _rebase(self, new_frame: int) -> None:
        """Move the frame forward: R(j - new) k = R(old - new) R(j - old) k, one rotation of the ring, in place
        (a recorded decode step keeps writing the same buffers) unless a snapshot holds it."""
        offset = self.frame - new_frame
        if self.shared:
            with outside_inference_mode():  # the new ring outlives this call, whatever its grad mode
                self.ring_k, self.ring_v = self.rope.rotate_by(self.ring_k, offset), self.ring_v.clone()
            self.shared = False
        else:
            self.ring_k.copy_(self.rope.rotate_by(self.ring_k, offset))
        self.frame = new_frame

    def memory(self) -> dict[str, int]:
        """Bytes: the ring (n_starting decode rows + window slots, preallocated), the unrotated start keys,
        the middle store's rows in use, their scan copy and the capacity beyond them."""
        middle = (0, 0, 0) if self.middle is None else (
            self.middle.nbytes, self.middle.scan_bytes, self.middle.reserved_bytes)
        if not self.is_initialized:
            return {"starting": 0, "window": 0, "middle": middle[0], "middle_scan": middle[1],
                    "middle_reserved": middle[2]}
        batch, kv_heads, _, head_dim = self.ring_k.shape
        row = batch * row_bytes(kv_heads, head_dim, self.ring_k.element_size())
        return {
            "starting": row * (self.start_k.shape[-2] + self.config.n_starting),
            "window": row * self.config.window_,
            "middle": middle[0],
            "middle_scan": middle[1],
            "middle_reserved": middle[2],
        }


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Row spans [lo, hi), sorted, with touching ones joined: one fill where a run of slots follows the start rows."""
    merged = []
    for lo, hi in sorted(span for span in spans if span[1] > span[0]):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def _join(*parts: torch.Tensor) -> torch.Tensor:
    """Concatenate along positions, without a copy when only one part holds any (a first chunk, a full start)."""
    filled = [part for part in parts if part.shape[-2]] or parts[:1]
    return filled[0] if len(filled) == 1 else torch.cat(filled, dim=-2)
