"""Integer copies of the weights for decoding on the CPU: an answer token reads every weight once, so it is bound by
memory traffic, and a weight read as 4 or 8 bits is read two to four times faster than as bfloat16.

Decoding Qwen2.5-Coder-1.5B on 2 threads spent 87 % of each token's 260 ms in the linear layers' matrix-vector
products. The bundled models come from GGUF files whose weights were already quantized, so most of them lie exactly
on a 4-bit grid: Q4_K stores each group of 32 weights as ``offset + step * q`` with ``q`` in 0..15. ``fit_int4``
finds that grid again in the dequantized weights (to bfloat16 rounding) and keeps the codes: the same weights, a
quarter of the bytes. A weight that lies on no such grid (Q6_K, Q8_0, float) is kept as int8 with one scale per
output row, the closest PyTorch's CPU kernels come. Prefill (many rows at once) keeps the bfloat16 weights: there
the matrix unit is compute-bound and the integer kernels are several times slower. The kernels are fed bfloat16
rows, in a float32 model too (a CPU without bfloat16 units runs the model in float32, cpu_dtype.py): on such a CPU
(AMD EPYC, AVX2 only, 1 thread) a 1536 x 8960 product of one row took 1.8-3.8 ms through the 4-bit copy fed
bfloat16, 29-37 ms fed float32, and 5.8-7.9 ms through float32's own weights. The row is rounded to bfloat16 going
in, as a bfloat16 model's is, and the product comes back in the model's dtype.

The copies are made once per converted model and cached beside it (``decode-weights.safetensors``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch
from torch import nn

from lminfinite.atomic_file import replacing
from lminfinite.tensor_file import TensorFile

log = logging.getLogger(__name__)

GROUP = 32  # weights per 4-bit group: Q4_K's sub-block, and a group size PyTorch's int4 CPU kernel takes
ROWS_DTYPE = torch.bfloat16  # what the integer kernels are fed, whatever the model's dtype (module docstring)
DECODE_ROWS = 1  # a forward of one token uses the integer copy (an answer: one token at a time); the int8 kernel
# crashed the process on a 4-row forward inside Qwen2.5-Coder-1.5B (torch 2.13), so more rows go to the dense layer
ON_GRID = 0.1  # a weight is on its group's grid when it lies within this fraction of a step of a grid point
INT4_GROUPS = 0.99  # a weight matrix is kept in 4 bits when at least this share of its groups lie on a grid
SIDECAR = "decode-weights.safetensors"
FORMAT = 1


class CopyKind(StrEnum):
    INT4 = "int4"
    INT8 = "int8"


@dataclass(frozen=True)
class Int4Grid:
    """Codes 0..15 (two to a byte, low nibble first), and per group the step and the value of code 0."""

    codes: torch.Tensor  # uint8 [out, in / 2]
    steps: torch.Tensor  # float32 [out, in / GROUP]
    offsets: torch.Tensor  # float32 [out, in / GROUP]
    exact_share: float  # groups whose weights all lay on their grid

    def unpacked(self) -> torch.Tensor:
        """The codes one to an element, [out, in]."""
        return torch.stack([self.codes & 0xF, self.codes >> 4], dim=-1).reshape(self.codes.shape[0], -1)

    def dequantize(self) -> torch.Tensor:
        codes = self.unpacked().float()
        grouped = codes.reshape(codes.shape[0], -1, GROUP)
        return (grouped * self.steps[..., None] + self.offsets[..., None]).reshape(codes.shape)


def fit_int4(weight: torch.Tensor, rows_per_block: int = 1024) -> Int4Grid:
    """The 4-bit grid each group of GROUP weights lies on: for a group of a Q4_K matrix, the codes it used span
    ``0..n`` of its grid for some n ≤ 15, so the step is the group's range over n. Tried from n = 15 down, each
    group keeping the first n that puts all its weights on grid points; a group that fits none keeps n = 15 (the
    nearest grid points: ``exact_share`` counts the groups that fitted). Fitted ``rows_per_block`` rows at a time
    (memory)."""
    out_features, in_features = weight.shape
    parts = [_fit_rows(weight[lo:lo + rows_per_block]) for lo in range(0, out_features, rows_per_block)]
    fitted = sum(part[3] for part in parts) / (out_features * in_features // GROUP)
    return Int4Grid(*(torch.cat([part[i] for part in parts]) for i in range(3)), fitted)


def _fit_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    out_features, in_features = weight.shape
    grouped = weight.detach().float().reshape(out_features, in_features // GROUP, GROUP)
    low, high = grouped.amin(-1), grouped.amax(-1)
    span = high - low
    steps = torch.where(span > 0, span / 15, torch.ones_like(span))
    fitted = torch.zeros_like(span, dtype=torch.bool)
    for n in range(15, 0, -1):
        todo = (~fitted).nonzero(as_tuple=True)
        if not len(todo[0]):
            break
        step = torch.where(span[todo] > 0, span[todo] / n, torch.ones_like(span[todo]))
        scaled = (grouped[todo] - low[todo][:, None]) / step[:, None]
        on_grid = ((scaled - scaled.round()).abs() <= ON_GRID).all(-1)
        hit = (todo[0][on_grid], todo[1][on_grid])
        steps[hit] = step[on_grid]
        fitted[hit] = True
    codes = ((grouped - low[..., None]) / steps[..., None]).round().clamp(0, 15).to(torch.uint8)
    codes = codes.reshape(out_features, in_features)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), steps, low, int(fitted.sum())


@dataclass(frozen=True)
class Int8Rows:
    """Int8 weights with one scale per output row (symmetric)."""

    values: torch.Tensor  # int8 [out, in]
    scales: torch.Tensor  # float32 [out]

    def dequantize(self) -> torch.Tensor:
        return self.values.float() * self.scales[:, None]


def fit_int8(weight: torch.Tensor) -> Int8Rows:
    rows = weight.detach().float()
    scales = (rows.abs().amax(1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    return Int8Rows((rows / scales[:, None]).round().clamp(-127, 127).to(torch.int8), scales)


SAMPLE_ROWS = 64  # rows tried first: a matrix on no grid (most of a Q6_K one) is not searched through


def fits_kernels(weight: torch.Tensor) -> bool:
    """Shapes PyTorch's CPU kernels take safely: whole groups, and output rows in blocks of 16 (the int8 kernel
    crashed on a 101-row matrix in a test, reading past its end)."""
    out_features, in_features = weight.shape
    return in_features % GROUP == 0 and out_features % 16 == 0


def fit(weight: torch.Tensor) -> Int4Grid | Int8Rows:
    """4 bits where the matrix lies on a 4-bit grid, else int8 rows."""
    out_features, in_features = weight.shape
    if fits_kernels(weight):
        sample = torch.randperm(out_features, generator=torch.Generator().manual_seed(0))[:SAMPLE_ROWS]
        if fit_int4(weight[sample]).exact_share < INT4_GROUPS:
            return fit_int8(weight)
        grid = fit_int4(weight)
        if grid.exact_share >= INT4_GROUPS:
            return grid
    return fit_int8(weight)


class DecodeLinear(nn.Module):
    """A linear layer that multiplies a few rows by an integer copy of its weight, and more rows by the layer
    itself (``dense``, unchanged and still the model's parameter)."""

    def __init__(self, dense: nn.Linear, copy: Int4Grid | Int8Rows):
        super().__init__()
        self.dense = dense
        self.kind = CopyKind.INT4 if isinstance(copy, Int4Grid) else CopyKind.INT8
        if isinstance(copy, Int4Grid):
            codes = copy.unpacked().to(torch.int32)
            self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2),
                                 persistent=False)
            # the kernel's weight is (code - 8) * scale + zero, per group; [in / GROUP, out, 2]
            zeros = copy.offsets + 8 * copy.steps
            self.register_buffer("scales_zeros", torch.stack([copy.steps, zeros], -1).transpose(0, 1).contiguous()
                                 .to(ROWS_DTYPE), persistent=False)
        else:
            self.register_buffer("values", copy.values, persistent=False)
            self.register_buffer("scales", copy.scales.to(ROWS_DTYPE), persistent=False)

    @property
    def weight(self) -> torch.Tensor:  # what code reading ``layer.weight`` (its dtype, its device) expects
        return self.dense.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows > DECODE_ROWS or x.dtype != self.dense.weight.dtype:
            return self.dense(x)
        flat = x.reshape(rows, x.shape[-1]).to(ROWS_DTYPE).contiguous()  # the kernels read it as one block
        if self.kind is CopyKind.INT4:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_zeros)
        else:
            out = torch.ops.aten._weight_int8pack_mm(flat, self.values, self.scales)
        out = out.to(x.dtype)
        if self.dense.bias is not None:
            out = out + self.dense.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The model's linear layers: every one is read once per answer token."""
    return [(name, module) for name, module in model.named_modules() if type(module) is nn.Linear]


def fit_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every linear layer's integer copy, as tensors named for the sidecar file."""
    tensors: dict[str, torch.Tensor] = {}
    for name, layer in linear_layers(model):
        if not fits_kernels(layer.weight):
            continue
        copy = fit(layer.weight)
        if isinstance(copy, Int4Grid):
            tensors.update({f"{name}.int4.codes": copy.codes, f"{name}.int4.steps": copy.steps,
                            f"{name}.int4.offsets": copy.offsets})
        else:
            tensors.update({f"{name}.int8.values": copy.values, f"{name}.int8.scales": copy.scales})
    return tensors


def copies_from(tensors: Mapping[str, torch.Tensor], name: str) -> Int4Grid | Int8Rows | None:
    if f"{name}.int4.codes" in tensors:
        return Int4Grid(tensors[f"{name}.int4.codes"], tensors[f"{name}.int4.steps"],
                        tensors[f"{name}.int4.offsets"], 1.0)
    if f"{name}.int8.values" in tensors:
        return Int8Rows(tensors[f"{name}.int8.values"], tensors[f"{name}.int8.scales"])
    return None


@contextmanager
def cached_copies(model: nn.Module, folder: Path | None) -> Iterator[Mapping[str, torch.Tensor]]:
    """The copies from ``folder``'s sidecar when it was made for this model, each read when asked for (loading all
    at once doubled the peak memory); else fitted now and written there (atomically; a folder that cannot be
    written only costs the fitting at the next start too)."""
    sidecar = folder / SIDECAR if folder is not None else None
    names = {name for name, layer in linear_layers(model) if fits_kernels(layer.weight)}
    if sidecar is None or not matches(sidecar, names):
        tensors = fit_model(model)
        if sidecar is None or not write(sidecar, tensors):
            yield tensors
            return
        del tensors
    with TensorFile(sidecar) as stored:
        yield stored


def matches(sidecar: Path, names: set[str]) -> bool:
    """Whether ``sidecar`` is readable, of this FORMAT, and holds copies of exactly the layers ``names``."""
    if not sidecar.is_file():
        return False
    try:
        with TensorFile(sidecar) as stored:
            return stored.metadata.get("format") == str(FORMAT) and {k.rsplit(".", 2)[0] for k in stored} == names
    except Exception as exc:  # noqa: BLE001 - a damaged sidecar is made again
        log.warning("decode weights in %s unreadable (%s); fitting them again", sidecar, exc)
        return False


def write(sidecar: Path, tensors: dict[str, torch.Tensor]) -> bool:
    """Write ``tensors`` to ``sidecar`` atomically; False (and nothing left behind) where it cannot."""
    from safetensors.torch import save_file

    try:
        with replacing(sidecar) as temporary:
            save_file({k: v.contiguous() for k, v in tensors.items()}, temporary, metadata={"format": str(FORMAT)})
        return True
    except OSError as exc:
        log.warning("could not cache decode weights in %s: %s", sidecar.parent, exc)
        return False


def use_for_decoding(model: nn.Module, folder: Path | None = None) -> dict[str, int]:
    """Swap each linear layer for a DecodeLinear over it (nn.Module.set_submodule); returns how many layers took
    each kind. Tied weights stay tied: the dense layer is the same module."""
    kinds = dict.fromkeys(CopyKind, 0)
    with cached_copies(model, folder) as tensors:
        for name, layer in linear_layers(model):
            copy = copies_from(tensors, name)
            if copy is None:
                continue
            swapped = DecodeLinear(layer, copy)
            model.set_submodule(name, swapped)
            kinds[swapped.kind] += 1
    return kinds
