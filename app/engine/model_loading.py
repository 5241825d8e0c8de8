"""Which model to load, how (quantization, dtype, devices), and switching it to LM-Infinite.

The default is deliberate and said out loud: Llama-2-7b-chat in 4-bit when a CUDA GPU is present and its
weights are already in the local Hugging Face cache (it is gated: we never start a 13 GB download on our
own); otherwise SmolLM2-135M-Instruct, a real chat model that a pip package ships (``bundled_model``),
on the GPU when there is one. ``--model demo`` is the tiny bundled test model, which cannot really read.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

import lminfinite
from lminfinite.patch import trained_span

from ..cli import DEMO_MODEL_DIR, LLAMA2_CHAT, AppConfig
from . import bundled_model, decode_weights
from .cpu_dtype import default_cpu_dtype
from .native_memory import bound_kernel_caches
from .runtime import ExclusiveCudaGraph, ModelRuntime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelChoice:
    name_or_path: str
    reason: str  # shown in the UI and printed at start-up
    display_name: str | None = None
    window: int | None = None  # the LM-Infinite window chosen by measurement for this model (None: its L)
    bundled: str | None = None  # the bundled model's short name (bundled_model.BUNDLED), when it is one


def cached_snapshot(repo_id: str) -> str | None:
    """Local snapshot folder of ``repo_id`` if its config and weights are cached, without any network."""
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(repo_id, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached, or no hub library: either way, not available offline
        return None
    files = os.listdir(path)
    has_weights = any(f.endswith((".safetensors", ".bin")) for f in files)
    return path if has_weights and "config.json" in files else None


def from_bundle(model: bundled_model.BundledModel, reason: str) -> ModelChoice:
    """A model a pip package ships, converted once into a cached transformers folder (see bundled_model)."""
    if not bundled_model.installed(model):
        raise bundled_model.ModelFilesError(f"{model.display_name} (--model {model.name}) is not installed. "
                                            f"Install it with\n  {model.install_hint}")
    return ModelChoice(str(bundled_model.bundled_folder(model)), reason, model.display_name, model.window, model.name)


def from_gguf(gguf: Path, reason: str) -> ModelChoice:
    """A GGUF file, converted once into a cached transformers folder; a bundled model's file keeps its settings."""
    known = next((m for m in bundled_model.BUNDLED.values() if m.gguf_name == gguf.name), None)
    folder = bundled_model.converted_folder(gguf, dtype=known.cache_dtype if known else "bfloat16")
    return ModelChoice(str(folder), reason, known.display_name if known else gguf.stem, known.window if known else None,
                       known.name if known else None)


def choose_model(config: AppConfig, cuda_available: bool | None = None) -> ModelChoice:
    if config.model == "demo":
        return ModelChoice(str(DEMO_MODEL_DIR), "--model demo: the tiny test model, not a real reader",
                           "demo model (1.9M parameters)")
    if config.model in bundled_model.BUNDLED:
        return from_bundle(bundled_model.BUNDLED[config.model], f"--model {config.model}")
    if config.model:
        gguf = bundled_model.gguf_in(Path(config.model).expanduser())
        if gguf is not None:
            return from_gguf(gguf, "chosen with --model")
        return ModelChoice(config.model, "chosen with --model")
    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    wants_cpu = config.device == "cpu"
    if cuda and not wants_cpu:
        if cached_snapshot(LLAMA2_CHAT):
            return ModelChoice(LLAMA2_CHAT, "CUDA is available and its weights are in the local Hugging Face cache")
        why = (f"CUDA is available, but {LLAMA2_CHAT} is not in the local Hugging Face cache "
               f"(accept its license, then `huggingface-cli download {LLAMA2_CHAT}`)")
    elif wants_cpu:
        why = "--device cpu was given"
    else:
        why = f"no CUDA GPU was found, and {LLAMA2_CHAT} needs one"
    default = bundled_model.BUNDLED[bundled_model.DEFAULT_CPU_MODEL]
    if bundled_model.installed(default):
        return from_bundle(default, f"the default real model: {why}")
    fallback = next((bundled_model.BUNDLED[n] for n in bundled_model.installed_names()), None)
    if fallback is None:
        raise SystemExit(f"{why}, and the default CPU model is not installed. Install it with\n  "
                         f"{default.install_hint}\nor pass --model (a Hugging Face folder or a .gguf file), "
                         "or --model demo for the tiny test model.")
    return from_bundle(fallback, f"{why}, and the default {default.display_name} is not installed "
                                 f"({default.install_hint}): {fallback.display_name} instead")


def resolve_dtype(config: AppConfig, on_cuda: bool) -> tuple[torch.dtype, str]:
    """The model's dtype, and why where ``--dtype auto`` chose it on the CPU (cpu_dtype.py), else ""."""
    if config.dtype != "auto":
        return getattr(torch, config.dtype), ""
    if on_cuda:
        return (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16), ""
    return default_cpu_dtype()


def quantization_config(kind: str, compute_dtype: torch.dtype):
    from transformers import BitsAndBytesConfig

    if kind == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=torch.bfloat16 if compute_dtype != torch.float16
                                  else torch.float16)
    if kind == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return None


def device_map_for(device: str, on_cuda: bool):
    """accelerate's 'auto' (spreads layers over every visible GPU) unless one device was named."""
    if device == "auto":
        return "auto" if on_cuda else None
    return {"": device}


def topk_from_layer_for(config: AppConfig, num_layers: int) -> int:
    if config.topk_from_layer is not None:
        return config.topk_from_layer
    return lminfinite.suggested_topk_from_layer(num_layers)


def load_runtime(config: AppConfig, choice: ModelChoice | None = None) -> ModelRuntime:
    """Load tokenizer and model as configured and enable LM-Infinite on it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bound_kernel_caches()  # before the first matmul: oneDNN reads its cache's capacity once
    choice = choice or choose_model(config)
    if config.cpu_threads:
        torch.set_num_threads(config.cpu_threads)
    on_cuda = torch.cuda.is_available() and not config.device.startswith("cpu")
    quant = config.quantization or ("4bit" if on_cuda and choice.name_or_path == LLAMA2_CHAT else "none")
    dtype, why_dtype = resolve_dtype(config, on_cuda)
    kwargs: dict = {"dtype": dtype}
    if quant != "none":
        kwargs["quantization_config"] = quantization_config(quant, dtype)
    device_map = device_map_for(config.device, on_cuda)
    if device_map is not None:
        kwargs["device_map"] = device_map
    log.info("loading %s (%s, %s, device_map=%s)", choice.name_or_path, quant, dtype, device_map)
    tokenizer = AutoTokenizer.from_pretrained(choice.name_or_path)
    ingest_tokenizer = AutoTokenizer.from_pretrained(choice.name_or_path)
    model = AutoModelForCausalLM.from_pretrained(choice.name_or_path, **kwargs).eval()
    num_layers = model.config.get_text_config().num_hidden_layers
    window, window_note = window_for(config, choice, model)
    lm_config = lminfinite.LMInfiniteConfig(
        n_starting=config.n_starting, window=window, topk=0,
        topk_from_layer=topk_from_layer_for(config, num_layers), offload_middle=config.offload_middle,
    )
    decode_note = use_decode_weights(model, config, choice, on_cuda or quant != "none")
    lminfinite.enable(model, lm_config)
    resolved = lminfinite.get_state(model).config
    name = choice.name_or_path.rstrip("/")
    short = choice.display_name or (Path(name).name if os.path.isdir(name) else name)
    return ModelRuntime(
        model=model, tokenizer=tokenizer, ingest_tokenizer=ingest_tokenizer, name=short,
        notice=(f"Model: {short} ({choice.reason}); {quant_label(quant)}, {str(dtype).removeprefix('torch.')}"
                + (f" ({why_dtype})" if why_dtype else "") + f"; {window_note}{decode_note}" + other_models(short)),
        lm_config=resolved, prefill_chunk=config.prefill_chunk, offload_middle=config.offload_middle,
        quantization=quant, dtype=dtype, bundled_name=choice.bundled,
        graph_recorder=ExclusiveCudaGraph if on_cuda and config.cuda_graphs else None,
    )


def use_decode_weights(model, config: AppConfig, choice: ModelChoice, elsewhere: bool) -> str:
    """On the CPU, answers of a bfloat16 or float32 model decode through integer copies of a GGUF-converted model's
    weights (decode_weights.py), fed bfloat16 rows; the header's words on it, or "" where the model keeps its own
    weights only. Fed bfloat16 rows, PyTorch's integer kernels ran 3x faster than the bfloat16 product, and 2-3x
    faster than float32's own on a CPU without bfloat16 units (fed float32 rows they ran 5x slower there)."""
    folder = Path(choice.name_or_path)
    if (config.decode_weights != "auto" or elsewhere or model.dtype not in (torch.bfloat16, torch.float32)
            or not folder.is_relative_to(bundled_model.cache_root())):
        return ""
    log.info("integer copies of the weights for decoding (made once, then cached in %s)", folder)
    kinds = decode_weights.use_for_decoding(model, folder)
    return (f"; answers decoded from {kinds[decode_weights.CopyKind.INT4]} layers in 4 bits, "
            f"{kinds[decode_weights.CopyKind.INT8]} in 8")


UNMEASURED_WINDOW = 4096  # the window of a model nobody measured one for: Llama-2's L, where the paper's settings hold


def window_for(config: AppConfig, choice: ModelChoice, model) -> tuple[int, str]:
    """The LM-Infinite window, and the header's words on where it comes from: --window, the one measured for this
    model, or for another model the smaller of its training length and UNMEASURED_WINDOW. Never the training
    length silently: a window as long as a 32K-trained model's leaves nothing to recall below 32K tokens."""
    trained = trained_span(model.config.get_text_config())
    if config.window:
        return config.window, f"window {config.window:,} (--window; trained on {trained:,})"
    if choice.window:
        return choice.window, f"window {choice.window:,} (measured for this model; trained on {trained:,})"
    window = min(trained, UNMEASURED_WINDOW)
    if window == trained:
        return window, f"window {window:,}: the model's training length (none measured for it; --window sets one)"
    return window, (f"window {window:,}, not measured for this model (trained on {trained:,}: a window that long "
                    "would leave nothing to recall below it; --window sets one)")


def other_models(serving: str) -> str:
    """The header's list of the other bundled models installed here, each one flag away."""
    others = [name for name in bundled_model.installed_names() if bundled_model.BUNDLED[name].display_name != serving]
    return f"; also installed: {', '.join(f'--model {name}' for name in others)}" if others else ""


def quant_label(quant: str) -> str:
    return {"4bit": "4-bit NF4 (double quant)", "8bit": "8-bit", "none": "not quantized"}[quant]
