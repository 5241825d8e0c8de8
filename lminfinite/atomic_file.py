"""Replace a file all at once: a crash while writing leaves the previous file whole, never half a new one."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (one file system, so the rename is atomic); when the block ends
    without error the temporary file is synced, takes the old file's mode (else 0644) and is renamed onto
    ``path``, and the folder is synced so the rename itself is durable. On error it is removed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as file:
            os.fsync(file.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)  # mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def write_text(text: str, path: str | Path) -> None:
    """``path`` holds ``text`` (UTF-8), old or new, whatever happens meanwhile."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable (POSIX); folders cannot be opened for syncing on Windows."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_whole(path: str | Path, text: str, mode: int = 0o644) -> bool:
    """Write ``text`` to ``path`` unless something is there already; whether this call wrote it. Written beside and
    hard-linked into place (the link fails when the name exists: one writer wins, on local disks and on NFS, and no
    reader sees half of it); where the file system has no hard links, created exclusively (O_EXCL) and written."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(tmp, mode)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links here (some FUSE, SMB or exFAT mounts)
            return _create_exclusively(path, text, mode)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _create_exclusively(path: Path, text: str, mode: int) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    return True
