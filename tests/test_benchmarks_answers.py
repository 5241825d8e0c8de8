"""The development set and the answers benchmark's scoring, without a model: every answer pattern matches the page or
lines it cites (and not the question), rankings fuse as the app fuses them, and rows are scored again as the set is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import answers, devset
from ingest import Provenance, ingest


def test_the_set_has_over_three_hundred_questions_over_22_documents_a_third_of_the_new_ones_paraphrased():
    documents = devset.load()
    questions = [q for d in documents for q in d.questions]
    assert len(documents) == 22 and len(questions) >= 320
    names = [n for split in devset.SPLITS.values() for n in split]
    assert len(set(names)) == len(names) == 22 and [devset.split(n) for n in devset.HOLDOUT] == ["holdout"] * 2
    assert [devset.split(n) for n in devset.BLIND] == ["blind"] * 3
    new = [q for d in documents if d.name not in ("mime", "libtasn1", "argparse") for q in d.questions]
    assert 0.25 < sum(q.paraphrased for q in new) / len(new) < 0.45
    assert all(q.answers and (q.pages or (q.file and q.lines)) for q in questions)
    assert not any("r-doc" in d.path or "/R-" in d.path for d in documents)  # R's manuals stay out


def test_follow_ups_continue_a_question_of_their_own_document_and_only_the_four_late_splits_have_them():
    for document in devset.load():
        flags = [q.followup for q in document.questions]
        assert not flags[0], document.name  # a follow-up needs a question before it
        if document.name in devset.FRESH + devset.BLIND:
            assert sum(flags) == 4, document.name
        elif document.name in devset.REFERENCE:
            assert sum(flags) == 6, document.name
        elif document.name in devset.MANUALS:
            assert sum(flags) == (4 if document.name in ("liboctave", "gcrypt", "pspp") else 5), document.name
        else:
            assert not any(flags), document.name


@pytest.mark.parametrize("name", [n for split in devset.SPLITS.values() for n in split])
def test_every_answer_is_stated_where_its_question_says_and_not_in_the_question(name, tmp_path):
    document = devset.load((name,))[0]
    try:
        path = devset.document_path(document, tmp_path)
    except SystemExit as missing:
        pytest.skip(str(missing))
    corpus = ingest(path)
    for question in document.questions:
        assert not question.is_right(question.question), question.question  # the question gives nothing away
        if question.pages:
            text = "".join(c.text for c in corpus.chunks if c.where.page in question.pages)
        else:
            assert any(question._same_file(c.where.source) for c in corpus.chunks), question.file
            lines = _file_lines(path, question.file)
            text = "\n".join(lines[line - 1] for line in question.lines if line <= len(lines))
        assert any(re.search(p, text, re.IGNORECASE) for p in question.answers), (question.question, question.answers)


def _file_lines(path: Path, display: str) -> list[str]:
    """The lines of a code question's file: the document itself, or its member of the zip."""
    if path.suffix != ".zip":
        return path.read_text().splitlines()
    import zipfile

    with zipfile.ZipFile(path) as archive:
        return archive.read(display.split("/", 1)[1]).decode().splitlines()


def test_a_cited_passage_holds_the_answer_by_page_or_by_line_range_of_the_same_file():
    paged = devset.Question("d.pdf", "q", ("x",), pages=(3, 17))
    assert paged.holds(Provenance("d.pdf", 17)) and not paged.holds(Provenance("d.pdf", 4))
    code = devset.Question("h11.zip", "q", ("x",), file="h11.zip/h11/_util.py", lines=(41,))
    assert code.holds(Provenance("h11.zip/h11/_util.py", line_start=30, line_end=60))
    assert not code.holds(Provenance("h11.zip/h11/_util.py", line_start=42, line_end=60))
    assert not code.holds(Provenance("h11.zip/h11/_events.py", line_start=30, line_end=60))


def _row(**kwargs) -> answers.Row:
    base = dict(method="app", document="mime", split="tune", index=2, question="q", answer="", right=False,
                source_right=False, paraphrased=False, ttft_s=1.0, prefill_tps=1.0, decode_tps=1.0)
    return answers.Row(**{**base, **kwargs})


def test_rankings_fuse_by_rank_or_by_score_as_the_app_does():
    a, b, c = (Provenance("d.pdf", n).as_dict() for n in (1, 2, 3))
    row = _row(attention_ranking=[c, b], attention_scores=[1.0, 0.5], lexical_ranking=[a, b, c],
               lexical_scores=[10.0, 9.0, 1.0])
    pages = lambda how: [p.page for p in answers.fused(row, how)]  # noqa: E731
    assert pages("lexical") == [1, 2, 3] and pages("attention") == [3, 2]
    assert pages("lexical+0.25 attention") == [2, 1, 3]  # 0.9 + 0.125 beats 1.0; 0.1 + 0.25 is last
    assert pages("lexical+1 attention") == [2, 3, 1]
    assert pages("rrf") == [3, 2, 1]  # 1/11 + 1/13 just ahead of 1/12 + 1/12, both ahead of 1/11


def test_rows_are_scored_again_with_the_set_as_it_is_now():
    question = devset.load(("mime",))[0].questions[2]  # the date, stated as "2 October 2018"
    rows = answers.rescored([_row(answer="It was last updated on October 2, 2018.", right=False),
                             _row(answer="In 2019.", right=True)])
    assert question.question.startswith("On what date") and [r.right for r in rows] == [True, False]
    table = answers.methods_of(rows)["app"]
    assert (table["right"], table["questions"], table["right_tune"], table["right_later_questions"]) == (1, 2, 1, 1)


def test_the_h11_zip_is_the_installed_package_and_the_same_bytes_every_time(tmp_path):
    document = devset.load(("h11",))[0]
    first = devset.document_path(document, tmp_path).read_bytes()
    (tmp_path / "again").mkdir()
    assert devset.document_path(document, tmp_path / "again").read_bytes() == first
    assert Path(tmp_path / "h11.zip").stat().st_size > 10_000


def test_a_report_takes_one_way_of_answering_from_a_run_when_asked():
    """docs/benchmarks.md's 1.5B rows: the app from the runs with the reader's current wording, retrieval from the earlier
    runs, which also hold app rows of the earlier wording (``run.json:retrieval``)."""
    results = Path(answers.__file__).parent / "results" / "answers"
    both = answers.merged([results / "c_q15.json"])
    only = answers.merged([results / "c_q15.json:retrieval", results / "c_q15_parts.json"])
    assert set(both[0]["methods"]) == {"app", "retrieval"} and both[0]["methods"]["app"]["questions"] == 48
    assert only[0]["methods"]["app"]["questions"] == 48  # c_q15_parts' only: c_q15's app rows were left out
    assert only[0]["methods"]["retrieval"] == both[0]["methods"]["retrieval"]
    assert only[0]["methods"]["app"]["right"] == answers.methods_of(
        answers.read_rows(results / "c_q15_parts.jsonl"))["app"]["right"]


def test_asked_while_feeding_each_question_is_answered_from_chunks_ranked_by_its_words(runtime, tmp_path):
    """The benchmark's ``app-feeding`` way, on the tiny test model: a row per question, each cited by its words
    (no recall ranking: the document is barely fed), the page BM25 ranks first among its sources."""
    document = devset.load(("fontconfig",))[0]
    try:
        path = devset.document_path(document, tmp_path)
    except SystemExit as missing:
        pytest.skip(str(missing))
    rows = list(answers.answer_while_feeding(runtime, document, path, None))
    assert [r.index for r in rows] == list(range(len(document.questions))) and {r.method for r in rows} == {
        "app-feeding"}
    assert all(r.sources and not r.attention_ranking for r in rows)
    assert all(r.lexical_ranking[0]["label"] in [s["label"] for s in r.sources] for r in rows)  # a source has a heading


def test_first_chunks_ranks_by_the_apps_keyword_ranking_and_scores_each_question(tmp_path):
    from benchmarks import first_chunks
    from ingest_fixtures import WordTokenizer

    (tmp_path / "notes.md").write_text("\n\n".join(f"The widget{i} option sets the colour to shade {i}."
                                                   for i in range(40)))
    corpus = ingest(tmp_path / "notes.md", tokenizer=WordTokenizer(), chunk_tokens=30)
    wanted = next(c for c in corpus.chunks if "widget17 " in c.text)
    asked = [devset.Question("notes.md", "Which shade does the widget17 option set?", ("17",), file="notes.md",
                             lines=(wanted.where.line_start,)),
             devset.Question("notes.md", "And the widget3 option?", ("3",), file="notes.md", lines=(10_000,))]
    ranked = first_chunks.ranked_chunks(corpus.chunks, asked)
    assert ranked[0][0] is wanted and len(ranked[0]) == first_chunks.FIRST
    assert "widget3 " in ranked[1][0].text
    assert asked[0].holds(ranked[0][0].where) and not asked[1].holds(ranked[1][0].where)


def test_a_written_passage_adds_its_words_to_the_question_at_its_weight(tmp_path):
    from benchmarks import first_chunks
    from benchmarks.written_passages import SYSTEM, messages_for
    from ingest_fixtures import WordTokenizer

    (tmp_path / "notes.md").write_text("\n\n".join(f"The widget{i} option sets the colour to shade {i}."
                                                   for i in range(40)))
    corpus = ingest(tmp_path / "notes.md", tokenizer=WordTokenizer(), chunk_tokens=30)
    asked = [devset.Question("notes.md", "Which colour does the gadget take?", ("9",), file="notes.md")]
    written = ["The widget9 option sets it."]
    assert "widget9 " not in first_chunks.ranked_chunks(corpus.chunks, asked)[0][0].text  # all chunks alike
    assert "widget9 " in first_chunks.ranked_chunks(corpus.chunks, asked, written, 0.25)[0][0].text
    assert first_chunks.ranked_chunks(corpus.chunks, asked, written, 0.0) == first_chunks.ranked_chunks(corpus.chunks,
                                                                                                         asked)
    # The exchange before is two chat turns, not folded into the question (the model answered it instead).
    assert messages_for("And of SHA384?", ("What is SHA256's digest size?", "32 octets.")) == [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is SHA256's digest size?"},
        {"role": "assistant", "content": "32 octets."}, {"role": "user", "content": "And of SHA384?"}]
    assert messages_for("What is SHA256's digest size?", None)[1:] == [
        {"role": "user", "content": "What is SHA256's digest size?"}]
