"""Scoring and citation mapping of the real-model quality benchmarks (pure logic; no model is loaded)."""

from __future__ import annotations

import json

from benchmarks import docqa, real_passkey
from benchmarks.docqa_set import QUESTIONS


def test_passkey_scoring_reads_the_first_integer():
    assert real_passkey.is_correct("The pass key is 12345.", "12345")
    assert not real_passkey.is_correct("The pass key is 123456.", "12345")
    assert not real_passkey.is_correct("Page 2: the pass key is 12345.", "12345")
    assert not real_passkey.is_correct("I do not know.", "12345")


def test_docqa_answers_match_case_insensitively_any_pattern():
    assert docqa.is_correct("It was written by thomas leonard.", [r"Thomas Leonard"])
    assert docqa.is_correct("Version 0.21 of the spec", [r"0\.21"])
    assert not docqa.is_correct("Version 0.2 of the spec", [r"0\.21"])
    assert docqa.is_correct("use the --benchmark flag", [r"-b\b", r"--benchmark"])


def test_positions_map_through_token_offsets_to_pages():
    # prompt: "SYS" (3 chars) then the document "aaaa|bbbb" (page 1: chars 0-3, page 2: chars 4-7 of the document)
    token_chars = [0, 3, 5, 7, 9, 11]  # token 0 is the system prompt; tokens 1-4 document; token 5 after it
    locate = lambda c: ("doc.pdf", 1 if c < 4 else 2)  # noqa: E731
    positions = docqa.PositionMap(token_chars, doc_char=3, doc_len=8, locate=locate)
    assert positions.passage(0) is None and positions.passage(5) is None and positions.passage(99) is None
    assert [positions.passage(p) for p in (1, 2, 3, 4)] == [("doc.pdf", 1), ("doc.pdf", 1), ("doc.pdf", 2), ("doc.pdf", 2)]
    ranked = docqa.rank_passages({0: 5.0, 1: 0.1, 2: 0.1, 3: 0.3, 4: 0.3}, positions)  # system weight ignored
    assert [p for p, _ in ranked] == [("doc.pdf", 2), ("doc.pdf", 1)]
    assert abs(sum(s for _, s in ranked) - 1) < 1e-9 and abs(ranked[0][1] - 0.75) < 1e-9
    assert docqa.citation_hits(ranked, lambda passage: passage == 2) == (True, True)
    assert docqa.citation_hits(ranked, lambda passage: passage == 1) == (False, True)
    assert docqa.citation_hits([], lambda passage: True) == (False, False)
    assert docqa.rank_passages({1: -0.2, 2: 0.1, 3: 0.3, 4: -0.1}, positions) == [(("doc.pdf", 2), 1.0)]  # > 0 only
    assert docqa.page_token_ranges(positions, 6) == {1: (1, 3), 2: (3, 5)}


def test_position_map_with_a_real_ingested_corpus(tmp_path):
    import ingest

    from benchmarks import real_common

    class Tok:  # whitespace "tokenizer" with offsets, enough for build_prompt's contract
        eos_token_id = 0

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            return "".join(f"<{m['role']}>{m['content']}</>" for m in messages) + "<assistant>"

        def __call__(self, text, add_special_tokens, return_offsets_mapping):
            import re

            spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
            return {"input_ids": list(range(len(spans))), "offset_mapping": spans}

        def encode(self, text, add_special_tokens=False):
            return list(range(len(text.split())))

    (tmp_path / "a.txt").write_text("alpha beta\ngamma delta\n")
    corpus = ingest.ingest([str(tmp_path / "a.txt")])
    prompt = real_common.build_prompt(Tok(), corpus.text, "Which word?")
    positions = docqa.PositionMap([s for s, _ in prompt.offsets], prompt.doc_char, prompt.doc_len,
                                  docqa.corpus_locator(corpus))
    words = prompt.text[: prompt.doc_char + prompt.doc_len].split()
    gamma = words.index("gamma")
    assert positions.passage(gamma) == (corpus.chunks[0].source, (1, 2))  # text is cited by its chunk's lines
    assert positions.passage(0) is None  # the system turn


def test_question_set_is_well_formed():
    assert len(QUESTIONS) >= 20
    for q in QUESTIONS:
        assert q.answers and bool(q.pages) != bool(q.lines)
        assert all(isinstance(n, int) and n >= 1 for n in q.pages + q.lines)


def test_a_passage_holds_the_answer_by_page_or_by_line_range():
    from benchmarks.docqa_set import Question

    pdf = Question("d.pdf", "Q?", ("x",), (3, 17))
    code = Question("m.py", "Q?", ("x",), (), (681, 682))
    assert pdf.holds(3) and pdf.holds(17) and not pdf.holds(4) and not pdf.holds([1, 40])
    assert code.holds([650, 681]) and code.holds([682, 700]) and code.holds((600, 700))
    assert not code.holds([683, 700]) and not code.holds(681)  # a page number is not a line


def test_docqa_section_renders_from_saved_records(tmp_path):
    record = dict(document="spec.pdf", question="Q?", pages=[3], window=2048, context_tokens=9000,
                  answer_outside_window=True, truncate="x", lminfinite="x", lminfinite_topk="0.21",
                  truncate_correct=False, lminfinite_correct=False, lminfinite_topk_correct=True,
                  cite_decode=[[2, 0.6], [3, 0.4]], cite_decode_hits=[False, True],
                  cite_app=[[3, 1.0]], cite_app_hits=[True, True])
    (tmp_path / "real_docqa_w2048.json").write_text(json.dumps([record]))
    text = docqa.section(tmp_path)
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1] for line in text.splitlines() if " | " in line}
    assert rows["cited passage top-1: the answer's recall, every token (first release)"] == "0% (0/1)"
    assert rows["cited passage top-1: the question's recall minus a neutral question's, content tokens (app)"] == "100% (1/1)"
    assert rows["cited passage top-1, beyond the window (app)"] == "100% (1/1)"
    assert not any("content tokens" in row and "answer" in row for row in rows)  # a way this run did not save
    assert "3 (100%)" in text  # the per-question table shows the app's citations
