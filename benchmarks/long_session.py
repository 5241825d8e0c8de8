"""One long session through the app's own engine: a context of ``--tokens`` document tokens, then ``--questions``
questions asked one after another, as a user asks them. Measures what a user waits for and what the process holds:

- the documents' prefill rate (tokens/s),
- per question: seconds to the first token of the answer, the answer's decode rate,
- the process's resident memory after each question (flat, or growing by what was read).

    python -m benchmarks.long_session --model qwen2.5-coder-0.5b --tokens 32768 --questions 50 --readme
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import psutil
import torch

from benchmarks import devset
from benchmarks.report import splice_readme
from ingest.tables import markdown_table

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("icccm", "xlfd", "mime", "libtasn1")  # about 120K tokens: enough to cut any --tokens up to that from


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--window", type=int, default=None)
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--questions", type=int, default=50)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--readme", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    from app.cli import AppConfig
    from app.engine.context import ContextEngine
    from app.engine.context_records import AnswerResult
    from app.engine.generation import GenerationSettings
    from app.engine.model_loading import load_runtime
    from ingest import ingest

    torch.set_num_threads(args.threads)
    runtime = load_runtime(AppConfig(model=args.model, window=args.window))
    documents = devset.load(DOCUMENTS)
    with tempfile.TemporaryDirectory() as scratch:
        corpus = ingest([devset.document_path(d, Path(scratch)) for d in documents], tokenizer=runtime.ingest_tokenizer)
    chunks, total = [], 0
    for chunk in corpus.chunks:  # whole chunks, up to the token count asked for
        if total + chunk.tokens > args.tokens:
            break
        chunks.append(chunk)
        total += chunk.tokens
    questions = [q.question for d in documents for q in d.questions]
    engine = ContextEngine(runtime, system_prompt="You are a helpful assistant. Answer questions about the document.")
    process = psutil.Process()
    started = time.perf_counter()
    for _ in engine.feed_documents(chunks):
        pass
    prefill_s = time.perf_counter() - started
    fed = engine.length
    rss = [process.memory_info().rss]
    asked = []
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    for index in range(args.questions):
        result = None
        for result in engine.ask(questions[index % len(questions)], settings):
            pass
        assert isinstance(result, AnswerResult)
        rss.append(process.memory_info().rss)
        asked.append({"ttft_s": result.ttft_s, "decode_tps": result.decode_tps, "tokens": result.tokens,
                      "context": engine.length, "rss": rss[-1]})
        print(json.dumps(asked[-1]), flush=True)
    summary = {
        "model": runtime.name, "window": runtime.window, "threads": args.threads, "dtype": str(runtime.dtype),
        "date": time.strftime("%Y-%m-%d"), "context_tokens": fed, "prefill_tps": fed / prefill_s,
        "ttft_s_median": statistics.median(a["ttft_s"] for a in asked),
        "ttft_s_max": max(a["ttft_s"] for a in asked),
        "decode_tps_median": statistics.median(a["decode_tps"] for a in asked if a["tokens"] > 1),
        "rss_after_documents_mib": rss[0] / 2**20, "rss_after_first_mib": rss[1] / 2**20,
        "rss_after_last_mib": rss[-1] / 2**20, "questions": args.questions,
        "tokens_read_by_questions": engine.length - fed,
        "kv_bytes_per_token": sum(engine.memory().values()) / max(1, engine.length),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"long_session_{args.model}"
    (args.out / f"{stem}.json").write_text(json.dumps({"summary": summary, "questions": asked}, indent=1))
    table = markdown_table(
        ["model", "window", "context", "prefill tok/s", "first token s (median / max)", "decode tok/s (median)",
         f"RSS MiB: documents read / after 1 question / after {args.questions}", "tokens the questions added"],
        [[summary["model"], f"{summary['window']:,}", f"{fed:,}", f"{summary['prefill_tps']:,.0f}",
          f"{summary['ttft_s_median']:.1f} / {summary['ttft_s_max']:.1f}", f"{summary['decode_tps_median']:.1f}",
          f"{summary['rss_after_documents_mib']:,.0f} / {summary['rss_after_first_mib']:,.0f} / "
          f"{summary['rss_after_last_mib']:,.0f}", f"{summary['tokens_read_by_questions']:,}"]])
    text = (f"{summary['date']}, this CPU, {args.threads} threads, {summary['dtype']}; the app's engine: documents "
            f"read, then {args.questions} questions in sequence (quoting on, answers of at most "
            f"{args.max_new_tokens} tokens).\n\n{table}")
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(text)
    if args.readme:
        splice_readme(ROOT / "README.md", "long_session", text)


if __name__ == "__main__":
    main()
