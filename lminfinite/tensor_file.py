"""Tensors to one safetensors file and back, without a second copy of them in memory.

A cache's middle store is a view of a larger buffer (it grows ahead of its rows), so it is not contiguous, and
safetensors' own writer wants contiguous tensors: a copy of the whole store just to save it, gigabytes for a
long context. Here each tensor is written as the contiguous pieces it is made of (one head's rows, say), in
the safetensors format (an 8-byte little-endian header length, a JSON header with dtype, shape and offsets,
then the bytes), which safetensors reads back as usual. Reading is lazy for the same reason: ``TensorFile``
hands out one tensor at a time, so restoring a cache never holds the file's tensors and the cache at once.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

import safetensors
import torch

from .atomic_file import replacing

_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
           torch.bool: "BOOL"}


def write_tensors(tensors: dict[str, torch.Tensor], metadata: dict[str, str], path) -> None:
    """One safetensors file at ``path``, replaced atomically (atomic_file.replacing): a crash mid-save leaves the
    previous file whole. Tensors may be views, non-contiguous, or on a GPU: nothing is copied whole."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _DTYPES:
            raise ValueError(f"{name}: dtype {tensor.dtype} cannot be saved")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with replacing(path) as tmp:
        with open(tmp, "wb") as file:
            file.write(struct.pack("<Q", len(encoded)))
            file.write(encoded)
            for tensor in tensors.values():
                _write_pieces(file, tensor.detach())


def _write_pieces(file, tensor: torch.Tensor) -> None:
    """Row-major bytes of ``tensor``, from its largest contiguous pieces."""
    if tensor.is_contiguous():
        if tensor.numel():
            file.write(memoryview(tensor.cpu().reshape(-1).view(torch.uint8).numpy()))
        return
    for piece in tensor.unbind(0):
        _write_pieces(file, piece)


class TensorFile(Mapping):
    """An open safetensors file as a read-only mapping of its tensors, each read when asked for. Use it as a
    context manager; ``metadata`` is the file's string metadata."""

    def __init__(self, path: str | Path):
        self._handle = safetensors.safe_open(str(path), framework="pt", device="cpu")
        self._file = self._handle.__enter__()
        self.metadata = dict(self._file.metadata() or {})
        self._names = list(self._file.keys())

    def __enter__(self) -> "TensorFile":
        return self

    def __exit__(self, *exc) -> None:
        self._handle.__exit__(*exc)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._names:
            raise KeyError(name)
        return self._file.get_tensor(name)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
