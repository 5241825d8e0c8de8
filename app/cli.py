"""Command-line flags of ``python app.py``, parsed into one validated ``AppConfig``.

Each flag is one AppConfig field: its default, help text, group and bound are declared on the field
(app.flags), and the parser is built from the fields.  Only what no field can say lives below the class:
--auth-file's users are merged into ``auth``, and --allow-local-paths roots must be folders.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from ingest import units

from . import flags
from .engine.bundled_model import BUNDLED, DEFAULT_CPU_MODEL as BUNDLED_DEFAULT, installed
from .flags import flag

LLAMA2_CHAT = "meta-llama/Llama-2-7b-chat-hf"
DEFAULT_CPU_MODEL = BUNDLED_DEFAULT
DEMO_MODEL_DIR = Path(__file__).resolve().parents[1] / "demo_model"


def parse_size(text: str) -> int:
    """'200MB', '1.5 GB', '5000' (bytes) -> bytes (ingest.units.parse_size); a bad size is a usage error."""
    try:
        return units.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_auth(text: str) -> tuple[str, str]:
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise argparse.ArgumentTypeError("--auth takes USER:PASS")
    return user, password


MODEL, LM_INFINITE, SERVER = "model", "LM-Infinite", "server"  # the --help sections


def bundled_models_help() -> str:
    """The bundled models' short names, each with whether its package is installed here."""
    return "; ".join(f"{name}: {model.display_name}, {'installed' if installed(model) else 'not installed'}"
                     for name, model in BUNDLED.items())
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


@dataclass
class AppConfig:
    """Everything ``python app.py`` is told; each field is also its flag, in --help order."""

    # None: Llama-2-7b-chat on CUDA when cached, else the default bundled model; "demo": the tiny test model
    model: str | None = flag(
        None, "a bundled model's short name (" + bundled_models_help() + "), a Hugging Face id, a local folder, a "
        ".gguf file (or a folder holding one), or 'demo' for the tiny test model. Default: "
        f"{LLAMA2_CHAT} in 4-bit when CUDA is available and its weights are in the local cache, otherwise "
        f"{DEFAULT_CPU_MODEL} (requirements-model.txt)", group=MODEL)
    # "4bit" | "8bit" | "none"; None: 4-bit for Llama-2 on CUDA, else none
    quantization: str | None = flag(None, group=MODEL, switches={
        "--load-in-4bit": ("4bit", "bitsandbytes NF4 with double quantization and bf16 compute "
                                   "(default for Llama-2 on CUDA)"),
        "--load-in-8bit": ("8bit", "bitsandbytes LLM.int8()"),
        "--no-quant": ("none", "full-precision weights (default, except for Llama-2 on CUDA)"),
    })
    device: str = flag("auto", "auto (all GPUs through accelerate's device_map='auto', else CPU), cpu, cuda, "
                       "cuda:N", group=MODEL)
    dtype: str = flag("auto", "weights/activations dtype; auto: bfloat16 on CUDA, and on a CPU that multiplies bfloat16 "
                      "in hardware (the amx_bf16 or avx512_bf16 flag), else float32. A workspace saved in another "
                      "dtype is converted when reopened", group=MODEL,
                      choices=["auto", "float32", "bfloat16", "float16"])
    cpu_threads: int | None = flag(None, "torch CPU threads (default: torch's choice)", group=MODEL, type=int,
                                   at_least=1)
    decode_weights: str = flag("auto", "auto: on the CPU, a model converted from a GGUF file decodes answers through "
                               "integer copies of its weights (4 bits where the GGUF's grid allows, else 8; about twice "
                               "the tokens per second, reading the same weights), made once and cached beside it; "
                               "dense: the model's own weights only", group=MODEL, choices=["auto", "dense"])
    model_switch: bool = flag(True, group=MODEL, switches={
        "--no-model-switch": (False, "users cannot switch the model from Settings (a switch restarts the server for "
                                     "every user; app/web/model_switch.py)"),
    })
    cuda_graphs: bool = flag(True, group=MODEL, switches={
        "--no-cuda-graphs": (False, "on CUDA, decode answers through the model's own forward "
                                    "rather than a recorded CUDA graph (lminfinite.GraphedDecoder)"),
    })

    n_starting: int = flag(10, "starting tokens every query attends to (default: 10)", group=LM_INFINITE, type=int,
                           at_least=0)
    window: int | None = flag(None, "attention window and distance ceiling (default: 1024 for SmolLM2, chosen by "
                              "measurement; otherwise the model's pre-training length)", group=LM_INFINITE, type=int,
                              at_least=1)
    topk: int = flag(5, "middle tokens recalled per head while answering; 0 turns recall off by default "
                     "(default: 5)", group=LM_INFINITE, type=int, at_least=0)
    quote: bool = flag(True, group=LM_INFINITE, switches={
        "--no-quote": (False, "answer from the question read with recall, rather than quoting the top source "
                              "before the question and answering without recall (with the default SmolLM2 gets about "
                              "three times as many of the benchmark's questions right; app/engine/quoting.py)"),
    })
    guess: bool = flag(True, group=LM_INFINITE, switches={
        "--no-guess": (False, "search the documents with the question's words alone, rather than also with a passage "
                              "the model writes first (a short decode before each answer; app/engine/guess.py)"),
    })
    # None: lminfinite.suggested_topk_from_layer (5 for Llama-2, 1 for the demo)
    topk_from_layer: int | None = flag(None, "first layer that recalls middle tokens (default: 5 for 30+ layers as "
                                       "in the paper, 1 for the demo model)", group=LM_INFINITE, type=int, at_least=0)
    offload_middle: bool = flag(False, "keep the evicted middle tokens in CPU memory (GPU memory stays bounded)",
                                group=LM_INFINITE, action="store_true")
    prefill_chunk: int = flag(512, "tokens per prefill forward; another session's question waits for at most one (default: 512)",
                              group=LM_INFINITE, type=int, at_least=1)
    answer_while_feeding: float = flag(30.0, "a question asked while documents are fed is answered at once, between "
                                       "two chunks, when the feed has at least this many seconds left; 0: always "
                                       "(default: 30)", group=LM_INFINITE, type=float, at_least=0,
                                       metavar="SECONDS")
    # tokens; None: sized from memory, at most 1M
    context_budget: int | None = flag(None, "most tokens one session's context may hold with recall; documents that "
                                      "would not fit are read without recall in a new context, refused in one that "
                                      "holds something (default: what 70%% of the free memory holds, at most "
                                      "1,000,000)", group=LM_INFINITE, type=int, at_least=1)
    max_question_tokens: int = flag(4096, "longest question, in tokens; a longer one is refused at once, asking "
                                    "for it as a file (an answer holds the model from its question's first token to its "
                                    "last; a document steps aside between chunks) (default: 4096)",
                                    group=LM_INFINITE, type=int, at_least=1)
    memory_budget: int | None = flag(None, "most memory all sessions' contexts may hold together, e.g. 8GB; work "
                                     "that would cross it is refused with a message, and documents in a new context "
                                     "are read without recall (default: 70%% of the memory free at start-up)",
                                     group=LM_INFINITE, type=parse_size, metavar="SIZE", at_least=1)

    host: str = flag("127.0.0.1", "address to bind; 0.0.0.0 for every interface (default: 127.0.0.1)", group=SERVER)
    port: int = flag(7860, "1-65535 (default: 7860)", group=SERVER, type=int, at_least=1,
                     at_most=65535)
    share: bool = flag(False, "create a public Gradio share link", group=SERVER, action="store_true")
    auth: list[tuple[str, str]] = flag([], "require a login (repeatable)", group=SERVER, action="append",
                                       type=parse_auth, metavar="USER:PASS")
    auth_file: str | None = flag(None, "file with one USER:PASS per line", group=SERVER)  # merged into auth
    max_file_size: int = flag(200 * units.MiB, "largest accepted upload, e.g. 50MB (default: 200MB)", group=SERVER,
                              type=parse_size, at_least=1)
    # roots users may read by path (and git URLs)
    allow_local_paths: list[str] = flag([], "let users add folders and files inside these folders on the server "
                                        "(symlinks are resolved first; nothing outside is read), and https git URLs "
                                        "(off by default)", group=SERVER, nargs="+", metavar="DIR")
    session_timeout_s: float = flag(3600.0, "minutes of inactivity after which a session's context is freed "
                                    "(default: 60)", group=SERVER, name="--session-timeout", type=float, scale=60,
                                    at_least=1)
    # None: $LMINFINITE_WORKSPACES, else $XDG_CACHE_HOME/lminfinite-chat/workspaces (~/.cache/... without it)
    workspaces: str | None = flag(None, "folder where workspaces (context, chat and documents) are saved, one "
                                  "subfolder per user (default: $LMINFINITE_WORKSPACES, else ~/.cache/lminfinite-chat/workspaces)", group=SERVER,
                                  metavar="DIR")
    workspace_quota: int | None = flag(None, "most disk one user's saved workspaces may take together, e.g. 20GB; "
                                       "a save or import that would cross it is refused, saying so, and the previous "
                                       "save stays (default: no limit)", group=SERVER, type=parse_size,
                                       metavar="SIZE", at_least=1)
    save_middle: str = flag("exact", "how a saved workspace stores the middle tokens recall reads: exact (the "
                            "cache's dtype; a reopened context answers token for token as before) or bfloat16 / "
                            "float16 (half the file on CPU; answers may differ slightly)", group=SERVER,
                            choices=["exact", "bfloat16", "float16"])
    # None: this host's name and --port (two replicas on one host differ by port)
    replica: str | None = flag(None, "this server's name among replicas sharing one --workspaces folder (default: "
                               "HOST:PORT); a workspace is open on one replica at a time (docs/deploy.md)",
                               group=SERVER, metavar="NAME")
    lease_s: float = flag(30.0, "seconds a replica's hold on an open workspace lasts unless renewed (every third of "
                          "it); a replica that crashed lets its workspaces go after this (default: 30)", group=SERVER,
                          name="--lease-seconds", type=float, at_least=1)
    queue_size: int = flag(64, "most requests waiting in the queue (default: 64)", group=SERVER, type=int,
                           at_least=1)

    @property
    def local_paths_enabled(self) -> bool:
        """Whether the 'path on the server' box (and git URLs) is on: some root was given."""
        return bool(self.allow_local_paths)

    @property
    def local_roots(self) -> list[Path]:
        """The allowed roots, symlinks resolved."""
        return [Path(root).expanduser().resolve() for root in self.allow_local_paths]

    def local_path_allowed(self, path: str) -> Path | None:
        """``path`` resolved (symlinks followed) when it lies inside an allowed root; None otherwise."""
        try:
            resolved = Path(path).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):
            return None
        return resolved if any(resolved.is_relative_to(root) for root in self.local_roots) else None

    @property
    def workspace_root(self) -> Path:
        chosen = self.workspaces or os.environ.get("LMINFINITE_WORKSPACES")
        if chosen:
            return Path(chosen).expanduser()
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(cache) / "lminfinite-chat" / "workspaces"

    @property
    def replica_name(self) -> str:
        return self.replica or f"{socket.gethostname()}:{self.port}"

    @property
    def share_without_auth(self) -> bool:
        return self.share and not self.auth


def read_auth_file(path: str) -> list[tuple[str, str]]:
    """One USER:PASS per line; blank lines and '#' comments are ignored."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"--auth-file {path}: cannot be read ({exc})") from None
    pairs = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            pairs.append(parse_auth(line))
        except argparse.ArgumentTypeError:
            raise SystemExit(f"--auth-file {path}: line {number} is not USER:PASS") from None
    if not pairs:
        raise SystemExit(f"--auth-file {path}: no USER:PASS lines")
    return pairs


def build_parser() -> argparse.ArgumentParser:
    return flags.build_parser(
        AppConfig, prog="app.py",
        description="Chat with long PDFs and code repositories in one unbounded LM-Infinite context.")


def parse_args(argv: list[str] | None = None) -> AppConfig:
    config = AppConfig(**flags.from_args(AppConfig, build_parser().parse_args(argv)))
    if config.auth_file:
        config.auth = config.auth + read_auth_file(config.auth_file)
    flags.check_bounds(config)
    if not DEVICE.fullmatch(config.device):
        raise SystemExit(f"--device {config.device}: use auto, cpu, cuda or cuda:N")
    for root in config.allow_local_paths:
        if not Path(root).expanduser().is_dir():
            raise SystemExit(f"--allow-local-paths: {root} is not a folder")
    return config
