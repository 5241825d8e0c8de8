"""Whether the first source's snippet states the answer, for answers recorded while the document was fed
(``benchmarks.answers --methods app-feeding``), offline: what such a question reads is the documents' chunks ranked
by its words, which needs no forward of the model, so each recorded answer's sources are rebuilt and its snippet
drawn both ways, around the question's words (as before) and around the answer's own words in its quote (the app).

Why: a user checks an answer against the sentence shown under its first source. The rebuilt sources are counted
against those recorded (``same_sources``), so a change since the run shows.

    python -m benchmarks.snippets benchmarks/results/answers/m_q20_octave.jsonl ... [--out snippets.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from pathlib import Path

from benchmarks import devset


def measure(runtime, document, rows: list[dict], scratch: Path) -> Counter:
    """The counts for one document's recorded rows, its questions asked in order as the run asked them."""
    from app.engine.citations import lead_with_answer_source
    from app.engine.context import ContextEngine, answer_sources
    from app.engine.generation import GenerationSettings
    from app.engine.history import Exchange
    from benchmarks.answers import SYSTEM_PROMPT
    from ingest import ingest

    corpus = ingest(devset.document_path(document, scratch), tokenizer=runtime.ingest_tokenizer)
    engine = ContextEngine(runtime, system_prompt=SYSTEM_PROMPT)
    feeding = engine.feed_documents(corpus.chunks)
    next(feeding)  # the feed under way, as a question asked while it is fed finds it
    counts, earlier = Counter(), None
    for row in sorted(rows, key=lambda r: r["index"]):
        question = document.questions[row["index"]]
        view, index, report = engine.sources_while_feeding(question.question, GenerationSettings(), earlier=earlier)
        earlier = Exchange(question.question, ())
        support = index.scores(row["answer"])
        before = lead_with_answer_source(report, [support.get(view.spans.at(lo), 0.0) for lo, _ in report.quote_spans])
        now = answer_sources(report, question.question, row["answer"], index, view)
        if not now.citations:
            continue
        counts.update(questions=1, same_sources=[c.where.page for c in now.citations] == [
            s["page"] for s in row["sources"]], first_source_right=question.holds(now.citations[0].where),
            states_by_question_words=question.is_right(before.citations[0].snippet),
            states_by_answer_words=question.is_right(now.citations[0].snippet))
    feeding.close()
    return counts


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="answers runs' .jsonl files (their app-feeding rows)")
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="the model the runs used (its tokenizer)")
    p.add_argument("--out", type=Path, default=None, help="write the table here as JSON")
    args = p.parse_args(argv)
    import torch

    from app.cli import AppConfig
    from app.engine.model_loading import load_runtime

    torch.set_num_threads(1)
    runtime = load_runtime(AppConfig(model=args.model, topk=5))
    rows = [json.loads(line) for path in args.runs for line in path.read_text(encoding="utf-8").splitlines()]
    rows = [row for row in rows if row["method"] == "app-feeding"]
    table = {}
    with tempfile.TemporaryDirectory() as scratch:
        for document in devset.load(tuple(dict.fromkeys(row["document"] for row in rows))):
            mine = [row for row in rows if row["document"] == document.name]
            table[document.name] = dict(measure(runtime, document, mine, Path(scratch)))
            print(document.name, table[document.name], flush=True)
    table["all"] = dict(sum((Counter(row) for row in table.values()), Counter()))
    print(json.dumps(table["all"]))
    if args.out:
        args.out.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
