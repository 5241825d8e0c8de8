"""The dtype benchmark's machinery on the tiny test model: both dtypes run in turn, each round's ratios are the
rates' own, and the report names the dtype ``--dtype auto`` picks on this CPU."""

import re

import torch

from app_fixtures import model_dir
from benchmarks import cpu_dtype


def test_both_dtypes_take_turns_and_the_report_names_what_auto_picks_here(tmp_path):
    threads = torch.get_num_threads()
    try:
        text = cpu_dtype.main(["--model", str(model_dir()), "--rounds", "2", "--context", "96", "--decode", "4",
                               "--threads", "1", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / f"cpu_dtype_{model_dir().name}.md").read_text() == text + "\n"
    rows = [line for line in text.splitlines() if re.match(r"\| [12] \|", line)]
    assert len(rows) == 2
    for row in rows:
        _, _, prefill, prefill_ratio, decode, decode_ratio, _ = (cell.strip() for cell in row.split("|"))
        f32, bf16 = (float(v.replace(",", "")) for v in prefill.split(" / "))
        assert f32 > 0 and bf16 > 0 and abs(float(prefill_ratio) - bf16 / f32) < 0.01 * bf16 / f32 + 0.006
        f32, bf16 = (float(v) for v in decode.split(" / "))
        assert f32 > 0 and bf16 > 0 and abs(float(decode_ratio) - bf16 / f32) < 0.01 * bf16 / f32 + 0.006
    agree = int(re.search(r"the greedy tokens agree (\d) of 4", text).group(1))
    assert 0 <= agree <= 4
    from app.engine.cpu_dtype import default_cpu_dtype

    auto, why = default_cpu_dtype()
    assert f"`--dtype auto` here: {str(auto).removeprefix('torch.')} ({why})" in text
    assert "decoding through its own weights" in text  # the test model is no GGUF conversion: no integer copies
