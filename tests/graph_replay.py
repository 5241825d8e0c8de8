"""ReplayedOps: a CUDA graph's contract on the CPU, so the tests can check what a graph would replay.

A CUDA graph records the kernels a forward launches with their arguments as they were: tensors by their storage,
numbers by value. On replay no Python runs. ReplayedOps records the aten operations of a forward the same way
(below autograd, through a TorchDispatchMode) and replays them: tensors that existed before the recording by
identity, tensors made during it by the operation that made them, every other argument as recorded. A forward
that decides anything from a Python number that changes between steps replays wrongly here as on a GPU, and one
that reads a tensor into Python (a device sync, which a CUDA graph refuses to record) fails to record.

Unlike a CUDA graph, recording here also runs the forward; what it writes into memory that existed before the
recording (a cache's rings, say) is put back afterwards, as a graph's capture writes nothing. (Running the step
twice is not harmless: the step just run moved a token into the middle store, which the second run would recall.)
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
        self.held_storages: set[int] = set()  # memory that existed before the recording (a held tensor's)
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # such memory, as it was: (bytes, copy)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNCS:
            raise RuntimeError(f"a recorded step reads a tensor into Python ({func}): a CUDA graph cannot record that")
        kwargs = kwargs or {}
        for arg in tree_flatten((args, kwargs))[0]:
            if isinstance(arg, torch.Tensor) and id(arg) not in self.slots:
                self.held_storages.add(arg.untyped_storage().data_ptr())
        self._save_what_it_writes(func, args, kwargs)
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

    def _save_what_it_writes(self, func, args, kwargs) -> None:
        """Keep a copy of held memory before ``func`` first writes into it (its schema says which arguments)."""
        written = [args[i] if i < len(args) else kwargs.get(a.name) for i, a in enumerate(func._schema.arguments)
                   if a.alias_info is not None and a.alias_info.is_write]
        for tensor in tree_flatten(written)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key in self.held_storages and key not in self.saved:
                memory = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
                self.saved[key] = (memory, memory.clone())

    def put_back(self) -> None:
        """Held memory as it was before the recording (in inference mode, where any tensor may be written)."""
        with torch.inference_mode():
            for memory, copy in self.saved.values():
                memory.copy_(copy)


class ReplayedOps:
    """``record(forward)`` -> forward's output tensor; ``replay()`` writes the replayed output into that tensor,
    as a CUDA graph rewrites its output buffer."""

    def record(self, forward):
        with _Recorder() as recorder:
            output = forward()
        recorder.put_back()
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
