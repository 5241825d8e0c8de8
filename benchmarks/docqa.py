"""Question answering over real documents, with attention-grounded citations (the app's "sources").

Each document is ingested (``ingest.ingest``) and prefilled once in the app's prompt with top-k recall off;
every question is then answered from a snapshot of that cache, rolled back after each answer:

- ``lminfinite``: recall off; ``lminfinite_topk``: recall on while the question is read and answered;
- ``lminfinite_quote`` (the app's default): the question read with recall ranks the sources; then the first
  source's densest ``W / 4`` tokens (a third of the app's quote budget), then the question, are read and answered with recall off
  (``app.engine.quoting``, the same code);
- ``truncate``: the unpatched model on the last ``W`` tokens (the last ``W - TRUNCATE_ROOM`` document
  tokens, shared by the document's questions, then the question).

Scoring: the answer is correct when any of the question's regular expressions matches it (case-insensitive).
Citations: ``lminfinite.observe_topk`` reports the recalled absolute token positions and their softmax weights,
while the question is read and while the answer is decoded; weights are summed per position, positions mapped
through the prompt's token offsets to characters of the document text, and those to passages with
``Corpus.locate``: a PDF's page, or a text or code chunk's line range, as the app cites them. Four ways of
ranking passages are compared (``CITATIONS``); the app's is the question's recall on content tokens minus that
of ``NEUTRAL_QUESTION`` read at the same point (``app.engine.citations``, the same code). The top-1 citation
hits when it holds the answer (``Question.holds``); top-3 when any of the first three does. Recall only ever
picks *middle* tokens (evicted from the window), so a passage that is still inside the last W tokens can never
be cited: hit rates are also given for the questions whose passages lie wholly outside it.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from app.engine.citations import NEUTRAL_QUESTION, RecallTally, content_token_ids, relevance
from app.engine.quoting import densest_window, quote_budget, quoted_question
from ingest.results import citation_label
from benchmarks import real_common as rc

MAX_NEW_TOKENS = 32
ANSWERS = ("truncate", "lminfinite", "lminfinite_topk", "lminfinite_quote")  # the ways of answering compared
TRUNCATE_ROOM = 96  # tokens left for the question in the truncation baseline's W


# -- scoring and citation mapping (pure logic, tested without a model) ------------------------------------
def is_correct(answer: str, patterns) -> bool:
    return any(re.search(p, answer, flags=re.IGNORECASE) for p in patterns)


@dataclass
class PositionMap:
    """Token position -> (source, passage) for the document part of a prompt (passage: ``corpus_locator``).

    ``token_chars``: each context token's character start in the rendered prompt; ``doc_char``/``doc_len``:
    the document text's span in it; ``locate(char_offset_in_document) -> (source, passage)``."""

    token_chars: list[int]
    doc_char: int
    doc_len: int
    locate: object
    cache: dict = field(default_factory=dict)

    def passage(self, position: int):
        if not 0 <= position < len(self.token_chars):
            return None
        char = self.token_chars[position] - self.doc_char
        if not 0 <= char < self.doc_len:
            return None
        return self.locate(char)


def rank_passages(scores: dict[int, float], positions: PositionMap) -> list[tuple[tuple, float]]:
    """(source, passage) by summed score, best first, those above 0 only, as shares of their sum."""
    by_passage: dict[tuple, float] = defaultdict(float)
    for position, score in scores.items():
        passage = positions.passage(position)
        if passage is not None:
            by_passage[passage] += score
    ranked = sorted(((p, s) for p, s in by_passage.items() if s > 0), key=lambda kv: -kv[1])
    total = sum(s for _, s in ranked)
    return [(p, s / total) for p, s in ranked]


def citation_hits(ranked: list[tuple[tuple, float]], holds) -> tuple[bool, bool]:
    """(top-1 hit, top-3 hit): whether the first passage, and any of the first three, ``holds`` the answer."""
    cited = [passage for (_, passage), _ in ranked]
    return (bool(cited) and holds(cited[0]), any(holds(p) for p in cited[:3]))


def corpus_locator(corpus):
    """char offset -> (source, page) in a PDF, (source, (first, last line)) of its chunk in text and code."""
    def locate(char_offset: int):
        found = corpus.locate(char_offset)
        if found.page is not None:
            return (found.source, found.page)
        chunk = corpus.chunks[found.chunk]
        return (found.source, (chunk.line_start, chunk.line_end))
    return locate


def page_token_ranges(positions: PositionMap, n_context: int) -> dict[object, tuple[int, int]]:
    """passage (page, or chunk's lines) -> (first, last + 1) token position of its text in the context."""
    ranges: dict[int, list[int]] = {}
    for p in range(n_context):
        passage = positions.passage(p)
        if passage is not None:
            lo_hi = ranges.setdefault(passage[1], [p, p + 1])
            lo_hi[1] = p + 1
    return {page: (lo, hi) for page, (lo, hi) in ranges.items()}


# -- the run ---------------------------------------------------------------------------------------------
@torch.inference_mode()
def run_document(model, tokenizer, path: str, questions, settings: rc.Settings, log=print) -> list[dict]:
    import ingest
    from transformers import DynamicCache

    import lminfinite

    corpus = ingest.ingest([path], tokenizer=tokenizer)
    document = corpus.text
    prompt = rc.build_prompt(tokenizer, document, questions[0].question)
    context = prompt.context
    positions = PositionMap([start for start, _ in prompt.offsets], prompt.doc_char, prompt.doc_len,
                            corpus_locator(corpus))
    pages = page_token_ranges(positions, len(context))
    clock = rc.Stopwatch()
    cache = rc.new_cache(model, settings)
    rc.feed(model, cache, context, settings.prefill_chunk)
    prefill_s = clock()
    log(f"{path}: {len(context)} context tokens prefilled in {prefill_s:.0f} s")
    snap = cache.snapshot()
    eos = tokenizer.eos_token_id
    content = content_token_ids(tokenizer)
    every = lambda p: positions.passage(p) is not None  # noqa: E731
    is_content = lambda p: every(p) and context[p] in content  # noqa: E731
    rc.set_topk(model, settings, settings.topk)
    neutral = RecallTally()  # what any question recalls here, read once per document (the snapshot is shared)
    with lminfinite.observe_topk(model, neutral):
        rc.feed(model, cache, rc.question_ids(tokenizer, document, NEUTRAL_QUESTION), settings.prefill_chunk)
    cache.rollback(snap)
    records = []
    for q in questions:
        q_ids = rc.question_ids(tokenizer, document, q.question)
        total = len(context) + len(q_ids)
        in_window = total - settings.window  # tokens before this are out of the window at the question
        middle_only = all(end <= in_window for passage, (_, end) in pages.items() if q.holds(passage))
        record = dict(document=path.rsplit("/", 1)[-1], question=q.question, pages=list(q.pages), lines=list(q.lines),
                      window=settings.window, context_tokens=total, answer_outside_window=middle_only)
        # recall off
        rc.set_topk(model, settings, 0)
        logits = rc.feed(model, cache, q_ids, settings.prefill_chunk)
        record["lminfinite"] = tokenizer.decode(rc.greedy(model, cache, logits, eos, MAX_NEW_TOKENS),
                                                skip_special_tokens=True)
        cache.rollback(snap)
        # recall on, watched: the question's prefill and the answer's decode separately
        rc.set_topk(model, settings, settings.topk)
        on_question, on_decode = RecallTally(), RecallTally()
        with lminfinite.observe_topk(model, on_question):
            logits = rc.feed(model, cache, q_ids, settings.prefill_chunk)
        with lminfinite.observe_topk(model, on_decode):
            ids = rc.greedy(model, cache, logits, eos, MAX_NEW_TOKENS)
        record["lminfinite_topk"] = tokenizer.decode(ids, skip_special_tokens=True)
        cache.rollback(snap)
        rc.set_topk(model, settings, 0)
        scores_by = {"cite_decode": relevance(on_decode, None, every),
                     "cite_decode_content": relevance(on_decode, None, is_content),
                     "cite_question": relevance(on_question, None, is_content),
                     "cite_app": relevance(on_question, neutral, is_content)}
        ranked_by = {name: rank_passages(scores, positions) for name, scores in scores_by.items()}
        for name, ranked in ranked_by.items():
            record[name] = [[page, round(share, 4)] for (_, page), share in ranked[:5]]
            record[name + "_hits"] = citation_hits(ranked, q.holds)
        first = ranked_by["cite_app"][:1]  # the app quotes its first source; it answers with recall without one
        record["lminfinite_quote"] = (_quoted_answer(model, tokenizer, cache, settings, corpus, context, positions,
                                                     pages, scores_by["cite_app"], first[0], q.question)
                                      if first else record["lminfinite_topk"])
        cache.rollback(snap)
        records.append(record)
        log(f"  p.{q.pages or q.lines} {q.question[:50]!r}: topk={record['lminfinite_topk'][:60]!r} "
            f"cites {record['cite_app'][:3]}")
    # truncation: the last W - TRUNCATE_ROOM document tokens, shared by the questions (cropped back)
    lminfinite.disable(model)
    kept = context[-(settings.window - TRUNCATE_ROOM):]
    cache = DynamicCache()
    rc.feed(model, cache, kept, settings.prefill_chunk)
    mark = cache.get_seq_length()
    for q, record in zip(questions, records):
        q_ids = rc.question_ids(tokenizer, document, q.question)
        logits = rc.feed(model, cache, q_ids, settings.prefill_chunk)
        record["truncate"] = tokenizer.decode(rc.greedy(model, cache, logits, eos, MAX_NEW_TOKENS),
                                              skip_special_tokens=True)
        cache.crop(mark - cache.get_seq_length())
    for q, record in zip(questions, records):
        for method in ANSWERS:
            record[method + "_correct"] = is_correct(record[method], q.answers)
    rc.set_topk(model, settings, 0)
    return records


def _quoted_answer(model, tokenizer, cache, settings: rc.Settings, corpus, context: list[int], positions: PositionMap,
                   pages, scores: dict[int, float], first, question: str) -> str:
    """The app's answer (``ContextEngine.ask`` with quoting): its ``first`` source's densest part quoted before
    the question, read and answered with recall off (the caller rolls the cache back)."""
    (_, passage), _ = first
    lo, hi = densest_window(scores, *pages[passage], quote_budget(settings.window) // 3)  # as the app quoted pages
    found = corpus.locate(positions.token_chars[lo] - positions.doc_char)
    where = (citation_label(found.source, found.page, found.page_label) if found.page is not None
             else citation_label(found.source, line_start=passage[0], line_end=passage[1]))
    text = quoted_question([(where, tokenizer.decode(context[lo:hi], skip_special_tokens=True))], question)
    logits = rc.feed(model, cache, rc.question_ids(tokenizer, corpus.text, text), settings.prefill_chunk)
    return tokenizer.decode(rc.greedy(model, cache, logits, tokenizer.eos_token_id, MAX_NEW_TOKENS),
                            skip_special_tokens=True)


def run(args, results) -> None:
    from benchmarks.docqa_set import QUESTIONS

    torch.set_num_threads(args.threads)
    tokenizer, model = rc.load_real()
    settings = rc.Settings(window=args.window, prefill_chunk=args.chunk)
    records = []
    for path in dict.fromkeys(q.document for q in QUESTIONS):
        records += run_document(model, tokenizer, path, [q for q in QUESTIONS if q.document == path], settings)
        (results / f"real_docqa_w{args.window}.json").write_text(json.dumps(records, indent=1))


def section(results) -> str | None:
    paths = sorted(results.glob("real_docqa_w*.json"), key=lambda p: int(p.stem.rsplit("w", 1)[1]))
    return "\n\n".join(filter(None, (section_for(json.loads(p.read_text())) for p in paths))) or None


def section_for(records: list[dict]) -> str | None:
    from ingest.tables import markdown_table

    if not records:
        return None
    window = records[0]["window"]
    docs = list(dict.fromkeys(r["document"] for r in records))
    header = ["", *docs, "all"]
    groups = [[r for r in records if r["document"] == d] for d in docs] + [records]  # each document, then all
    rows = [["questions", *[str(len(g)) for g in groups]],
            ["context tokens", *[f"{g[0]['context_tokens']:,}" for g in groups[:-1]], "–"]]
    rows += _correct_rows(groups, window) + _citation_rows(records, groups)
    quoting = all("lminfinite_quote" in r for r in records)
    detail_header = ["document", "question", "answer at", "truncate", "top-k off", "top-k",
                     *(["top source quoted (app)"] if quoting else []), "cited (share)"]
    detail = [_detail_row(r, quoting) for r in records]
    return (f"**Document QA with citations** ({len(records)} questions with short known answers, W = {window:,}, "
            f"top-k = 5 from layer 5, answers of at most {MAX_NEW_TOKENS} tokens; questions in "
            "`benchmarks/docqa_set.py`; correct = an expected regex matches the answer; cited passage: the PDF "
            "page, or the chunk of source lines, ranked first (or among the first three) by each way of citing, "
            "`app.engine.citations` for the app's):\n\n"
            + markdown_table(header, rows)
            + "\n\n<details><summary>Per question</summary>\n\n" + markdown_table(detail_header, detail)
            + "\n\n</details>")


def _pct(hits) -> str:
    """'75% (3/4)' of a run of booleans; '–' when there are none."""
    hits = list(hits)
    return f"{100 * sum(hits) / len(hits):.0f}% ({sum(hits)}/{len(hits)})" if hits else "–"


def _correct_rows(groups: list[list[dict]], window: int) -> list[list[str]]:
    """Share of correct answers per method, one cell per group."""
    rows = []
    for method, label in (("truncate", f"correct: truncate (last {window:,} tokens)"),
                          ("lminfinite", "correct: LM-Infinite, top-k off"),
                          ("lminfinite_topk", "correct: LM-Infinite + top-k while answering"),
                          ("lminfinite_quote", "correct: LM-Infinite, top-k reads the question, its top source "
                                               "quoted (app)")):
        if all(method + "_correct" in r for g in groups for r in g):  # older runs did not quote
            rows.append([label, *[_pct(r[method + "_correct"] for r in g) for g in groups]])
    return rows


# Ways of ranking cited passages, as saved per record: (key, label). Older saved runs hold other keys; a row is
# shown when every record of the table has its key.
CITATIONS = (
    ("cite_decode", "the answer's recall, every token (first release)"),
    ("cite_decode_content", "the answer's recall, content tokens"),
    ("cite_question", "the question's recall, content tokens"),
    ("cite_app", "the question's recall minus a neutral question's, content tokens (app)"),
    ("cite_contrastive", "the answer's recall minus the document's other questions' average"),
    ("cite_question_decode", "question + answer recall, every token"),
)


def _citation_rows(records: list[dict], groups: list[list[dict]]) -> list[list[str]]:
    """Top-1 and top-3 hits of each way of citing the records have, and of the app's (or the first
    release's, in older runs) over the questions whose passages lie beyond the window."""
    rows = []
    kept = [(key, label) for key, label in CITATIONS if all(key + "_hits" in r for r in records)]
    for key, label in kept:
        for idx, rank in ((0, "top-1"), (1, "in top-3")):
            rows.append([f"cited passage {rank}: {label}", *[_pct(r[key + "_hits"][idx] for r in g) for g in groups]])
    key = "cite_app" if any(k == "cite_app" for k, _ in kept) else "cite_decode"
    for idx, rank in ((0, "top-1"), (1, "in top-3")):
        rows.append([f"cited passage {rank}, beyond the window ({'app' if key == 'cite_app' else 'first release'})",
                     *[_pct(r[key + "_hits"][idx] for r in g if r["answer_outside_window"]) for g in groups]])
    return rows


def _mark(ok) -> str:
    return "✓" if ok else "✗"


def _detail_row(r: dict, quoting: bool) -> list[str]:
    """One question of the per-question table: its answers marked right or wrong, and its top cited passages."""
    where = ", ".join(map(str, r["pages"])) or "l. " + ", ".join(map(str, r.get("lines", [])))
    quoted = [_mark(r["lminfinite_quote_correct"]) + " " + _short(r["lminfinite_quote"])] if quoting else []
    return [r["document"].split("-")[0].split(".")[0], r["question"].replace("|", "\\|"), where,
            _mark(r["truncate_correct"]), _mark(r["lminfinite_correct"]),
            _mark(r["lminfinite_topk_correct"]) + " " + _short(r["lminfinite_topk"]), *quoted,
            ", ".join(f"{_passage(p)} ({s:.0%})" for p, s in r.get("cite_app", r["cite_decode"])[:3])]


def _passage(passage) -> str:
    """A page number as it is; a chunk's lines as "l. first-last"."""
    return f"l. {passage[0]}-{passage[1]}" if isinstance(passage, list) else str(passage)


def _short(text: str, n: int = 50) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return repr(text if len(text) <= n else text[: n - 1] + "…")
