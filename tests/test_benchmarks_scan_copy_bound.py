"""The scan-copy bound benchmark's measures: each copy's error bound holds, an exact copy rescores only the k
best, and the queries and keys it measures are the ones recall scans."""

import pytest
import torch

from benchmarks import scan_copy_bound


def keys_with_outlier_channels(n: int = 300, dim: int = 64) -> torch.Tensor:
    """Keys like a real model's: a few channels far larger than the rest (Qwen's key biases)."""
    torch.manual_seed(0)
    keys = torch.randn(1, 2, n, dim, dtype=torch.float64)
    keys[..., :3] *= 40
    return keys


@pytest.mark.parametrize("name", list(scan_copy_bound.COPIES))
def test_every_scanned_logit_lies_within_its_bound(name):
    quantize, _ = scan_copy_bound.COPIES[name]
    keys = keys_with_outlier_channels()
    copy = quantize(keys)
    assert copy.shape == keys.shape and not torch.equal(copy, keys)
    query = torch.randn(1, 2, 7, 64, dtype=torch.float64)
    scanned, exact = query @ copy.transpose(-1, -2), query @ keys.transpose(-1, -2)
    bound = query.norm(dim=-1, keepdim=True) * (keys - copy).norm(dim=-1)[..., None, :]
    assert ((scanned - exact).abs() <= bound * (1 + 1e-12)).all()
    shares = scan_copy_bound.rescore_shares(query, keys, copy, k=5, scale=0.125)
    assert shares.shape == (14,) and (shares >= 5 / 300).all() and (shares <= 1).all()
    assert shares.max() > 5 / 300  # a copy that is not exact leaves more than the k best to rescore


def test_the_keys_left_to_rescore_hold_the_exact_top_k():
    keys = keys_with_outlier_channels()
    copy = scan_copy_bound.int8_per_block_channel(keys)
    query = torch.randn(1, 2, 7, 64, dtype=torch.float64)
    scanned = query @ copy.transpose(-1, -2)
    bound = query.norm(dim=-1, keepdim=True) * (keys - copy).norm(dim=-1)[..., None, :]
    kept = (scanned + bound) >= (scanned - bound).topk(5, dim=-1).values[..., -1:]
    best = (query @ keys.transpose(-1, -2)).topk(5, dim=-1).indices
    assert kept.gather(-1, best).all()
    assert torch.allclose(scan_copy_bound.rescore_shares(query, keys, copy, k=5, scale=1.0),
                          kept.double().mean(-1).flatten())


def test_an_exact_copy_rescores_the_k_best_alone():
    keys = keys_with_outlier_channels().to(torch.bfloat16).double()
    query = torch.randn(1, 2, 3, 64, dtype=torch.float64)
    shares = scan_copy_bound.rescore_shares(query, keys, keys.clone(), k=5, scale=0.125)
    assert torch.equal(shares, torch.full((6,), 5 / 300, dtype=torch.float64))


def test_asymmetric_codes_lie_within_half_a_step_of_each_channels_range_per_block():
    keys = keys_with_outlier_channels(n=200) + 100  # blocks of 32: six full ones and one of 8, far from zero
    copy = scan_copy_bound.asymmetric_per_block_channel(4, 32)(keys)
    for lo in range(0, 200, 32):
        block, coded = keys[..., lo : lo + 32, :], copy[..., lo : lo + 32, :]
        low, high = block.amin(-2, keepdim=True), block.amax(-2, keepdim=True)
        assert ((block - coded).abs() <= (high - low) / 15 / 2 * (1 + 1e-9) + 1e-12).all()
        assert (((coded - low) / ((high - low) / 15)).round().unique().numel()) <= 16


def test_a_block_scale_is_per_channel_and_a_partial_block_keeps_its_rows():
    keys = keys_with_outlier_channels(n=200)  # one block of 128 and one of 72
    copy = scan_copy_bound.int8_per_block_channel(keys)
    for lo, hi in ((0, 128), (128, 200)):
        step = keys[..., lo:hi, :].abs().amax(-2, keepdim=True) / 127
        assert ((keys[..., lo:hi, :] - copy[..., lo:hi, :]).abs() <= step / 2 * (1 + 1e-12)).all()


def test_it_sees_each_recall_scan_of_a_decode_step_and_puts_recall_back(runtime):
    from lminfinite import kernel

    original = kernel.recall_topk
    cache = runtime.new_cache()
    vocab = runtime.model.config.vocab_size
    runtime.forward([3 + i % (vocab - 3) for i in range(3 * runtime.window)], cache, topk=0)
    with scan_copy_bound.recall_inputs() as seen:
        logits = runtime.forward([5], cache, topk=3)
    assert kernel.recall_topk is original
    layers = runtime.num_layers - runtime.lm_config.topk_from_layer
    assert len(seen) == layers
    for query, keys, k, scale in seen:
        assert k == 3 and query.dtype == keys.dtype == torch.float64 and query.shape[-2] >= 1
        assert keys.shape[-2] == 3 * runtime.window + 1 - runtime.window - runtime.lm_config.n_starting
        assert 0 < scale < 1
    assert torch.isfinite(logits).all()


def test_the_report_has_a_row_per_copy_each_share_between_k_over_n_and_all(tmp_path):
    import re

    from app_fixtures import model_dir

    if not scan_copy_bound.SPEC.is_file():
        pytest.skip(f"{scan_copy_bound.SPEC} is not installed (apt-get install shared-mime-info)")
    threads = torch.get_num_threads()
    try:
        text = scan_copy_bound.main(["--model", str(model_dir()), "--context", "1024", "--steps", "2", "--threads", "1",
                                     "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / f"scan_copy_bound_{model_dir().name}_1k.md").read_text() == text + "\n"
    k_over_n = float(re.search(r"k / n = ([\d.]+) %", text).group(1))
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith(("| int", "| fp8"))]
    assert [cells[0].strip() for cells in rows] == list(scan_copy_bound.COPIES)
    for cells in rows:
        mean, median, p99, worst = (float(cell.strip().rstrip(" %")) for cell in cells[2:])
        assert k_over_n - 0.01 <= median <= p99 <= worst <= 100 and k_over_n - 0.01 <= mean <= worst
