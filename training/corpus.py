"""Python standard-library sources as an offline training corpus.

Every machine that can run the app has these files, so the demo model can be
rebuilt anywhere without downloads.  The train / held-out split is decided by
a hash of each file's path relative to the stdlib root, so it is the same on
every machine and for every Python version that ships the file.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

# Directories that are not library code (tests, vendored packages, caches).
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
HELDOUT_PERCENT = 5


def stdlib_root() -> Path:
    """The directory holding the standard library's .py files."""
    return Path(sysconfig.get_paths()["stdlib"])


def _is_library_file(rel: Path) -> bool:
    if any(part in _SKIP_DIRS for part in rel.parts[:-1]):
        return False
    # Machine-specific build data differs per install; keep it out.
    return not rel.name.startswith("_sysconfigdata")


def is_heldout(rel_path: str) -> bool:
    """True for the ~5% of files, chosen by path hash, that are never trained on."""
    digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


def _is_generated_table(path: Path) -> bool:
    """Charmap codecs written by gencodec.py are ~1 MB of near-identical tables."""
    with path.open("rb") as fh:
        return b"gencodec.py" in fh.read(2000)


def list_files(split: str, root: Path | None = None) -> list[tuple[str, Path]]:
    """Sorted (relative path, absolute path) pairs of one split: 'train' or 'heldout'."""
    if split not in ("train", "heldout"):
        raise ValueError(f"unknown split {split!r}")
    root = root or stdlib_root()
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if not _is_library_file(rel) or _is_generated_table(path):
            continue
        rel_s = rel.as_posix()
        if is_heldout(rel_s) == (split == "heldout"):
            out.append((rel_s, path))
    return out


def read_text(path: Path) -> str:
    """File text; undecodable bytes are replaced so the corpus is always valid UTF-8."""
    return path.read_bytes().decode("utf-8", errors="replace")
