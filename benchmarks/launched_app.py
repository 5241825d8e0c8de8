"""``python app.py`` as a user runs it, in its own process group, for the HTTP tests and benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUIET_ENV = {"GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
             "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class AppServer:
    process: subprocess.Popen
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # our own process group: the server and its PDF worker
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


    def wait_until_ready(self, timeout_s: float = 180) -> "AppServer":
        """Return once the page answers; stopped, with its log in the error, if it exits or takes longer."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"app exited with {self.process.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url, timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"app did not start within {timeout_s} s:\n{self.log()}")


def launch_app(*args: str, port: int | None = None) -> AppServer:
    """Launch ``app.py args`` on ``port`` (default: a free one) of the loopback, without waiting for it: servers
    launched together start side by side."""
    port = port or free_port()
    log_path = Path(tempfile.mkdtemp(prefix="app-log-")) / "server.log"
    command = [sys.executable, str(ROOT / "app.py"), *args, "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **QUIET_ENV}, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return AppServer(process, f"http://127.0.0.1:{port}/", log_path)


def start_app(*args: str, timeout_s: float = 180, port: int | None = None) -> AppServer:
    """Launch ``app.py args`` and return once the page answers."""
    return launch_app(*args, port=port).wait_until_ready(timeout_s)


NGINX = "/usr/sbin/nginx"


def start_proxy(replicas: dict[str, int], prefix: Path, *, timeout_s: float = 30) -> tuple[subprocess.Popen, str]:
    """nginx in front of the loopback ``replicas`` (name -> port), configured by deploy/nginx_config.py as a user
    configures it, everything it writes under ``prefix``; returns the process and its address once it answers."""
    port = free_port()
    config = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "nginx_config.py"), "--listen", f"127.0.0.1:{port}",
         "--max-file-size", "2MB", "--standalone", str(prefix), *(f"{n}=127.0.0.1:{p}" for n, p in replicas.items())],
        check=True, capture_output=True, text=True).stdout
    (prefix / "nginx.conf").write_text(config)
    process = subprocess.Popen([NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return process, url
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"nginx did not answer:\n{(prefix / 'error.log').read_text(errors='replace')}")
            time.sleep(0.2)
