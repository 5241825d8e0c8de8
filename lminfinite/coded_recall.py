"""Top-k recall through a middle store's int8 copy (key_codes.py): the store's own top k, reading half the bytes.

The steps, none of which waits for the device (a CUDA graph records them as they are), five launches in all:
  1. ``recall_scan_codes``: per block, an upper bound on every key's logit (its scanned logit plus its error bound,
     or in the block being filled its own logit plus a rounding); per pool of POOL keys (a few blocks), the KEEP
     largest bounds and their positions, and the largest bound it left out;
  2. torch.topk: the BUDGET + 1 largest bounds among the pools' candidates, unsorted (no sort launched), where
     the pools keep more; the smallest of them is not rescored but joins the certificate;
  3. ``recall_certify``: those candidates rescored from the store's own keys, their k best kept, and the
     certificate: where no key left out (in a pool, or among the candidates) has a bound above the k-th best
     rescored logit, that k best is the store's top k, and the row is settled;
  4. ``recall_scan`` scans in full the heads of any row not settled, told to skip the other heads' blocks;
  5. ``recall_settle_``: each row not settled takes the k best of that scan's candidates, in place.

The bound. For a coded key, k̃ = code · scale, and the scan computes q·k̃ as (q ⊙ scale)·code in float32 on
tensor cores (inputs rounded to TF32: 2^-10 relative at worst; codes are exact), or for one or two query rows as
float32 products summed along the channels. So

    |q·k − scanned| ≤ ‖q‖·‖k − k̃‖ + (2^-10 + 2D·2^-24)·‖q‖·‖k̃‖

(Cauchy–Schwarz; the last term also covers the float32 sums of the scan and of the rescoring), with ‖k − k̃‖
kept per key and ‖k̃‖ bounded by its block's largest, and a margin of 25 % (SAFETY) for the bound's own float32
arithmetic. A NaN bound counts as +inf: such a key is never left out. Measured on a real model's recall queries
(benchmarks/scan_copy_bound.py), such bounds leave 0.05-0.2 % of the keys within reach of the k-th best.
"""

from __future__ import annotations

import functools
import itertools

import torch

from . import recall_kernel
from .key_codes import BLOCK, KEEP, POOL, KeyCodes  # noqa: F401 (KEEP, POOL: benchmarks read them from here)

BUDGET = 128  # candidates rescored per query row
SAFETY = 1.25


def rounding(head_dim: int) -> float:
    """The bound's relative term: TF32 inputs, and two float32 sums of head_dim products."""
    return 2.0**-10 + 2 * head_dim * 2.0**-24


def fits(codes: KeyCodes | None, k: int) -> bool:
    return codes is not None and codes.codes is not None and k <= codes.keep


def coded_topk(query: torch.Tensor, keys: torch.Tensor, codes: KeyCodes, live: torch.Tensor | None, *, k: int,
               scale: float, first_row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """recall_kernel.store_topk's result (the store's k best logits per query row, and their positions), through
    the store's codes. query (B, Hkv, R, D); keys (B, Hkv, n, D), the buffer ``codes`` copies (n: its rows, or
    those in use); live: the rows in use, as store_topk takes it."""
    logits, positions, settled = _certified(query, keys, codes, live, k=k, scale=scale, first_row=first_row)
    full_logits, full_positions = torch.ops.lminfinite.recall_scan(query, keys, live, k, scale, first_row, settled)
    torch.ops.lminfinite.recall_settle_(logits, positions, settled, full_logits, full_positions, first_row)
    return logits, positions


def certified_topk(query: torch.Tensor, keys: torch.Tensor, codes: KeyCodes, live: torch.Tensor | None, *, k: int,
                   scale: float, first_row: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Steps 1 to 3: per query row, the k best rescored logits and their positions, and whether they are surely
    the store's top k (B, Hkv, R) bool."""
    logits, positions, settled = _certified(query, keys, codes, live, k=k, scale=scale, first_row=first_row)
    return logits, positions, settled.bool()


def _certified(query, keys, codes, live, *, k, scale, first_row):
    upper, positions, left = scan_bounds(query, keys, codes, live, scale=scale, first_row=first_row)
    bounds, pick, count = best_bounds(upper)
    return torch.ops.lminfinite.recall_certify(query, keys, positions, bounds, pick, left, k, count, scale, first_row)


def scan_bounds(query: torch.Tensor, keys: torch.Tensor, codes: KeyCodes, live: torch.Tensor | None, *,
                scale: float, first_row: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step 1: the pools' candidates' bounds and positions, and the largest bound each pool left out."""
    return torch.ops.lminfinite.recall_scan_codes(query, keys, codes.codes, codes.scales, codes.errors, codes.norms,
                                                  live, scale, first_row, codes.keep, codes.pool)


def best_bounds(upper: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Step 2: (bounds, their places among the candidates, how many are rescored): the BUDGET + 1 largest,
    unsorted, or every candidate (no pick, nothing launched) where there are no more than BUDGET."""
    count = min(BUDGET, upper.shape[-1])
    bounds, pick = upper.topk(count + 1, dim=-1, sorted=False) if count < upper.shape[-1] else (upper, None)
    return bounds, pick, count


def keeps_codes(requested: str, recall_kernel_name: str, device: torch.device, dtype: torch.dtype,
                head_dim: int) -> bool:
    """Whether a middle store on ``device`` keeps codes: only where asked (``int8``), and where recall runs through
    Triton's kernels (else an error); on a CUDA device only where the coded scan agrees with float64 there (checked
    once; else a warning, and recall scans the keys). ``auto`` and ``off`` never: on the one GPU measured (H200,
    2026-11-29, docs/benchmarks.md's recall_kernel_gpu) the coded scan was slower than the keys' own at 4K to 128K
    middle tokens, eager and from a CUDA graph, and the codes made the store 30 % larger. ``recall_kernel_name``:
    LMInfiniteConfig.recall_kernel."""
    if requested != "int8":
        return False
    if not recall_kernel.resolve(recall_kernel_name, device, dtype, head_dim):
        raise ValueError("recall_key_codes='int8' needs recall through Triton's kernels (recall_kernel='triton', "
                         "or 'auto' on a CUDA device); use 'off'")
    return device.type != "cuda" or _checked(device.type, device.index, dtype, head_dim)


@torch.library.custom_op("lminfinite::recall_scan_codes", mutates_args=())
def recall_scan_codes(query: torch.Tensor, keys: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                      errors: torch.Tensor, norms: torch.Tensor, live: torch.Tensor | None, scale: float,
                      first_row: int, keep: int, pool: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per query row: the ``keep`` largest bounds of each pool of ``pool`` keys and their positions
    (B, Hkv, R, pools·keep), and the largest bound each pool left out (B, Hkv, R, pools); -inf for rows not in
    use."""
    from . import coded_triton

    return coded_triton.scan_codes(query, keys, codes, scales, errors, norms, live, scale, first_row, keep, pool,
                                   BLOCK, rounding(query.shape[-1]), SAFETY)


@recall_scan_codes.register_fake
def _(query, keys, codes, scales, errors, norms, live, scale, first_row, keep, pool):
    batch, kv_heads, rows, _ = query.shape
    pools = -(-keys.shape[-2] // pool)
    shape = (batch, kv_heads, rows, pools * keep)
    return (query.new_empty(shape, dtype=torch.float32), query.new_empty(shape, dtype=torch.long),
            query.new_empty((batch, kv_heads, rows, pools), dtype=torch.float32))


@torch.library.custom_op("lminfinite::recall_certify", mutates_args=())
def recall_certify(query: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor, bounds: torch.Tensor,
                   pick: torch.Tensor | None, left: torch.Tensor, k: int, count: int, scale: float,
                   first_row: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per query row, the ``count`` candidates of ``bounds`` (all of them, or the count + 1 at ``pick`` in any order
    but the smallest) rescored from the store's keys: their k best logits and positions (B, Hkv, R, k), best first,
    and whether no bound left out (``left``, and where they are picked the smallest) reaches the k-th: (B, Hkv, R)
    int32."""
    from . import coded_triton

    return coded_triton.certify(query, keys, positions, bounds, pick, left, k, count, scale, first_row)


@recall_certify.register_fake
def _(query, keys, positions, bounds, pick, left, k, count, scale, first_row):
    shape = (*query.shape[:3], k)
    return (query.new_empty(shape, dtype=torch.float32), query.new_empty(shape, dtype=torch.long),
            query.new_empty(query.shape[:3], dtype=torch.int32))


@torch.library.custom_op("lminfinite::recall_settle_", mutates_args=("logits", "positions"))
def recall_settle_(logits: torch.Tensor, positions: torch.Tensor, settled: torch.Tensor, full_logits: torch.Tensor,
                   full_positions: torch.Tensor, first_row: int) -> None:
    """Rows not ``settled`` take the k best of the full scan's candidates (``full_logits``, ``full_positions``:
    recall_scan's), in place."""
    from . import coded_triton

    coded_triton.settle(logits, positions, settled, full_logits, full_positions, first_row)


@recall_settle_.register_fake
def _(logits, positions, settled, full_logits, full_positions, first_row):
    return None


@functools.lru_cache(maxsize=None)
def _checked(device_type: str, index: int | None, dtype: torch.dtype, head_dim: int) -> bool:
    return recall_kernel.passes(agrees_with_float64, torch.device(device_type, index), dtype, head_dim,
                                what="coded_recall: the coded scan's kernels",
                                otherwise="recall scans the keys themselves")


def agrees_with_float64(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """The coded top k against float64's over a store of a whole pool of coded blocks, then a coded block and a
    block being filled, read through a buffer with spare rows holding huge numbers, for one query row per key
    head and for four (recall_kernel.CHECKED_ROWS: both ways the scan multiplies): once with keys the codes tell
    apart, and once with every key the same up to a rounding, where no bound is certain and every head is scanned
    in full."""
    generator = torch.Generator().manual_seed(0)
    agrees = True
    in_use = POOL + BLOCK + 70
    for rows, spread in itertools.product(recall_kernel.CHECKED_ROWS, (1.0, 0.0)):
        keys = torch.randn(1, 2, 1, head_dim, generator=generator) + spread * torch.randn(
            1, 2, in_use + 100, head_dim, generator=generator)
        keys[..., in_use:, :] = 3e4  # spare rows
        keys = keys.to(device, dtype)
        query = torch.randn(1, 2, rows, head_dim, generator=generator).to(device, dtype)
        live, k, scale = torch.tensor(in_use, device=device), 5, head_dim**-0.5
        codes = KeyCodes().grown(keys, keys.shape[-2])
        codes.code(keys, in_use)
        logits, positions = coded_topk(query, keys, codes, live, k=k, scale=scale, first_row=3)
        exact = (query.double() @ keys[..., :in_use, :].double().transpose(-1, -2)) * scale
        rows = positions - 3
        best = exact.topk(k, dim=-1).values
        agrees = agrees and bool(
            (rows >= 0).all() and (rows < in_use).all()
            and torch.allclose(logits.double(), best, atol=1e-4, rtol=1e-4)
            and torch.allclose(exact.gather(-1, rows), best, atol=1e-4, rtol=1e-4))
    return agrees

