"""rotary: a range of consecutive offsets read as a slice of Rope's table gives cos_sin's numbers, and rotate_into
gives apply_rotation's, bit for bit."""

from __future__ import annotations

import itertools

import pytest
import torch

from lminfinite.rotary import Rope, apply_rotation, half_negated, rotate_into, rotation_dtype

TABLE_ROWS = 40
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float64: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns: +0.0 and -0.0 differ here, as they would in a rotation's last bit."""
    return t.contiguous().view(BITS[t.dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_consecutive_offsets_are_cos_sin_of_the_listed_offsets_bit_for_bit(dtype):
    """Ranges rising and falling, on either side of zero, ending at it, crossing it, at the table's edge and past
    it, of 0 to 30 offsets: the slice (negated below zero, reversed where sizes fall) or the fallback equals the
    lookup of the listed offsets."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, 2, dtype=torch.float64) / 32))
    rope = Rope(inv_freq, table_rows=TABLE_ROWS)
    firsts = [*range(-45, 46, 4), -TABLE_ROWS, -TABLE_ROWS + 1, TABLE_ROWS - 1, TABLE_ROWS, 0]
    for first, step, n in itertools.product(firsts, (1, -1), (0, 1, 2, 9, 30)):
        offsets = first + step * torch.arange(n)
        got, expected = rope.consecutive(first, step, n, dtype, "cpu"), rope.cos_sin(offsets, dtype)
        for part, want in zip(got, expected):
            assert part.shape == want.shape == (n, 32)
            assert torch.equal(bits(part), bits(want)), (first, step, n)


@pytest.mark.parametrize("dtype", list(BITS))
def test_rotating_into_a_rows_slice_writes_apply_rotations_numbers_bit_for_bit(dtype):
    """What a steady decode step places as its start keys (layer.py): keys over six decades, zeros of either sign,
    angles whose sine is +0.0 or -0.0 in either half, written into the first rows of a larger buffer (strided),
    whose other rows stay as they were. With the sine's first half not negated it fails."""
    generator = torch.Generator().manual_seed(1)
    keys = (torch.randn(2, 3, 10, 64, generator=generator, dtype=torch.float64) * torch.logspace(-3, 3, 64)).to(dtype)
    keys[0, 0, 0, :5], keys[0, 0, 1, :5] = 0.0, -0.0
    angle = torch.rand(1, 32, generator=generator, dtype=torch.float64) * 6
    cos, sin = (torch.cat((f(angle), f(angle)), dim=-1).to(rotation_dtype(dtype)) for f in (torch.cos, torch.sin))
    sin[0, 3], sin[0, 40] = 0.0, -0.0
    ring = torch.full((2, 3, 30, 64), float("nan"), dtype=dtype)
    rotate_into(ring[..., :10, :], keys, cos, half_negated(sin))
    assert torch.equal(bits(ring[..., :10, :]), bits(apply_rotation(keys, cos, sin)))
    assert ring[..., 10:, :].isnan().all()


@pytest.mark.parametrize("dtype", list(BITS))
def test_a_row_filled_in_place_is_rows_numbers_bit_for_bit(dtype):
    """What a decode step loads before it runs (decode_step.py): offsets of either sign, zero (whose sine is +0.0,
    and -0.0 where its first half is negated), at the table's edge and past it, into rows that held NaN, the sine
    as is and half-negated."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, 2, dtype=torch.float64) / 32))
    rope = Rope(inv_freq, table_rows=TABLE_ROWS)
    for offset, negate in itertools.product([0, 1, -1, 17, -17, TABLE_ROWS - 1, 1 - TABLE_ROWS, TABLE_ROWS,
                                             -TABLE_ROWS, 3 * TABLE_ROWS + 5, -3 * TABLE_ROWS - 5], (False, True)):
        cos, sin = torch.full((2, 1, 32), float("nan"), dtype=dtype).unbind(0)
        rope.fill_row(cos, sin, offset, negate_first_half=negate)
        want_cos, want_sin = rope.row(offset, dtype, "cpu")
        assert torch.equal(bits(cos), bits(want_cos)), (offset, negate)
        assert torch.equal(bits(sin), bits(half_negated(want_sin) if negate else want_sin)), (offset, negate)


@pytest.mark.parametrize("dtype", list(BITS))
def test_a_rotated_range_is_apply_rotations_numbers_bit_for_bit_its_short_runs_rows_kept(dtype):
    """What a layer's start keys and evicted keys go through (layer.py): runs rising and falling, on either side of
    zero, at the table's edge and past it, short (rows kept, asked for twice) and long (not kept); keys over six
    decades and zeros of either sign. The kept runs stay bounded, and rows first made in inference mode rotate keys
    under autograd later."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, 2, dtype=torch.float64) / 32))
    rope = Rope(inv_freq, table_rows=TABLE_ROWS)
    generator = torch.Generator().manual_seed(2)
    scale = torch.logspace(-3, 3, 32, dtype=torch.float64)
    for first, step, n in itertools.product((-45, -TABLE_ROWS, -3, 0, 5, TABLE_ROWS - 1, 45), (1, -1), (1, 10, 80)):
        keys = (torch.randn(2, 3, n, 32, generator=generator, dtype=torch.float64) * scale).to(dtype)
        keys[0, 0, 0, :5] = -0.0
        cos, sin = rope.consecutive(first, step, n, rotation_dtype(dtype), "cpu")
        for _ in range(2):
            with torch.inference_mode():
                got = rope.rotate_range(keys, first, step, keep=True)
            assert torch.equal(bits(got), bits(apply_rotation(keys, cos, sin))), (first, step, n)
    kept = rope._runs
    assert 0 < len(kept) <= 8 and all(pair[0].shape[0] <= 64 for pair in kept.values())
    keys = torch.randn(1, 1, 10, 32, dtype=dtype, requires_grad=True)
    rope.rotate_range(keys, -3, -1, keep=True).sum().backward()  # kept rows are no inference tensors
    assert keys.grad is not None
    rope._runs.clear()
    rope.rotate_range(keys.detach(), 7, 1)
    assert not rope._runs  # kept only when asked
