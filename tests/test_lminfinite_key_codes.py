"""Recall through a middle store's int8 codes (lminfinite/key_codes.py, coded_recall.py) against float64.

The codes' scan runs in Triton's kernels, here under its interpreter (conftest.py); tests/test_lminfinite_cuda.py
runs these checks on a GPU. What must hold: the store's own top k, whether the certificate spared the full scan
or not, and the certificate used where the codes tell the keys apart.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import lminfinite
from graph_replay import ReplayedOps
from lminfinite import coded_recall, recall_kernel
from lminfinite.graphed import GraphedDecoder
from lminfinite.key_codes import BLOCK, KeyCodes, code_blocks
from lminfinite.kv_bytes import KVShape, codes_row_bytes, span_bytes
from lminfinite.middle_store import MiddleStore
from lminfinite_models import WINDOW, feed_in_chunks, random_ids, tiny_model
from test_lminfinite_graphed import one_thread  # noqa: F401 (a fixture)
from test_lminfinite_recall_kernel import decoded_against_the_reference, extra_launches_per_recall_layer

pytestmark = pytest.mark.skipif(not recall_kernel.runs_on(torch.device("cpu")),
                                reason="needs Triton (requirements-dev.txt) and TRITON_INTERPRET=1 (conftest.py)")

CONFIG = lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1, recall_scan_copy=False,
                                     recall_kernel="triton", recall_key_codes="int8")


def unsure_heads(query, keys, codes, live=None, **options) -> torch.Tensor:
    """The heads (B, Hkv) whose rows the certificate does not vouch for: coded_topk scans them in full."""
    return ~coded_recall.certified_topk(query, keys, codes, live, **options)[2].all(dim=-1)


def coded_store(keys: torch.Tensor, live: int, keep: int = coded_recall.KEEP,
                pool: int = coded_recall.POOL) -> KeyCodes:
    codes = KeyCodes(keep=keep, pool=pool).grown(keys, keys.shape[-2])
    codes.code(keys, live)
    return codes


def test_codes_hold_each_key_within_half_a_step_and_their_error_and_norm_exactly():
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 3, 2 * BLOCK, 64, generator=generator, dtype=torch.float64)
    keys[0, 1, :BLOCK, 5] = 0  # a channel zero throughout a block: exact
    codes, scales, errors, norms = code_blocks(keys)
    coded = (codes.double().unflatten(-2, (2, BLOCK)) * scales.double()[..., None, :]).flatten(-3, -2)
    step = scales.double().repeat_interleave(BLOCK, dim=-2)
    assert ((keys - coded).abs() <= step / 2 * (1 + 1e-6)).all() and codes.abs().max() == 127
    torch.testing.assert_close(errors.double(), (keys - coded).norm(dim=-1), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(norms.double(), coded.norm(dim=-1).unflatten(-1, (2, BLOCK)).amax(-1), rtol=1e-6, atol=0)
    assert scales[0, 1, 0, 5] == 1 and codes[0, 1, :BLOCK, 5].eq(0).all()


def test_a_store_codes_each_block_as_it_fills_keeps_them_as_it_grows_and_recodes_a_block_it_reopens():
    generator = torch.Generator().manual_seed(1)
    rows = torch.randn(1, 2, 700, 32, generator=generator)
    store = MiddleStore(scan_copy=False, key_codes="int8", recall_kernel="triton")
    store.append(rows[..., :300, :], rows[..., :300, :])
    assert store.codes.blocks == 2
    for i in range(300, 520):  # one row at a time, as decoding evicts them; the buffer grows on the way
        store.append(rows[..., i : i + 1, :], rows[..., i : i + 1, :])
    assert store.codes.blocks == 4 and store.codes.codes.shape[-2] == store.keys.shape[-2] > 300
    torch.testing.assert_close(store.codes.codes[..., : 4 * BLOCK, :], code_blocks(rows[..., : 4 * BLOCK, :])[0],
                               atol=0, rtol=0)
    store.truncate(3 * BLOCK - 10)
    store.append(rows[..., 600:700, :], rows[..., 600:700, :])  # rows other than those block 2 was coded from
    reopened = torch.cat((rows[..., 2 * BLOCK : 3 * BLOCK - 10, :], rows[..., 600:610, :]), dim=-2)
    assert store.codes.blocks == 3
    torch.testing.assert_close(store.codes.codes[..., 2 * BLOCK : 3 * BLOCK, :], code_blocks(reopened)[0],
                               atol=0, rtol=0)
    assert store.scan_bytes == store.length * codes_row_bytes(2, 32)
    keys, values = store.view()
    store.restore(keys, values, "cpu", torch.float32)  # a saved store read back: coded anew
    assert store.codes.blocks == 3
    torch.testing.assert_close(store.codes.codes[..., : 3 * BLOCK, :], code_blocks(keys[..., : 3 * BLOCK, :])[0],
                               atol=0, rtol=0)


@pytest.mark.parametrize("dtype, keep, pool", [(torch.float32, 32, 1024), (torch.bfloat16, 32, 1024),
                                               (torch.bfloat16, 16, BLOCK), (torch.float16, 16, 3 * BLOCK)])
@pytest.mark.parametrize("rows, n, live, k", [(1, 6 * BLOCK + 40, 5 * BLOCK + 70, 5), (4, 3 * BLOCK, None, 8),
                                              (2, 2 * BLOCK + 1, 2 * BLOCK, 1), (3, BLOCK + 60, 3, 5)])
def test_the_codes_recall_float64s_top_k_and_spare_the_full_scan(dtype, keep, pool, rows, n, live, k):
    """Coded blocks, a block being filled (or none), spare rows holding huge numbers, fewer rows in use than k:
    the logits are float64's k best up to float32 rounding, the rows float64's up to a near-tie, and no head is
    scanned in full where the rows in use tell apart; keeping 32 candidates per pool of 1,024 keys (the library's),
    16 per block (the benchmark's other way) or 16 per 3 blocks (pools that end in the block being filled, and a
    last pool of fewer blocks)."""
    generator = torch.Generator().manual_seed(rows * n + k)
    query = torch.randn(2, 3, rows, 64, generator=generator).to(dtype)
    keys = torch.randn(2, 3, n, 64, generator=generator).to(dtype)
    in_use = n if live is None else live
    keys[..., in_use:, :] = 3e4
    codes, count = coded_store(keys, in_use, keep, pool), None if live is None else torch.tensor(live)
    logits, positions = coded_recall.coded_topk(query, keys, codes, count, k=k, scale=0.125, first_row=10)
    exact = (query.double() @ keys[..., :in_use, :].double().transpose(-1, -2)) * 0.125
    best = exact.topk(min(k, in_use), dim=-1).values
    found = logits[..., : best.shape[-1]]
    torch.testing.assert_close(found.double(), best, atol=1e-4, rtol=1e-4)
    assert logits[..., best.shape[-1]:].eq(float("-inf")).all()
    rows_found = positions[..., : best.shape[-1]] - 10
    assert ((rows_found >= 0) & (rows_found < in_use)).all()
    torch.testing.assert_close(exact.gather(-1, rows_found), best, atol=1e-4, rtol=1e-4)
    assert not unsure_heads(query, keys, codes, count, k=k, scale=0.125, first_row=10).any()


@pytest.mark.parametrize("rows", [1, 3])
def test_a_pool_keeps_its_largest_bounds_over_its_blocks_and_leaves_out_the_next(rows):
    """The scan's pools against torch.topk over the same bounds (the scan itself keeping every bound of every
    block): each pool of 2 blocks keeps its 8 largest bounds and their positions, and leaves out its 9th, where
    head 0's bounds rise along the store (each block's best displace the pool's earlier ones), head 1's fall, and
    the last pool is a coded block and the one being filled. Rows of one key head summed along the channels (1) and
    on tensor cores (3)."""
    generator = torch.Generator().manual_seed(8)
    n, live = 5 * BLOCK + 70, 5 * BLOCK + 50
    query = torch.randn(1, 2, rows, 64, generator=generator)
    ramp = torch.linspace(-4, 4, n)[:, None] * query[:, :, :1] / query[:, :, :1].norm(dim=-1, keepdim=True)
    keys = torch.randn(1, 2, n, 64, generator=generator) + torch.cat((ramp[:, :1], -ramp[:, 1:]), dim=1)
    options = dict(scale=0.125, first_row=10)
    every, every_at, _ = coded_recall.scan_bounds(query, keys, coded_store(keys, live, BLOCK, BLOCK),
                                                  torch.tensor(live), **options)
    kept, kept_at, left = coded_recall.scan_bounds(query, keys, coded_store(keys, live, 8, 2 * BLOCK),
                                                   torch.tensor(live), **options)
    assert kept.shape[-1] == 3 * 8 and left.shape[-1] == 3
    for pool in range(3):
        bounds = every[..., pool * 2 * BLOCK : (pool + 1) * 2 * BLOCK]
        best, at = bounds.topk(9, dim=-1)
        mine = kept[..., pool * 8 : (pool + 1) * 8]
        assert torch.equal(mine.sort(-1, descending=True).values, best[..., :8])
        assert torch.equal(left[..., pool], best[..., 8])
        positions = every_at[..., pool * 2 * BLOCK : (pool + 1) * 2 * BLOCK].gather(-1, at[..., :8])
        assert torch.equal(kept_at[..., pool * 8 : (pool + 1) * 8].sort(-1).values, positions.sort(-1).values)
    whole = every_at[..., : 5 * BLOCK].unflatten(-1, (5, BLOCK)).sort(-1).values - 10  # each block's own rows
    assert torch.equal(whole, torch.arange(5 * BLOCK).reshape(5, BLOCK).expand_as(whole))
    assert every[..., : 5 * BLOCK].isfinite().all()
    with pytest.raises(ValueError, match="whole blocks"):
        KeyCodes(pool=BLOCK + 1)
    assert (every[..., 5 * BLOCK :].isfinite().sum(-1) == live - 5 * BLOCK).all()  # -inf past the rows in use


@pytest.mark.parametrize("programs", [64, 3])
def test_where_the_codes_cannot_tell_keys_apart_those_heads_alone_are_scanned_in_full(programs, monkeypatch):
    """Head 0's keys differ by less than a code's step (so the bound of every key reaches the k-th best), head 1's
    do not; with a NaN among head 2's keys nothing of it can be left out. The result is float64's either way, with
    a program per block of the full scan or 3 programs per head taking every third block."""
    from lminfinite import recall_triton  # Triton's, imported where it runs

    monkeypatch.setattr(recall_triton, "FALLBACK_PROGRAMS", programs)
    generator = torch.Generator().manual_seed(2)
    keys = torch.randn(1, 3, 4 * BLOCK, 64, generator=generator)
    keys[0, 0] = keys[0, 0, :1] + 1e-4 * keys[0, 0]
    keys[0, 2, 17, 3] = float("nan")
    query = torch.randn(1, 3, 2, 64, generator=generator)
    codes = coded_store(keys, 4 * BLOCK)
    logits, positions = coded_recall.coded_topk(query, keys, codes, None, k=5, scale=0.125, first_row=0)
    assert unsure_heads(query, keys, codes, k=5, scale=0.125, first_row=0).tolist() == [[True, False, True]]
    exact = (query[:, :2].double() @ keys[:, :2].double().transpose(-1, -2)) * 0.125
    torch.testing.assert_close(logits[:, :2].double(), exact.topk(5, dim=-1).values, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(exact.gather(-1, positions[:, :2]), exact.topk(5, dim=-1).values, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spread", [1.0, 0.01])
def test_a_budget_smaller_than_the_candidates_rescores_the_best_bounds_and_stays_exact(monkeypatch, spread):
    """Fewer candidates rescored than the pools keep: the best bound not rescored joins the certificate. Keys a
    code's step apart (``spread`` 0.01) scan in another order than their logits': only the bound keeps the
    result float64's there (without it, rows pass the certificate with a key missing)."""
    monkeypatch.setattr(coded_recall, "BUDGET", 8)
    generator = torch.Generator().manual_seed(4)
    base = torch.randn(1, 4, 1, 64, generator=generator)
    keys = base + spread * torch.randn(1, 4, 4 * BLOCK, 64, generator=generator)
    keys = keys.bfloat16()
    query = torch.randn(1, 4, 4, 64, generator=generator).bfloat16()
    codes = coded_store(keys, 4 * BLOCK)
    logits, positions = coded_recall.coded_topk(query, keys, codes, None, k=5, scale=0.125, first_row=0)
    exact = (query.double() @ keys.double().transpose(-1, -2)) * 0.125
    best = exact.topk(5, dim=-1).values
    torch.testing.assert_close(logits.double(), best, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(exact.gather(-1, positions), best, atol=1e-5, rtol=1e-5)
    assert unsure_heads(query, keys, codes, k=5, scale=0.125, first_row=0).any() == (spread < 1)


def test_a_row_left_unsettled_takes_the_k_best_of_the_full_scans_candidates_over_many_chunks():
    """recall_settle_ over 2,600 candidates per row (three chunks of 1,024, as a store of 66K keys gives at k = 5),
    -inf among them: a row not settled takes their 5 best and those candidates' positions, best first; a settled
    row keeps what the certificate gave it, bit for bit."""
    generator = torch.Generator().manual_seed(5)
    count, k = 2600, 5
    full_logits = torch.randn(2, 3, 2, count, generator=generator)
    full_logits[0, 1, 1, ::3] = float("-inf")
    full_logits[1, 2, 0, 2500:] += 10  # the best all in the last chunk
    full_positions = torch.randperm(12 * count, generator=generator).reshape(2, 3, 2, count) + 7
    settled = torch.randint(0, 2, (2, 3, 2), generator=generator, dtype=torch.int32)
    settled[1, 2, 0] = 0
    logits, positions = torch.randn(2, 3, 2, k, generator=generator), torch.randint(7, 99, (2, 3, 2, k))
    before = logits.clone(), positions.clone()
    torch.ops.lminfinite.recall_settle_(logits, positions, settled, full_logits, full_positions, 7)
    best, pick = full_logits.topk(k, dim=-1)
    kept = settled.bool()[..., None]
    assert torch.equal(logits, torch.where(kept, before[0], best))
    assert torch.equal(positions, torch.where(kept, before[1], full_positions.gather(-1, pick)))
    assert not settled.all() and settled.any()


def test_the_certificate_reads_the_bound_every_block_left_out_and_the_smallest_picked():
    """recall_certify over 2,100 blocks' left-out bounds (three chunks of 1,024) and count + 1 picks in any order
    (torch.topk unsorted): the smallest picked bound, wherever it lies, is left out, the others rescored. A row is
    settled only where the largest bound the blocks left, and that smallest picked, lie below its k-th best rescored
    logit; a left-out bound in the last chunk, or picks all raised above every logit, unsettle the row alone. The
    logits are float64's of the rescored keys, their k best, best first. Reading the picks as sorted (the last one
    left out) fails."""
    generator = torch.Generator().manual_seed(6)
    keys = torch.randn(1, 2, 400, 64, generator=generator).bfloat16()
    query = torch.randn(1, 2, 3, 64, generator=generator).bfloat16()
    blocks, width, count, k = 2100, 40, 16, 5
    rows = [torch.randperm(400, generator=generator)[:width] for _ in range(6)]
    positions = torch.stack(rows).reshape(1, 2, 3, width) + 10
    exact = (query.double() @ keys.double().transpose(-1, -2)) * 0.125
    upper = exact.gather(-1, positions - 10).float() + 0.01  # bounds: a key's logit and a little
    upper[0, 1, 2] += 100.0  # every bound of this row above every logit
    sorted_bounds, sorted_pick = upper.topk(count + 1, dim=-1)
    shuffle = torch.stack([torch.randperm(count + 1, generator=generator) for _ in range(6)]).reshape(1, 2, 3, -1)
    shuffle[0, 0, 0] = torch.arange(count, -1, -1)  # one row with its smallest first
    bounds, pick = sorted_bounds.gather(-1, shuffle), sorted_pick.gather(-1, shuffle)
    left = torch.full((1, 2, 3, blocks), -50.0)
    left[0, 0, 1, 2050] = 50.0
    logits, found, settled = torch.ops.lminfinite.recall_certify(
        query, keys, positions, bounds, pick, left, k, count, 0.125, 10)
    rescored = exact.gather(-1, positions.gather(-1, sorted_pick[..., :count]) - 10)
    torch.testing.assert_close(logits.double(), rescored.topk(k, dim=-1).values, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(exact.gather(-1, found - 10), logits.double(), atol=1e-5, rtol=1e-5)
    assert settled.tolist() == [[[1, 0, 1], [1, 1, 0]]]


def test_a_decode_step_through_the_codes_launches_nine_kernels_more_per_layer_than_without_recall(monkeypatch):
    """What a graph replays is launches: the coded scan, the top BUDGET of its bounds, the certificate (rescoring
    and the k best with it), the full scan told which heads to skip, the settling of the rows it scanned, and
    what recall through the keys themselves runs besides its scan (the query's rotation, the window part in float32
    and back, the merge): 9 more per recall layer than the same step without recall, where these steps launched 25
    (22 without the top BUDGET); recall through the keys launches 7."""
    monkeypatch.setattr(coded_recall, "BUDGET", 8)  # fewer than the pools keep: the top BUDGET runs
    extra = {}
    for codes in ("off", "int8"):
        extra[codes], calls = extra_launches_per_recall_layer(dataclasses.replace(CONFIG, recall_key_codes=codes))
        assert (calls["lminfinite::recall_scan_codes"] > 0) == (codes == "int8")
    assert extra == {"off": 7, "int8": 9}


def test_the_check_the_auto_choice_runs_agrees_and_a_store_keeps_codes_only_where_asked():
    for dtype in (torch.float32, torch.bfloat16):
        assert coded_recall.agrees_with_float64(torch.device("cpu"), dtype, 64)
    cpu = torch.device("cpu")
    assert not coded_recall.keeps_codes("off", "triton", cpu, torch.float32, 64)
    assert coded_recall.keeps_codes("int8", "triton", cpu, torch.float32, 64)
    with pytest.raises(ValueError, match="needs recall through Triton's kernels"):
        coded_recall.keeps_codes("int8", "torch", cpu, torch.float32, 64)  # nothing would scan them
    with pytest.raises(ValueError, match="recall_key_codes must be one of auto, int8, off"):
        lminfinite.LMInfiniteConfig(recall_key_codes="fp8")


def test_only_int8_keeps_codes_and_on_a_gpu_only_where_its_check_agrees(monkeypatch):
    """``auto`` keeps none, even on a GPU whose kernels pass every check: there the coded scan was slower than the
    keys' own (H200). ``int8`` on a GPU keeps codes where the coded scan agrees with float64, else it warns."""
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(recall_kernel, "runs_on", lambda device: True)
    monkeypatch.setattr(recall_kernel, "_checked", lambda *args: True)
    checked = []
    monkeypatch.setattr(coded_recall, "_checked", lambda *args: checked.append(args) or len(checked) == 1)
    assert not coded_recall.keeps_codes("auto", "auto", cuda, torch.bfloat16, 128)
    assert not coded_recall.keeps_codes("off", "auto", cuda, torch.bfloat16, 128)
    assert checked == []
    assert coded_recall.keeps_codes("int8", "auto", cuda, torch.bfloat16, 128)
    assert not coded_recall.keeps_codes("int8", "auto", cuda, torch.bfloat16, 128)  # the check said no
    assert checked == [("cuda", 0, torch.bfloat16, 128)] * 2


def test_the_checks_before_auto_run_each_way_the_scans_multiply(monkeypatch):
    """One query row per key head is summed along the channels, four go to tensor cores: a check that ran one way
    only (it ran two rows: the channels' way) kept kernels whose other way was wrong (a negated tensor-core product
    passed it, tried under the interpreter)."""
    from lminfinite import coded_triton, recall_triton

    on_tensor_cores = {"scan": set(), "scan_codes": set()}
    for module, name in ((recall_triton, "scan"), (coded_triton, "scan_codes")):
        def spy(query, *args, _scan=getattr(module, name), _name=name, **kwargs):
            on_tensor_cores[_name].add(query.shape[-2] > recall_kernel.FEW_ROWS)
            return _scan(query, *args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    assert recall_kernel.agrees_with_float64(torch.device("cpu"), torch.bfloat16, 64)
    assert on_tensor_cores == {"scan": {False, True}, "scan_codes": set()}
    on_tensor_cores["scan"].clear()
    assert coded_recall.agrees_with_float64(torch.device("cpu"), torch.bfloat16, 64)
    assert on_tensor_cores == {"scan": {False, True}, "scan_codes": {False, True}}  # the full scan: the plain one


def test_codes_count_in_a_gpu_caches_bytes_per_token_and_in_a_budgeted_primary(monkeypatch):
    shape = KVShape(num_layers=32, num_kv_heads=32, head_dim=128)
    config = lminfinite.LMInfiniteConfig(topk=5, recall_key_codes="int8")
    on_gpu = span_bytes(shape, config.resolved(4096), torch.bfloat16, device_type="cuda")
    assert on_gpu.middle_scan == 27 * 32 * (128 + 4 + 5)  # 27 recall layers: about half a bfloat16 key
    for uncoded in ("off", "auto"):
        assert span_bytes(shape, dataclasses.replace(config, recall_key_codes=uncoded).resolved(4096),
                          torch.bfloat16, device_type="cuda").middle_scan == 0
    monkeypatch.setattr(coded_recall, "_checked", lambda *args: True)  # as on a GPU where the coded scan agrees
    budgeted = MiddleStore(device_budget=1 << 20, key_codes="int8", recall_kernel="triton")
    budgeted._place(torch.empty(1, 2, 1, 32), torch.device("cuda"))  # placement alone: nothing is allocated
    assert budgeted.primary_cap == (1 << 20) // (2 * 2 * 32 * 4 + codes_row_bytes(2, 32))


def test_decoding_through_the_codes_equals_the_reference():
    """A prompt of 24 windows leaves two coded blocks and one being filled; decoding fills it, so a block is coded
    mid-way. Every logit is the float64 reference's, and the coded scan ran in every recall layer of every step.
    One family: the codes see keys as the store keeps them, unrotated, whichever family made them (the plain
    scan's test, test_lminfinite_recall_kernel.py, runs Qwen2's biased projections too)."""
    steps = 24
    cache, calls, recall_layers = decoded_against_the_reference(CONFIG, "llama-gqa", 24, steps)
    assert calls["lminfinite::recall_scan_codes"] == calls["lminfinite::recall_merge_"] >= steps * recall_layers
    assert cache.layers[1].middle.codes.blocks == 3


def test_steps_that_recall_through_the_codes_replay_with_the_models_own_logits(one_thread):
    """A recording holds the coded scan: replayed steps give the model's own logits bit for bit while blocks are
    coded between replays and the stores grow into new buffers (test_lminfinite_recall_kernel.py says why the
    float32 span kernel and one thread)."""
    config = dataclasses.replace(CONFIG, window_kernel="float32")
    model = lminfinite.enable(tiny_model("llama-gqa", dtype=torch.bfloat16), config)
    ids = random_ids(2 * BLOCK + 19 - 6, seed=3)  # the stores six rows short of two full blocks
    plain, graphed = (lminfinite.InfiniteCache(model, recall_fixed_shapes=True) for _ in range(2))
    token = feed_in_chunks(model, ids, 3 * WINDOW, plain)[:, -1:].argmax(-1)
    feed_in_chunks(model, ids, 3 * WINDOW, graphed)
    decoder, blocks = GraphedDecoder(model, graphed, recorder=ReplayedOps), set()
    with torch.no_grad():
        for step in range(10):  # a block is coded after the sixth step
            blocks.add(graphed.layers[1].middle.codes.blocks)
            expected = model(input_ids=token, past_key_values=plain, use_cache=True).logits
            got = decoder(token)
            torch.testing.assert_close(got, expected, atol=0, rtol=0, msg=lambda m: f"step {step}: {m}")
            token = expected[:, -1:].argmax(-1)
    assert blocks == {1, 2} and decoder.recordings < 10 and not decoder.unrecordable
