"""Shared helpers for the app tests: the model to test on, generated documents, and a launched app server."""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
import zipfile
from pathlib import Path

from benchmarks.launched_app import AppServer, launch_app

ROOT = Path(__file__).resolve().parents[1]
DEMO_MODEL = ROOT / "demo_model"
_built_model: Path | None = None


def model_dir() -> Path:
    """The bundled demo model (or $APP_TEST_MODEL); a tiny random Llama with the same tokenizer recipe when absent."""
    global _built_model
    override = os.environ.get("APP_TEST_MODEL")
    if override:
        return Path(override)
    if (DEMO_MODEL / "config.json").is_file() and (DEMO_MODEL / "model.safetensors").is_file():
        return DEMO_MODEL
    if _built_model is None:
        _built_model = Path(tempfile.mkdtemp(prefix="app-test-model-"))
        _build_tiny_model(_built_model)
    return _built_model


def _build_tiny_model(out: Path) -> None:
    import sysconfig

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT))
    from training.tokenizer import train_tokenizer

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))[:30]]
    tokenizer = train_tokenizer(texts, vocab_size=512)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


# -- documents ---------------------------------------------------------------------------------
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def make_pdf(path: Path, pages: int = 6, secret_page: int = 4, secret: str = "71432") -> Path:
    """A text PDF whose page ``secret_page`` holds a pass key among filler sentences."""
    import pymupdf

    doc = pymupdf.open()
    for number in range(1, pages + 1):
        page = doc.new_page()
        lines = [f"Report page {number}."] + [FILLER] * 14
        if number == secret_page:
            lines.insert(7, f"The pass key is {secret}. Remember it. {secret} is the pass key.")
        page.insert_textbox(pymupdf.Rect(40, 40, 560, 800), "\n".join(lines), fontsize=9)
    doc.save(path)
    doc.close()
    return path


def make_repo_zip(path: Path) -> Path:
    """A small repository: code, a README and a binary file that must be skipped with a reason."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("demo_repo/README.md", "# Demo repo\n\nA tiny package that greets people.\n")
        z.writestr("demo_repo/src/greet.py",
                   "def greet(name):\n    \"\"\"Say hello.\"\"\"\n    return f'Hello, {name}!'\n\n\n"
                   "def farewell(name):\n    return f'Goodbye, {name}.'\n")
        z.writestr("demo_repo/src/util.py", "import os\n\n\ndef home():\n    return os.path.expanduser('~')\n")
        z.writestr("demo_repo/logo.png", b"\x89PNG\r\n\x1a\n" + bytes(200))
    return path


def make_corrupt_pdf(path: Path) -> Path:
    """The first third of a real PDF, as an interrupted download leaves it: MuPDF cannot open it."""
    make_pdf(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    return path


def make_long_text(path: Path, sentences: int = 3000) -> Path:
    """A text file long enough that prefilling it takes seconds (for Stop mid-prefill)."""
    path.write_text("\n".join(f"{i}. {FILLER}" for i in range(sentences)) + "\n", encoding="utf-8")
    return path


# -- a launched app ------------------------------------------------------------------------------
def start_server(*extra: str, timeout_s: float = 180, real_model: bool = False, port: int | None = None) -> AppServer:
    """``python app.py`` on the test model, or with ``real_model`` on the default (Qwen2.5-Coder-1.5B) as a user runs
    it: its first start joins, checks and converts the model's parts (about a minute), so it is given longer."""
    if real_model:
        timeout_s = max(timeout_s, 480)
    return launch_server(*extra, real_model=real_model, port=port).wait_until_ready(timeout_s)


def launch_server(*extra: str, real_model: bool = False, port: int | None = None) -> AppServer:
    """``start_server``'s app, launched without waiting for its page (``AppServer.wait_until_ready``)."""
    model = [] if real_model else ["--model", str(model_dir()), "--dtype", "float32"]  # as conftest's runtime
    return launch_app(*model, "--cpu-threads", "2" if real_model else "1", *extra, port=port)


_shared: AppServer | None = None


def shared_server() -> AppServer:
    """One app per test process (the e2e and browser tests share it); stopped at exit."""
    global _shared
    if _shared is None or _shared.process.poll() is not None:
        _shared = start_server("--max-file-size", "2MB")
        atexit.register(_shared.stop)
    return _shared
