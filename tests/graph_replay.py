"""ReplayedOps: a CUDA graph's contract on the CPU, so the tests can check what a graph would replay.

A CUDA graph records the kernels a forward launches with their arguments as they were: tensors by their storage,
numbers by value. On replay no Python runs. ReplayedOps records the aten operations of a forward the same way
(below autograd, through a TorchDispatchMode) and replays them: tensors that existed before the recording by
identity, tensors made during it by the operation that made them, every other argument as recorded. A forward
that decides anything from a Python number that changes between steps replays wrongly here as on a GPU, and one
that reads a tensor into Python (a device sync, which a CUDA graph refuses to record) fails to record.

Unlike a CUDA graph, recording here also runs the forward; GraphedDecoder records a step whose effects on the
cache repeat the step just run, so running it twice changes nothing.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default}


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []  # (func, args, kwargs, output leaves' slots); tensor args as ("made", slot) or ("held", tensor)
        self.slots: dict[int, int] = {}  # id of a tensor made during the recording -> its slot
        self.made: list[torch.Tensor] = []  # keeps them alive, so their ids stay theirs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNCS:
            raise RuntimeError(f"a recorded step reads a tensor into Python ({func}): a CUDA graph cannot record that")
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        bind = lambda x: (("made", self.slots[id(x)]) if id(x) in self.slots else ("held", x))  # noqa: E731
        recorded_args = tree_map(lambda x: bind(x) if isinstance(x, torch.Tensor) else x, (args, kwargs))
        slots = []
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor):
                self.slots[id(leaf)] = len(self.made)
                self.made.append(leaf)
                slots.append(self.slots[id(leaf)])
            else:
                slots.append(None)
        self.ops.append((func, *recorded_args, slots))
        return out


class ReplayedOps:
    """``record(forward)`` -> forward's output tensor; ``replay()`` writes the replayed output into that tensor,
    as a CUDA graph rewrites its output buffer."""

    def record(self, forward):
        with _Recorder() as recorder:
            output = forward()
        self._ops, self._output_slot = recorder.ops, recorder.slots[id(output)]
        self.output = output
        return output

    def replay(self) -> None:
        made: dict[int, torch.Tensor] = {}
        resolve = lambda x: (made[x[1]] if x[0] == "made" else x[1]) if _is_binding(x) else x  # noqa: E731
        for func, args, kwargs, slots in self._ops:
            out = func(*tree_map(resolve, args, is_leaf=_is_binding), **tree_map(resolve, kwargs, is_leaf=_is_binding))
            for leaf, slot in zip(tree_flatten(out)[0], slots):
                if slot is not None:
                    made[slot] = leaf
        with torch.inference_mode():  # as a graph writes its buffer, whatever mode it was recorded in
            self.output.copy_(made[self._output_slot])


def _is_binding(x) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and x[0] in ("made", "held") and (
        x[0] == "held" and isinstance(x[1], torch.Tensor) or x[0] == "made" and isinstance(x[1], int))
