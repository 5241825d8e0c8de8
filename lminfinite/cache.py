"""InfiniteCache: a transformers Cache whose layers keep only what LM-Infinite can still attend to.

Per layer: the first n_starting tokens (unrotated) and the last window - 1 tokens (the token being
computed completes the window) in a ring buffer, rotated into a *frame*: key j is stored as
R(j - frame)·k_j. Queries are rotated by i - frame, so scores depend on i - j only, and the frame moves
forward every window + 2 tokens or so (a re-base rotates the ring once) to keep every angle's offset
below 2·window, and with it the model's rotation tables (rotary.lookup_rows). Steady decoding therefore
writes one row and reads the buffer as it is: no per-token rotation or copy of the window. Layers that
do top-k recall also keep every evicted token once, unrotated, in a MiddleStore. Everything kept across
calls is allocated outside inference mode, so a cache filled under ``torch.inference_mode`` goes on
under ``no_grad`` (``generate``) and back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .config import LMInfiniteConfig
from .context import KeyContext
from .middle_store import MiddleStore
from .modes import outside_inference_mode
from .rotary import Rope


def rebase_interval(window: int) -> int:
    """Tokens the frame may fall behind the next position before the ring is re-rotated: 2·window.

    A re-base moves the frame to the oldest window token, window - 1 behind, so it comes every window + 2
    tokens at most: one rotation of n_starting + window rows per layer, about one row per token. In
    exchange every offset stays below 2·window (plus the call's chunk), which bounds the rotation tables.
    """
    return 2 * window


class InfiniteLayer(CacheLayerMixin):
    """One layer's bounded cache; ``update`` also leaves the call's KeyContext for the attention."""

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(self, config: LMInfiniteConfig, rope: Rope, keep_middle: bool, middle_device=None):
        super().__init__()
        self.config, self.rope = config, rope
        self.middle = MiddleStore(middle_device) if keep_middle else None
        self.start_k = self.start_v = None  # unrotated, positions [0, min(seen, n_starting))
        # Rows [0, n_starting): start keys placed for the current decode step; then the ring, slot(p) below.
        self.ring_k = self.ring_v = None
        self.win_start = 0  # the ring holds positions [win_start, seen)
        self.seen = 0
        self.frame = 0
        self.shared = False  # a snapshot references the ring: copy it before writing
        self.context: KeyContext | None = None

    # -- transformers' layer contract -------------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        n_starting, window = self.config.n_starting, self.config.window_
        shape = (*key_states.shape[:2], n_starting + window, key_states.shape[-1])
        with outside_inference_mode():
            self.ring_k = torch.zeros(shape, dtype=key_states.dtype, device=key_states.device)
            self.ring_v = torch.zeros(shape, dtype=value_states.dtype, device=value_states.device)
            self.start_k, self.start_v = key_states[..., :0, :].clone(), value_states[..., :0, :].clone()
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n_starting, window = self.config.n_starting, self.config.window_
        # Keys arrive rotated into the frame (see patch._rotate_into_frame): R(p - frame)·k_p.
        if key_states.shape[-2] == 1 and self.seen >= n_starting + window - 1:
            self._decode_step(key_states, value_states)
        else:
            self._prefill(key_states, value_states)
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.__init__(self.config, self.rope, self.middle is not None, None if self.middle is None else self.middle.device)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("InfiniteCache does not support beam search")

    # -- the two phases ---------------------------------------------------------------------------
    def _decode_step(self, rotated, value_states) -> None:
        """One token once the window is full: write it into the free slot, evict the oldest afterwards."""
        n_starting, window = self.config.n_starting, self.config.window_
        position = self.seen
        self._writable()
        slot = self._slot(position)
        self.ring_k[..., slot, :] = rotated[..., 0, :]
        self.ring_v[..., slot, :] = value_states[..., 0, :]
        # Start keys at exactly distance `window` from this query: the distance ceiling.
        self.ring_k[..., :n_starting, :] = self.rope.rotate_uniform(self.start_k, position - self.frame - window)
        self.ring_v[..., :n_starting, :] = self.start_v
        middle_k, middle_v = self.middle.view() if self.middle is not None else (None, None)
        self.context = KeyContext(
            rotated, value_states, position, self.frame, self.start_k, self.start_v, middle_k, middle_v,
            decode_keys=self.ring_k, decode_values=self.ring_v,
        )
        oldest = self.win_start  # at distance window - 1 now, beyond the window from the next token on
        if self.middle is not None:
            old = self._slot(oldest)
            self.middle.append(self._unrotate(self.ring_k[..., old : old + 1, :], oldest), self.ring_v[..., old : old + 1, :])
        self.win_start += 1
        self.seen += 1

    def _prefill(self, rotated, value_states) -> None:
        """Any chunk: lay out [start?, window, chunk] in position order, then keep what the future needs."""
        n_starting, window = self.config.n_starting, self.config.window_
        first, c = self.seen, rotated.shape[-2]
        end = first + c
        slots = self._slot(torch.arange(self.win_start, first, device=rotated.device))
        ordered_k, ordered_v = self.ring_k.index_select(-2, slots), self.ring_v.index_select(-2, slots)
        n_start = self.start_k.shape[-2]
        contiguous = self.win_start == n_start  # nothing evicted yet: [0, seen) is all here
        if contiguous:
            start_pos = torch.arange(n_start, device=rotated.device)
            recent_k = _join(self.rope.rotate(self.start_k, start_pos - self.frame), ordered_k, rotated)
            recent_v = _join(self.start_v, ordered_v, value_states)
            recent_start = 0
            new_start = self._unrotate(rotated[..., : max(0, min(n_starting, end) - first), :], first)
            start_k = torch.cat((self.start_k, new_start), dim=-2)
            start_v = torch.cat((self.start_v, value_states), dim=-2)[..., :n_starting, :]
        else:
            recent_k, recent_v = _join(ordered_k, rotated), _join(ordered_v, value_states)
            recent_start, start_k, start_v = self.win_start, self.start_k, self.start_v
        middle_k, middle_v = self.middle.view() if self.middle is not None else (None, None)
        self.context = KeyContext(recent_k, recent_v, recent_start, self.frame, start_k, start_v, middle_k, middle_v)

        # Commit. The next query (position `end`) needs the start and keys at [end - window + 1, end).
        if contiguous and n_start < n_starting:
            with outside_inference_mode():
                self.start_k, self.start_v = start_k.clone(), start_v.clone()
        keep_from = max(min(n_starting, end), end - (window - 1))
        evict_from = max(recent_start, n_starting)
        if self.middle is not None and keep_from > evict_from:
            lo, hi = evict_from - recent_start, keep_from - recent_start
            self.middle.append(self._unrotate(recent_k[..., lo:hi, :], evict_from), recent_v[..., lo:hi, :])
        new_from = max(keep_from, first)
        if end > new_from:
            self._writable()
            new_slots = self._slot(torch.arange(new_from, end, device=rotated.device))
            self.ring_k.index_copy_(-2, new_slots, rotated[..., new_from - first :, :])
            self.ring_v.index_copy_(-2, new_slots, value_states[..., new_from - first :, :])
        self.win_start, self.seen = keep_from, end

    # -- helpers ----------------------------------------------------------------------------------
    def _slot(self, position):
        return self.config.n_starting + position % self.config.window_

    def _unrotate(self, keys: torch.Tensor, first_position: int) -> torch.Tensor:
        offsets = self.frame - torch.arange(first_position, first_position + keys.shape[-2], device=keys.device)
        return self.rope.rotate(keys, offsets)

    def _writable(self) -> None:
        if self.shared:
            with outside_inference_mode():
                self.ring_k, self.ring_v = self.ring_k.clone(), self.ring_v.clone()
            self.shared = False

    def _rebase(self, new_frame: int) -> None:
        """Move the frame forward: R(j - new) k = R(old - new) R(j - old) k, one rotation of the ring."""
        if not self.is_initialized:
            self.frame = new_frame
            return
        offsets = torch.full((self.ring_k.shape[-2],), self.frame - new_frame, device=self.ring_k.device)
        with outside_inference_mode():
            self.ring_k = self.rope.rotate(self.ring_k, offsets)  # a new tensor: snapshots keep the old one
            self.ring_v = self.ring_v.clone() if self.shared else self.ring_v
        self.shared = False
        self.frame = new_frame

    def memory(self) -> dict[str, int]:
        """Bytes: the ring (n_starting decode rows + window slots, preallocated), the unrotated start keys,
        the middle store's rows in use and its capacity beyond them."""
        middle = (0, 0) if self.middle is None else (self.middle.nbytes, self.middle.reserved_bytes)
        if not self.is_initialized:
            return {"starting": 0, "window": 0, "middle": middle[0], "middle_reserved": middle[1]}
        row = 2 * self.ring_k[..., :1, :].numel() * self.ring_k.element_size()  # one key + one value
        n_starting, window = self.config.n_starting, self.config.window_
        return {
            "starting": row * (self.start_k.shape[-2] + n_starting),
            "window": row * window,
            "middle": middle[0],
            "middle_reserved": middle[1],
        }


def _join(*parts: torch.Tensor) -> torch.Tensor:
    """Concatenate along positions, without a copy when only one part holds any (a first chunk)."""
    filled = [part for part in parts if part.shape[-2]]
    return filled[0] if len(filled) == 1 else torch.cat(filled, dim=-2)


@dataclass(frozen=True)
class CacheSnapshot:
    """Everything needed to put a cache back as it was: tensor references and counters."""

    layers: tuple
    seen: int
    epoch: int


_SNAPSHOT_FIELDS = ("is_initialized", "start_k", "start_v", "ring_k", "ring_v", "win_start", "seen", "frame")


class InfiniteCache(Cache):
    """Pass as ``past_key_values`` to ``model(...)`` or ``model.generate(...)`` of an LM-Infinite model.

    ``keep_middle`` (default: the model's ``topk > 0``) keeps evicted tokens so top-k recall can be switched
    on later without re-encoding; ``offload_middle`` (default from the config) keeps them in CPU memory.
    """

    def __init__(self, model, keep_middle: bool | None = None, offload_middle: bool | None = None):
        from .patch import get_state

        state = get_state(model)
        if state is None:
            raise ValueError("InfiniteCache needs an LM-Infinite model: call lminfinite.enable(model) first")
        self.config = state.config
        keep = self.config.topk > 0 if keep_middle is None else keep_middle
        offload = self.config.offload_middle if offload_middle is None else offload_middle
        layers = [
            InfiniteLayer(self.config, state.rope, keep and i >= self.config.topk_from_layer, "cpu" if offload else None)
            for i in range(state.num_layers)
        ]
        super().__init__(layers=layers)
        self._rollbacks: list[int] = []

    @property
    def frame(self) -> int:
        return self.layers[0].frame

    def begin_forward(self) -> int:
        """Called before each forward: move every layer's frame to its oldest window token when the frame
        has fallen too far behind, so rotation offsets stay bounded. Returns the frame to rotate into."""
        first = self.layers[0]
        if first.seen - first.frame > rebase_interval(self.config.window_):
            for layer in self.layers:
                layer._rebase(layer.win_start)
        return self.frame

    @property
    def keeps_middle(self) -> bool:
        return any(layer.middle is not None for layer in self.layers)

    def snapshot(self) -> CacheSnapshot:
        """O(layers): references to the current tensors; the next write to a ring copies it first."""
        layers = []
        for layer in self.layers:
            layer.shared = True
            saved = tuple(getattr(layer, name) for name in _SNAPSHOT_FIELDS)
            layers.append(saved + (0 if layer.middle is None else layer.middle.length,))
        return CacheSnapshot(tuple(layers), self.get_seq_length(), len(self._rollbacks))

    def rollback(self, snap: CacheSnapshot) -> None:
        """Return exactly to ``snap``. A snapshot taken after an older state was restored is no longer valid."""
        if any(fence < snap.seen for fence in self._rollbacks[snap.epoch :]):
            raise ValueError("this snapshot belongs to a branch that was already rolled back")
        if snap.seen > self.get_seq_length():
            raise ValueError("cannot roll forward to a snapshot newer than the cache")
        for layer, saved in zip(self.layers, snap.layers):
            for name, value in zip(_SNAPSHOT_FIELDS, saved):
                setattr(layer, name, value)
            layer.shared, layer.context = True, None
            if layer.middle is not None:
                layer.middle.truncate(saved[-1])
        self._rollbacks.append(snap.seen)

    def memory(self) -> dict[str, int]:
        """Bytes held; the values add up to every tensor the cache keeps.

        starting / window / middle (rows in use), as the app shows them; middle_reserved: the middle store's
        capacity beyond its rows (it grows by doubling; appends fill it first); rotation: the model's rotary
        tables, bounded by rotary.lookup_rows(window) and shared by every cache of the model.
        """
        total = {"starting": 0, "window": 0, "middle": 0, "middle_reserved": 0}
        for layer in self.layers:
            for key, value in layer.memory().items():
                total[key] += value
        total["rotation"] = self.layers[0].rope.nbytes
        return total
