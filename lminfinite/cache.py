"""InfiniteCache: a transformers Cache of InfiniteLayers (layer.py), one per model layer, owned by one sequence.

Besides the layers it holds what belongs to its sequence rather than to the model: snapshots and rollback, the
bytes it keeps, and the recall k its forwards attend with (``topk``; None follows the model's config). A model
shared by several sessions thus serves each with its own k, set on the session's cache, without re-patching.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from transformers.cache_utils import Cache

from .config import LMInfiniteConfig, require_int
from .decode_step import DecodeStep, StepKind
from .forward_rotation import ForwardRotation
from .layer import InfiniteLayer
from .layer_state import LayerState
from .model_state import get_state


def _free_share(model, config: LMInfiniteConfig) -> int | None:
    """Bytes of GPU memory the middle stores of a new cache may hold: the config's share of what is free now on the
    model's GPU, counting what PyTorch's allocator holds unused (a freed cache's blocks stay reserved: on an H200,
    a second 128K-token cache saw half the memory free, spilled, and decoded at 1 s a token); None (no bound) for a
    model on the CPU."""
    parameter = next(model.parameters(), None)
    if parameter is None or parameter.device.type != "cuda":
        return None
    device = parameter.device
    free, _ = torch.cuda.mem_get_info(device)
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int((free + unused) * config.middle_device_share)


@dataclass(frozen=True)
class CacheSnapshot:
    """Everything needed to put a cache back as it was: each layer's snapshot (tensor references and counters)."""

    layers: tuple[LayerState, ...]
    seen: int
    epoch: int


class InfiniteCache(Cache):
    """Pass as ``past_key_values`` to ``model(...)`` or ``model.generate(...)`` of an LM-Infinite model.

    ``keep_middle`` (default: the model's ``topk > 0``) keeps evicted tokens so top-k recall can be switched
    on later without re-encoding; ``offload_middle`` (default from the config) keeps them in pinned CPU pages;
    ``middle_device_bytes`` (default: the config's ``middle_device_share`` of the free GPU memory, on a GPU) bounds
    what the middle stores hold on the model's device before their rows go to pinned CPU pages; ``topk``
    (default None: the model's) is the recall k of this cache's forwards, and may change between them.
    ``recall_fixed_shapes`` (default None: on a GPU) makes a steady decode step scan each middle store's whole
    buffer with its spare rows masked, so a CUDA graph can stand for a step that recalls (MiddleStore.fixed_view).
    ``window_fixed_shapes`` (default None: on a GPU) makes a decode step before the window is full attend over the
    ring's window rows in use, a prefix counted on the device, so a CUDA graph stands for those steps too (an
    answer read in a short context decodes through one from its first token; decode_step.py, filling.py).
    """

    def __init__(self, model, keep_middle: bool | None = None, offload_middle: bool | None = None,
                 topk: int | None = None, middle_device_bytes: int | None = None,
                 recall_fixed_shapes: bool | None = None, window_fixed_shapes: bool | None = None):
        state = get_state(model)
        if state is None:
            raise ValueError("InfiniteCache needs an LM-Infinite model: call lminfinite.enable(model) first")
        self.config = state.config
        keep = self.config.topk > 0 if keep_middle is None else keep_middle
        offload = self.config.offload_middle if offload_middle is None else offload_middle
        keeping = [keep and i >= self.config.topk_from_layer for i in range(state.num_layers)]
        total = middle_device_bytes if middle_device_bytes is not None else _free_share(model, self.config)
        budget = None if total is None or not any(keeping) else total // sum(keeping)
        layers = [InfiniteLayer(self.config, state.rope, keeps, offload, budget, recall_fixed_shapes,
                                window_fixed_shapes) for keeps in keeping]
        super().__init__(layers=layers)
        self._model = weakref.ref(model)  # to refuse clearly a forward after lminfinite.disable(model)
        self.topk = topk
        self._rollbacks: list[int] = []
        self._recall_config: tuple | None = None  # (model config, topk, that config with this k)
        self._step: DecodeStep | None = None  # the next decode step's slot and rotations (decode_step.py)
        self._recording = False
        self._forward_plan: ForwardRotation | None = None  # the forward under way's (plan_rotation)
        self._rotated = False  # this forward's queries and keys came rotated into the frame (forward_rotation.py)

    def __getstate__(self) -> dict:
        """A pickled cache (torch.save) leaves its model behind: a weak reference does not pickle."""
        return {**self.__dict__, "_model": None, "_step": None, "_forward_plan": None}

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """Every layer of a forward: its keys and values in, its KeyContext out (layer.py). Before the first
        layer, what the whole forward needs: a model still LM-Infinite, the frames re-based when due, and for a
        decode step its DecodeStep, unless the forward is being recorded (``recording``)."""
        if layer_idx == 0:
            plan = self._forward_plan
            if plan is None:  # the model's rotary embedding did not run a plan of ours: prepared here
                self._check_model()
                if not self._recording:
                    self.prepare_forward(key_states.shape[-2])
            self._rotated = plan is not None and plan.applied
        return self.layers[layer_idx].update(key_states, value_states, self._step, advance=not self._recording,
                                             rotated=self._rotated)

    def plan_rotation(self, tokens: int) -> ForwardRotation:
        """Before a forward of ``tokens`` tokens (patch.py's hook on the model): prepare it, unless it is being
        recorded, and say how its queries and keys are rotated into the frame (forward_rotation.py)."""
        self._check_model()
        if not self._recording:
            self.prepare_forward(tokens)
        first = self.layers[0]
        step = tokens == 1 and first.step_kind is not None and self._step is not None
        self._forward_plan = ForwardRotation(self, first.seen - first.frame, self._step if step else None)
        return self._forward_plan

    def end_forward(self) -> None:
        """After the forward (patch.py's hook, also when it raised): its plan is done with."""
        self._forward_plan = None

    def _check_model(self) -> None:
        model = self._model() if self._model is not None else None
        if model is not None and get_state(model) is None:
            raise RuntimeError("this InfiniteCache's model is no longer LM-Infinite (lminfinite.disable): enable "
                               "it again to go on, or use a new cache of the plain model")

    def prepare_forward(self, tokens: int) -> None:
        """Before a forward of ``tokens`` tokens: re-base the frames that are due, and load the DecodeStep if it is
        one decode step (steady or filling: InfiniteLayer.step_kind). A forward does this itself; a recorded one is
        prepared by whoever replays it."""
        for layer in self.layers:
            layer.rebase_if_due()
        first = self.layers[0]
        if tokens == 1 and first.step_kind is not None:
            ring = first.ring_k
            if self._step is None or not self._step.fits(ring.dtype, ring.device):
                self._step = DecodeStep.allocate(ring.shape[-1], ring.dtype, ring.device, self.config.n_starting,
                                                 self.config.window_)
            first.load_step(self._step, evicts=self.keeps_middle)

    def replay_buffers(self, model_config: LMInfiniteConfig, observed: bool = False) -> tuple | None:
        """The step's kind, the recall k and the tensors a recorded decode step of this cache reads and writes (a
        recording stands for a step only while they are the same), or None when its next step
        cannot be replayed from a recording: the last forward was not a decode step of the same kind (so the
        DecodeStep may not be the one the next step loads, e.g. after a rollback or a reset), a snapshot holds a
        ring (the step must copy it before writing), or, in a steady step, a layer recalls from a store without a
        fixed-shape view
        (MiddleStore.fixed_view: on the CPU by default, or rows in pages) or while ``observed`` (the model's
        observers are told what recall picks; a replay runs no Python to tell them). A recalling layer's store
        buffers and its count of rows are among the tensors: when the store grows, the step is recorded again.
        Middle tokens kept without recall are fine: ``advance`` moves the evicted one into the store after the step."""
        config, first = self._with_topk(model_config), self.layers[0]
        kind = first.step_kind
        if self._step is None or self._step.position != first.seen - 1 or kind is None or self._step.kind is not kind:
            return None
        if not self._step.fits(first.ring_k.dtype, first.ring_k.device):
            return None
        recall = []
        for i, layer in enumerate(self.layers):
            if layer.shared:
                return None
            if config.uses_topk(i) and kind is StepKind.STEADY:  # a filling step has nothing to recall
                fixed = None if observed or layer.middle is None else layer.middle.fixed_view()
                if fixed is None:
                    return None
                recall.extend(fixed)
        rings = (t for layer in self.layers for t in layer.tensors())
        return (kind, config.topk, *self._step.tensors, *rings, *recall)

    @contextmanager
    def recording(self):
        """The forwards inside are recorded to be replayed, not run (a CUDA graph, graphed.py): they neither
        prepare their step nor count it; the replayer calls ``prepare_forward`` before and ``advance`` after."""
        self._recording = True
        try:
            yield
        finally:
            self._recording = False

    def advance(self) -> None:
        """Count one replayed steady decode step in every layer, as the step itself does when it runs."""
        for layer in self.layers:
            layer.advance(self._step)

    @property
    def topk(self) -> int | None:
        """Middle tokens recalled per query and head in this cache's forwards (0: off; None: the model's)."""
        return self._topk

    @topk.setter
    def topk(self, value: int | None) -> None:
        if value is not None:
            require_int("topk", value, minimum=0)
        self._topk = value

    @property
    def keeps_middle(self) -> bool:
        return any(layer.middle is not None for layer in self.layers)

    def attention_config(self, model_config: LMInfiniteConfig, layer_idx: int) -> LMInfiniteConfig:
        """The config layer ``layer_idx`` of this cache's next forward attends with: the model's, with this cache's
        recall k. Refuses a model re-enabled with another window, and recall once evicted tokens were dropped."""
        if (self.config.window, self.config.n_starting) != (model_config.window, model_config.n_starting):
            raise ValueError(
                "this InfiniteCache was built for window/n_starting "
                f"{self.config.window}/{self.config.n_starting}, the model now uses "
                f"{model_config.window}/{model_config.n_starting}: start a new cache"
            )
        config = self._with_topk(model_config)
        layer = self.layers[layer_idx]
        if config.uses_topk(layer_idx) and layer.middle is None and layer.win_start > config.n_starting:
            raise ValueError(
                "top-k recall is on but this InfiniteCache keeps no middle tokens: create it with "
                "InfiniteCache(model, keep_middle=True)"
            )
        return config

    def _with_topk(self, model_config: LMInfiniteConfig) -> LMInfiniteConfig:
        if self.topk is None or self.topk == model_config.topk:
            return model_config
        memo = self._recall_config
        if memo is None or memo[0] is not model_config or memo[1] != self.topk:
            memo = self._recall_config = (model_config, self.topk, replace(model_config, topk=self.topk))
        return memo[2]

    def snapshot(self) -> CacheSnapshot:
        """O(layers): references to the current tensors; the next write to a ring copies it first."""
        layers = tuple(layer.snapshot() for layer in self.layers)
        return CacheSnapshot(layers, self.get_seq_length(), len(self._rollbacks))

    def rollback(self, snap: CacheSnapshot) -> None:
        """Return exactly to ``snap``. A snapshot taken after an older state was restored is no longer valid."""
        if any(fence < snap.seen for fence in self._rollbacks[snap.epoch :]):
            raise ValueError("this snapshot belongs to a branch that was already rolled back")
        if snap.seen > self.get_seq_length():
            raise ValueError("cannot roll forward to a snapshot newer than the cache")
        for layer, saved in zip(self.layers, snap.layers):
            layer.rollback(saved)
        self._rollbacks.append(snap.seen)

    def memory(self) -> dict[str, int]:
        """Bytes held; the values add up to every tensor the cache keeps.

        starting / window / middle (rows in use), as the app shows them; middle_scan: the middle store's bfloat16
        copy of its keys for recall's scan, where it keeps one (scan_copy.py); middle_reserved: the middle store's
        capacity beyond its rows (under an eighth of them and 8,192 rows: middle_store.GROWTH; appends fill it first); rotation: the model's rotary
        tables, bounded by rotary.lookup_rows(window) and shared by every cache of the model, and this cache's
        DecodeStep. Per token, these are kv_bytes.span_bytes.
        """
        total = {"starting": 0, "window": 0, "middle": 0, "middle_scan": 0, "middle_reserved": 0}
        for layer in self.layers:
            for key, value in layer.memory().items():
                total[key] += value
        total["rotation"] = self.layers[0].rope.nbytes + (0 if self._step is None else self._step.nbytes)
        return total
