"""Right answers about real documents: the app's own engine against retrieval with the same model.

    python -m benchmarks.answers --model qwen2.5-coder-0.5b --methods app,retrieval --split all

For each document of the development set (benchmarks/devset.py) and each way of answering, one session asks the
document's questions one after another, as a user does:

- ``app``: the app's ``ContextEngine`` (its chunking, chat format, LM-Infinite window, recall, sources and
  quoting, exactly the code ``python app.py`` runs), the document fed once, then each question in sequence.
- ``app-without-recall``: the same in a context read without recall, as the app reads documents longer than
  recall's memory (``ContextEngine.keep_recall``): sources ranked by the question's words alone.
- ``app-without-guess``: the app searching with the question's words alone, without the passage the model writes
  first (``--no-guess``; app/engine/guess.py).
- ``app-feeding``: each question answered between two chunks of the feed, before the model has read the document.
- ``retrieval``: what PrivateGPT or AnythingLLM users get, the peer to beat: the document's chunks (the same
  ingest chunks), the ``RETRIEVED`` best by BM25 (bm25s) pasted into one prompt with the question, answered by
  the same model without LM-Infinite, each question on its own.
- ``retrieval-chat``: the same, with the previous question and the answer it got before the prompt as chat turns
  (as AnythingLLM sends the chat's history), the chunks still retrieved by the question alone.
- ``truncate``: the same model without LM-Infinite given the document's last ``window`` tokens and the question.

Scored per question: right (any of its patterns in the answer), the first source holds the answer (app: the
first cited passage; retrieval: the first retrieved chunk), seconds to the first token, the prompt's prefill
and the answer's decode rates. Per run: the documents' prefill rate and the process's peak memory. Rows go to
``--out`` as JSONL (one line per question) and a summary table; ``--readme`` puts the table into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import torch

from benchmarks import devset

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("app", "app-without-recall", "app-without-guess", "app-feeding", "retrieval", "retrieval-chat", "truncate")
RETRIEVED = 4  # chunks the retrieval baseline pastes (a typical RAG default)
MAX_NEW_TOKENS = 128  # Qwen restates the question first: 64 cut some answers before their point
SYSTEM_PROMPT = "You are a helpful assistant. Answer questions about the document."  # the app's default
RAG_PROMPT = ("Use the following pieces of context to answer the question at the end.\n\n{context}\n\n"
              "Question: {question}")


def _question_around(excerpts: list[tuple[str, str]], question: str) -> str:
    """The question before the excerpts too, so the model reads them knowing what it looks for."""
    quoted = "\n\n".join(f'From {label}:\n"""\n{text.strip()}\n"""' for label, text in excerpts)
    return f"Question: {question}\n\n{quoted}\n\nUsing the excerpt, answer the question: {question}"


def _exact_words(excerpts: list[tuple[str, str]], question: str) -> str:
    """The app's wording, asking for a short answer in the excerpt's own words."""
    from app.engine.quoting import quoted_question

    return quoted_question(excerpts, question) + "\nAnswer briefly, in the excerpt's own words."


def _pieces(excerpts: list[tuple[str, str]], question: str) -> str:
    """The retrieval baseline's wording: the passages unlabelled, as pieces of context, then the question."""
    return RAG_PROMPT.format(context="\n\n".join(text.strip() for _, text in excerpts), question=question)


WORDINGS = {"question-around": _question_around, "exact-words": _exact_words, "pieces": _pieces}


@dataclass
class Row:
    method: str
    document: str
    split: str
    index: int
    question: str
    answer: str
    right: bool
    source_right: bool
    paraphrased: bool
    ttft_s: float
    prefill_tps: float
    decode_tps: float
    sources: list = field(default_factory=list)
    attention_ranking: list = field(default_factory=list)
    lexical_ranking: list = field(default_factory=list)
    attention_scores: list = field(default_factory=list)
    lexical_scores: list = field(default_factory=list)
    followup: bool = False
    guess: str = ""  # the app's: the passage it searched with beside the question (app/engine/guess.py)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="a bundled model's short name (app --model)")
    p.add_argument("--window", type=int, default=None, help="LM-Infinite window (default: the model's measured one)")
    p.add_argument("--methods", default="app,retrieval")
    p.add_argument("--split", choices=(*devset.SPLITS, "all"), default="all")
    p.add_argument("--documents", default="", help="comma-separated devset names (default: the split's)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--dtype", default="auto")
    p.add_argument("--ranking", default=None, help="the app's source ranking: attention, lexical or hybrid")
    p.add_argument("--quotes", type=int, default=None, help="chunks the app quotes at most (default: the app's)")
    p.add_argument("--recall-slot", default=None, help="the quote that is recall's best passage: a number, or off")
    p.add_argument("--wording", choices=sorted(WORDINGS), default=None,
                   help="app: another wording of the quoted user turn, to measure against the app's (quoting.py)")
    p.add_argument("--sources-only", action="store_true",
                   help="app: rank the sources of each question without answering it (one token, no quote)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "answers")
    p.add_argument("--tag", default="")
    p.add_argument("--readme", action="store_true")
    p.add_argument("--block", default="answers",
                   help="with --report --readme: the docs/benchmarks.md block the table goes to (answers, answers_fresh)")
    p.add_argument("--report", nargs="*", type=Path, default=None,
                   help="only write the table of these summaries (…/answers/<tag>.json, or <tag>.json:<method> for "
                        "one way of answering of that run) and stop")
    p.add_argument("--sources-report", nargs="*", type=Path, default=None,
                   help="only write the table of first sources per way of ranking, from these runs' app rows")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if _published_only(args):
        return
    from app.cli import AppConfig
    from app.engine.model_loading import load_runtime

    torch.set_num_threads(args.threads)
    runtime = load_runtime(AppConfig(model=args.model, window=args.window, dtype=args.dtype, topk=5))
    documents = devset.load(_document_names(args))
    args.out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or f"{args.model}_w{runtime.window}"
    rows = rescored(_answer_all(runtime, documents, args, args.out / f"{tag}.jsonl"))
    summary = summarize(rows, runtime, args)
    summary["sources"] = source_table(rows, documents)
    (args.out / f"{tag}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


def _published_only(args) -> bool:
    """--sources-report or --report: write that table from runs already made (True), nothing to run."""
    if args.sources_report is not None:
        publish_sources([row for path in args.sources_report for row in read_rows(path.with_suffix(".jsonl"))],
                        args.readme)
        return True
    if args.report is not None:
        publish_table(merged(args.report), args.readme, args.block)
        return True
    return False


def _document_names(args) -> tuple[str, ...]:
    """--documents, else the split's documents (every split's for 'all')."""
    return tuple(n for n in args.documents.split(",") if n) or (
        sum(devset.SPLITS.values(), ()) if args.split == "all" else devset.SPLITS[args.split])


def _answer_all(runtime, documents, args, rows_path: Path) -> list[Row]:
    """Every document's questions by every way of answering asked for; each row written to ``rows_path`` as it
    comes, and a line per document and way."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as scratch, rows_path.open("w") as sink:
        for document in documents:
            path = devset.document_path(document, Path(scratch))
            for method in (m for m in args.methods.split(",") if m):
                started = time.perf_counter()
                answered = list(ANSWERERS[method](runtime, document, path, args))
                for row in answered:
                    sink.write(json.dumps(asdict(row)) + "\n")
                    sink.flush()
                rows.extend(answered)
                print(f"{document.name} {method}: {sum(r.right for r in answered)}/{len(answered)} right, "
                      f"{sum(r.source_right for r in answered)} first sources, {time.perf_counter() - started:.0f} s",
                      flush=True)
    return rows


# -- the app ---------------------------------------------------------------------------------------------
def answer_with_app(runtime, document, path: Path, args, method: str = "app"):
    from app.engine.budget import WITHOUT_RECALL
    from app.engine.citations import Ranking
    from app.engine.context import ContextEngine
    from app.engine.context_records import AnswerResult
    from app.engine.generation import GenerationSettings
    from ingest import ingest

    corpus = ingest(path, tokenizer=runtime.ingest_tokenizer)
    engine = ContextEngine(runtime, system_prompt=SYSTEM_PROMPT)
    if method == "app-without-recall":  # as a new context reads documents over recall's budget
        engine.keep_recall(False, WITHOUT_RECALL)
    if args.ranking:
        engine.ranking = Ranking(args.ranking)
    if args.recall_slot is not None:
        import app.engine.citations as citations

        citations.RECALL_SLOT = None if args.recall_slot == "off" else int(args.recall_slot)
    if args.quotes is not None:
        import app.engine.context as context

        context.QUOTED_CHUNKS = args.quotes
    if args.wording:
        import app.engine.context as context

        context.quoted_question = WORDINGS[args.wording]
    started = time.perf_counter()
    for _ in engine.feed_documents(corpus.chunks):
        pass
    feed_tps = engine.length / (time.perf_counter() - started)
    settings = GenerationSettings(max_new_tokens=1, quote=False) if args.sources_only else \
        GenerationSettings(max_new_tokens=MAX_NEW_TOKENS, guess=method != "app-without-guess")
    for index, question in enumerate(document.questions):
        result = None
        for result in engine.ask(question.question, settings):
            pass
        assert isinstance(result, AnswerResult)
        yield _app_row(method, document, index, question, result, feed_tps if index == 0 else result.prefill_tps)


def answer_while_feeding(runtime, document, path: Path, args):
    """The app asked while the document is still fed (model_work answers a question between two chunks of a long
    feed: ContextEngine.ask_while_feeding): every question in turn after the feed's first forward, each read with
    the exchange before it, as model_work gives it. The feed goes no further: what these answers read is the same."""
    from app.engine.context import ContextEngine
    from app.engine.context_records import AnswerResult
    from app.engine.generation import GenerationSettings
    from app.engine.history import Exchange
    from ingest import ingest

    corpus = ingest(path, tokenizer=runtime.ingest_tokenizer)
    engine = ContextEngine(runtime, system_prompt=SYSTEM_PROMPT)
    feeding = engine.feed_documents(corpus.chunks)
    next(feeding)
    settings = GenerationSettings(max_new_tokens=MAX_NEW_TOKENS)
    earlier = None
    try:
        for index, question in enumerate(document.questions):
            result = None
            for result in engine.ask_while_feeding(question.question, settings, earlier=earlier):
                pass
            assert isinstance(result, AnswerResult)
            earlier = Exchange(question.question, result.answer_ids)
            yield _app_row("app-feeding", document, index, question, result, result.prefill_tps)
    finally:
        feeding.close()


def _app_row(method: str, document, index: int, question, result, prefill_tps: float) -> Row:
    sources = [c.where for c in result.citations.citations]
    shown = [{**c.where.as_dict(), "snippet": c.snippet} for c in result.citations.citations]  # as a user sees it
    return Row(method, document.name, devset.split(document.name), index, question.question, result.text,
               question.is_right(result.text), bool(sources) and question.holds(sources[0]),
               question.paraphrased, result.ttft_s, prefill_tps, result.decode_tps, shown,
               [w.as_dict() for w in result.citations.attention_ranking],
               [w.as_dict() for w in result.citations.lexical_ranking],
               list(result.citations.attention_scores), list(result.citations.lexical_scores),
               followup=question.followup, guess=result.guess)


# -- retrieval with the same model, no LM-Infinite ----------------------------------------------------------
def answer_with_retrieval(runtime, document, path: Path, args, *, chat: bool = False):
    import bm25s

    from app.engine.lexical import terms
    from ingest import ingest

    corpus = ingest(path, tokenizer=runtime.ingest_tokenizer)
    chunks = corpus.chunks
    retriever = bm25s.BM25()
    retriever.index([terms(c.text) or ["\u2205"] for c in chunks], show_progress=False)
    earlier = None
    for index, question in enumerate(document.questions):
        scores = retriever.get_scores(terms(question.question) or ["\u2205"])
        best = sorted(range(len(chunks)), key=lambda i: -scores[i])[:RETRIEVED]
        context = "\n\n".join(chunks[i].text for i in best)
        prompt = RAG_PROMPT.format(context=context, question=question.question)
        text, ttft, prefill_tps, decode_tps = _plain_answer(runtime, prompt, earlier if chat else None)
        earlier = (question.question, text)
        first = chunks[best[0]].where if best else None
        yield Row("retrieval-chat" if chat else "retrieval", document.name, devset.split(document.name), index,
                  question.question, text, question.is_right(text), first is not None and question.holds(first),
                  question.paraphrased, ttft, prefill_tps, decode_tps, [chunks[i].where.as_dict() for i in best],
                  followup=question.followup)


def answer_with_retrieval_chat(runtime, document, path: Path, args):
    return answer_with_retrieval(runtime, document, path, args, chat=True)


def answer_with_truncation(runtime, document, path: Path, args):
    from ingest import ingest

    corpus = ingest(path, tokenizer=runtime.ingest_tokenizer)
    ids = runtime.tokenizer.encode(corpus.text, add_special_tokens=False)
    tail = runtime.tokenizer.decode(ids[-(runtime.window - 256):])
    for index, question in enumerate(document.questions):
        prompt = f"{tail}\n\n{question.question}"
        text, ttft, prefill_tps, decode_tps = _plain_answer(runtime, prompt)
        yield Row("truncate", document.name, devset.split(document.name), index, question.question, text,
                  question.is_right(text), False, question.paraphrased, ttft, prefill_tps, decode_tps,
                  followup=question.followup)


def _plain_answer(runtime, user_turn: str, earlier: tuple[str, str] | None = None) -> tuple[str, float, float, float]:
    """The model without LM-Infinite, greedy, on [system, user_turn] (after the ``earlier`` question and answer as
    chat turns, if given): answer, first-token seconds, rates."""
    import lminfinite
    from transformers import DynamicCache

    model, tokenizer = runtime.model, runtime.tokenizer
    state = lminfinite.get_state(model)
    lminfinite.disable(model)
    try:
        history = [{"role": "user", "content": earlier[0]}, {"role": "assistant", "content": earlier[1]}] \
            if earlier else []
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, *history, {"role": "user", "content": user_turn}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            started = time.perf_counter()
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
            ttft = time.perf_counter() - started
            answer: list[int] = []
            token = int(logits[0, -1].argmax())
            decode_started = time.perf_counter()
            while token not in runtime.stop_ids and len(answer) < MAX_NEW_TOKENS:
                answer.append(token)
                logits = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits
                token = int(logits[0, -1].argmax())
            decode_s = time.perf_counter() - decode_started
    finally:
        lminfinite.enable(model, state.config)
    return (tokenizer.decode(answer, skip_special_tokens=True), ttft, ids.shape[1] / ttft,
            len(answer) / decode_s if answer and decode_s > 0 else 0.0)


ANSWERERS = {"app": answer_with_app, "app-without-recall": partial(answer_with_app, method="app-without-recall"),
             "app-without-guess": partial(answer_with_app, method="app-without-guess"),
             "app-feeding": answer_while_feeding, "retrieval": answer_with_retrieval,
             "retrieval-chat": answer_with_retrieval_chat, "truncate": answer_with_truncation}


# -- sources: each ranking, and fusions of the two, from the rankings the app recorded -------------------------
FUSIONS = ("attention", "lexical", "rrf", "lexical+0.1 attention", "lexical+0.25 attention", "lexical+0.5 attention",
           "lexical+1 attention")
RRF_K = 10  # reciprocal rank fusion: 1 / (K + rank)


def fused(row: Row, how: str) -> list:
    """Passages of ``row`` ranked ``how``: one ranking alone, reciprocal rank fusion, or the BM25 score over its
    best plus a share of the recall relevance over its best (the app's, citations.ATTENTION_WEIGHT)."""
    from ingest import Provenance

    attention = [Provenance(**{k: v for k, v in d.items() if k != "label"}) for d in row.attention_ranking]
    lexical = [Provenance(**{k: v for k, v in d.items() if k != "label"}) for d in row.lexical_ranking]
    if how in ("attention", "lexical"):
        return attention if how == "attention" else lexical
    if how == "rrf":
        scores: dict = {}
        for ranking in (attention, lexical):
            for rank, passage in enumerate(ranking):
                scores[passage] = scores.get(passage, 0.0) + 1 / (RRF_K + rank + 1)
        return sorted(scores, key=lambda p: -scores[p])
    from app.engine.citations import fuse

    weight = float(how.split("+")[1].split()[0])
    return [passage for passage, _ in fuse(dict(zip(attention, row.attention_scores)),
                                           dict(zip(lexical, row.lexical_scores)), attention_weight=weight)]


def source_table(rows: list[Row], documents) -> dict:
    """First source right and among the first three, per way of ranking, over the app's rows."""
    questions = {(d.name, i): q for d in documents for i, q in enumerate(d.questions)}
    table = {}
    for how in FUSIONS:
        ranked = [(questions[r.document, r.index], fused(r, how)) for r in rows if r.method == "app"]
        table[how] = {"first": sum(bool(p) and q.holds(p[0]) for q, p in ranked),
                      "first_three": sum(any(q.holds(x) for x in p[:3]) for q, p in ranked), "questions": len(ranked)}
    return table


# -- summary -------------------------------------------------------------------------------------------------
def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rescored(rows: list[Row]) -> list[Row]:
    """The rows scored again with the development set as it is now (a pattern corrected since a run counts for
    every way of answering alike)."""
    questions = {(d.name, i): q for d in devset.load() for i, q in enumerate(d.questions)}
    out = []
    for row in rows:
        question = questions[row.document, row.index]
        out.append(replace(row, right=question.is_right(row.answer), followup=question.followup))
    return out


def summarize(rows: list[Row], runtime, args) -> dict:
    return {"model": runtime.name, "window": runtime.window, "threads": args.threads, "dtype": str(runtime.dtype),
            "date": time.strftime("%Y-%m-%d"), "peak_rss_mib": round(peak_rss_mib()), "methods": methods_of(rows)}


def methods_of(rows: list[Row]) -> dict:
    """Per way of answering, in the order first met: what ``_method_summary`` counts."""
    return {method: _method_summary(method, [r for r in rows if r.method == method])
            for method in dict.fromkeys(r.method for r in rows)}


def _method_summary(method: str, mine: list[Row]) -> dict:
    """Right answers (all, per split, first against later questions, paraphrased, follow-ups), first sources,
    median timings and the right answers per document of one way of answering."""
    return {"right": _right(mine), "questions": len(mine), **_per_split(mine),
            "first_source_right": sum(r.source_right for r in mine), **_first_and_later(mine),
            **_paraphrased_and_followups(mine), **_medians(method, mine), "by_document": _by_document(mine)}


def _first_and_later(rows: list[Row]) -> dict:
    first = [r for r in rows if r.index == 0]
    later = [r for r in rows if r.index > 0]
    return {"right_first_question": _right(first), "first_questions": len(first),
            "right_later_questions": _right(later), "later_questions": len(later)}


def _paraphrased_and_followups(rows: list[Row]) -> dict:
    return {"right_paraphrased": _right(r for r in rows if r.paraphrased),
            "paraphrased": sum(r.paraphrased for r in rows),
            "right_followup": _right(r for r in rows if r.followup), "followups": sum(r.followup for r in rows)}


def _medians(method: str, rows: list[Row]) -> dict:
    """Median first-token seconds and rates; the app's prefill is the documents' (its first row per document),
    the others' each prompt's."""
    first = [r for r in rows if r.index == 0]
    prefill_rows = first if method == "app" and first else rows
    return {"ttft_s_median": _median([r.ttft_s for r in rows], 2),
            "prefill_tps_median": _median([r.prefill_tps for r in prefill_rows]),
            "decode_tps_median": _median([r.decode_tps for r in rows], 1)}


def _right(rows) -> int:
    return sum(r.right for r in rows)


def _median(values: list[float], digits: int | None = None) -> float | int | None:
    """The median rounded to ``digits`` (a whole number without), None when nothing was measured."""
    return round(statistics.median(values), digits) if values else None


def _per_split(rows: list[Row]) -> dict:
    """right_<split> and questions_<split> for every split of the development set."""
    out = {}
    for split in devset.SPLITS:
        asked = [r for r in rows if r.split == split]
        out[f"right_{split}"], out[f"questions_{split}"] = _right(asked), len(asked)
    return out


def _by_document(rows: list[Row]) -> dict:
    """'right/asked' per document, in the order first met."""
    documents: dict[str, list[Row]] = {}
    for row in rows:
        documents.setdefault(row.document, []).append(row)
    return {document: f"{_right(asked)}/{len(asked)}" for document, asked in documents.items()}


def merged(paths: list[Path]) -> list[dict]:
    """One summary per model and window from runs' summaries, their rows (the .jsonl beside each) joined and scored
    again as the set is now: a tune run and a confirm run of the same settings make one row per way of answering."""
    groups: dict[tuple, dict] = {}
    for given in paths:
        path, _, only = str(given).partition(":")  # "run.json:retrieval": that run's rows of one way only
        path = Path(path)
        summary = json.loads(path.read_text())
        key = (summary["model"], summary["window"])
        group = groups.setdefault(key, {**summary, "rows": [], "dates": set(), "threads_": set()})
        group["rows"] += [r for r in read_rows(path.with_suffix(".jsonl")) if not only or r.method == only]
        group["dates"].add(summary["date"])
        group["threads_"].add(summary["threads"])
        group["peak_rss_mib"] = max(group["peak_rss_mib"], summary["peak_rss_mib"])
    out = []
    for group in groups.values():
        out.append({**{k: v for k, v in group.items() if k not in ("rows", "dates", "threads_")},
                    "date": ", ".join(sorted(group["dates"])), "threads": min(group["threads_"]),
                    "methods": methods_of(group["rows"])})
    return out


def read_rows(path: Path) -> list[Row]:
    return rescored([Row(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()])


def publish_sources(rows: list[Row], readme: bool) -> str:
    """docs/benchmarks.md's sources table: the first source right, and among the first three, per way of ranking, per split."""
    from benchmarks.report import splice_readme
    from ingest.tables import markdown_table

    documents = devset.load()
    tables = {split: source_table([r for r in rows if r.split == split], documents) for split in devset.SPLITS}
    labels = {"attention": "the question's recall alone", "lexical": "BM25 alone",
              "rrf": f"reciprocal rank fusion (1 / ({RRF_K} + rank))"}
    body = []
    for how in FUSIONS:
        label = labels.get(how) or f"BM25 + {how.split('+')[1].split()[0]} × recall (each over its best)"
        if how == "lexical+0.25 attention":
            label += ": **the app's weight**"
        cells = []
        for split in devset.SPLITS:
            t = tables[split][how]
            cells += [f"{t['first']}/{t['questions']}", f"{t['first_three']}/{t['questions']}"]
        body.append([label, *cells])
    table = markdown_table(["sources ranked by", *(f"first {which}, {split}" for split in devset.SPLITS
                                                   for which in ("right", "three"))], body)
    text = ("Which passage comes first, recomputed per page from the rankings the app's runs recorded (each "
            "ranking's first ten); the weight was chosen on the tune split. The app now fuses with that weight per "
            "chunk and cites pages in the order of their best chunk (docs/answers.md).\n\n" + table)
    print(text)
    if readme:
        splice_readme(ROOT / "README.md", "sources", text)
    return text


def publish_table(summaries: list[dict], readme: bool, block: str = "answers") -> str:
    """docs/benchmarks.md's table: per model and way of answering, right answers (all, and per split asked), first sources,
    first against later questions, paraphrased questions (and follow-ups, where asked), time to first token,
    decode rate, peak memory."""
    from benchmarks.report import splice_readme
    from ingest.tables import markdown_table

    methods = [m for summary in summaries for m in summary["methods"].values()]
    splits = [s for s in devset.SPLITS if any(m.get(f"questions_{s}") for m in methods)]
    followups = any(m.get("followups") for m in methods)
    rows = [_table_row(summary, method, m, splits, followups)
            for summary in summaries for method, m in summary["methods"].items()]
    table = markdown_table(["model", "window", "answered by", "right", *(f"right, {s}" for s in splits),
                            "first source right", "right: first question · later", "right: paraphrased",
                            *(["right: follow-up"] if followups else []), "first token s (median)",
                            "prefill tok/s (median)", "decode tok/s (median)", "peak RSS MiB"], rows)
    text = _measured_where(summaries) + table
    print(text)
    if readme:
        splice_readme(ROOT / "README.md", block, text)
    return text


def _share(right: int, asked: int) -> str:
    return f"{right}/{asked} ({100 * right / asked:.0f} %)" if asked else "–"


def _table_row(summary: dict, method: str, m: dict, splits: list[str], followups: bool) -> list:
    """One way of answering of one run, as publish_table's columns say."""
    return [summary["model"], f"{summary['window']:,}", method, _share(m["right"], m["questions"]),
            *(_share(m.get(f"right_{s}", 0), m.get(f"questions_{s}", 0)) for s in splits),
            _share(m["first_source_right"], m["questions"]),
            f"{m['right_first_question']}/{m['first_questions']} · "
            f"{m['right_later_questions']}/{m['later_questions']}",
            _share(m["right_paraphrased"], m["paraphrased"]),
            *([_share(m.get("right_followup", 0), m.get("followups", 0))] if followups else []),
            f"{m['ttft_s_median']:.1f}", f"{m['prefill_tps_median']:,}", f"{m['decode_tps_median']:.1f}",
            f"{summary['peak_rss_mib']:,}"]


def _measured_where(summaries: list[dict]) -> str:
    """The line above the table: when, with how many threads and which dtype, and how."""
    dates = sorted({d for s in summaries for d in s["date"].split(", ")})
    threads = sorted({s["threads"] for s in summaries})
    dtypes = sorted({s["dtype"].removeprefix("torch.") for s in summaries})
    return (f"Measured {', '.join(dates)} on this CPU ({', '.join(map(str, threads))} threads, "
            f"{', '.join(dtypes)}), `python -m benchmarks.answers` (docs/answers.md): each document's questions asked "
            "one after another in one session.\n\n")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
