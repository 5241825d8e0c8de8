"""GraphedDecoder on the CPU: recorded steady decode steps, replayed as a CUDA graph replays them (graph_replay.py),
give exactly the model's own logits, across re-based frames, snapshots and rollbacks, and every step a graph cannot
stand for runs the model instead. test_lminfinite_cuda.py runs the same decoder through real CUDA graphs."""

from __future__ import annotations

import warnings

import pytest
import torch

import lminfinite
from graph_replay import ReplayedOps
from lminfinite.decode_step import StepKind
from lminfinite.graphed import GraphedDecoder
from lminfinite_models import WINDOW, feed_in_chunks, random_ids, tiny_model

LAMBDA = lminfinite.LMInfiniteConfig(n_starting=4)


def _twin_caches(model, prompt_tokens: int, **cache_options):
    """Two caches fed the same prompt: one decodes through the model, one through a GraphedDecoder."""
    ids = random_ids(prompt_tokens, seed=3)
    caches = [lminfinite.InfiniteCache(model, **cache_options) for _ in range(2)]
    logits = [feed_in_chunks(model, ids, 7, cache) for cache in caches]
    return caches, logits[0][:, -1:].argmax(-1)


def _decode_both(model, plain, decoder, token, steps: int, between=None, mode=torch.no_grad, tolerance=0.0):
    """Greedy steps on both; every step's logits must be equal, bit for bit (or within ``tolerance``).
    ``between(i)`` acts before step i."""
    with mode():
        for i in range(steps):
            if between is not None:
                between(i)
            expected = model(input_ids=token, past_key_values=plain, use_cache=True).logits
            got = decoder(token)
            torch.testing.assert_close(got, expected, atol=tolerance, rtol=0, msg=lambda m: f"step {i}: {m}")
            token = expected[:, -1:].argmax(-1)
    return token


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["llama-mha", "llama-gqa", "qwen2-gqa"])
def test_replayed_steps_give_the_models_own_logits_across_rebased_frames(family, dtype):
    model = lminfinite.enable(tiny_model(family, dtype=dtype), LAMBDA)
    (plain, graphed), token = _twin_caches(model, 3 * WINDOW + 5)
    decoder = GraphedDecoder(model, graphed, recorder=ReplayedOps)
    frames = {graphed.layers[0].frame}
    _decode_both(model, plain, decoder, token, 6 * WINDOW, between=lambda i: frames.add(graphed.layers[0].frame))
    assert len(frames) >= 3  # the frame moved (in place) at least twice while one recording was replayed
    assert decoder.recordings == 1
    assert graphed.get_seq_length() == plain.get_seq_length() == 9 * WINDOW + 5
    assert all(a.frame == b.frame and a.win_start == b.win_start for a, b in zip(plain.layers, graphed.layers))


def test_a_snapshot_and_a_rollback_are_recorded_again_and_stay_exact():
    model = lminfinite.enable(tiny_model("llama-gqa"), LAMBDA)
    (plain, graphed), token = _twin_caches(model, 2 * WINDOW)
    decoder = GraphedDecoder(model, graphed, recorder=ReplayedOps)
    token = _decode_both(model, plain, decoder, token, 5)
    snaps = (plain.snapshot(), graphed.snapshot())
    token = _decode_both(model, plain, decoder, token, WINDOW + 3)  # the first write copies the snapshot's rings
    plain.rollback(snaps[0])
    graphed.rollback(snaps[1])
    _decode_both(model, plain, decoder, token, WINDOW + 3)
    assert decoder.recordings == 3  # at the start, after the copy, after the rollback


def test_a_cache_reset_and_refilled_in_another_dtype_is_recorded_afresh():
    """Its DecodeStep no longer fits the rings: the step after the refill loads a new one, and only then is the
    next step recorded (recording against the old one would replay stale slots and rotations)."""
    model = lminfinite.enable(tiny_model("llama-gqa"), LAMBDA)
    (plain, graphed), token = _twin_caches(model, 2 * WINDOW)
    decoder = GraphedDecoder(model, graphed, recorder=ReplayedOps)
    _decode_both(model, plain, decoder, token, 3)
    model.to(torch.bfloat16)
    ids = random_ids(LAMBDA.n_starting + WINDOW - 2, seed=5)  # one short of steady: the next call is a prefill
    for cache in (plain, graphed):
        cache.reset()
        feed_in_chunks(model, ids, 7, cache)
    _decode_both(model, plain, decoder, torch.tensor([[3]]), 2 * WINDOW)
    assert decoder.recordings == 2 and graphed._step.cos.dtype == torch.bfloat16


@pytest.mark.parametrize("record_mode, replay_mode", [
    (torch.inference_mode, torch.no_grad), (torch.no_grad, torch.inference_mode),
], ids=["inference-then-no_grad", "no_grad-then-inference"])
def test_a_decoder_moves_between_inference_mode_and_no_grad(record_mode, replay_mode):
    model = lminfinite.enable(tiny_model("llama-gqa"), LAMBDA)
    (plain, graphed), token = _twin_caches(model, 2 * WINDOW)
    decoder = GraphedDecoder(model, graphed, recorder=ReplayedOps)
    token = _decode_both(model, plain, decoder, token, 3, mode=record_mode)
    _decode_both(model, plain, decoder, token, 3, mode=replay_mode)
    assert decoder.recordings == 1


def test_steps_a_graph_cannot_stand_for_run_the_model():
    """Before the window is full, and while the cache recalls (its middle store grows), the model runs each step;
    once recall is off on a cache that keeps nothing in the middle, steps are replayed again."""
    model = lminfinite.enable(tiny_model("llama-gqa"), lminfinite.LMInfiniteConfig(n_starting=4, topk=3,
                                                                                  topk_from_layer=1))
    (plain, graphed), token = _twin_caches(model, WINDOW // 2, keep_middle=False, topk=0)
    decoder = GraphedDecoder(model, graphed, recorder=ReplayedOps)
    token = _decode_both(model, plain, decoder, token, WINDOW)  # fills the window, then replays
    assert decoder.recordings == 1
    (plain, graphed), token = _twin_caches(model, 2 * WINDOW)  # keeps middle tokens, recalls
    decoder = GraphedDecoder(model, graphed, recorder=ReplayedOps)
    _decode_both(model, plain, decoder, token, 2 * WINDOW)
    assert decoder.recordings == 0 and graphed.layers[1].middle.length == plain.layers[1].middle.length


def test_middle_tokens_kept_without_recall_go_into_the_store_after_each_replay():
    """A cache that keeps evicted tokens for later recall (as the app's do) replays while recall is off; its middle
    store is the model's own, row for row, so recall switched on afterwards reads what it would have."""
    model = lminfinite.enable(tiny_model("llama-gqa"), lminfinite.LMInfiniteConfig(n_starting=4, topk=3,
                                                                                  topk_from_layer=1))
    (plain, graphed), token = _twin_caches(model, 2 * WINDOW, topk=0)
    decoder = GraphedDecoder(model, graphed, recorder=ReplayedOps)
    token = _decode_both(model, plain, decoder, token, 2 * WINDOW)
    evicted = 4 * WINDOW - LAMBDA.n_starting - (WINDOW - 1)  # all but the start and the last window - 1
    assert decoder.recordings == 1 and graphed.layers[1].middle.length == evicted
    for kept, replayed in zip(plain.layers[1:], graphed.layers[1:]):
        for a, b in zip(kept.middle.view(), replayed.middle.view()):
            torch.testing.assert_close(b, a, atol=0, rtol=0)
    plain.topk = graphed.topk = None  # the model's k: recall on, the model runs every step
    _decode_both(model, plain, decoder, token, WINDOW)
    assert decoder.recordings == 1


def test_another_config_or_input_shape_is_recorded_again():
    model = lminfinite.enable(tiny_model("llama-gqa"), LAMBDA)
    (plain, graphed), token = _twin_caches(model, 2 * WINDOW)
    decoder = GraphedDecoder(model, graphed, recorder=ReplayedOps)
    token = _decode_both(model, plain, decoder, token, 4)
    lminfinite.enable(model, LAMBDA)  # a new state (hooks), the same window
    token = _decode_both(model, plain, decoder, token, 4)
    assert decoder.recordings == 2


def test_the_cpu_stand_in_replays_what_was_recorded_not_what_python_would_do_now():
    """ReplayedOps binds numbers as recorded and refuses a read into Python, as a CUDA graph does: the tests above
    could fail."""
    held, offset = torch.zeros(3), [1.0]
    graph = ReplayedOps()
    out = graph.record(lambda: held + offset[0])
    held.fill_(10.0)
    offset[0] = 100.0
    graph.replay()
    assert out.tolist() == [11.0, 11.0, 11.0]
    with pytest.raises(RuntimeError, match="reads a tensor into Python"):
        ReplayedOps().record(lambda: held * int(held.sum()))


def test_a_forward_that_cannot_be_recorded_is_warned_about_once_and_decoded_without_a_graph():
    """A hook that reads a tensor into Python (a device sync on a GPU) makes the step unrecordable."""
    model = lminfinite.enable(tiny_model("llama-gqa"), LAMBDA)
    (plain, graphed), token = _twin_caches(model, 2 * WINDOW)
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda module, args, out: seen.append(int(args[0][0, -1])))
    decoder = GraphedDecoder(model, graphed, recorder=ReplayedOps)
    with pytest.warns(RuntimeWarning, match="cannot be recorded .*reads a tensor into Python") as warned:
        _decode_both(model, plain, decoder, token, 6)
    hook.remove()
    assert len(warned) == 1
    assert decoder.recordings == 0 and "reads a tensor into Python" in decoder.unrecordable
    assert graphed.get_seq_length() == plain.get_seq_length() == 2 * WINDOW + 6


def test_out_of_memory_while_recording_skips_that_recording_only():
    """Not the model's fault: no warning, and the next step records."""
    failures = [torch.OutOfMemoryError("CUDA out of memory (test)")]

    class OutOfMemoryOnce(ReplayedOps):
        def record(self, forward):
            if failures:
                raise failures.pop()
            return super().record(forward)

    model = lminfinite.enable(tiny_model("llama-gqa"), LAMBDA)
    (plain, graphed), token = _twin_caches(model, 2 * WINDOW)
    decoder = GraphedDecoder(model, graphed, recorder=OutOfMemoryOnce)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _decode_both(model, plain, decoder, token, 6)
    assert decoder.unrecordable is None and decoder.recordings == 1 and not failures


def test_release_lets_go_of_the_recording_and_the_next_step_records_again():
    model = lminfinite.enable(tiny_model("llama-gqa"), LAMBDA)
    (plain, graphed), token = _twin_caches(model, 2 * WINDOW)
    decoder = GraphedDecoder(model, graphed, recorder=ReplayedOps)
    token = _decode_both(model, plain, decoder, token, 3)
    decoder.release()
    assert decoder._recorded_with is None and decoder._graph is None  # nothing of the cache's rings is held
    _decode_both(model, plain, decoder, token, 3)
    assert decoder.recordings == 2


# The float32 span kernel: the CPU's fused flash kernel rounds a replayed call differently from the same call run
# (its scratch memory lies elsewhere); a CUDA graph replays at the recorded addresses.
RECALL = lminfinite.LMInfiniteConfig(n_starting=4, topk=3, topk_from_layer=1, recall_scan_copy=False,
                                    window_kernel="float32")


@pytest.fixture
def one_thread():
    """The CPU stand-in replays into new allocations, where a CUDA graph replays at the recorded addresses; with two
    threads the CPU's per-head products (head_products.py) round differently at other addresses."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_steps_that_recall_replay_through_fixed_shape_stores_with_the_models_own_logits(dtype, one_thread):
    """With fixed shapes (a GPU's default) a step that recalls reads each middle store's whole buffer, its spare
    rows masked by a count kept on the device: one recording stands for every step until a store grows into a new
    buffer, also across a snapshot and a rollback (the count goes back), and every step gives the model's logits
    with the same fixed shapes, bit for bit."""
    model = lminfinite.enable(tiny_model("llama-gqa", dtype=dtype), RECALL)
    (plain, graphed), token = _twin_caches(model, 2 * WINDOW, recall_fixed_shapes=True)
    decoder = GraphedDecoder(model, graphed, recorder=ReplayedOps)
    buffers, spare = [], []

    def watch(i):
        store = graphed.layers[1].middle
        if not any(store.keys is seen for seen in buffers):
            buffers.append(store.keys)
        spare.append(store.keys.shape[-2] - store.length)

    token = _decode_both(model, plain, decoder, token, 2 * WINDOW, between=watch)
    snaps = (plain.snapshot(), graphed.snapshot())
    _decode_both(model, plain, decoder, token, WINDOW, between=watch)
    plain.rollback(snaps[0])
    graphed.rollback(snaps[1])
    token = _decode_both(model, plain, decoder, token, 2 * WINDOW, between=watch)
    recordings = decoder.recordings
    plain.topk = graphed.topk = 2  # another k: recorded again, not replayed with the old one (whose recalled
    # token would move the logits by about 1e-2); the CPU stand-in's float32 sums round differently at other
    # addresses here, by 3e-8
    _decode_both(model, plain, decoder, token, WINDOW // 2, between=watch, tolerance=1e-6)
    assert decoder.recordings > recordings
    assert len(buffers) >= 2 and max(spare) > RECALL.topk  # the store grew, and spare rows were scanned
    # one recording per buffer, one more after the rollback (the snapshot held the rings), one for the new k
    assert decoder.recordings <= len(buffers) + 3 and decoder.recordings < 5 * WINDOW // 4
    assert graphed.layers[1].middle.length == plain.layers[1].middle.length
    assert int(graphed.layers[1].middle.fixed_view()[2]) == graphed.layers[1].middle.length


def test_a_fixed_shape_store_recalls_what_the_exact_one_does():
    """The masked spare rows change nothing: the same logits as a store read row for row (float32, the CPU)."""
    model = lminfinite.enable(tiny_model("llama-gqa"), RECALL)
    ids = random_ids(2 * WINDOW, seed=3)
    exact, fixed = (lminfinite.InfiniteCache(model, recall_fixed_shapes=flag) for flag in (False, True))
    logits = [feed_in_chunks(model, ids, 7, cache) for cache in (exact, fixed)]
    token = logits[0][:, -1:].argmax(-1)
    with torch.no_grad():
        for step in range(2 * WINDOW):
            expected = model(input_ids=token, past_key_values=exact, use_cache=True).logits
            got = model(input_ids=token, past_key_values=fixed, use_cache=True).logits
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=lambda m: f"step {step}: {m}")
            token = expected[:, -1:].argmax(-1)
    store = fixed.layers[1].middle
    assert exact.layers[1].middle.fixed_view() is None and store.keys.shape[-2] > store.length


@pytest.mark.parametrize("config", [LAMBDA, RECALL], ids=["lambda", "recall"])
def test_steps_before_the_window_is_full_replay_one_recording_with_fixed_window_shapes(config, one_thread):
    """A short context (the app's answer reader): with fixed window shapes (a GPU's default) each step from
    n_starting until the window's length attends over the whole ring, the slots not yet filled masked
    (decode_step.py), so one recording stands for all of them, recall on or off (nothing lies beyond the window to
    recall); the steady steps after them get another. Bit for bit the model's own logits with the same shapes."""
    model = lminfinite.enable(tiny_model("llama-gqa"), config)
    (plain, graphed), token = _twin_caches(model, WINDOW // 2, window_fixed_shapes=True)
    decoder = GraphedDecoder(model, graphed, recorder=ReplayedOps)
    kinds = []
    _decode_both(model, plain, decoder, token, 2 * WINDOW, between=lambda i: kinds.append(graphed.layers[0].step_kind))
    assert kinds.count(StepKind.FILLING) == WINDOW // 2 and kinds[-1] is StepKind.STEADY
    assert decoder.recordings == (1 if config.topk else 2)  # a steady step recalls: on the CPU, no fixed store
