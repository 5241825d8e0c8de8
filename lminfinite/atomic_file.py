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
