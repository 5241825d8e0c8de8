"""What ``python app.py`` checks before and while it loads the model, so a wrong flag or a busy port is one line
naming the flag, at once, not a traceback after minutes of loading."""

from __future__ import annotations

import socket
import sys
import tempfile
from pathlib import Path

from .cli import AppConfig
from .session.workspace_store import make_private_folder


def check_before_loading(config: AppConfig) -> None:
    """SystemExit naming the flag when the device, the port or the workspaces folder cannot be used."""
    if config.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit(f"--device {config.device}: this machine has no CUDA device PyTorch can use")
    _check_port(config.host, config.port)
    _check_folder(config)


def _check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the server will bind: a port left in TIME_WAIT by a server just stopped is free, a listening one not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except (OSError, OverflowError) as exc:
            raise SystemExit(f"--host {host} --port {port}: cannot listen there "
                             f"({getattr(exc, 'strerror', None) or exc}); choose another --host or --port") from None


def _check_folder(config: AppConfig) -> None:
    root = config.workspace_root
    try:
        make_private_folder(root)
        tempfile.TemporaryFile(dir=root).close()
    except OSError as exc:
        raise SystemExit(f"--workspaces {root}: workspaces cannot be saved there ({exc.strerror or exc}); "
                         "choose a writable folder (--workspaces or $LMINFINITE_WORKSPACES)") from None


def load_or_explain(config: AppConfig):
    """The model runtime; a model that cannot be loaded is SystemExit naming --model and why, in one line."""
    from .engine.model_loading import choose_model, load_runtime

    if config.model and config.model.startswith(("/", ".", "~")) and not Path(config.model).expanduser().exists():
        raise SystemExit(f"--model {config.model}: no such file or folder")
    choice = choose_model(config)
    print(f"[lminfinite-chat] model: {choice.name_or_path} ({choice.reason})", file=sys.stderr, flush=True)
    try:
        return load_runtime(config, choice)
    except (OSError, ValueError) as exc:  # a missing, partial or foreign model folder or file
        reason = " ".join(str(exc).split())
        raise SystemExit(f"--model {choice.name_or_path}: cannot be loaded: {reason[:400]}") from None
