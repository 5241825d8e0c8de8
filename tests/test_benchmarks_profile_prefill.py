"""The prefill profile's machinery on the CPU at Llama-2-7B's 32 layers, tiny: both ways timed pair by pair, and the
operators each layer runs counted, so a GPU's device time is not spent finding out it does not run."""

import re

from benchmarks import profile_prefill


def test_the_profile_times_both_ways_and_counts_what_a_layer_adds(capsys):
    profile_prefill.main(["--model", "random-host", "--device", "cpu", "--window", "64", "--context", "64",
                          "--rounds", "2", "--rows", "3"])
    printed = capsys.readouterr().out
    assert re.search(r"lminfinite / vanilla time: \d+\.\d{3} \(median of 2 pairs\)", printed)
    # Vanilla's attention module runs 17 operators; LM-Infinite's first call 11 more (test_lminfinite_first_call.py).
    assert "operators per layer: vanilla 17, lminfinite 28 (more: " in printed
    assert "== vanilla: operators by cpu_time_total ==" in printed and "== lminfinite: operators by" in printed
