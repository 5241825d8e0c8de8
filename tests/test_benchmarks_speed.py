"""The speed benchmark's machinery on a tiny random Llama: what it counts, not how fast it runs.

KV-cache bytes are exact functions of the shapes, so they are checked exactly: vanilla's grow with the
context, LM-Infinite's stay at n_starting + L rows per layer plus fixed rotation tables, top-k adds the middle store.
"""

import torch

import lminfinite

from benchmarks import measure
from benchmarks.models import cpu_default_shape
from benchmarks.speed import best_of_rounds, recall_note, scaling_note, summary_table, vanilla_decode_at_window

WINDOW, N_STARTING, DECODE = 64, 4, 3


def measure_one(method, context):
    job = dict(method=method, context=context, model_spec="random", window=WINDOW, device="cpu", dtype="float32",
               load_in_4bit=False, decode_tokens=DECODE, prefill_chunk=2 * WINDOW, n_starting=N_STARTING, topk=2,
               threads=torch.get_num_threads(), repeat_budget_s=0)  # one prefill per cell: what is counted, not timed
    return measure.run(job)


def kv_row_bytes():
    shape = cpu_default_shape(WINDOW)
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    return shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * head_dim * 4  # key + value, float32


def test_kv_bytes_and_summary_table():
    results = [measure_one(m, c) for c in (2 * WINDOW, 4 * WINDOW)
               for m in ("vanilla", "truncate", "lminfinite", "lminfinite-topk")]
    by = {(r["method"], r["context"]): r for r in results}
    assert not any(r["error"] for r in results)
    assert all(r["prefill_s"] > 0 and r["decode_ms"] > 0 and r["peak_bytes"] >= 0 for r in results)
    _check_kv_bytes(by)
    # One process kept one model across the cells (as a CUDA worker does): a vanilla cell after LM-Infinite ones
    # runs it unpatched.
    measure_one("vanilla", 2 * WINDOW)
    (model,) = measure._loaded.values()
    assert lminfinite.get_state(model) is None and model.config._attn_implementation == "sdpa"
    _check_halfway_times(by, results)
    _check_summary_table(results)


def _check_kv_bytes(by):
    rotation = set()
    for context in (2 * WINDOW, 4 * WINDOW):
        assert by[("vanilla", context)]["kv_bytes"] == kv_row_bytes() * (context + DECODE)
        assert by[("truncate", context)]["kv_bytes"] == kv_row_bytes() * (WINDOW + DECODE)
        # The start keys twice (unrotated, and placed for the decode step), the ring of L slots, and the
        # rotation tables the cache's frame needs (bounded by O(L), the same at every context).
        rotation.add(by[("lminfinite", context)]["kv_bytes"] - kv_row_bytes() * (2 * N_STARTING + WINDOW))
    assert len(rotation) == 1 and 0 < rotation.pop() < kv_row_bytes() * WINDOW
    topk_growth = by[("lminfinite-topk", 4 * WINDOW)]["kv_bytes"] - by[("lminfinite-topk", 2 * WINDOW)]["kv_bytes"]
    assert topk_growth > 0  # the middle store keeps every evicted token of the top-k layers


def _check_halfway_times(by, results):
    for method in ("lminfinite", "lminfinite-topk"):  # chunks of 2·L: the first half ends at a chunk boundary
        row = by[(method, 4 * WINDOW)]
        assert 0 < row["half_prefill_s"] < row["prefill_s"]
    assert by[("vanilla", 4 * WINDOW)]["half_prefill_s"] == 0  # one call: no halfway point
    assert scaling_note(results, WINDOW).startswith("Prefill scaling inside one prefill, t(n) / t(n/2): lminfinite ")


def _check_summary_table(results):
    table = summary_table(results, WINDOW).splitlines()
    assert len(table) == 2 + len(results)
    assert "| vanilla | 128 |" in table[2] and "1.00×" in table[2]
    baseline = vanilla_decode_at_window(results, WINDOW)
    truncations = sorted(r["decode_ms"] for r in results if r["method"] == "truncate")
    assert baseline == (truncations[0] + truncations[1]) / 2  # no vanilla row at L here: the truncation runs


def test_best_of_rounds_keeps_each_cells_fastest_times_and_any_error():
    def row(method, prefill_s, decode_ms, peak, error=""):
        return dict(method=method, context=1024, prefill_s=prefill_s, prefill_tok_s=1024 / prefill_s if prefill_s else 0,
                    decode_ms=decode_ms, peak_bytes=peak, kv_bytes=7, error=error, half_prefill_s=prefill_s / 3)

    first = [row("vanilla", 2.0, 30.0, 100), row("lminfinite", 1.5, 20.0, 50), row("truncate", 0.5, 9.0, 10, "OOM")]
    second = [row("vanilla", 1.6, 33.0, 90), row("lminfinite", 1.7, 19.0, 60), row("truncate", 0, 0, 0, "too slow")]
    merged = {r["method"]: r for r in best_of_rounds([first, second])}
    assert (merged["vanilla"]["prefill_s"], merged["vanilla"]["prefill_tok_s"]) == (1.6, 1024 / 1.6)
    assert merged["vanilla"]["half_prefill_s"] == 1.6 / 3  # from the same (fastest) run
    assert (merged["vanilla"]["decode_ms"], merged["vanilla"]["peak_bytes"]) == (30.0, 100)
    assert (merged["lminfinite"]["prefill_s"], merged["lminfinite"]["decode_ms"], merged["lminfinite"]["peak_bytes"]) == (1.5, 19.0, 60)
    assert merged["truncate"]["error"] == "OOM"


def test_a_deadline_leaves_later_cells_out_and_a_later_round_fills_them(monkeypatch):
    from benchmarks import speed

    ran = []
    monkeypatch.setattr(speed, "measure_in_fresh_process", lambda spawn, job: ran.append(job["context"]) or dict(
        method=job["method"], context=job["context"], prefill_s=1.0, prefill_tok_s=job["context"], decode_ms=5.0,
        peak_bytes=1, kv_bytes=1, error="", half_prefill_s=0.5))
    args = speed.parse_args(["--device", "cpu", "--window", str(WINDOW), "--decode-tokens", str(DECODE),
                             "--n-starting", str(N_STARTING), "--topk", "2", "--threads", "1",
                             "--vanilla-budget-s", "1e9"])  # every flag the cells take, as a command line gives them
    past = speed.run_round(args, "float32", [WINDOW, 2 * WINDOW], ["lminfinite"], {}, None, deadline=0.0)
    assert ran == [] and [r["error"] for r in past] == [speed.NO_TIME] * 2
    stop_at = speed.stops_in([past], 1e9)
    assert stop_at == {}  # cells with no time are not failures: a later round runs them
    later = speed.run_round(args, "float32", [WINDOW, 2 * WINDOW], ["lminfinite"], stop_at, None)
    merged = {r["context"]: r for r in best_of_rounds([past, later])}
    assert ran == [WINDOW, 2 * WINDOW] and all(not r["error"] for r in merged.values())
    assert best_of_rounds([past])[0]["error"] == speed.NO_TIME


def test_cuda_graph_decodes_get_their_own_columns_and_speed_ups():
    def row(method, context, decode_ms, graph_ms=0.0, error=""):
        return dict(method=method, context=context, prefill_s=1.0, prefill_tok_s=context, decode_ms=decode_ms,
                    peak_bytes=1, kv_bytes=1, error=error, half_prefill_s=0.5, graph_decode_ms=graph_ms)

    rounds = [[row("vanilla", 4096, 30.0), row("vanilla", 32768, 60.0), row("lminfinite", 32768, 24.0, 8.0)],
              [row("vanilla", 4096, 31.0), row("vanilla", 32768, 66.0), row("lminfinite", 32768, 25.0, 7.5),
               row("vanilla", 131072, 0, error="OOM")]]
    merged = best_of_rounds(rounds)
    assert {(r["method"], r["context"]): r["graph_decode_ms"] for r in merged}[("lminfinite", 32768)] == 7.5
    header, _, *lines = summary_table(merged, 4096).splitlines()
    assert header.count("|") == 12 and "decode ms/token, CUDA graph" in header
    cells = {line.split(" | ")[0].strip("| ") + line.split(" | ")[1]: line.split(" | ") for line in lines}
    assert cells["lminfinite32,768"][6:9] == ["2.50×", "7.50", "8.00×"]  # 60 / 24, and 60 / 7.5
    assert cells["vanilla32,768"][6:9] == ["1.00×", "", ""]
    assert cells["vanilla131,072"][2] == "OOM" and len(cells["vanilla131,072"]) == len(header.split(" | "))
    assert "CUDA graph" not in summary_table(best_of_rounds([[row("vanilla", 4096, 30.0)]]), 4096)


def test_the_recall_note_compares_decodes_eager_and_through_cuda_graphs():
    def row(method, decode_ms, graph_ms=0.0):
        return dict(method=method, context=32768, prefill_s=1.0, prefill_tok_s=1.0, decode_ms=decode_ms,
                    peak_bytes=1, kv_bytes=1, error="", half_prefill_s=0.5, graph_decode_ms=graph_ms)

    note = recall_note([row("lminfinite", 40.0, 8.0), row("lminfinite-topk", 60.0, 10.0)])
    assert "at 32,768 a token decodes in 1.50× the time (1.25× through CUDA graphs)" in note
    assert "CUDA graphs" not in recall_note([row("lminfinite", 40.0, 8.0), row("lminfinite-topk", 60.0)])
