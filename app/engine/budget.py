"""How much context the server may hold: tokens per session, and bytes across all sessions.

With top-k recall the cache keeps every evicted token once (in GPU memory, or in CPU memory with
``--offload-middle``), so one session's budget is what that memory can hold, capped at one million tokens. Documents
that do not fit it in a new context are read without recall instead (``WITHOUT_RECALL``): LM-Infinite's own
bounded memory, with sources ranked by the question's words.
Every session may take that much, so a second limit, in bytes, covers all sessions together: work that
would cross it is refused with a message, instead of the machine swapping or the process being killed. Every
token read counts: a document, a question with the answer it may get, a context read again (Clear, Remove), and
a reopened workspace (counted from its file's tensors, never from the summary the file claims).
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil
import torch

import lminfinite
from ingest import units

from .runtime import ModelRuntime

GENEROUS = 1_000_000
HEADROOM = 0.7  # of the free memory; activations, other sessions and the allocator need the rest
# A context read without recall keeps no evicted tokens (ContextEngine.keep_recall): its cache is the same
# few megabytes at any length, and what grows is its text: 8 bytes a token of ids, and the chunks' BM25 index. Ten
# million tokens (the 3,700 pages of a reference manual are about 2.5 million) hold about 100 MB of that.
WITHOUT_RECALL = 10_000_000


@dataclass(frozen=True)
class Budget:
    tokens: int
    why: str
    middle_bytes_per_token: int
    memory_bytes: int | None = None  # all sessions' caches together; None: no limit
    memory_why: str = ""

    def memory_refusal(self, in_use: int, adding_tokens: int, what: str = "") -> str | None:
        """Why adding ``adding_tokens`` to the sessions' ``in_use`` cache bytes would cross the memory budget;
        ``what`` names them in the message (default: "these N tokens")."""
        return self.bytes_refusal(in_use, adding_tokens * self.middle_bytes_per_token,
                                  what or f"these {adding_tokens:,} tokens")

    def bytes_refusal(self, in_use: int, needed: int, what: str) -> str | None:
        """Why ``needed`` more bytes (``what``, e.g. a reopened cache) on top of ``in_use`` would cross the budget."""
        if self.memory_bytes is None or in_use + needed <= self.memory_bytes:
            return None
        return (f"the server's memory for contexts is taken: {what} need "
                f"{units.human_bytes(needed)}, and the open sessions hold {units.human_bytes(in_use)} of "
                f"{units.human_bytes(self.memory_bytes)} ({self.memory_why}). Try again when others are done, "
                "or add less")


def middle_bytes_per_token(runtime: ModelRuntime) -> int:
    """Keys + values (and the keys' scan copy, where one is kept) one token adds to a session cache's middle
    store (only recall layers keep it)."""
    shape = lminfinite.KVShape.from_config(runtime.model.config)
    per_token = lminfinite.span_bytes(shape, runtime.lm_config, runtime.dtype, keep_middle=True,
                                      device_type=runtime.device_type)
    return per_token.middle + per_token.middle_scan


def free_memory(runtime: ModelRuntime) -> tuple[int, str]:
    """Bytes the caches can still take, and where (free GPU memory, or available CPU memory)."""
    if runtime.device_type == "cuda" and not runtime.offload_middle:
        return sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())), "free GPU memory"
    return psutil.virtual_memory().available, "available CPU memory"


def context_budget(runtime: ModelRuntime, requested: int | None, memory: int | None = None) -> Budget:
    """The per-session token budget (``--context-budget``) and the all-sessions memory (``--memory-budget``),
    each sized from the memory free at start-up unless given."""
    per_token = middle_bytes_per_token(runtime)
    free, where = free_memory(runtime)
    room = int(free * HEADROOM)
    if memory is not None:
        memory_why = "set with --memory-budget"
    else:
        memory, memory_why = room, f"{HEADROOM:.0%} of the {where} at start-up"
    if requested is not None:
        return Budget(requested, "set with --context-budget", per_token, memory, memory_why)
    fits = room // max(per_token, 1)
    tokens = max(1, min(GENEROUS, fits))
    capped = "capped at 1M" if tokens == GENEROUS else f"{HEADROOM:.0%} of the {where}"
    return Budget(tokens, f"{capped}; the middle store takes {per_token / 1024:.1f} KiB per token", per_token,
                  memory, memory_why)
