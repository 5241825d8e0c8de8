"""InfiniteCache: a transformers Cache whose layers keep only what LM-Infinite can still attend to.

Per layer: the first n_starting tokens, the last window - 1 tokens (the token being computed completes
the window), and, for layers that do top-k recall, every evicted token once in a MiddleStore. Keys are
stored unrotated; positions are implicit in the token counts, so no absolute angle is ever formed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .config import LMInfiniteConfig
from .context import KeyContext
from .middle_store import MiddleStore


class InfiniteLayer(CacheLayerMixin):
    """One layer's bounded cache; ``update`` also leaves the call's KeyContext for the attention."""

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(self, config: LMInfiniteConfig, keep_middle: bool, middle_device=None):
        super().__init__()
        self.config = config
        self.middle = MiddleStore(middle_device) if keep_middle else None
        self.start_k = self.start_v = None  # positions [0, min(seen, n_starting))
        self.win_k = self.win_v = None  # positions [win_start, seen)
        self.win_start = 0
        self.seen = 0
        self.context: KeyContext | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        empty = key_states[..., :0, :]
        self.start_k = self.win_k = empty.clone()
        self.start_v = self.win_v = value_states[..., :0, :].clone()
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n_starting, window = self.config.n_starting, self.config.window_
        n_start_stored = self.start_k.shape[-2]
        contiguous = self.win_start == n_start_stored  # nothing evicted yet: [0, seen) is all here
        if contiguous:
            recent_k = torch.cat((self.start_k, self.win_k, key_states), dim=-2)
            recent_v = torch.cat((self.start_v, self.win_v, value_states), dim=-2)
            recent_start = 0
        else:
            recent_k = torch.cat((self.win_k, key_states), dim=-2)
            recent_v = torch.cat((self.win_v, value_states), dim=-2)
            recent_start = self.win_start
        middle_k, middle_v = self.middle.view() if self.middle is not None else (None, None)
        if contiguous:
            start_k, start_v = recent_k[..., :n_starting, :], recent_v[..., :n_starting, :]
        else:
            start_k, start_v = self.start_k, self.start_v
        self.context = KeyContext(recent_k, recent_v, recent_start, start_k, start_v, middle_k, middle_v)

        # Commit: the next query (position `end`) needs keys at [end - window + 1, end) besides the start.
        end = recent_start + recent_k.shape[-2]
        if contiguous and n_start_stored < n_starting:
            self.start_k = recent_k[..., : min(n_starting, end), :].clone()
            self.start_v = recent_v[..., : min(n_starting, end), :].clone()
        keep_from = max(min(n_starting, end), end - (window - 1))
        evict_from = max(recent_start, n_starting)
        if self.middle is not None and keep_from > evict_from:
            self.middle.append(
                recent_k[..., evict_from - recent_start : keep_from - recent_start, :],
                recent_v[..., evict_from - recent_start : keep_from - recent_start, :],
            )
        self.win_k = recent_k[..., keep_from - recent_start :, :].clone()
        self.win_v = recent_v[..., keep_from - recent_start :, :].clone()
        self.win_start = keep_from
        self.seen = end
        return recent_k, recent_v

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.__init__(self.config, self.middle is not None, None if self.middle is None else self.middle.device)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("InfiniteCache does not support beam search")

    def memory(self) -> dict[str, int]:
        def size(*ts):
            return sum(t.numel() * t.element_size() for t in ts if t is not None)

        return {
            "starting": size(self.start_k, self.start_v),
            "window": size(self.win_k, self.win_v),
            "middle": 0 if self.middle is None else self.middle.nbytes,
        }


@dataclass(frozen=True)
class CacheSnapshot:
    """Everything needed to put a cache back as it was: tensor references (never mutated) and lengths."""

    layers: tuple
    seen: int
    epoch: int


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
        n_layers = state.num_layers
        layers = [
            InfiniteLayer(self.config, keep and i >= self.config.topk_from_layer, "cpu" if offload else None)
            for i in range(n_layers)
        ]
        super().__init__(layers=layers)
        self._rollbacks: list[int] = []

    @property
    def keeps_middle(self) -> bool:
        return any(layer.middle is not None for layer in self.layers)

    def snapshot(self) -> CacheSnapshot:
        """O(layers): references to the current tensors, which later updates replace rather than modify."""
        layers = tuple(
            (l.is_initialized, l.start_k, l.start_v, l.win_k, l.win_v, l.win_start, l.seen,
             0 if l.middle is None else l.middle.length)
            for l in self.layers
        )
        return CacheSnapshot(layers, self.get_seq_length(), len(self._rollbacks))

    def rollback(self, snap: CacheSnapshot) -> None:
        """Return exactly to ``snap``. A snapshot taken after an older state was restored is no longer valid."""
        if any(fence < snap.seen for fence in self._rollbacks[snap.epoch :]):
            raise ValueError("this snapshot belongs to a branch that was already rolled back")
        if snap.seen > self.get_seq_length():
            raise ValueError("cannot roll forward to a snapshot newer than the cache")
        for layer, saved in zip(self.layers, snap.layers):
            init, layer.start_k, layer.start_v, layer.win_k, layer.win_v, layer.win_start, layer.seen, mid = saved
            layer.is_initialized = init
            layer.context = None
            if layer.middle is not None:
                layer.middle.truncate(mid)
        self._rollbacks.append(snap.seen)

    def memory(self) -> dict[str, int]:
        """Bytes held, split as the app shows them: starting / window / middle store."""
        total = {"starting": 0, "window": 0, "middle": 0}
        for layer in self.layers:
            for key, value in layer.memory().items():
                total[key] += value
        return total
