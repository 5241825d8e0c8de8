"""The window-span kernels: each one this machine runs against the float64 reference, the flex block lists
against the dense band, and ``auto``'s choice and fallback (the CUDA kernels run in test_lminfinite_cuda.py)."""

import dataclasses
import warnings

import pytest
import torch

import lminfinite
from lminfinite import filling, fused, kernel_choice, window
from lminfinite.flex_window import block_lists
from lminfinite.reference import ReferenceModel
from lminfinite_models import WINDOW, feed_in_chunks, random_ids, tiny_model

CONFIGS = {
    "lambda": lminfinite.LMInfiniteConfig(n_starting=4),
    "topk": lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1),
}
CPU_KERNELS = ["cpu-flash", "flex", "float32"]


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
@pytest.mark.parametrize("chunk", [7, 3 * WINDOW])
@pytest.mark.parametrize("config_name", ["lambda", "topk"])
@pytest.mark.parametrize("family", ["llama-mha", "qwen2-gqa"])
@pytest.mark.parametrize("kernel", CPU_KERNELS)
def test_every_window_kernel_follows_the_float64_reference(kernel, family, config_name, chunk):
    config = dataclasses.replace(CONFIGS[config_name], window_kernel=kernel)
    model = lminfinite.enable(tiny_model(family), config)
    ids = random_ids(12 * WINDOW)
    expected = ReferenceModel(model, config).logits(ids)
    logits = feed_in_chunks(model, ids, chunk, lminfinite.InfiniteCache(model))
    torch.testing.assert_close(logits.double(), expected, atol=2e-5, rtol=0)


@pytest.mark.parametrize("queries, keys, offset, window", [
    (300, 300, 0, 100), (512, 1023, 511, 512), (1000, 1200, 200, 384), (129, 700, 571, 600), (1, 4000, 3999, 4000),
    (640, 3000, 2360, 2361),
])
def test_flex_block_lists_are_exactly_the_blocks_the_band_touches_and_fills(queries, keys, offset, window):
    partial, full = (table[0, 0] for table in block_lists(queries, keys, offset, window, "cpu", block=64))
    distance = torch.arange(queries)[:, None] + offset - torch.arange(keys)[None, :]
    dense = (distance >= 0) & (distance < window)
    for qb in range(partial.shape[0]):
        for kb in range(partial.shape[1]):
            tile = dense[qb * 64 : (qb + 1) * 64, kb * 64 : (kb + 1) * 64]
            assert bool(full[qb, kb]) == bool(tile.all()), (qb, kb)
            assert bool(partial[qb, kb]) == bool(tile.any() and not tile.all()), (qb, kb)
    assert full.any() or window < 128  # the geometry exercises whole blocks, not only edges


def test_auto_picks_the_fused_cpu_kernel_where_it_exists_and_float32_elsewhere():
    cpu = torch.device("cpu")
    assert kernel_choice.kernels_for("auto", cpu, torch.float32, 64) == ("cpu-flash", "cpu-flash", "sdpa")
    assert kernel_choice.kernels_for("auto", cpu, torch.bfloat16, 64) == ("cpu-flash", "cpu-flash", "sdpa")
    assert kernel_choice.kernels_for("auto", cpu, torch.float16, 64) == ("float32", "float32", "sdpa")
    assert kernel_choice.kernels_for("flex", cpu, torch.float32, 64) == ("flex", "cpu-flash", "sdpa")
    assert kernel_choice.kernels_for("float32", cpu, torch.float32, 64) == ("float32", "float32", "sdpa")


def test_auto_skips_a_kernel_that_disagrees_with_float64(monkeypatch):
    def off_by_a_tenth(q, k, v, mask, scale):
        out, lse = fused.float32_span(q, k, v, mask, scale)
        return out * 1.1, lse

    def raises(q, k, v, mask, scale):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setitem(fused.SPAN_KERNELS, "cpu-flash", off_by_a_tenth)
    with pytest.warns(UserWarning, match="off by"):
        assert not kernel_choice.agrees_with_float64("cpu-flash", torch.device("cpu"), torch.float32, 64)
    monkeypatch.setitem(fused.SPAN_KERNELS, "cpu-flash", raises)
    with pytest.warns(UserWarning, match="no kernel image"):
        assert not kernel_choice.agrees_with_float64("cpu-flash", torch.device("cpu"), torch.float32, 64)
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernel_choice.agrees_with_float64("cpu-flash", torch.device("cpu"), torch.bfloat16, 128)


def forget_choices():
    """Drop auto's remembered checks and choices (a test changed the candidates or a kernel)."""
    kernel_choice._checked.cache_clear()
    kernel_choice.kernels_for.cache_clear()


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
def test_auto_checks_a_whole_span_kernel_on_a_clipped_grouped_window_and_prefers_it_when_listed_first(monkeypatch):
    cpu = torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        # flex_attention's own notice, raised the first time a process calls it (the mark above covers it outside)
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        assert kernel_choice.agrees_with_float64("flex", cpu, torch.float32, 64)
    monkeypatch.setattr(kernel_choice, "AUTO_WINDOW", {"cpu": ("flex", "cpu-flash", "float32")})
    forget_choices()
    assert kernel_choice.kernels_for("auto", cpu, torch.float32, 64) == ("flex", "cpu-flash", "sdpa")

    def shifted_by_one_key(query, keys, values, window_size, scale):  # a window one key too far back
        return window.flex_window_span(query, keys[..., :-1, :], values[..., :-1, :], window_size, scale)

    monkeypatch.setitem(window.WHOLE_SPAN_KERNELS, "flex", shifted_by_one_key)
    forget_choices()
    with pytest.warns(UserWarning, match="'flex' window kernel is off by"):
        assert kernel_choice.kernels_for("auto", cpu, torch.float32, 64) == ("cpu-flash", "cpu-flash", "sdpa")
    forget_choices()


def test_the_flash_window_call_binds_this_pytorch_builds_operator_and_returns_float32_spans():
    """The CUDA tests check its values; here the meta kernel checks the call against this build's op schema."""
    query = torch.empty(1, 32, 100, 128, device="meta", dtype=torch.bfloat16)
    keys = torch.empty(1, 8, 150, 128, device="meta", dtype=torch.bfloat16)
    out, lse = window.flash_window_span(query, keys, keys, 60, 0.1)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == (query.shape, torch.float32, (1, 32, 100), torch.float32)


def test_the_flash_decode_span_binds_this_pytorch_builds_operator_and_refuses_a_mask():
    """A decode step's rows (four grouped heads per key head) over a whole ring; the CUDA tests check its values."""
    rows = torch.empty(1, 8, 4, 128, device="meta", dtype=torch.bfloat16)
    keys = torch.empty(1, 8, 4106, 128, device="meta", dtype=torch.bfloat16)
    out, lse = fused.attend_with_lse(rows, keys, keys, None, 0.1, "flash")
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == (rows.shape, torch.float32, (1, 8, 4), torch.float32)
    with pytest.raises(ValueError, match="takes no mask"):
        fused.attend_with_lse(rows, keys, keys, torch.zeros(4, 4106, device="meta"), 0.1, "flash")


def test_the_flash_filling_call_binds_this_pytorch_builds_operator_over_the_rings_window_rows():
    """One query over a ring's window rows (a view past its start rows), with one and with four heads per key head;
    the CUDA tests check its values and that it reads only the rows in use."""
    for heads, kv_heads in ((32, 32), (8, 2)):
        query = torch.empty(1, heads, 1, 128, device="meta", dtype=torch.bfloat16)
        ring = torch.empty(1, kv_heads, 10 + 4096, 128, device="meta", dtype=torch.bfloat16)
        filled = filling.FilledRows.allocate(4096, "meta")
        out = filling.flash_filling(query, ring[..., 10:, :], ring[..., 10:, :], filled, 0.1)
        assert (out.shape, out.dtype) == (query.shape, torch.bfloat16)


def test_filling_rows_are_a_prefix_and_auto_checks_a_filling_kernel_against_float64(monkeypatch):
    filled = filling.FilledRows.allocate(8, "cpu")
    filled.fill(3)
    assert filled.valid.tolist() == [[True] * 3 + [False] * 5] and filled.used.tolist() == [3]
    assert filled.key_bounds.tolist() == [0, 8] and filled.query_bounds.tolist() == [0, 1]
    cpu = torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernel_choice.filling_agrees_with_float64("sdpa", cpu, torch.float32, 64)

    def one_row_too_many(query, keys, values, rows, scale):
        wider = filling.FilledRows.allocate(keys.shape[-2], keys.device)
        wider.fill(int(rows.used) + 1)
        return filling.masked_filling(query, keys, values, wider, scale)

    monkeypatch.setitem(filling.FILLING_KERNELS, "sdpa", one_row_too_many)
    with pytest.warns(UserWarning, match="'sdpa' filling kernel is off by"):
        assert not kernel_choice.filling_agrees_with_float64("sdpa", cpu, torch.float32, 64)


def test_a_kernel_this_device_lacks_or_an_unknown_one_is_refused_by_name():
    for kernel in ("efficient", "flash"):
        with pytest.raises(ValueError, match=f"'{kernel}' does not run on cpu"):
            kernel_choice.kernels_for(kernel, torch.device("cpu"), torch.float32, 64)
    with pytest.raises(ValueError, match="window_kernel must be one of"):
        lminfinite.LMInfiniteConfig(window_kernel="triton")


def test_bias_rows_are_realigned_only_when_they_are_not():
    padded = torch.zeros(8, 32)[:, :20]
    assert fused.aligned_bias(padded) is padded
    unaligned = torch.randn(8, 40)[:, 3:23]
    copy = fused.aligned_bias(unaligned)
    assert torch.equal(copy, unaligned) and copy.stride(-2) % fused.BIAS_ALIGNMENT == 0
    assert copy.data_ptr() % (fused.BIAS_ALIGNMENT * copy.element_size()) == 0
