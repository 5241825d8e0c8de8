"""How many middle keys a narrow scan copy leaves to rescore, on a real model's own recall queries (issue 34).

Decoding with recall at 128K tokens on a GPU is bound by reading every middle key of every recall layer (28 GiB a
token at Llama-2-7B's shape). A copy of the keys in fewer bits halves that, and stays exact where each scanned logit
comes with a bound on its error: every key whose bound reaches the k-th best lower bound is rescored from the store's
own keys (as bounded_scan.py does on the CPU with a bfloat16 copy). What that costs depends on how tight the bound is
on real keys, which this measures:

    python -m benchmarks.scan_copy_bound --model qwen2.5-coder-1.5b --context 8192

A real document (the Shared MIME-info spec) is read without recall, a question asked with recall, and ``--steps``
greedy tokens decoded; each recall layer's query rows and middle keys are taken as the library hands them to
recall_topk. For each copy, per query row, the bound of key i is ‖q‖·‖k_i − k̃_i‖·scale (Cauchy–Schwarz, with the
key's own rounding error, which a copy would store beside it), and the share of keys whose upper bound reaches the
k-th largest lower bound is what must be rescored. Float64 throughout: the scan's own rounding is not counted.

The GPU's int8 key codes built on this (a scan of the codes, then a rescoring of its best candidates) were the
slowest recall at every size on an H200 and made the store 30 % larger; they were removed (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from benchmarks.decode_weights import write_result
from ingest.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
SPEC = Path("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf")
QUESTION = "What is the default weight value of a glob element?"
BLOCK = 128  # keys per block of the GPU scan (recall_triton.py): a per-block scale costs no extra pass


def int8_per_key(keys: torch.Tensor) -> torch.Tensor:
    scale = keys.abs().amax(-1, keepdim=True).clamp(min=1e-30) / 127
    return (keys / scale).round().clamp(-127, 127) * scale


def in_blocks(keys: torch.Tensor, block: int) -> torch.Tensor:
    """Keys (B, H, n, D) as blocks of ``block`` (B, H, blocks, block, D), a partial last one filled with copies of
    its last key: neither a channel's range nor its largest size changes."""
    filler = keys[..., -1:, :].expand(*keys.shape[:-2], -keys.shape[-2] % block, keys.shape[-1])
    return torch.cat((keys, filler), dim=-2).unflatten(-2, (-1, block))


def int8_per_block_channel(keys: torch.Tensor) -> torch.Tensor:
    """One scale per channel for each block of BLOCK keys: a store appends without rescaling older blocks."""
    blocks = in_blocks(keys, BLOCK)
    scale = blocks.abs().amax(-2, keepdim=True).clamp(min=1e-30) / 127
    coded = (blocks / scale).round().clamp(-127, 127) * scale
    return coded.flatten(-3, -2)[..., : keys.shape[-2], :]


def asymmetric_per_block_channel(bits: int, block: int = BLOCK) -> Callable[[torch.Tensor], torch.Tensor]:
    """Codes of ``bits`` bits from each channel's least to its largest value in each block of ``block`` keys (a
    step and an offset per channel and block): the narrowest copies, to see how loose their bound gets."""

    def quantize(keys: torch.Tensor) -> torch.Tensor:
        blocks = in_blocks(keys, block)
        low = blocks.amin(-2, keepdim=True)
        step = ((blocks.amax(-2, keepdim=True) - low) / (2**bits - 1)).clamp(min=1e-30)
        return (((blocks - low) / step).round() * step + low).flatten(-3, -2)[..., : keys.shape[-2], :]

    return quantize


def fp8_e4m3(keys: torch.Tensor) -> torch.Tensor:
    return keys.float().to(torch.float8_e4m3fn).double()


# name: (quantize, bytes per key and head at head size D, the bound's error norm included)
COPIES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[int], float]]] = {
    "int8, one scale per key": (int8_per_key, lambda d: d + 2 + 2),
    f"int8, one scale per channel per {BLOCK} keys": (int8_per_block_channel, lambda d: d + 2 * d / BLOCK + 2),
    "fp8 e4m3": (fp8_e4m3, lambda d: d + 2),
    f"int6, a step and an offset per channel per {BLOCK} keys": (asymmetric_per_block_channel(6),
                                                                  lambda d: 6 * d / 8 + 4 * d / BLOCK + 2),
    f"int4, a step and an offset per channel per {BLOCK} keys": (asymmetric_per_block_channel(4),
                                                                  lambda d: d / 2 + 4 * d / BLOCK + 2),
    "int4, a step and an offset per channel per 32 keys": (asymmetric_per_block_channel(4, 32),
                                                           lambda d: d / 2 + 4 * d / 32 + 2),
}


def rescore_shares(query: torch.Tensor, keys: torch.Tensor, copy: torch.Tensor, *, k: int,
                   scale: float) -> torch.Tensor:
    """Per query row, the share of keys whose scanned logit's bound reaches the k-th best lower bound: the keys an
    exact scan through ``copy`` must rescore (at least k/n). query (B, H, R, D), keys and copy (B, H, n, D)."""
    scanned = (query @ copy.transpose(-1, -2)) * scale
    bound = query.norm(dim=-1, keepdim=True) * (keys - copy).norm(dim=-1)[..., None, :] * scale
    kth_lower = (scanned - bound).topk(min(k, keys.shape[-2]), dim=-1).values[..., -1:]
    return ((scanned + bound) >= kth_lower).double().mean(-1).flatten()


@contextlib.contextmanager
def recall_inputs() -> Iterator[list[tuple[torch.Tensor, torch.Tensor, int, float]]]:
    """(query rows, middle keys in use, k, scale) of every store scan recall makes inside the block, in float64."""
    from lminfinite import kernel

    seen: list[tuple[torch.Tensor, torch.Tensor, int, float]] = []
    recall_topk = kernel.recall_topk

    def observed(q, query_pos, first_pos, ctx, rope, **options):
        if ctx.middle_k is not None:
            live = ctx.middle_k.shape[-2] if ctx.middle_live is None else int(ctx.middle_live)
            rows = q.detach().reshape(q.shape[0], q.shape[1], -1, q.shape[-1]).double()
            seen.append((rows, ctx.middle_k[..., :live, :].double(), options["k"], options["scale"]))
        return recall_topk(q, query_pos, first_pos, ctx, rope, **options)

    kernel.recall_topk = observed
    try:
        yield seen
    finally:
        kernel.recall_topk = recall_topk


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="a bundled model's name, or a model folder")
    p.add_argument("--context", type=int, default=8192, help="tokens of the document read before the question")
    p.add_argument("--steps", type=int, default=4, help="greedy tokens decoded after the question")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--document", type=Path, default=SPEC, help="a PDF")
    p.add_argument("--question", default=QUESTION, help="asked with recall after the document")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    return p.parse_args(argv)


def main(argv=None) -> str:
    args = parse_args(argv)
    import pymupdf

    from app.cli import AppConfig
    from app.engine.model_loading import choose_model, load_runtime

    config = AppConfig(model=args.model, cpu_threads=args.threads)
    runtime = load_runtime(config, choose_model(config))
    with pymupdf.open(args.document) as pdf:
        text = "".join(page.get_text() for page in pdf)
    ids = runtime.tokenizer(text)["input_ids"][:args.context]
    cache = runtime.new_cache()
    for lo in range(0, len(ids), runtime.prefill_chunk):
        runtime.forward(ids[lo:lo + runtime.prefill_chunk], cache, topk=0)
    with recall_inputs() as seen:
        logits = runtime.forward(runtime.tokenizer(args.question)["input_ids"], cache, topk=5)
        seen.clear()  # the question's rows: a prefill; what is measured is decoding
        for _ in range(args.steps):
            logits = runtime.forward([int(logits.argmax())], cache, topk=5)
    head_dim = seen[0][1].shape[-1]
    rows = []
    for name, (quantize, row_bytes) in COPIES.items():
        shares = torch.cat([rescore_shares(q, keys, quantize(keys), k=k, scale=scale) for q, keys, k, scale in seen])
        ordered = shares.sort().values
        rows.append([name, f"{row_bytes(head_dim):.0f} / {2 * head_dim}",
                     f"{100 * shares.mean():.2f} %", f"{100 * statistics.median(ordered.tolist()):.2f} %",
                     f"{100 * ordered[int(0.99 * (len(ordered) - 1))]:.2f} %", f"{100 * ordered[-1]:.1f} %"])
    middle = seen[0][1].shape[-2]
    table = markdown_table(["copy", "bytes per key and head (copy / bfloat16)", "rescored: mean", "median",
                            "99th percentile row", "worst row"], rows)
    result = (f"{time.strftime('%Y-%m-%d')}; {runtime.name} ({str(runtime.dtype).removeprefix('torch.')}), "
              f"{len(ids):,} tokens of {args.document.name} read, a question asked and {args.steps} tokens decoded "
              f"with recall (k = {seen[0][2]}): {len(seen)} recall layer scans of {middle:,} middle keys, "
              f"{sum(q.shape[1] * q.shape[2] for q, *_ in seen):,} query rows. Share of the middle keys an exact scan "
              f"through each copy must rescore from the store's own keys (k / n = {100 * seen[0][2] / middle:.2f} %)."
              f"\n\n{table}")
    write_result(args.out / f"scan_copy_bound_{Path(args.model).name}_{round(len(ids) / 1024)}k.md", result)
    return result


if __name__ == "__main__":
    main()
