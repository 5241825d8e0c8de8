"""Clone a repository given as an https git URL, with time and size limits.

Only https:// is accepted: ssh needs keys, git:// and http:// are
unauthenticated, file:// would read the server's own disk.  The host name
is resolved first with a short timeout, so an offline server refuses in
seconds instead of waiting for git's network timeouts.  The clone is shallow,
never prompts for credentials, skips LFS downloads, checks symlinks out as
plain files, and is killed when it runs too long or grows too big.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from .limits import IngestLimits
from .results import IngestCancelled
from .units import human_bytes

_POLL_S = 0.25
log = logging.getLogger(__name__)


class CloneRefused(Exception):
    """The URL was not cloned; str(exc) is a sentence for the file report."""


def looks_like_url(source: str) -> bool:
    """True for 'scheme://...' and scp-like 'git@host:path' sources."""
    return "://" in source or (source.startswith("git@") and ":" in source)


def check_https_url(url: str) -> str:
    """Host name of an acceptable https URL; CloneRefused otherwise."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "https":
        scheme = parts.scheme or url.split(":", 1)[0]
        raise CloneRefused(f"only https:// git URLs are accepted (got {scheme}:)")
    if not parts.hostname:
        raise CloneRefused("the URL has no host name")
    if parts.username or parts.password:
        raise CloneRefused("URLs with credentials are not accepted")
    return parts.hostname


def repo_name(url: str) -> str:
    """'repo' for https://host/owner/repo(.git)."""
    name = urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]
    return (name[:-4] if name.endswith(".git") else name) or "repository"


def _resolves(host: str, timeout_s: float) -> bool:
    outcome: list[bool] = []

    def lookup() -> None:
        try:
            socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
            outcome.append(True)
        except OSError:
            outcome.append(False)

    worker = threading.Thread(target=lookup, daemon=True, name="ingest-dns")
    worker.start()
    worker.join(timeout_s)
    return bool(outcome and outcome[0])


def _tree_bytes(path: str) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()
    proc.wait()


def clone_https(url: str, dest: str, limits: IngestLimits, cancel: Any = None) -> None:
    """Shallow-clone an https URL into the empty folder `dest` (CloneRefused on failure)."""
    host = check_https_url(url)
    if not _resolves(host, limits.dns_timeout_s):
        raise CloneRefused(f"cannot resolve {host} (offline or unknown host); nothing cloned")
    clone(url, dest, limits, allowed_protocols="https", cancel=cancel)


def clone(source: str, dest: str, limits: IngestLimits, *, allowed_protocols: str = "https",
          cancel: Any = None) -> None:
    """Run `git clone --depth 1` under the limits; no URL checks (internal, tests use local paths).

    A set `cancel` flag kills the clone and raises IngestCancelled.
    """
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_LFS_SKIP_SMUDGE": "1", "GIT_ASKPASS": "",
           "SSH_ASKPASS": "", "GIT_ALLOW_PROTOCOL": allowed_protocols, "GIT_CONFIG_NOSYSTEM": "1"}
    cmd = ["git", "-c", "credential.helper=", "-c", "core.symlinks=false", "-c", "http.lowSpeedLimit=1000",
           "-c", f"http.lowSpeedTime={max(5, int(limits.clone_timeout_s // 4))}", "clone", "--depth", "1",
           "--single-branch", "--no-tags", "--quiet", "--", source, dest]
    with tempfile.TemporaryFile() as stderr:
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                    env=env, start_new_session=True)
        except FileNotFoundError as exc:
            raise CloneRefused("git is not installed on the server") from exc
        deadline = time.monotonic() + limits.clone_timeout_s
        polls = 0
        while True:
            try:
                proc.wait(timeout=_POLL_S)
                break
            except subprocess.TimeoutExpired:
                polls += 1
            if cancel is not None and cancel.is_set():
                _kill_group(proc)
                raise IngestCancelled()
            if time.monotonic() > deadline:
                _kill_group(proc)
                raise CloneRefused(f"git clone took longer than {limits.clone_timeout_s:g} s and was stopped")
            if polls % 4 == 0 and _tree_bytes(dest) > limits.max_clone_bytes:  # size walk once a second
                _kill_group(proc)
                raise CloneRefused(f"repository is larger than {human_bytes(limits.max_clone_bytes)}; clone stopped")
        if proc.returncode != 0:
            stderr.seek(0)
            lines = [ln for ln in stderr.read().decode("utf-8", "replace").splitlines() if ln.strip()]
            detail = lines[-1].strip() if lines else f"exit code {proc.returncode}"
            log.warning("git clone of %s failed: %s", source, detail)  # network details stay in the server log
            raise CloneRefused("git clone failed: could not clone the repository (details are in the server log)")
    if _tree_bytes(dest) > limits.max_clone_bytes:
        raise CloneRefused(f"repository is larger than {human_bytes(limits.max_clone_bytes)}")
