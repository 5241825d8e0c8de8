"""Top-k recall over a middle store in Triton's GPU kernels: a decode step's recall layer launches 8 kernels more than
without recall, where recall.py's general path, kernel.py's merge and the query's rotation launch 45.

Why. A decode step that recalls reads every middle key of every recall layer. Through PyTorch's operators that is
a product, a mask, a top-k, then a dozen small operators to pick and gather values, per layer: on an H200 about
7 ms per token of launches alone at 4K tokens, and the scan reads the keys at a fifth of the GPU's bandwidth
(docs/benchmarks.md, GPU round 2). Here:
  0. ``recall_rotate``: the decode step's query turned to the distance recall scores at (rotary.apply_rotation);
  1. ``recall_scan``: each program scores one block of keys against every query row of its key head, in float32,
     and keeps the block's k best (logit and position): the keys are read once, in their own dtype (or, where
     SCORES says so, one batched product scores every row in float32 and ``recall_select`` keeps each block's k
     best of its numbers);
  2. torch.topk picks the k best of the blocks' candidates (a few thousand per row, not the whole store);
  3. ``recall_merge_`` folds them into the window's output in place, as one softmax, reading their values from the
     store (none where the store held fewer than k rows); where something else must see them first (start keys
     to merge too, an observer of recall), ``recall_gather`` gathers the values and kernel.py merges.
A row count on the device (MiddleStore.fixed_view) masks a buffer's spare rows, so a CUDA graph records the step
once per buffer (graphed.py). The kernels are PyTorch operators (torch.library.custom_op): the dispatcher, a
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
# Query rows per key head up to which a scan's products are summed along the channels instead of multiplied on
# tensor cores, whose products need 16 rows: a decode step of a model without grouped heads (Llama-2) has one row,
# and every pass of a block's selection would otherwise run over 16.
FEW_ROWS = 2
# Blocks per program of the scan for FEW_ROWS query rows or fewer (1: each block's k best, in k passes; more: a
# running k best over that many blocks, recall_triton._scan_spans). 1 until a GPU times the other
# (benchmarks/recall_kernel.py's ``triton-span`` way).
SPAN = 1
# How a decode step's scan scores the store: "kernel", recall_scan's programs multiply the keys and select in one
# pass; "products", a batched product (cuBLAS on a GPU, written in float32) scores every row of the buffer and
# recall_select's programs pick each SELECT_BLOCK rows' k best from those numbers. From a graph on an H200 PyTorch's
# product and full top-k read 128K keys at 2.3 TB/s, the scan at 1.45 (docs/benchmarks.md); the selection
# reads 4 bytes a row where the product read 256. "kernel" until a GPU times the other (benchmarks/
# recall_kernel.py's ``products`` way).
SCORES = "kernel"
SELECT_BLOCK = 1024
# Query rows per key head up to which SCORES applies (a decode step of up to 8 query heads per key head): the
# products are held whole, 4 bytes a row a query row (16 MiB a layer at 128K middle tokens for Llama-2's step); a
# question read with recall, up to MAX_ROWS rows, is scanned.
PRODUCT_ROWS = 8
MAX_ROWS = 64  # query rows per key head (a decode step: the group's heads); more is a prefill, recall.py's scan
MAX_K = 64  # the per-block top-k is unrolled k times
MAX_DIM = 256
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Query rows per key head the checks before ``auto`` run with: one, summed along the channels (a decode step of a
# model without grouped heads: Llama-2), and four, on tensor cores (grouped heads, a question read with recall).
CHECKED_ROWS = (1, 4)
# Rows of a store's buffer from which ``auto`` scans it through PyTorch's operators in a step recorded into a CUDA
# graph. From a graph on an H200 (docs/benchmarks.md, recall_kernel_gpu: one layer, 32 heads of 128) the kernels
# took 0.045 ms to the operators' 0.112 at 4K middle tokens, the same at 32K, and 0.74 to 0.46 at 128K, where
# cuBLAS's product read the keys at 2.3 TB/s and the scan at 1.45 (between 32K and 128K: not measured); eagerly
# the kernels won at every size.
GRAPHED_OPERATORS_FROM = 65536


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


def scans_store(requested: str, device: torch.device, dtype: torch.dtype, shape: torch.Size) -> bool:
    """Whether recall scans a middle store's primary (keys of ``shape``: B, Hkv, rows, D) through these kernels:
    where ``resolve`` says so, except, for ``auto``, a store of GRAPHED_OPERATORS_FROM rows or more in a step being
    recorded into a CUDA graph."""
    if not resolve(requested, device, dtype, shape[-1]):
        return False
    return (requested != "auto" or shape[-2] < GRAPHED_OPERATORS_FROM or device.type != "cuda"
            or not torch.cuda.is_current_stream_capturing())


def fits(query: torch.Tensor, keys: torch.Tensor, k: int) -> bool:
    """Whether one call covers this scan: a decode step's rows, a small k, and nothing that needs a gradient."""
    needs_grad = torch.is_grad_enabled() and (query.requires_grad or keys.requires_grad)
    return (query.shape[-2] <= MAX_ROWS and 1 <= k <= MAX_K and not needs_grad and keys.dtype == query.dtype
            and query.device == keys.device)


def rotate(query: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``query`` (..., D) rotated by one row's ``cos``, ``sin`` (1, D): rotary.apply_rotation's numbers (computed in
    float32, rounded to the query's dtype) in one launch instead of seven."""
    return torch.ops.lminfinite.recall_rotate(query, cos, sin)


def merge_into(out: torch.Tensor, lse: torch.Tensor, logits: torch.Tensor, positions: torch.Tensor,
               values: torch.Tensor, first_row: int) -> None:
    """Fold recalled tokens into a window output, in place, as one softmax: ``out`` (B, Hkv, R, D) float32 and its
    log-sum-exp ``lse`` (B, Hkv, R), the recalled ``logits`` and ``positions`` (B, Hkv, R, k), their values read
    from the store's ``values`` (B, Hkv, n, D) at rows ``positions - first_row`` (none where the logit is -inf)."""
    torch.ops.lminfinite.recall_merge_(out, lse, logits, positions, values, first_row)


def gather(positions: torch.Tensor, logits: torch.Tensor, values: torch.Tensor, first_row: int) -> torch.Tensor:
    """The values (B, Hkv, R, k, D) of the store's rows ``positions - first_row``; zeros where the logit is -inf."""
    return torch.ops.lminfinite.recall_gather(positions, logits, values, first_row)


def store_topk(query: torch.Tensor, keys: torch.Tensor, live: torch.Tensor | None, *, k: int, scale: float,
               first_row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits (B, Hkv, R, k), best first, and their positions ``first_row`` + the row in the store (-inf
    where fewer rows are in use).

    query: (B, Hkv, R, D); keys: (B, Hkv, n, D); live: the rows in use (a 0-d count on the keys' device), None for
    all n."""
    if SCORES == "products" and query.shape[-2] <= PRODUCT_ROWS:
        cand_logits, cand_positions = torch.ops.lminfinite.recall_select(products(query, keys), live, k, scale,
                                                                          first_row)
    else:
        cand_logits, cand_positions = torch.ops.lminfinite.recall_scan(query, keys, live, k, scale, first_row, SPAN)
    logits, pick = cand_logits.topk(k, dim=-1)
    return logits, cand_positions.gather(-1, pick)


def products(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """float32 (B, Hkv, R, n): ``query`` (B, Hkv, R, D) times every row of ``keys`` (B, Hkv, n, D), summed in
    float32, as recall_scan sums them. On a GPU one batched product written in float32 (bmm's out_dtype: CUDA only),
    which reads the keys in their own dtype; elsewhere through float32 copies."""
    batch, kv_heads, rows, dim = query.shape
    flat_q, flat_k = query.reshape(batch * kv_heads, rows, dim), keys.reshape(batch * kv_heads, -1, dim)
    if query.device.type == "cuda" and query.dtype != torch.float32:
        out = torch.bmm(flat_q, flat_k.transpose(1, 2), out_dtype=torch.float32)
    else:
        out = torch.bmm(flat_q.float(), flat_k.float().transpose(1, 2))
    return out.view(batch, kv_heads, rows, -1)


@torch.library.custom_op("lminfinite::recall_select", mutates_args=())
def recall_select(products: torch.Tensor, live: torch.Tensor | None, k: int, scale: float,
                  first_row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query row, the ``k`` best of each SELECT_BLOCK of ``products`` (float32, B, Hkv, R, n), scaled, and their
    positions: (B, Hkv, R, blocks·k) each, -inf where a block holds fewer rows in use, as recall_scan gives them."""
    from . import recall_triton

    return recall_triton.select(products, live, k, scale, first_row, SELECT_BLOCK)


@recall_select.register_fake
def _(products, live, k, scale, first_row):
    shape = (*products.shape[:3], -(-products.shape[-1] // SELECT_BLOCK) * k)
    return products.new_empty(shape), products.new_empty(shape, dtype=torch.long)


@torch.library.custom_op("lminfinite::recall_scan", mutates_args=())
def recall_scan(query: torch.Tensor, keys: torch.Tensor, live: torch.Tensor | None, k: int, scale: float,
                first_row: int, span: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query row, the ``k`` best scaled float32 logits of each block of BLOCK keys (of each ``span`` blocks
    where ``_spans`` takes them) and their positions: (B, Hkv, R, blocks·k) each, -inf where a block holds fewer
    rows in use."""
    from . import recall_triton

    return recall_triton.scan(query, keys, live, k, scale, first_row, BLOCK, _spans(span, query.shape[-2]))


@recall_scan.register_fake
def _(query, keys, live, k, scale, first_row, span=1):
    batch, kv_heads, rows, _ = query.shape
    candidates = -(-keys.shape[-2] // (BLOCK * _spans(span, rows))) * k
    shape = (batch, kv_heads, rows, candidates)
    return query.new_empty(shape, dtype=torch.float32), query.new_empty(shape, dtype=torch.long)


def _spans(span: int, rows: int) -> int:
    """Blocks per program of a scan: ``span`` for FEW_ROWS query rows or fewer, else 1 (on tensor cores the
    running selection of recall_triton._scan_spans took every register and spilled: ptxas, sm_90, 232 bytes in
    float32 over 4 warps, more over 8)."""
    return span if rows <= FEW_ROWS else 1


@torch.library.custom_op("lminfinite::recall_rotate", mutates_args=())
def recall_rotate(query: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    from . import recall_triton

    return recall_triton.rotate(query, cos, sin)


@recall_rotate.register_fake
def _(query, cos, sin):
    return torch.empty_like(query)


@torch.library.custom_op("lminfinite::recall_gather", mutates_args=())
def recall_gather(positions: torch.Tensor, logits: torch.Tensor, values: torch.Tensor, first_row: int) -> torch.Tensor:
    from . import recall_triton

    return recall_triton.gather(positions, logits, values, first_row)


@recall_gather.register_fake
def _(positions, logits, values, first_row):
    return values.new_empty((*positions.shape, values.shape[-1]))


@torch.library.custom_op("lminfinite::recall_merge_", mutates_args=("out",))
def recall_merge_(out: torch.Tensor, lse: torch.Tensor, logits: torch.Tensor, positions: torch.Tensor,
                  values: torch.Tensor, first_row: int) -> None:
    from . import recall_triton

    recall_triton.merge(out, lse, logits, positions, values, first_row)


@recall_merge_.register_fake
def _(out, lse, logits, positions, values, first_row):
    return None


@functools.lru_cache(maxsize=None)
def _checked(device_type: str, index: int | None, dtype: torch.dtype, head_dim: int) -> bool:
    """The kernels against float64 on a small store with a count and spare rows, once per device, dtype and head
    size; a build where they fail or disagree falls back to PyTorch's operators, with a warning."""
    return passes(agrees_with_float64, torch.device(device_type, index), dtype, head_dim,
                  what="recall_kernel: Triton's recall kernels", otherwise="recall runs through PyTorch's operators")


def passes(check, device: torch.device, dtype: torch.dtype, head_dim: int, *, what: str, otherwise: str) -> bool:
    """``check(device, dtype, head_dim)``, False where it raises (a Triton or driver that cannot build or run the
    kernels) or disagrees, with a warning naming ``what`` failed and what is done ``otherwise``."""
    try:
        agrees = check(device, dtype, head_dim)
    except Exception as exc:
        warnings.warn(f"{what} fail on {device} ({type(exc).__name__}: {exc}); {otherwise}", RuntimeWarning,
                      stacklevel=3)
        return False
    if not agrees:
        warnings.warn(f"{what} disagree with float64 on {device} {dtype}; {otherwise}", RuntimeWarning, stacklevel=3)
    return agrees


def agrees_with_float64(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """``_agrees_for`` each of CHECKED_ROWS query rows per key head."""
    return all(_agrees_for(rows, device, dtype, head_dim) for rows in CHECKED_ROWS)


def _agrees_for(rows: int, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Logits within the inputs' rounding of float64's over the rows in use, rows among float64's top k except
    between near-ties, each picked row's values, a window output merged with them as float64 merges it, and a query
    rotated within a rounding of its dtype; ``rows`` query rows per key head, 300 rows of a 400-row buffer."""
    generator = torch.Generator().manual_seed(rows)
    query = torch.randn(1, 2, rows, head_dim, generator=generator).to(device, dtype)
    keys, values = (torch.randn(1, 2, 400, head_dim, generator=generator).to(device, dtype) for _ in range(2))
    out, lse = torch.randn(1, 2, rows, head_dim, generator=generator).to(device), torch.randn(1, 2, rows).to(device)
    live, k, scale = torch.tensor(300, device=device), 5, head_dim ** -0.5
    logits, positions = store_topk(query, keys, live, k=k, scale=scale, first_row=4)
    gathered = gather(positions, logits, values, 4)
    merged = out.clone()
    merge_into(merged, lse, logits, positions, values, 4)
    exact = (query.double() @ keys[..., :300, :].double().transpose(-1, -2)) * scale
    best = exact.topk(k, dim=-1).values
    rows = positions - 4
    expected = values.gather(2, rows.reshape(1, 2, -1, 1).expand(-1, -1, -1, head_dim)).reshape(gathered.shape)
    total = torch.logaddexp(lse.double(), torch.logsumexp(logits.double(), dim=-1))[..., None]
    weights = torch.exp(logits.double() - total)[..., None]
    float64 = out.double() * torch.exp(lse.double()[..., None] - total) + (weights * expected.double()).sum(-2)
    tolerance = 1e-4  # float32 sums of the same numbers float64 sums
    angle = torch.linspace(0, 6, head_dim // 2, device=device)[None]
    cos, sin = torch.cat((angle.cos(), angle.cos()), -1), torch.cat((angle.sin(), angle.sin()), -1)
    rotated = rotate(query, cos, sin).double()
    turned = torch.cat((-query[..., head_dim // 2:], query[..., : head_dim // 2]), -1).double()
    rounding = torch.finfo(dtype).eps
    return bool(
        torch.allclose(rotated, query.double() * cos.double() + turned * sin.double(), atol=1e-5, rtol=rounding)
        and (rows >= 0).all() and (rows < 300).all() and torch.equal(gathered, expected)
        and torch.allclose(logits.double(), best, atol=tolerance, rtol=tolerance)
        and torch.allclose(exact.gather(-1, rows), best, atol=tolerance, rtol=tolerance)
        and torch.allclose(merged.double(), float64, atol=tolerance, rtol=tolerance)
    )
