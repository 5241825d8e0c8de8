"""scripts/gpu_check.sh shares one device call's budget among its steps: a step that hangs (or whose kernels take
longer to build) costs itself, never the steps after it. A GPU session has one call and one rerun; a budget that
overran would be found there, with no time to mend it. GPU_CHECK_PLAN=1 prints each step's timeout, were every
step to run to it, and runs nothing."""

import pathlib
import subprocess

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"


def plan(*steps: str, budget: int | None = None) -> dict[str, int]:
    env = {"PATH": "/usr/bin:/bin", "GPU_CHECK_PLAN": "1"} | ({"GPU_CHECK_BUDGET_S": str(budget)} if budget else {})
    out = subprocess.run(["bash", str(SCRIPT), *steps], env=env, capture_output=True, text=True, check=True).stdout
    return {step: int(seconds) for step, seconds in (line.split() for line in out.splitlines())}


def test_the_next_sessions_call_fits_one_device_call_and_the_speed_cells_get_what_they_ask():
    """The command the notes give the next GPU session, under a device call's 590 s: the tests last, as what a
    slow step before them leaves is cut from them (a killed pytest still logs the tests it ran)."""
    timeouts = plan("recall", "cells", "tests")
    assert timeouts == {"recall": 100, "cells": 200, "tests": 270}
    assert sum(timeouts.values()) <= 570


def test_a_cut_budget_is_taken_from_the_first_steps_and_the_later_keep_their_floors():
    assert plan("recall", "tests", "cells", budget=400) == {"recall": 40, "tests": 210, "cells": 150}
    assert plan("recall", "tests", "cells", budget=300) == {"recall": 0, "tests": 150, "cells": 150}


def test_one_step_alone_gets_what_it_asks_up_to_the_budget():
    assert plan("speed") == {"speed": 540}
    assert plan("speed", budget=400) == {"speed": 400}
    assert plan() == {"cells": 200, "tests": 370}  # the default steps


@pytest.mark.parametrize("step", ["cell", "--help"])
def test_an_unknown_step_is_refused_before_anything_runs(step):
    result = subprocess.run(["bash", str(SCRIPT), "recall", step], env={"PATH": "/usr/bin:/bin", "GPU_CHECK_PLAN": "1"},
                            capture_output=True, text=True)
    assert result.returncode == 2 and f"unknown step {step}" in result.stdout
