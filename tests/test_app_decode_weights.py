"""Integer copies of the weights for decoding (app/engine/decode_weights.py): a GGUF's 4-bit grid is found again
exactly, few rows go through the integer kernels and match a float64 reference of the copy, many rows go through the
dense layer untouched, and a tiny Qwen2 decodes the same tokens with the copies as without."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from app.engine import decode_weights as dw
from tests.lminfinite_models import random_ids, tiny_model


def on_q4_grid(out_features: int, in_features: int, seed: int = 0, top_code: int = 15) -> torch.Tensor:
    """Weights as Q4_K stores them: per group of 32, offset + step * code, codes 0..top_code (bfloat16)."""
    generator = torch.Generator().manual_seed(seed)
    groups = in_features // dw.GROUP
    codes = torch.randint(0, top_code + 1, (out_features, groups, dw.GROUP), generator=generator)
    codes[..., 0], codes[..., 1] = 0, top_code  # the group's range spans its codes, as a fitted block's does
    steps = torch.rand(out_features, groups, 1, generator=generator) * 0.01 + 0.001
    offsets = -torch.rand(out_features, groups, 1, generator=generator) * top_code * steps  # values straddle 0
    return (codes * steps + offsets).reshape(out_features, in_features).to(torch.bfloat16)


@pytest.mark.parametrize("top_code", [15, 11])
def test_weights_on_a_4_bit_grid_are_found_again_to_bfloat16_rounding(top_code):
    weight = on_q4_grid(64, 128, top_code=top_code)
    copy = dw.fit(weight)
    assert isinstance(copy, dw.Int4Grid) and copy.exact_share == 1.0
    error = (copy.dequantize() - weight.float()).abs().max() / weight.float().abs().max()
    assert error < 2 ** -8  # bfloat16 rounding, not a 4-bit step (1/15 of a group's range)


def test_weights_on_no_grid_are_kept_in_8_bits():
    weight = torch.randn(64, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    copy = dw.fit(weight)
    assert isinstance(copy, dw.Int8Rows)
    relative = (copy.dequantize() - weight.float()).norm() / weight.float().norm()
    assert relative < 0.01


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("grid", [True, False])
def test_one_row_uses_the_copy_and_more_rows_the_dense_layer(dtype, grid):
    dense = nn.Linear(128, 64, bias=True).to(dtype)
    with torch.no_grad():
        dense.weight.copy_(on_q4_grid(64, 128) if grid else torch.randn(64, 128))
        dense.bias.copy_(torch.randn(64))
    copy = dw.fit(dense.weight)
    layer = dw.DecodeLinear(dense, copy)
    assert layer.kind == ("int4" if grid else "int8")
    x = torch.randn(1, dw.DECODE_ROWS, 128, dtype=dtype)
    # the kernels are fed the row in bfloat16, a float32 model's too: the product is that row's, to bfloat16 rounding
    reference = x.to(dw.ROWS_DTYPE).double() @ copy.dequantize().double().T + dense.bias.double()
    got = layer(x)
    assert got.shape == (1, dw.DECODE_ROWS, 64) and got.dtype == dtype
    # a bfloat16 model rounds twice: the kernel's product, then the bias added in bfloat16 (up to 2 ** -8 each); over
    # 300 seeds on an AMD EPYC with avx512_bf16 the int8 rows reached 1.2 * 2 ** -7 (the kernel alone 0.78)
    bound = 2 ** -6 if dtype == torch.bfloat16 else 2 ** -7
    assert (got.double() - reference).abs().max() / reference.abs().max() < bound
    many = torch.randn(1, dw.DECODE_ROWS + 1, 128, dtype=dtype)
    assert torch.equal(layer(many), dense(many))
    assert layer.weight is dense.weight


def snapped_to_grid(model: nn.Module) -> nn.Module:
    """A random model whose linear weights are moved onto a 4-bit grid, as a Q4 GGUF's are."""
    with torch.no_grad():
        for _, layer in dw.linear_layers(model):
            out_features, in_features = layer.weight.shape
            if in_features % dw.GROUP == 0 and out_features % 16 == 0:
                grid = dw.fit_int4(layer.weight)
                layer.weight.copy_(grid.dequantize().to(layer.weight.dtype))
    return model


def greedy(model, ids: torch.Tensor, steps: int) -> tuple[list[int], torch.Tensor]:
    from transformers import DynamicCache

    cache, tokens, logits = DynamicCache(config=model.config), [], None
    with torch.inference_mode():
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
        for _ in range(steps):
            tokens.append(int(logits.argmax()))
            logits = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True).logits[:, -1]
    return tokens, logits


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_model_decodes_the_same_tokens_and_the_copies_are_cached_beside_it(tmp_path, dtype):
    model = snapped_to_grid(tiny_model("qwen2-gqa", dtype=dtype, seed=4))
    ids = random_ids(24, seed=5)
    dense_tokens, dense_logits = greedy(model, ids, 12)
    kinds = dw.use_for_decoding(model, tmp_path)
    assert kinds["int4"] > 0 and sum(kinds.values()) == sum(
        isinstance(m, dw.DecodeLinear) for m in model.modules())
    sidecar = tmp_path / dw.SIDECAR
    assert [p.name for p in tmp_path.iterdir()] == [dw.SIDECAR]  # nothing half-written left beside it
    tokens, logits = greedy(model, ids, 12)
    assert tokens == dense_tokens
    assert (logits.float() - dense_logits.float()).abs().max() < 0.05 * dense_logits.float().abs().max()

    again = snapped_to_grid(tiny_model("qwen2-gqa", dtype=dtype, seed=4))
    written = sidecar.stat().st_mtime_ns
    dw.use_for_decoding(again, tmp_path)
    assert sidecar.stat().st_mtime_ns == written  # read back, not fitted again
    assert greedy(again, ids, 12)[0] == dense_tokens


def test_a_damaged_sidecar_is_fitted_again(tmp_path):
    model = snapped_to_grid(tiny_model("qwen2-gqa", dtype=torch.bfloat16, seed=4))
    (tmp_path / dw.SIDECAR).write_bytes(b"not a safetensors file")
    kinds = dw.use_for_decoding(model, tmp_path)
    assert kinds["int4"] > 0
    from safetensors.torch import load_file

    assert load_file(tmp_path / dw.SIDECAR)  # written again, readable


def test_a_model_converted_from_a_gguf_decodes_through_the_copies_unless_told_not_to(tmp_path, monkeypatch):
    """load_runtime: a bfloat16 or float32 model in the converted-models cache (as a GGUF's is) gets the copies,
    the header says how many layers took each kind, and ``--decode-weights dense`` keeps the model's own weights
    only, as a float16 model does (the kernels are fed bfloat16 rows: decode_weights.ROWS_DTYPE)."""
    from app.cli import AppConfig
    from app.engine import bundled_model
    from app.engine.model_loading import ModelChoice, load_runtime
    from app_fixtures import model_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = bundled_model.cache_root() / "tiny"
    import shutil

    shutil.copytree(model_dir(), folder)
    loaded = {}
    for mode in ("auto", "dense"):
        config = AppConfig(model=str(folder), cpu_threads=1, dtype="bfloat16", decode_weights=mode)
        loaded[mode] = load_runtime(config, ModelChoice(str(folder), "test"))
    for dtype, takes_copies in (("float32", True), ("float16", False)):
        other = load_runtime(AppConfig(model=str(folder), cpu_threads=1, dtype=dtype), ModelChoice(str(folder), "test"))
        assert any(isinstance(m, dw.DecodeLinear) for m in other.model.modules()) == takes_copies, dtype
        assert ("answers decoded from" in other.notice) == takes_copies, other.notice
    swapped = [m for m in loaded["auto"].model.modules() if isinstance(m, dw.DecodeLinear)]
    assert swapped and "answers decoded from" in loaded["auto"].notice and (folder / dw.SIDECAR).is_file()
    assert not any(isinstance(m, dw.DecodeLinear) for m in loaded["dense"].model.modules())
    assert "answers decoded from" not in loaded["dense"].notice
    elsewhere = load_runtime(AppConfig(model=str(model_dir()), cpu_threads=1, dtype="bfloat16"),
                             ModelChoice(str(model_dir()), "test"))
    assert not any(isinstance(m, dw.DecodeLinear) for m in elsewhere.model.modules())  # not converted by us
