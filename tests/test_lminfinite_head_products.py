"""Recall's head-by-head product (lminfinite/head_products.py) and the store scan's selection (recall.py) give
the float64 values, whichever order the product is taken in; and selecting before widening picks the same keys
as widening first."""

import pytest
import torch

from lminfinite.head_products import KEY_MAJOR_MAX_ROWS, head_products
from lminfinite.recall import _store_topk


def store_keys(n, dtype, generator, heads=3, dim=64, spare=37):
    """Keys laid out as a middle store holds them: a token per row, each head a whole capacity apart."""
    buffer = torch.randn(2, heads, n + spare, dim, generator=generator).to(dtype)
    return buffer[..., :n, :]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 3, KEY_MAJOR_MAX_ROWS, KEY_MAJOR_MAX_ROWS + 1, 40])
@pytest.mark.parametrize("copy_layout", [False, True])
def test_each_product_order_gives_the_float64_product(dtype, rows, copy_layout):
    generator = torch.Generator().manual_seed(rows)
    keys = store_keys(1000, dtype, generator)
    if copy_layout:  # a dimension per row, as the scan copy holds them
        keys = keys.transpose(-1, -2).contiguous().transpose(-1, -2)
    query = torch.randn(2, 3, rows, 64, generator=generator).to(dtype)
    products = head_products(query, keys)
    expected = query.double() @ keys.double().transpose(-1, -2)
    tolerance = dict(atol=0.05, rtol=2.0**-7) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-5)
    assert products.shape == expected.shape and products.dtype == dtype
    torch.testing.assert_close(products.double(), expected, **tolerance)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_selecting_before_widening_recalls_what_widening_first_would(dtype):
    generator = torch.Generator().manual_seed(7)
    keys = store_keys(5000, dtype, generator)
    query = torch.randn(2, 3, 3, 64, generator=generator).to(dtype)
    scale = 64**-0.5  # not a power of two: scaling rounds
    logits, idx = _store_topk(query, keys, 5, scale)
    widened = head_products(query, keys).float() * scale
    expected, _ = widened.topk(5, dim=-1)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, atol=0, rtol=0)
    assert torch.equal(widened.gather(-1, idx), logits)
