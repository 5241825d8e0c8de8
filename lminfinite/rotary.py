"""Rotary position embedding at relative, bounded offsets.

LM-Infinite never rotates by an absolute position: queries and keys are rotated by offsets from a nearby frame
(layer.py), with these tables, by the model's own rotary embedding where an InfiniteCache planned the forward
(forward_rotation.py), else here.
Angles are computed in float64, so position 10^9 behaves exactly like position 10^4 (the official code
lost precision near 10^7). Small offsets are looked up in a table of ``lookup_rows(window)`` rows, so the
tables a model holds do not grow with the context.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .modes import outside_inference_mode

# RoPE variants whose frequencies do not depend on the sequence length: a fixed inv_freq (and, for
# YaRN, a fixed logit scale) describes them completely.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
SIGN_PAIRS = ((1.0, 1.0), (-1.0, -1.0), (-1.0, 1.0), (1.0, -1.0))  # fill_row's signs of a row's two halves
# rotate_range(keep=True) keeps the rows of runs this short (a prefill's start keys: every layer of a forward asks
# for the same), at most KEPT_RUNS of them: 2 × 64 × head_dim floats each, 64 KB at head_dim 128.
KEPT_RUN_ROWS, KEPT_RUNS = 64, 8


def lookup_rows(window: int) -> int:
    """Offsets a Rope looks up rather than computes: [0, 4·window).

    An InfiniteLayer re-bases once its frame is 2·window behind (layer.rebase_interval), so a decode step
    rotates by at most about 2·window, and a prefill chunk of up to 2·window tokens by at most 4·window.
    Larger offsets (long chunks, calls without an InfiniteCache) are computed the same way and not kept.
    """
    return 4 * window


@dataclass(frozen=True, eq=False)
class Rope:
    """The model's own rotary parameters: ``inv_freq`` (head_dim / 2) and HF's ``attention_scaling``."""

    inv_freq: torch.Tensor
    attention_scaling: float = 1.0
    table_rows: int = 4096  # enable() sets lookup_rows(window)
    _tables: dict = field(default_factory=dict, init=False, repr=False)
    _rows: dict = field(default_factory=dict, init=False, repr=False)  # kept one-offset rows, see _row
    _sign_rows: dict = field(default_factory=dict, init=False, repr=False)  # see _signs
    _runs: dict = field(default_factory=dict, init=False, repr=False)  # kept rows of short runs, see _run_rows

    @property
    def head_dim(self) -> int:
        return 2 * self.inv_freq.numel()

    def cos_sin(self, offsets: torch.Tensor, dtype: torch.dtype,
                max_abs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of ``offsets × inv_freq`` laid out as HF's ``rotate_half`` expects (n, head_dim).

        Offsets below ``table_rows`` are looked up in a table computed once in float64 (sin is odd, cos
        even); larger ones are computed the same way, with identical values, and not kept. ``max_abs``: the
        largest |offset| when the caller knows it, which spares reading it off the device (a sync).
        """
        index = offsets.abs()
        sign = torch.where(offsets < 0, -1.0, 1.0).to(dtype)[:, None]
        if max_abs is None and offsets.numel():
            max_abs = int(index.max())
        if offsets.numel() and max_abs < self.table_rows:
            cos_table, sin_table = self._table(offsets.device, dtype)
            cos, sin = cos_table[index], sin_table[index]
        else:
            cos, sin = _half_cos_sin(index, self.inv_freq, dtype)
        return _full(cos), _full(sin * sign)

    def span(self, lo: int, hi: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos_sin(arange(lo, hi))``; a slice of the table (no gather, no device sync) when it lies inside."""
        return self.consecutive(lo, 1, hi - lo, dtype, device)

    def consecutive(self, first: int, step: int, n: int, dtype: torch.dtype,
                    device) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos_sin`` of first, first + step, ... (n offsets, step ±1), without reading the device (no sync).

        Offsets on one side of zero, inside the table, are a slice of it (sin negated below zero; reversed where
        their sizes fall): a prefill's few start keys are rotated with no gather and no offsets computed, so a
        layer launches fewer kernels than a rotation by a list of offsets does. Otherwise looked up as listed."""
        last = first + step * (n - 1)
        lo, hi = min(first, last), max(first, last)
        if n and (lo >= 0 or hi <= 0) and max(-lo, hi) < self.table_rows:
            cos_table, sin_table = self._table(torch.device(device), dtype)
            a, b = sorted((abs(first), abs(last)))
            cos, sin = cos_table[a : b + 1], sin_table[a : b + 1]
            if abs(last) < abs(first):  # sizes falling: the rows in the offsets' order
                cos, sin = cos.flip(0), sin.flip(0)
            return _full(cos), _full(sin if lo >= 0 else 0.0 - sin)  # offset 0 keeps sin(0) = +0.0, as cos_sin
        offsets = first + step * torch.arange(n, device=device)
        return self.cos_sin(offsets, dtype, max_abs=max(abs(first), abs(last)) if n else 0)

    def rotate_from(self, x: torch.Tensor, first: int) -> torch.Tensor:
        """Rows of ``x`` (n, head_dim) rotated by first, first + 1, ...: a call's queries or new keys.

        Computed in x's dtype exactly as HF's ``apply_rotary_pos_emb`` does, with these cos/sin: the keys and
        queries the attention sees are the numbers the model's own rotation would give at these offsets.
        """
        if x.shape[-2] == 1:
            cos, sin = self._row("from", first, x.device, x.dtype)
        else:
            cos, sin = self.span(first, first + x.shape[-2], x.dtype, x.device)
        return (x * cos) + (_rotate_half(x) * sin)

    def rotate_uniform(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        """``rotate`` with one offset for every row, its row kept: every layer of a decode step asks for the same."""
        return apply_rotation(x, *self._row("uniform", offset, x.device, rotation_dtype(x.dtype)))

    def rotate_by(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        """``rotate`` with one offset for every row, nothing kept and no device sync: a re-base, an evicted key."""
        return apply_rotation(x, *self.row(offset, rotation_dtype(x.dtype), x.device))

    def row(self, offset: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos_sin`` of one offset (1, head_dim), either sign, read without a device sync: a table row (sin
        negated below zero) when it lies inside, else computed the same way."""
        size = abs(offset)
        if size >= self.table_rows:  # filled on the device: no copy from the host, so no sync
            return self.cos_sin(torch.full((1,), offset, dtype=torch.long, device=device), dtype, max_abs=size)
        cos_table, sin_table = self._table(torch.device(device), dtype)
        sin = sin_table[size : size + 1]
        return _full(cos_table[size : size + 1]), _full(sin if offset >= 0 else -sin)

    def fill_row(self, cos: torch.Tensor, sin: torch.Tensor, offset: int, negate_first_half: bool = False) -> None:
        """Write ``row(offset)`` into ``cos`` and ``sin`` (1, head_dim; their dtype, on their device), the sine
        ``half_negated`` if asked: inside the table, the half row copied into both halves and the half sine times a
        sign for each half (exact), two launches where making the row and copying it take four to seven. A decode
        step's rows are filled so before every step (decode_step.py), on the host's path to the GPU."""
        size = abs(offset)
        if size >= self.table_rows:
            row_cos, row_sin = self.row(offset, cos.dtype, cos.device)
            cos.copy_(row_cos)
            sin.copy_(half_negated(row_sin) if negate_first_half else row_sin)
            return
        cos_table, sin_table = self._table(cos.device, cos.dtype)
        halves = (1, 2, self.head_dim // 2)
        cos.view(halves).copy_(cos_table[size : size + 1, None, :].expand(halves))
        sign = -1.0 if offset < 0 else 1.0
        signs = self._signs((-sign if negate_first_half else sign, sign), cos.device, cos.dtype)
        torch.mul(sin_table[size : size + 1, None, :], signs, out=sin.view(halves))

    def _signs(self, signs: tuple[float, float], device, dtype) -> torch.Tensor:
        """(1, 2, 1): a sign for each half of a row, the four pairs made at the first decode step that asks (on the
        device: no copy from the host) and kept."""
        key = (torch.device(device), dtype)
        if key not in self._sign_rows:
            with outside_inference_mode():
                self._sign_rows[key] = {pair: _sign_row(pair, device, dtype) for pair in SIGN_PAIRS}
        return self._sign_rows[key][signs]

    def _row(self, purpose: str, offset: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin (1, head_dim) of one offset. Every layer of a decode step asks for the same one, so the last
        row of each purpose is kept (the rotate_from and rotate_uniform offsets of a step differ)."""
        key = (offset, device, dtype)
        kept = self._rows.get(purpose)
        if kept is None or kept[0] != key:
            with outside_inference_mode():  # kept across calls
                kept = self._rows[purpose] = (key, self.row(offset, dtype, device))
        return kept[1]

    def _table(self, device: torch.device, dtype: torch.dtype):
        """(table_rows, head_dim / 2) cos and sin: the other half of each row repeats the first."""
        key = (device, dtype)
        if key not in self._tables:
            with outside_inference_mode():
                self._tables[key] = _half_cos_sin(torch.arange(self.table_rows, device=device), self.inv_freq, dtype)
        return self._tables[key]

    def rotate(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Rotate the last two dims (n, head_dim) of ``x`` by ``offsets`` (n,), in float32 at least.

        The scalar ``attention_scaling`` is not applied here; callers fold its square into the logit scale.
        """
        return apply_rotation(x, *self.cos_sin(offsets, rotation_dtype(x.dtype)))

    def rotate_range(self, x: torch.Tensor, first: int, step: int, keep: bool = False) -> torch.Tensor:
        """``rotate`` by first, first + step, first + 2·step, ... (one per row): offsets of consecutive positions,
        whose largest size is known from the two ends, so the device is never asked for it (no sync on a GPU).
        Bit for bit ``apply_rotation``'s numbers, computed as ``rotate_into`` does (no widening copy, no negation of
        x). ``keep``: the run's rows are kept (a first prefill's start keys, which every layer rotates alike), so
        the layers after the first launch no operator to make them."""
        cos, sin_half_negated = self._run_rows(first, step, x.shape[-2], rotation_dtype(x.dtype), x.device, keep)
        return (x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_half_negated).to(x.dtype)

    def _run_rows(self, first: int, step: int, n: int, dtype: torch.dtype, device,
                  keep: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``consecutive``'s rows, the sine half-negated; kept if asked for runs of up to KEPT_RUN_ROWS, the last
        KEPT_RUNS of them."""
        if not keep or n > KEPT_RUN_ROWS:
            cos, sin = self.consecutive(first, step, n, dtype, device)
            return cos, half_negated(sin)
        key = (first, step, n, torch.device(device), dtype)
        if key not in self._runs:
            if len(self._runs) >= KEPT_RUNS:
                self._runs.clear()
            with outside_inference_mode():  # kept across calls, whatever their mode
                self._runs[key] = self._run_rows(first, step, n, dtype, device, keep=False)
        return self._runs[key]

    @property
    def nbytes(self) -> int:
        """Bytes held: inv_freq, the tables (table_rows rows per device and dtype used), kept rows, runs and signs."""
        tensors = [self.inv_freq, *(t for pair in self._tables.values() for t in pair)]
        tensors += [t for _, pair in self._rows.values() for t in pair]
        tensors += [t for signs in self._sign_rows.values() for t in signs.values()]
        tensors += [t for pair in self._runs.values() for t in pair]
        return sum(t.numel() * t.element_size() for t in tensors)


def _sign_row(signs: tuple[float, float], device, dtype) -> torch.Tensor:
    row = torch.full((1, 2, 1), signs[1], dtype=dtype, device=device)
    row[:, :1].fill_(signs[0])
    return row


def _half_cos_sin(index: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``index × inv_freq`` (n, head_dim / 2) for non-negative integer offsets, angles in float64."""
    angles = index.to(torch.float64)[:, None] * inv_freq.to(index.device)[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _full(half: torch.Tensor) -> torch.Tensor:
    """HF's rotate_half layout repeats the frequencies: (n, head_dim / 2) -> (n, head_dim)."""
    return torch.cat((half, half), dim=-1)


def rotation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Where ``rotate`` and ``rotate_uniform`` compute: float32 at least."""
    return torch.promote_types(dtype, torch.float32)


def apply_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin in the dtype of cos/sin, returned in x's dtype: with rows in x's dtype, exactly
    ``rotate_from``'s numbers."""
    xw = x.to(cos.dtype)
    return (xw * cos + _rotate_half(xw) * sin).to(x.dtype)


def half_negated(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` (..., D) with its first half negated: what ``rotate_into`` takes."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate_into(out: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin_half_negated: torch.Tensor) -> None:
    """``out`` (x's dtype) = apply_rotation(x, cos, sin), bit for bit, in four operators where apply_rotation and
    a copy make eight: rotate_half(x)·sin is roll(x)·``half_negated(sin)`` (a negation is exact, whichever side of
    a product it lies), x is widened to cos' dtype inside the products, and the sum is rounded as it is stored.
    A steady decode step places the start keys so in every layer (layer.py)."""
    torch.add(x * cos, x.roll(x.shape[-1] // 2, dims=-1) * sin_half_negated, out=out)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def find_rotary_embedding(model: nn.Module) -> nn.Module:
    """The one module that turns position ids into (cos, sin); clear errors for models we cannot patch."""
    found = [m for _, m in model.named_modules() if hasattr(m, "inv_freq") and "Rotary" in type(m).__name__]
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no rotary position embedding (no *RotaryEmbedding module with inv_freq): "
            "LM-Infinite here supports RoPE models only (Llama, Mistral, Qwen2 and alike)"
        )
    if len(found) > 1:
        raise ValueError(
            f"{type(model).__name__} has {len(found)} rotary embeddings (e.g. local and global attention); "
            "LM-Infinite supports models with a single rotary embedding"
        )
    return found[0]


def rope_from_model(model: nn.Module) -> Rope:
    """Read the rotary parameters the model itself uses, refusing variants we cannot reproduce exactly."""
    rotary = find_rotary_embedding(model)
    config = model.config
    rope_type = getattr(rotary, "rope_type", None) or (getattr(config, "rope_parameters", None) or {}).get(
        "rope_type", "default"
    )
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"RoPE scaling type {rope_type!r} changes its frequencies with the sequence length and is not supported; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    partial = (getattr(config, "rope_parameters", None) or {}).get("partial_rotary_factor") or getattr(
        config, "partial_rotary_factor", 1.0
    )
    if partial not in (None, 1, 1.0):
        raise ValueError(f"partial rotary embeddings (partial_rotary_factor={partial}) are not supported")
    inv_freq = rotary.inv_freq.detach().to(torch.float64).clone()
    return Rope(inv_freq=inv_freq, attention_scaling=float(getattr(rotary, "attention_scaling", 1.0)))
