"""Recall through Triton's kernels (lminfinite/recall_kernel.py) against the float64 reference.

Without a GPU the kernels run under Triton's interpreter (conftest.py sets TRITON_INTERPRET=1), so what is checked
here is what they compute; tests/test_lminfinite_cuda.py runs them on a GPU, and benchmarks time them there.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import lminfinite
from benchmarks.profile_prefill import VIEWS  # operators that only make a view: no kernel runs
from graph_replay import ReplayedOps
from lminfinite import recall_kernel
from lminfinite.graphed import GraphedDecoder
from lminfinite.reference import ReferenceModel
from lminfinite.rotary import apply_rotation
from lminfinite_models import WINDOW, feed_in_chunks, random_ids, tiny_model
from test_lminfinite_graphed import one_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not recall_kernel.runs_on(torch.device("cpu")),
                                reason="needs Triton (requirements-dev.txt) and TRITON_INTERPRET=1 (conftest.py)")

FP32_ATOL = 2e-5
CONFIG = lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1, recall_scan_copy=False,
                                     recall_kernel="triton")


class CountOps(TorchDispatchMode):
    """How many times each operator ran, by name."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[func.name()] += 1
        return func(*args, **(kwargs or {}))

    @property
    def kernels(self) -> collections.Counter:
        """The operators that launch a kernel (views left out), by short name."""
        counted = collections.Counter()
        for name, n in self.calls.items():
            if (short := name.split("::")[1].split(".")[0]) not in VIEWS:
                counted[short] += n
        return counted


# How the store is scored: a scan of a block of 128 keys a program, of three blocks a program
# (recall_triton._scan_spans), or a batched product whose every 256 rows' k best recall_select picks
WAYS = {"block": dict(SPAN=1), "span3": dict(SPAN=3), "products": dict(SCORES="products", SELECT_BLOCK=256)}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, n, live, k", [(1, 1000, 777, 5), (3, 300, None, 1), (8, 129, 40, 7), (2, 200, 3, 5)])
def test_the_kernels_pick_float64s_top_k_among_the_rows_in_use(dtype, rows, n, live, k, way, monkeypatch):
    """Blocks with a partial last one, scanned or selected each way (WAYS); a count that leaves spare rows (holding
    huge numbers, which must not win); fewer rows in use than k (-inf logits, zero values). The logits are float32
    sums of the same numbers float64 sums; the rows are float64's top k up to a near-tie."""
    for name, value in WAYS[way].items():
        monkeypatch.setattr(recall_kernel, name, value)
    generator = torch.Generator().manual_seed(rows * n + k)
    query = torch.randn(2, 3, rows, 64, generator=generator).to(dtype)
    keys = torch.randn(2, 3, n, 64, generator=generator).to(dtype)
    values = torch.randn(2, 3, n, 64, generator=generator).to(dtype)
    in_use = n if live is None else live
    keys[..., in_use:, :] = 100.0
    count = None if live is None else torch.tensor(live)
    logits, positions = recall_kernel.store_topk(query, keys, count, k=k, scale=0.125, first_row=10)
    gathered = recall_kernel.gather(positions, logits, values, 10)
    exact = (query.double() @ keys[..., :in_use, :].double().transpose(-1, -2)) * 0.125
    found = min(k, in_use)
    best = exact.topk(found, dim=-1).values
    torch.testing.assert_close(logits[..., :found].double(), best, atol=1e-5, rtol=1e-5)
    assert (logits[..., found:] == float("-inf")).all()
    picked = positions[..., :found] - 10
    assert ((picked >= 0) & (picked < in_use)).all()
    torch.testing.assert_close(exact.gather(-1, picked), best, atol=1e-5, rtol=1e-5)
    index = picked.reshape(2, 3, -1, 1).expand(-1, -1, -1, 64)
    assert torch.equal(gathered[..., :found, :], values.gather(2, index).reshape(2, 3, rows, found, 64))
    assert (gathered[..., found:, :] == 0).all()


def test_more_query_rows_than_a_decode_step_has_are_scanned_not_multiplied_whole(monkeypatch):
    """SCORES = "products" holds every product: for a question read with recall (more rows than
    recall_kernel.PRODUCT_ROWS) that would be rows times more, so those are scanned, with the same picks."""
    from lminfinite import recall_triton

    monkeypatch.setattr(recall_kernel, "SCORES", "products")
    called, select, scan = [], recall_triton.select, recall_triton.scan
    monkeypatch.setattr(recall_triton, "select", lambda *args: called.append("select") or select(*args))
    monkeypatch.setattr(recall_triton, "scan", lambda *args: called.append("scan") or scan(*args))
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(1, 2, 300, 32, generator=generator)
    for rows in (recall_kernel.PRODUCT_ROWS, recall_kernel.PRODUCT_ROWS + 1):
        query = torch.randn(1, 2, rows, 32, generator=generator)
        logits, positions = recall_kernel.store_topk(query, keys, None, k=3, scale=1.0, first_row=0)
        best, rows_picked = (query.double() @ keys.double().transpose(-1, -2)).topk(3, dim=-1)
        torch.testing.assert_close(logits.double(), best, atol=1e-5, rtol=1e-5)
        assert torch.equal(positions, rows_picked)
    assert called == ["select", "scan"]


@pytest.mark.parametrize("rows", [1, 2])  # recall_kernel.FEW_ROWS: more rows are scanned a block a program
@pytest.mark.parametrize("rising", [True, False])
def test_a_program_over_several_blocks_keeps_their_k_best_as_each_block_displaces_earlier_picks(rows, rising,
                                                                                               monkeypatch):
    """Keys whose logits rise along the store: every block's k best displace all the picks before them (a running
    k best that took one key a block, or only the first block's, fails here); falling: the first block's stay.
    Eight blocks in two programs of four, the last one partial, against float64's top k."""
    monkeypatch.setattr(recall_kernel, "SPAN", 4)
    generator = torch.Generator().manual_seed(rows)
    n, k = 7 * recall_kernel.BLOCK + 40, 5
    query = torch.randn(1, 2, rows, 32, generator=generator)
    keys = torch.randn(1, 2, n, 32, generator=generator) * 0.01
    ramp = torch.linspace(-1.0, 1.0, n) if rising else torch.linspace(1.0, -1.0, n)
    keys += ramp[:, None] * query.mean(2, keepdim=True)  # every row's logit follows the ramp
    logits, positions = recall_kernel.store_topk(query, keys, None, k=k, scale=1.0, first_row=3)
    candidates, _ = torch.ops.lminfinite.recall_scan(query, keys, None, k, 1.0, 3, 4)
    exact = query.double() @ keys.double().transpose(-1, -2)
    best, rows_picked = exact.topk(k, dim=-1)
    assert candidates.shape[-1] == 2 * k  # two programs
    torch.testing.assert_close(logits.double(), best, atol=1e-5, rtol=1e-5)
    assert torch.equal(positions - 3, rows_picked)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rotation_kernel_turns_queries_as_apply_rotation_does(dtype):
    """A decode step's grouped query heads (B, Hkv, g, 1, D) by one float32 row: rotary.apply_rotation's numbers,
    within one rounding of the query's dtype (a GPU may fuse the multiply-adds)."""
    generator = torch.Generator().manual_seed(4)
    query = torch.randn(2, 3, 2, 1, 64, generator=generator).to(dtype)
    angle = torch.rand(1, 32, generator=generator) * 6
    cos, sin = torch.cat((angle.cos(), angle.cos()), -1), torch.cat((angle.sin(), angle.sin()), -1)
    expected = apply_rotation(query, cos, sin)
    rotated = recall_kernel.rotate(query, cos, sin)
    assert rotated.dtype == dtype and rotated.shape == query.shape
    torch.testing.assert_close(rotated, expected, atol=1e-6, rtol=torch.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("live", [777, 3])
def test_the_merge_folds_the_recalled_tokens_into_the_window_output_as_float64_does(dtype, live):
    """One softmax over the window (its output and log-sum-exp) and the recalled tokens, whose values the kernel
    reads from the store: a strided output, written in place; with fewer rows in use than k, the -inf picks weigh
    nothing (their rows, spare, hold NaN)."""
    generator = torch.Generator().manual_seed(live)
    query = torch.randn(1, 4, 2, 64, generator=generator).to(dtype)
    keys, values = (torch.randn(1, 4, 1000, 64, generator=generator).to(dtype) for _ in range(2))
    values[..., live:, :] = float("nan")
    logits, positions = recall_kernel.store_topk(query, keys, torch.tensor(live), k=5, scale=0.125, first_row=10)
    lse = torch.randn(1, 4, 2, generator=generator)
    out = torch.randn(1, 2, 4, 64, generator=generator).transpose(1, 2)  # strided, as CUDA's kernels may leave it
    expected = out.double().clone()
    recall_kernel.merge_into(out, lse, logits, positions, values, 10)
    total = torch.logaddexp(lse.double(), torch.logsumexp(logits.double(), dim=-1))[..., None]
    picked = values.double()[0].gather(1, (positions[0] - 10).clamp(max=live - 1).reshape(4, -1, 1).expand(-1, -1, 64))
    weights = torch.exp(logits.double() - total)
    expected = expected * torch.exp(lse.double()[..., None] - total) + (
        weights[..., None] * picked.reshape(1, 4, 2, 5, 64)).nan_to_num().sum(-2)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    assert weights[..., live:].eq(0).all() and not out.isnan().any()


def decoded_against_the_reference(config, family: str, prompt_windows: int, steps: int):
    """Greedy decoding of ``steps`` tokens after a prompt of ``prompt_windows`` windows (fed in chunks of three),
    every logit checked against the float64 reference: (the cache, the operators each recalling step ran, the
    recall layers)."""
    model = lminfinite.enable(tiny_model(family), config)
    prompt = random_ids(prompt_windows * WINDOW, seed=7)
    cache = lminfinite.InfiniteCache(model)
    feed_in_chunks(model, prompt[:, :-1], 3 * WINDOW, cache)
    with CountOps() as counted, torch.no_grad():
        out = model.generate(prompt, past_key_values=cache, max_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    expected = ReferenceModel(model, config).logits(out.sequences[:, :-1])[:, prompt.shape[1] - 1 :]
    torch.testing.assert_close(torch.stack(out.logits, dim=1).double(), expected, atol=FP32_ATOL, rtol=0)
    return cache, counted.calls, model.config.num_hidden_layers - config.topk_from_layer


@pytest.mark.parametrize("family, scores", [("llama-gqa", "kernel"), ("qwen2-gqa", "kernel"),
                                            ("llama-gqa", "products")])
def test_decoding_through_the_kernels_equals_the_reference(family, scores, monkeypatch):
    """A prompt beyond ten windows, then greedy decoding: every step recalls through the kernels alone (the store
    holds every middle token: scan, or product and selection, then merge), and every logit is the float64
    reference's."""
    monkeypatch.setattr(recall_kernel, "SCORES", scores)
    steps = 12
    _, calls, recall_layers = decoded_against_the_reference(CONFIG, family, 10, steps)
    scored, unused = ("recall_select", "recall_scan") if scores == "products" else ("recall_scan", "recall_select")
    assert calls[f"lminfinite::{scored}"] == calls["lminfinite::recall_merge_"] >= steps * recall_layers
    assert calls[f"lminfinite::{unused}"] == calls["lminfinite::recall_gather"] == 0


def test_an_observer_sees_what_the_kernels_recall_and_the_logits_stay_the_same():
    """lminfinite.observe_topk is told the positions and weights: the values are then gathered and merged by
    kernel.py, which gives the merge kernel's logits up to float32 rounding."""
    model = lminfinite.enable(tiny_model("llama-gqa"), CONFIG)
    caches = [lminfinite.InfiniteCache(model) for _ in range(2)]
    token = feed_in_chunks(model, random_ids(6 * WINDOW, seed=9), 3 * WINDOW, caches[0])[:, -1:].argmax(-1)
    feed_in_chunks(model, random_ids(6 * WINDOW, seed=9), 3 * WINDOW, caches[1])
    seen = []
    with torch.no_grad():
        plain = model(input_ids=token, past_key_values=caches[0]).logits
        with CountOps() as counted, lminfinite.observe_topk(model, seen.append):
            observed = model(input_ids=token, past_key_values=caches[1]).logits
    torch.testing.assert_close(observed, plain, atol=1e-6, rtol=0)
    assert counted.calls["lminfinite::recall_gather"] > 0 and counted.calls["lminfinite::recall_merge_"] == 0
    assert [selection.layer_idx for selection in seen] == [1, 2]
    assert all(selection.positions.shape[-1] == CONFIG.topk and selection.weights.sum() > 0 for selection in seen)


def test_a_prefill_block_and_tokens_still_in_recent_merge_with_the_kernels_scan():
    """Prefill chunks of a few tokens: some of their middle tokens are still in the ring, so the kernels scan the
    store and the general path merges the rest and gathers the values: the float64 reference's logits."""
    model = lminfinite.enable(tiny_model("llama-gqa"), CONFIG)
    ids = random_ids(5 * WINDOW, seed=5)
    expected = ReferenceModel(model, CONFIG).logits(ids)
    cache = lminfinite.InfiniteCache(model)
    with CountOps() as counted:
        logits = feed_in_chunks(model, ids, 5, cache)
    torch.testing.assert_close(logits.double(), expected, atol=FP32_ATOL, rtol=0)
    assert counted.calls["lminfinite::recall_scan"] > 0 and counted.calls["lminfinite::recall_gather"] == 0


def test_bf16_decoding_through_the_kernels_follows_the_reference():
    """bfloat16 with fixed-shape stores (a GPU's default): within 0.03 of the float64 reference of the same weights,
    as recall through PyTorch's operators is (test_lminfinite_equivalence.py)."""
    model = lminfinite.enable(tiny_model("llama-gqa", dtype=torch.bfloat16), CONFIG)
    prompt = random_ids(10 * WINDOW, seed=7)
    with torch.no_grad():
        out = model.generate(prompt, past_key_values=lminfinite.InfiniteCache(model, recall_fixed_shapes=True),
                             max_new_tokens=12, do_sample=False, output_logits=True, return_dict_in_generate=True)
    expected = ReferenceModel(model, CONFIG).logits(out.sequences[:, :-1])[:, prompt.shape[1] - 1 :]
    assert (torch.stack(out.logits, dim=1).double() - expected).abs().max() < 0.03


@pytest.mark.parametrize("kernel", ["triton", "torch"])
def test_steps_that_recall_through_the_kernels_replay_with_the_models_own_logits(kernel, one_thread):
    """The kernels are operators, so a recording holds them: replayed steps through fixed-shape stores give the
    model's own logits bit for bit, recorded again each time a store grows into a new buffer (the prompt leaves
    the stores a few rows short of full; PyTorch's operators are checked the same way). The float32 span kernel
    and one thread, as in test_lminfinite_graphed.py: the CPU's flash kernel and its two-thread products round a
    replayed call differently."""
    config = dataclasses.replace(CONFIG, window_kernel="float32", recall_kernel=kernel)
    model = lminfinite.enable(tiny_model("llama-gqa", dtype=torch.bfloat16), config)  # a GPU's dtype
    ids = random_ids(5 * WINDOW, seed=3)
    plain, graphed = (lminfinite.InfiniteCache(model, recall_fixed_shapes=True) for _ in range(2))
    token = feed_in_chunks(model, ids, 7, plain)[:, -1:].argmax(-1)
    feed_in_chunks(model, ids, 7, graphed)
    decoder, buffers = GraphedDecoder(model, graphed, recorder=ReplayedOps), set()
    with torch.no_grad():
        for step in range(14):  # the stores grow at steps 3 and 11; a step is recorded after each
            buffers.add(graphed.layers[1].middle.keys.shape[-2])  # by rows: a freed buffer's address can come back
            expected = model(input_ids=token, past_key_values=plain, use_cache=True).logits
            got = decoder(token)
            torch.testing.assert_close(got, expected, atol=0, rtol=0, msg=lambda m: f"step {step}: {m}")
            token = expected[:, -1:].argmax(-1)
    assert len(buffers) >= 3 and decoder.recordings <= len(buffers) + 1 and not decoder.unrecordable


def extra_launches_per_recall_layer(config) -> tuple[float, collections.Counter]:
    """How many operators a steady decode step runs per recall layer more than the same step of a cache fed the
    same without recall (views left out: no kernel runs), and what the recalling step ran, by name; the step
    before it run once (what is made once per model, such as a decode step's sign rows, made)."""
    model = lminfinite.enable(tiny_model("llama-gqa", dtype=torch.bfloat16), config)
    launches = []
    for topk in (0, config.topk):
        cache = lminfinite.InfiniteCache(model, recall_fixed_shapes=True)
        cache.topk = topk
        token = feed_in_chunks(model, random_ids(3 * WINDOW, seed=3), 7, cache)[:, -1:].argmax(-1)
        with torch.no_grad():
            model(input_ids=token, past_key_values=cache)
        with torch.no_grad(), CountOps() as counted:
            model(input_ids=token, past_key_values=cache)
        launches.append(sum(counted.kernels.values()))
    return (launches[1] - launches[0]) / (model.config.num_hidden_layers - config.topk_from_layer), counted.calls


def test_a_decode_step_that_recalls_launches_seven_kernels_more_per_layer_not_fortyfour():
    """What a graph replays is launches: a steady decode step with recall through the kernels runs 7 operators per
    recall layer more than the same step without recall (the query's rotation for recall, the window part in
    float32 with its log-sum-exp and back, the scan, the top-k and the candidates' positions, the merge), where
    PyTorch's operators run 44. The query's position as a tensor is made only for an observer (it was one more)."""
    extra = {kernel: extra_launches_per_recall_layer(dataclasses.replace(CONFIG, recall_kernel=kernel))[0]
             for kernel in ("torch", "triton")}
    assert extra == {"torch": 44, "triton": 7}


def test_auto_scans_a_large_store_through_the_operators_only_in_a_step_recorded_into_a_cuda_graph(monkeypatch):
    """From a CUDA graph the operators' product read 128K middle keys faster than the scan (H200); eagerly the scan
    won at every size. A named kernel is kept as it is."""
    monkeypatch.setattr(recall_kernel, "runs_on", lambda device: True)
    monkeypatch.setattr(recall_kernel, "_checked", lambda *args: True)
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    cuda, rows = torch.device("cuda", 0), recall_kernel.GRAPHED_OPERATORS_FROM
    chosen = {}
    for capturing[0] in (False, True):
        for name, store_rows in (("large", rows), ("small", rows - 1)):
            for requested in ("auto", "triton"):
                shape = torch.Size((1, 2, store_rows, 64))
                chosen[capturing[0], name, requested] = recall_kernel.scans_store(requested, cuda, torch.bfloat16,
                                                                                   shape)
    assert [key for key, fused in chosen.items() if not fused] == [(True, "large", "auto")]
    assert not recall_kernel.scans_store("torch", cuda, torch.bfloat16, torch.Size((1, 2, 8, 64)))


def test_the_kernel_named_must_be_one_there_is():
    with pytest.raises(ValueError, match="recall_kernel must be one of auto, torch, triton"):
        lminfinite.LMInfiniteConfig(recall_kernel="cuda")
    assert not recall_kernel.resolve("torch", torch.device("cpu"), torch.float32, 64)
    assert not recall_kernel.resolve("auto", torch.device("cpu"), torch.float32, 64)  # only on a GPU by default
    with pytest.raises(ValueError, match="heads of at most 256"):
        recall_kernel.resolve("triton", torch.device("cpu"), torch.float32, 512)
