"""Top-k recall over a middle store in two GPU kernels (Triton), where recall.py's general path launches about twenty.

Why. A decode step that recalls reads every middle key of every recall layer. Through PyTorch's operators that is
a product, a mask, a top-k, then a dozen small operators to pick and gather values, per layer: on an H200 about
7 ms per token of launches alone at 4K tokens, and the scan reads the keys at a fifth of the GPU's bandwidth
(docs/benchmarks.md, GPU round 2). Here:
  1. ``recall_scan``: each program scores one block of keys against every query row of its key head, in float32,
     and keeps the block's k best (logit and row): the keys are read once, in their own dtype;
  2. torch.topk picks the k best of the blocks' candidates (a few thousand per row, not the whole store);
  3. ``recall_gather``: the chosen rows' positions and values (zeros where the store held fewer than k rows).
A row count on the device (MiddleStore.fixed_view) masks a buffer's spare rows, so a CUDA graph records the step
once per buffer (graphed.py). Both kernels are PyTorch operators (torch.library.custom_op): the dispatcher, a
graph's stand-in recorder and torch.compile see them as one operator each.

The logits are float32 products of the store's numbers, scaled, which the general path rounds to the store's dtype
before selecting: the two recall the same tokens except between near-ties, and within float32 rounding these are
the float64 reference's logits (tests/test_lminfinite_recall_kernel.py). On a CPU the kernels run only under
Triton's interpreter (TRITON_INTERPRET=1, the tests).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings

import torch

BLOCK = 128  # keys per scan program
MAX_ROWS = 64  # query rows per key head (a decode step: the group's heads); more is a prefill, recall.py's scan
MAX_K = 64  # the per-block top-k is unrolled k times
MAX_DIM = 256
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def runs_on(device: torch.device) -> bool:
    """Whether the kernels can run on tensors of ``device``: Triton on a CUDA device, or its interpreter."""
    if importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or interpreted()


@functools.lru_cache(maxsize=None)
def resolve(requested: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether recall uses these kernels: ``triton`` where they run (else an error), ``torch`` never, ``auto`` on a
    CUDA device where Triton is installed and the kernels agree with float64 there (checked once)."""
    if requested == "torch":
        return False
    if requested == "triton":
        if not runs_on(device) or dtype not in DTYPES or head_dim > MAX_DIM:
            raise ValueError(f"recall_kernel='triton' needs Triton and a CUDA device (or TRITON_INTERPRET=1), "
                             f"{', '.join(map(str, DTYPES))} and heads of at most {MAX_DIM}; use 'auto'")
        return True
    return (device.type == "cuda" and runs_on(device) and dtype in DTYPES and head_dim <= MAX_DIM
            and _checked(device.type, device.index, dtype, head_dim))


def fits(query: torch.Tensor, keys: torch.Tensor, k: int) -> bool:
    """Whether one call covers this scan: a decode step's rows, a small k, and nothing that needs a gradient."""
    needs_grad = torch.is_grad_enabled() and (query.requires_grad or keys.requires_grad)
    return (query.shape[-2] <= MAX_ROWS and 1 <= k <= MAX_K and not needs_grad and keys.dtype == query.dtype
            and query.device == keys.device)


def recall_from_store(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, live: torch.Tensor | None, *,
                      k: int, scale: float, first_row: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, positions, values) of the ``k`` best store rows per query row: float32 (B, Hkv, R, k), int64
    positions ``first_row`` + row, and the rows' values (B, Hkv, R, k, D); -inf and zeros past the rows in use.

    query: (B, Hkv, R, D); keys, values: (B, Hkv, n, D); live: the rows in use (a 0-d count on the keys' device),
    None for all n."""
    logits, picked = store_topk(query, keys, live, k=k, scale=scale)
    positions, gathered = torch.ops.lminfinite.recall_gather(picked, logits, values, first_row)
    return logits, positions, gathered


def store_topk(query: torch.Tensor, keys: torch.Tensor, live: torch.Tensor | None, *, k: int,
               scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits (B, Hkv, R, k), best first, and their rows in the store (-inf where fewer rows exist)."""
    cand_logits, cand_rows = torch.ops.lminfinite.recall_scan(query, keys, live, k, scale)
    logits, pick = cand_logits.topk(k, dim=-1)
    return logits, cand_rows.gather(-1, pick)


@torch.library.custom_op("lminfinite::recall_scan", mutates_args=())
def recall_scan(query: torch.Tensor, keys: torch.Tensor, live: torch.Tensor | None, k: int,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query row, the ``k`` best scaled float32 logits of each block of BLOCK keys and their rows:
    (B, Hkv, R, blocks·k) each, -inf (row 0 of the block) where a block holds fewer rows in use."""
    from . import recall_triton

    return recall_triton.scan(query, keys, live, k, scale, BLOCK)


@recall_scan.register_fake
def _(query, keys, live, k, scale):
    batch, kv_heads, rows, _ = query.shape
    candidates = -(-keys.shape[-2] // BLOCK) * k
    shape = (batch, kv_heads, rows, candidates)
    return query.new_empty(shape, dtype=torch.float32), query.new_empty(shape, dtype=torch.long)


@torch.library.custom_op("lminfinite::recall_gather", mutates_args=())
def recall_gather(rows: torch.Tensor, logits: torch.Tensor, values: torch.Tensor,
                  first_row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions ``first_row`` + rows (int64, shaped as ``rows``) and the values of those rows (B, Hkv, R, k, D);
    zeros where the logit is -inf (no such row in use)."""
    from . import recall_triton

    return recall_triton.gather(rows, logits, values, first_row)


@recall_gather.register_fake
def _(rows, logits, values, first_row):
    return rows.new_empty(rows.shape, dtype=torch.long), values.new_empty((*rows.shape, values.shape[-1]))


@functools.lru_cache(maxsize=None)
def _checked(device_type: str, index: int | None, dtype: torch.dtype, head_dim: int) -> bool:
    """The kernels against float64 on a small store with a count and spare rows, once per device, dtype and head
    size; a build where they fail or disagree falls back to PyTorch's operators, with a warning."""
    device = torch.device(device_type, index)
    try:
        agrees = agrees_with_float64(device, dtype, head_dim)
    except Exception as exc:  # a Triton or driver that cannot build or run them
        warnings.warn(f"recall_kernel: Triton's recall kernels fail on {device} ({type(exc).__name__}: {exc}); "
                      "recall runs through PyTorch's operators", RuntimeWarning, stacklevel=2)
        return False
    if not agrees:
        warnings.warn(f"recall_kernel: Triton's recall kernels disagree with float64 on {device} {dtype}; recall "
                      "runs through PyTorch's operators", RuntimeWarning, stacklevel=2)
    return agrees


def agrees_with_float64(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Logits within the inputs' rounding of float64's over the rows in use, rows among float64's top k except
    between near-ties, and each picked row's values; two query rows per key head, 300 rows of a 400-row buffer."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 2, 2, head_dim, generator=generator).to(device, dtype)
    keys, values = (torch.randn(1, 2, 400, head_dim, generator=generator).to(device, dtype) for _ in range(2))
    live, k, scale = torch.tensor(300, device=device), 5, head_dim ** -0.5
    logits, positions, gathered = recall_from_store(query, keys, values, live, k=k, scale=scale, first_row=4)
    exact = (query.double() @ keys[..., :300, :].double().transpose(-1, -2)) * scale
    best = exact.topk(k, dim=-1).values
    rows = positions - 4
    expected = values.gather(2, rows.reshape(1, 2, -1, 1).expand(-1, -1, -1, head_dim)).reshape(gathered.shape)
    tolerance = 1e-4  # float32 sums of the same numbers float64 sums
    return bool(
        (rows >= 0).all() and (rows < 300).all() and torch.equal(gathered, expected)
        and torch.allclose(logits.double(), best, atol=tolerance, rtol=tolerance)
        and torch.allclose(exact.gather(-1, rows), best, atol=tolerance, rtol=tolerance)
    )
