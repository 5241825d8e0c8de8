"""BM25's first chunks on the development set, offline: for each question, asked after the one before it as the app
asks it, whether the chunk the app's keyword ranking puts first (and any of its first four) states the answer.

Why: a change to how documents are cut into chunks, or to what BM25 reads of them, can be tried on all the
development set's questions in minutes, without the model; only what it changes is then asked of the model
(``benchmarks.answers``). The chunks are ingest's, cut to the app's 512 tokens by the chosen model's tokenizer;
the ranking is the app's own (``app.engine.lexical.ChunkIndex``).

    python -m benchmarks.first_chunks --model qwen2.5-coder-1.5b [--split blind] [--out results.json]
        [--written passages.json --weight 0 0.25 0.5]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks import devset

CHUNK_TOKENS = 512  # the app's (app/session/uploads.py)
FIRST = 4  # the chunks the app quotes at most
COUNTS = ("questions", "first", "first_four", "chunks")  # per document, and summed over the set as "all"


def ranked_chunks(chunks, questions, written=(), weight: float = 0.0) -> list[list]:
    """For each question in order, the chunks BM25 ranks first, best first (up to FIRST), in the app's order;
    ``written``: for each question, a passage the model wrote without the document (benchmarks.written_passages),
    whose BM25 scores are added times ``weight``."""
    from app.engine.citations import Ranking, rank_chunks
    from app.engine.lexical import ChunkIndex
    from app.engine.spans import Span, SpanKind

    spans, start = [], 0
    for chunk in chunks:
        spans.append(Span(start, start + max(chunk.tokens, 1), SpanKind.DOCUMENT, chunk.where))
        start = spans[-1].end
    chunk_of = dict(zip(spans, chunks))
    index = ChunkIndex()
    index.refresh(spans, lambda span: chunk_of[span].text)
    ranked, earlier = [], ""
    for number, question in enumerate(questions):
        scores = index.scores(question.question, earlier)
        if weight and written:
            for span, score in index.scores(written[number]).items():
                scores[span] = scores.get(span, 0.0) + weight * score
        best = rank_chunks(spans, {}, scores, Ranking.LEXICAL)[:FIRST]
        ranked.append([chunk_of[span] for span, _ in best])
        earlier = question.question
    return ranked


def measure(documents, tokenizer, written: dict | None = None, weights: tuple[float, ...] = (0.0,)) -> dict:
    """For each of ``weights``, per document: questions, first chunk right, one of the first four right; and the
    chunks it was cut into. ``written``: passages by "document/number" (benchmarks.written_passages), added to the
    query at the weight. Each document is cut once for all weights."""
    from ingest import ingest

    tables = {weight: {} for weight in weights}
    with tempfile.TemporaryDirectory() as scratch:
        for document in documents:
            corpus = ingest(devset.document_path(document, Path(scratch)), tokenizer=tokenizer,
                            chunk_tokens=CHUNK_TOKENS)
            passages = [(written or {}).get(f"{document.name}/{n}", "") for n in range(len(document.questions))]
            for weight, table in tables.items():
                ranked = ranked_chunks(corpus.chunks, document.questions, passages, weight)
                table[document.name] = _scored(document, ranked, len(corpus.chunks))
                print(weight, document.name, {k: table[document.name][k] for k in COUNTS}, flush=True)
    for table in tables.values():
        table["all"] = {key: sum(row[key] for row in table.values()) for key in COUNTS}
    return tables


def _scored(document, ranked: list[list], chunks: int) -> dict:
    firsts = [bool(r) and q.holds(r[0].where) for q, r in zip(document.questions, ranked)]
    any_of = sum(any(q.holds(c.where) for c in r) for q, r in zip(document.questions, ranked))
    return {"questions": len(document.questions), "first": sum(firsts), "first_four": any_of, "chunks": chunks,
            "first_right": "".join(".x"[right] for right in firsts),
            "ranked": [[f"{c.where.label()} @{c.char_start}" for c in r] for r in ranked]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="a bundled model's short name: its tokenizer")
    p.add_argument("--split", choices=(*devset.SPLITS, "all"), default="all")
    p.add_argument("--out", type=Path, default=None, help="write the table here as JSON")
    p.add_argument("--written", type=Path, default=None,
                   help="passages the model wrote for each question (python -m benchmarks.written_passages)")
    p.add_argument("--weight", type=float, nargs="+", default=[0.25],
                   help="their BM25 scores' weight beside the question's; several: a table for each")
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    from app.cli import AppConfig
    from app.engine.model_loading import choose_model

    names = sum(devset.SPLITS.values(), ()) if args.split == "all" else devset.SPLITS[args.split]
    tokenizer = AutoTokenizer.from_pretrained(choose_model(AppConfig(model=args.model)).name_or_path)
    written = json.loads(args.written.read_text(encoding="utf-8")) if args.written else None
    weights = tuple(args.weight) if written else (0.0,)
    tables = measure(devset.load(names), tokenizer, written, weights)
    for weight, table in tables.items():
        print(weight, json.dumps(table["all"]))
        if args.out:
            out = args.out if len(tables) == 1 else args.out.with_name(f"{args.out.stem}_{weight:g}{args.out.suffix}")
            out.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
