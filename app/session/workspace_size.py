"""What a saved workspace will take in memory once reopened, counted from its tensors.

The memory budget (--memory-budget) must be checked before a workspace is read, and a file's summary is only
what the file says of itself: one claiming 0 tokens for a 20,000-token context got past the budget. The
safetensors header lists every tensor's shape, so the real size is known from the header alone, before a byte
of the cache is read.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..engine.context_file import CACHE, TOKEN_IDS
from .workspace_file import WorkspaceFileError


def reopened_bytes(path: Path, dtype: torch.dtype, per_token: int) -> int:
    """Bytes the reopened cache will hold: its tensors' elements at the model's ``dtype`` (a middle store saved
    smaller is widened back), or the token stream's length at the budget's ``per_token`` measure (which counts
    the middle store's scan copy too), whichever is larger."""
    element = torch.empty((), dtype=dtype).element_size()
    try:
        with safe_open(str(path), framework="pt") as handle:
            names = list(handle.keys())
            cache = sum(math.prod(handle.get_slice(n).get_shape()) for n in names if n.startswith(CACHE))
            tokens = math.prod(handle.get_slice(TOKEN_IDS).get_shape()) if TOKEN_IDS in names else 0
    except (SafetensorError, OSError, ValueError) as exc:
        raise WorkspaceFileError(f"{Path(path).name} is not a readable workspace file ({exc})") from exc
    return max(cache * element, tokens * per_token)
