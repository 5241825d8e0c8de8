"""The loaded model shared by every session: one forward at a time, and the LM-Infinite knobs it runs with.

Sessions own their caches; the model and its attention configuration are shared. Top-k recall is a
per-call choice (off while reading documents, on while answering): every forward states the k it wants,
and it is set on that session's cache (``InfiniteCache.topk``), so the shared model is never re-patched
and one session's k never reaches another's forward.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

import lminfinite
from lminfinite.graphed import CudaGraph

from .layer_stop import LayerStop
from .metrics import LiveStats
from .model_gate import ModelGate
from .native_memory import trim_heap


class OutOfMemory(RuntimeError):
    """The device ran out of memory during a forward; the caller rolls its context back."""


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OutOfMemoryError, the RuntimeError some backends (and bitsandbytes) raise instead, and what CPU
    allocations raise: MemoryError, or torch's DefaultCPUAllocator "can't allocate memory"."""
    if isinstance(exc, (OutOfMemory, torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OUT_OF_MEMORY_MARKERS)


# Emptying the CUDA allocator's cache frees memory (cudaFree syncs the device), which must not happen while
# another thread captures a CUDA graph: released sessions free memory from their own threads.
_CUDA_CAPTURE_OR_EMPTY = threading.Lock()


def release_memory() -> None:
    """Give freed memory back to the system: the CUDA allocator's spare blocks, and on CPU glibc's free heap
    pages (without malloc_trim a process stays ~400 MB larger after 15 sessions are freed)."""
    gc.collect()
    if torch.cuda.is_available():
        with _CUDA_CAPTURE_OR_EMPTY:
            torch.cuda.empty_cache()
    trim_heap()


class ExclusiveCudaGraph(CudaGraph):
    """A CUDA graph recorded while no other thread empties the allocator's cache (release_memory)."""

    def record(self, forward):
        with _CUDA_CAPTURE_OR_EMPTY:
            return super().record(forward)


OUT_OF_MEMORY_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "defaultcpuallocator")


@dataclass
class ModelRuntime:
    """Model, tokenizers and device, plus the gate that lets one forward through at a time (model_gate.py).

    ``ingest_tokenizer`` is a second tokenizer instance: documents are tokenised on the reading queue
    while the model queue encodes questions, and a Rust tokenizer must not be shared across threads.
    """

    model: torch.nn.Module
    tokenizer: object
    ingest_tokenizer: object
    name: str
    notice: str
    lm_config: lminfinite.LMInfiniteConfig  # resolved: window and topk_distance filled in
    prefill_chunk: int = 512
    offload_middle: bool = False
    quantization: str = "none"
    dtype: torch.dtype = torch.float32
    bundled_name: str | None = None  # the bundled model's short name (--model), when it is one: the Settings picker
    # What records the decode steps answers replay (decoder_for): ExclusiveCudaGraph on CUDA; None: none
    graph_recorder: Callable[[], object] | None = None

    def __post_init__(self) -> None:
        self.gate = ModelGate()
        self.layer_stop = LayerStop(self.model)
        self.input_device = self.model.get_input_embeddings().weight.device
        text_config = self.model.config.get_text_config()
        self.num_layers = int(text_config.num_hidden_layers)
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        self.stop_ids = tuple(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        self.forward_calls = 0
        self.tokens_forwarded = 0

    @functools.cached_property
    def content_ids(self) -> frozenset[int]:
        """The vocabulary's content tokens, the ones citations count (app/engine/citations.py says why)."""
        from .citations import content_token_ids

        return content_token_ids(self.tokenizer)

    @property
    def device_type(self) -> str:
        return self.input_device.type

    @property
    def window(self) -> int:
        return self.lm_config.window_

    def new_cache(self, keep_middle: bool = True) -> lminfinite.InfiniteCache:
        """A session cache that keeps evicted tokens, so recall can be switched on for any question (``keep_middle``
        False: none, so its memory stays flat however much it reads). Where its steps are recorded
        (``decoder_for``), the steps before its window is full keep fixed shapes, so a graph stands for them too: a
        quoted answer's reader never fills its window (decode_step.py)."""
        return lminfinite.InfiniteCache(self.model, keep_middle=keep_middle, offload_middle=self.offload_middle,
                                        window_fixed_shapes=self.graph_recorder is not None)

    def decoder_for(self, cache) -> lminfinite.GraphedDecoder | None:
        """On CUDA (unless --no-cuda-graphs), a GraphedDecoder of ``cache`` for ``forward``: one launch per answer
        token instead of thousands. Its owner keeps it with the cache and drops it with the cache."""
        if self.graph_recorder is None:
            return None
        return lminfinite.GraphedDecoder(self.model, cache, recorder=self.graph_recorder)

    @torch.inference_mode()
    def forward(self, ids: list[int], cache, *, topk: int, stats: LiveStats | None = None,
                decoder: lminfinite.GraphedDecoder | None = None, owner: object = None,
                cancel: threading.Event | None = None) -> torch.Tensor:
        """Feed ``ids`` after what ``cache`` holds, recalling ``topk`` middle tokens (0: off); returns float32
        logits for the token after the last one. Waits its turn at the gate (``stats`` shows the wait), unless
        the cache's owner holds it already (an answer holds it throughout; ``owner``: whose turn this is, default
        ``cache``: a session's answer reader feeds its own cache in the session's turn). One token without recall
        goes through ``decoder`` when given (decoder_for), which replays a recorded step where it can (with recall
        too, on a GPU: GraphedDecoder says when). Once ``cancel`` is set, a forward of several tokens ends before its
        next decoder layer, raising StoppedMidForward (layer_stop.py): the caller rolls the cache back."""
        with self.gate.turn(cache if owner is None else owner, answer=False, stats=stats):
            cache.topk = topk
            input_ids = torch.tensor([ids], dtype=torch.long, device=self.input_device)
            try:
                if decoder is not None and len(ids) == 1:
                    logits = decoder(input_ids)
                else:
                    with self.layer_stop.watching(cancel if len(ids) > 1 else None):
                        logits = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                                            logits_to_keep=1).logits
            except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError too
                if not is_out_of_memory(exc):
                    raise
                release_memory()
                raise OutOfMemory(str(exc)) from exc
            self.forward_calls += 1
            self.tokens_forwarded += len(ids)
            return logits[0, -1].float()

    def observe_recall(self, callback):
        """Context manager reporting which middle tokens top-k recall picked (for citations)."""
        return lminfinite.observe_topk(self.model, callback)
