"""Byte sizes written and read the same way everywhere: reports, the app, flags, benchmarks.

Sizes are binary (1 KB = 1024 bytes), as memory and upload limits are;
human_bytes() and parse_size() are inverses up to rounding ('1.5 GB' reads
back as 1.5 GiB), so a size the app prints can be pasted into a flag.
"""

from __future__ import annotations

import re

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

_FACTORS = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": TiB}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*((?:[KMGT]i?)?B?)\s*", re.IGNORECASE)  # an 'i' only after K, M, G, T
_LARGEST = 2**62  # past any real budget, and within the 64-bit integers sizes are passed on as


def human_bytes(n: int | float) -> str:
    """Short human size such as '12.3 MB' for sentences and tables."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def parse_size(text: str) -> int:
    """'200MB', '1.5 GB', '10KiB', '5000' (bytes) -> bytes; ValueError for anything else."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (use e.g. 200MB)")
    number, unit = float(match.group(1)), (match.group(2) or "").upper().replace("I", "").rstrip("B")
    size = number * _FACTORS[unit]
    if size > _LARGEST:
        raise ValueError(f"too large a size: {text!r}")
    return int(size)


def mib(n_bytes: float) -> str:
    """A number of MiB for a column headed 'MiB' ('1,234.5')."""
    return f"{n_bytes / MiB:,.1f}"
