"""The loaded model shared by every session: one forward at a time, and the LM-Infinite knobs it runs with.

Sessions own their caches; the model and its attention configuration are shared. Top-k recall is a
per-call choice (off while reading documents, on while answering), so every forward states the k it
wants and the runtime re-configures LM-Infinite only when that changes.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from dataclasses import dataclass

import torch

import lminfinite


class OutOfMemory(RuntimeError):
    """The device ran out of memory during a forward; the caller rolls its context back."""


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OutOfMemoryError, the RuntimeError some backends (and bitsandbytes) raise instead, and what CPU
    allocations raise: MemoryError, or torch's DefaultCPUAllocator "can't allocate memory"."""
    if isinstance(exc, (OutOfMemory, torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OUT_OF_MEMORY_MARKERS)


OUT_OF_MEMORY_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "defaultcpuallocator")


@dataclass
class ModelRuntime:
    """Model, tokenizers and device, plus the lock that keeps forwards from interleaving.

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

    def __post_init__(self) -> None:
        self.lock = threading.RLock()
        self.input_device = self.model.get_input_embeddings().weight.device
        text_config = self.model.config.get_text_config()
        self.num_layers = int(text_config.num_hidden_layers)
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        self.stop_ids = tuple(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        self.forward_calls = 0
        self.tokens_forwarded = 0

    @functools.cached_property
    def content_ids(self) -> frozenset[int]:
        """The vocabulary's content tokens, the ones citations count (app/citations.py says why)."""
        from .citations import content_token_ids

        return content_token_ids(self.tokenizer)

    @property
    def device_type(self) -> str:
        return self.input_device.type

    @property
    def window(self) -> int:
        return self.lm_config.window_

    def new_cache(self) -> lminfinite.InfiniteCache:
        """A session cache that keeps evicted tokens, so recall can be switched on for any question."""
        return lminfinite.InfiniteCache(self.model, keep_middle=True, offload_middle=self.offload_middle)

    def set_recall(self, topk: int) -> None:
        """Re-configure top-k middle recall (0: off). Cheap; only hooks are re-registered."""
        state = lminfinite.get_state(self.model)
        if state is not None and state.config.topk == topk:
            return
        lminfinite.enable(self.model, dataclasses.replace(self.lm_config, topk=topk))

    @torch.inference_mode()
    def forward(self, ids: list[int], cache, *, topk: int) -> torch.Tensor:
        """Feed ``ids`` after what ``cache`` holds; returns float32 logits for the token after the last one."""
        with self.lock:
            self.set_recall(topk)
            input_ids = torch.tensor([ids], dtype=torch.long, device=self.input_device)
            try:
                out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError too
                if not is_out_of_memory(exc):
                    raise
                self._release_memory()
                raise OutOfMemory(str(exc)) from exc
            self.forward_calls += 1
            self.tokens_forwarded += len(ids)
            return out.logits[0, -1].float()

    def observe_recall(self, callback):
        """Context manager reporting which middle tokens top-k recall picked (for citations)."""
        return lminfinite.observe_topk(self.model, callback)

    def _release_memory(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
