"""rotary.Rope: a range of consecutive offsets read as a slice of the table gives cos_sin's numbers, bit for bit."""

from __future__ import annotations

import itertools

import pytest
import torch

from lminfinite.rotary import Rope

TABLE_ROWS = 40
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns: +0.0 and -0.0 differ here, as they would in a rotation's last bit."""
    return t.contiguous().view(BITS[t.dtype])


@pytest.mark.parametrize("dtype", list(BITS))
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
