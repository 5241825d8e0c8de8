"""GraphedDecoder: decoding through one recorded CUDA graph of the model's whole forward.

One decoded token runs thousands of small kernels (per layer: norms, projections, rotations, the ring write,
attention); launched one by one from Python, they take longer to launch than the GPU takes to run them. A CUDA
graph launches a recorded forward at once. It records kernels and their arguments, not Python, so it may stand
for a step only while that step would run the same kernels on the same buffers. An InfiniteCache's steady
decode step does (decode_step.py: what depends on the position is loaded into tensors before it), and so does a
step before its window is full where the cache keeps fixed window shapes (on a GPU by default), provided
  - a layer that recalls in a steady step (a filling one has nothing beyond its window) reads its middle store
    through a fixed-shape view (on a GPU by default: the store's whole buffer, spare rows masked by a count kept
    on the device, MiddleStore.fixed_view), and nobody observes what recall picks; when the store grows into a
    new buffer the step is recorded again. The evicted token a layer keeps goes into its store after each replay,
    in Python, as after a step the model ran;
  - the cache's buffers are those the graph was recorded with, none of them held by a snapshot (a snapshot, a
    rollback or a copy-on-write changes them: the next step is recorded again);
  - the model's LM-Infinite state and the input's shape are those it was recorded with.
Any other call runs the model's own forward. Either way the logits are the same (tests/test_lminfinite_graphed.py).
A forward that cannot be recorded at all (it reads a tensor into Python, say, in a hook or a quantization kernel)
is warned about once and decoded without a graph from then on.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from .cache import InfiniteCache
from .modes import outside_inference_mode
from .model_state import get_state


class CudaGraph:
    """A torch.cuda.CUDAGraph behind the two calls GraphedDecoder makes of a recording.

    Captured in "thread_local" mode: only this thread is kept from calls a capture cannot record, so a server's
    other threads (reading free memory, emptying the allocator's cache) neither fail nor break the capture."""

    def __init__(self):
        self._graph = torch.cuda.CUDAGraph()

    def record(self, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Capture on a side stream, entered outside torch.cuda.graph: when ending a broken capture raises, that
        context's exit does not put the caller's stream back. The error raised is the forward's own, if it failed."""
        stream, failed = torch.cuda.Stream(), []
        stream.wait_stream(torch.cuda.current_stream())
        try:
            capture = torch.cuda.graph(self._graph, stream=stream, capture_error_mode="thread_local")
            with torch.cuda.stream(stream), capture:
                try:
                    logits = forward()
                except Exception as exc:
                    failed.append(exc)
                    raise
        except Exception as exc:
            raise failed[0] if failed else exc
        torch.cuda.current_stream().wait_stream(stream)
        return logits

    def replay(self) -> None:
        self._graph.replay()


class GraphedDecoder:
    """``decoder(next_ids)`` -> logits (B, 1, vocab) of the token after ``next_ids`` (B, 1), which the cache counts,
    as ``model(input_ids=next_ids, past_key_values=cache).logits``, replayed from a recording when it may be.

    Replayed logits live in the recording's buffer: read them (argmax, sampling) before the next call. ``recorder``
    makes a recording (default: a CUDA graph); ``recordings`` counts them; ``unrecordable`` says why the model's
    step could not be recorded, if it could not.
    """

    def __init__(self, model, cache: InfiniteCache, recorder: Callable[[], object] = CudaGraph):
        self.model, self.cache, self.recorder = model, cache, recorder
        self.recordings = 0
        self.unrecordable: str | None = None
        self._graph = self._recorded_with = self._input = self._logits = None

    @torch.no_grad()
    def __call__(self, next_ids: torch.Tensor) -> torch.Tensor:
        needs = self._replay_needs(next_ids)
        if needs is not None and self._recorded_with is not None and _same(needs, self._recorded_with):
            self.cache.prepare_forward(1)
            self._input.copy_(next_ids)
            self._graph.replay()
            self.cache.advance()
            return self._logits
        self.release()  # what the recording held is no longer what the step reads
        logits = self._forward(next_ids)  # also warms up what a recording needs (the step, kernels' workspaces)
        self._record(next_ids)
        return logits

    def release(self) -> None:
        """Let go of the recording and the buffers it holds (the cache's rings as they were when recorded): a
        cache rolled back to a snapshot no longer uses them. The next call records again if it can."""
        self._graph = self._recorded_with = self._input = self._logits = None

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, past_key_values=self.cache, use_cache=True).logits

    def _record(self, next_ids: torch.Tensor) -> None:
        """Record the next step if it can be replayed; a recording runs nothing, so the cache stays where the
        step just run left it (that step may have copied a buffer: what it relies on is read afterwards)."""
        needs = self._replay_needs(next_ids)
        if needs is None or self.unrecordable:
            return
        with outside_inference_mode():  # written in place at every replay, whatever the caller's mode
            recorded_input = next_ids.clone()
        graph = self.recorder()
        try:
            with self.cache.recording():
                logits = graph.record(lambda: self._forward(recorded_input))
        except torch.OutOfMemoryError:
            return  # not the model's fault: the next step tries again
        except RuntimeError as exc:
            self.unrecordable = f"{type(exc).__name__}: {exc}".splitlines()[0]
            warnings.warn(f"GraphedDecoder: this model's decode step cannot be recorded ({self.unrecordable}); "
                          "it decodes without a graph", RuntimeWarning, stacklevel=3)
            return
        self._graph, self._recorded_with, self._input, self._logits = graph, needs, recorded_input, logits
        self.recordings += 1

    def _replay_needs(self, next_ids: torch.Tensor) -> tuple | None:
        """What a recording of this step relies on, or None when the step cannot be replayed (module docstring)."""
        state = get_state(self.model)
        if state is None or next_ids.shape[-1] != 1:
            return None
        buffers = self.cache.replay_buffers(state.config, observed=bool(state.observers))
        return None if buffers is None else (state, next_ids.shape, next_ids.device, *buffers)


def _same(needs: tuple, recorded: tuple) -> bool:
    """Tensors and the state by identity (a graph holds their storage); shapes, devices and numbers by value."""
    by_value = (torch.Size, torch.device, int)
    return len(needs) == len(recorded) and all(
        a == b if isinstance(a, by_value) and isinstance(b, by_value) else a is b for a, b in zip(needs, recorded)
    )
