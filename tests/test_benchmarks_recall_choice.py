"""The recall way the GPU's speed cells run with, chosen from the recall benchmark's rows of the same call
(benchmarks/recall_choice.py), and how the cells' workers take it (benchmarks.speed --recall-settings)."""

import json

import pytest

from benchmarks import measure, recall_choice, speed
from lminfinite import recall_kernel


def rows(graph_ms: dict[str, tuple[float, float, float]]) -> list[dict]:
    """The recall benchmark's rows at 4K, 32K and 128K middle tokens, each way's graph time in ms."""
    return [dict(middle=middle, kernel=way, eager_s=1.0, graph_s=ms[i] / 1e3)
            for i, middle in enumerate((4096, 32768, 131072)) for way, ms in graph_ms.items()]


def test_the_fastest_way_at_32k_is_chosen_and_the_operators_dropped_where_it_beats_them_at_the_largest_size():
    graph_ms = {"torch": (0.11, 0.20, 0.46), "triton": (0.045, 0.21, 0.74), "triton-span8": (0.05, 0.15, 0.50),
                "products": (0.05, 0.13, 0.40)}
    assert recall_choice.choose(rows(graph_ms)) == {"SCORES": "products",
                                                    "GRAPHED_OPERATORS_FROM": recall_choice.NEVER}


def test_where_the_operators_win_at_the_largest_size_the_library_keeps_them_there():
    graph_ms = {"torch": (0.11, 0.20, 0.46), "triton": (0.045, 0.21, 0.74), "triton-span8": (0.05, 0.15, 0.60)}
    assert recall_choice.choose(rows(graph_ms)) == {"SPAN": 8}


def test_the_librarys_own_way_when_it_is_fastest_and_nothing_from_failed_or_eager_only_rows():
    graph_ms = {"torch": (0.11, 0.20, 0.46), "triton": (0.045, 0.12, 0.74), "triton-span8": (0.05, 0.15, 0.60)}
    failed = [dict(middle=32768, kernel="products", failed="RuntimeError: no bmm.dtype")]
    assert recall_choice.choose(rows(graph_ms) + failed) == {}
    cpu = [dict(middle=32768, kernel=way, eager_s=1.0, graph_s=None) for way in ("torch", "triton")]
    assert recall_choice.choose(cpu) == {} and recall_choice.choose([]) == {}


def test_the_choice_is_printed_as_json_from_the_tables_file(tmp_path, capsys):
    path = tmp_path / "recall_kernel_gpu.json"
    path.write_text(json.dumps(dict(results=rows({"torch": (1, 1, 1), "triton-span32": (0.5, 0.5, 2)}))))
    recall_choice.main([str(path)])
    assert json.loads(capsys.readouterr().out) == {"SPAN": 32}


def test_a_cells_worker_runs_with_the_settings_and_speed_refuses_unknown_ones(monkeypatch):
    seen = {}

    def measured(**job):
        seen.update(SPAN=recall_kernel.SPAN, SCORES=recall_kernel.SCORES, job=sorted(job))
        raise KeyError("stop here")

    for name in measure.RECALL_SETTINGS:
        monkeypatch.setattr(recall_kernel, name, getattr(recall_kernel, name))  # put back after the test
    monkeypatch.setattr(measure, "_measure", measured)
    args = speed.parse_args(["--device", "cpu", "--recall-settings", '{"SPAN": 8, "SCORES": "products"}'])
    with pytest.raises(KeyError):
        measure.run(speed.speed_job(args, "float32", "lminfinite-topk", 512))
    assert (seen["SPAN"], seen["SCORES"]) == (8, "products") and "recall_settings" not in seen["job"]
    with pytest.raises(SystemExit):
        speed.parse_args(["--recall-settings", '{"BLOCK": 64}'])
