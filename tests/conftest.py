import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Saved workspaces of every app the tests start (in-process or launched) go to a folder of this run only.
import tempfile  # noqa: E402

os.environ["LMINFINITE_WORKSPACES"] = tempfile.mkdtemp(prefix="lminfinite-tests-workspaces-")

sys.path.insert(0, str(Path(__file__).parent))

# Without a GPU, Triton's kernels (lminfinite/recall_kernel.py) run under its interpreter, on the CPU's tensors. Set
# before anything imports them: a kernel is built for the interpreter or for the GPU when it is defined.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# The files that take longest, collected first: scripts/test.sh runs two workers, a file each, taking files in
# collection order (--no-loadscope-reorder), so the real model's 7-9 minutes overlap the rest of the suite rather
# than close it (the last file to start, on 2026-11-30, it made the run 25 minutes).
FIRST = ("test_app_real_model.py", "test_deploy_replicas.py", "test_app_browser.py", "test_app_model_switch.py",
         "test_app_fair_sharing.py", "test_app_workspaces.py", "test_lminfinite_gpu_compile.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: each file's own order kept


@pytest.fixture(scope="module")
def runtime():
    """The demo model loaded as the app loads it (test_app_engine.py has its own, with small prefill chunks)."""
    import torch

    from app.cli import AppConfig
    from app.engine.model_loading import ModelChoice, load_runtime
    from app_fixtures import model_dir

    threads = torch.get_num_threads()
    directory = str(model_dir())
    # float32 whatever the CPU: the tests' expectations must not depend on whether it has AMX (cpu_dtype.py)
    yield load_runtime(AppConfig(model=directory, cpu_threads=1, dtype="float32"), ModelChoice(directory, "test"))
    torch.set_num_threads(threads)
