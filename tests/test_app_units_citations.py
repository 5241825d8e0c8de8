"""Fast unit tests of citations: recall grouped by page, ranked against a neutral question, quoted; the span index.
No model, no server."""

from __future__ import annotations

import pytest
import torch

from app import cli
from app.engine import citations
from app.engine.citations import CARRIED_TOKENS, Citation, Ranking, RecallTally, cite
from app.engine.spans import Span, SpanIndex
from app.session.state import ChatItem
from ingest import Provenance
from lminfinite import TopKSelection


# -- citations -----------------------------------------------------------------------------------
def test_citations_group_recall_weight_by_page_and_line_range():
    spans = SpanIndex()
    spans.append(Span(0, 10, "system"))
    spans.append(Span(10, 50, "document", where=Provenance("r.pdf", page=3, page_label="iii")))
    spans.append(Span(50, 90, "document", where=Provenance("r.pdf", page=4, page_label="4")))
    spans.append(Span(90, 120, "document", where=Provenance("src/a.py", line_start=10, line_end=30)))
    spans.append(Span(120, 130, "question"))
    tally = RecallTally()
    positions = torch.tensor([[[[12, 55, 95, 5, 0]]]])  # (B, H, c, k)
    weights = torch.tensor([[[[0.30, 0.10, 0.20, 0.05, 0.0]]]])  # the last slot is empty (weight 0)
    tally(TopKSelection(6, torch.tensor([130]), positions, weights))
    tally(TopKSelection(7, torch.tensor([130]), torch.tensor([[[[13, 96]]]]), torch.tensor([[[[0.10, 0.05]]]])))
    report = cite(tally, spans)
    labels = [(c.where.label(), round(c.share, 3)) for c in report.citations]
    # documents received 0.75 of the 0.80 recalled: page 3 0.40, a.py 0.25, page 4 0.10
    assert labels == [("r.pdf p. 3 (iii)", 0.533), ("src/a.py:10-30", 0.333), ("r.pdf p. 4", 0.133)]
    assert report.recalled and report.document_share == pytest.approx(0.75 / 0.80)
    assert cite(RecallTally(), spans).recalled is False


def test_citations_rank_what_the_question_recalls_beyond_a_neutral_question():
    """Measured shape (app/engine/citations.py): every question pulls recall to a title page and a table (p. 13);
    the question's own page is where its recall exceeds the neutral question's."""
    spans = SpanIndex()
    for start, page in ((0, 1), (100, 4), (200, 13)):
        spans.append(Span(start, start + 100, "document", where=Provenance("spec.pdf", page=page)))
    spans.append(Span(300, 320, "question"))

    def tally_of(weights: dict[int, float]) -> RecallTally:
        tally = RecallTally()
        tally(TopKSelection(6, torch.tensor([310]), torch.tensor([[[list(weights)]]]),
                            torch.tensor([[[list(weights.values())]]])))
        return tally

    question = tally_of({5: 0.30, 250: 0.40, 120: 0.20, 121: 0.05, 305: 0.05})  # 305: the question itself
    neutral = tally_of({10: 0.50, 260: 0.50})
    plain = cite(question, spans)
    assert [c.where.page for c in plain.citations] == [13, 1, 4]  # what every question recalls wins
    report = cite(question, spans, baseline=neutral)
    # shares over document tokens: question 1: .3158, 4: .2632, 13: .4211; neutral 1: .5, 13: .5
    # relevance 4: +.2632, 13: -.0789, 1: -.1842: only p. 4 is above the baseline
    assert [(c.where.page, round(c.share, 3)) for c in report.citations] == [(4, 1.0)]
    assert report.document_share == pytest.approx(0.95)
    snippets = cite(question, spans, baseline=neutral, snippet=lambda position, span: str(position))
    assert snippets.citations[0].snippet == "120"  # the page's most relevant token
    assert cite(neutral, spans, baseline=neutral).citations == ()  # nothing stands out: no sources


def test_an_answer_without_sources_says_why():
    from app.engine.citations import CitationReport
    from app.engine.context_records import AnswerResult
    from app.session.model_work import ModelWork

    def note(report: CitationReport) -> str:
        item = ChatItem("assistant", "answer", "", pending=True)
        result = AnswerResult("A.", 1, "eos", report, 0.1, 10.0, 5.0, 3)
        ModelWork._finish_answer(item, result)
        return item.recall_note

    # how the question was read decides, not the settings of an answer drawn again (it keeps its sources)
    assert "recall was off when the question was read" in note(CitationReport.recall_off())
    assert "inside the attention window" in note(CitationReport((), 0.0, recalled=False))
    lexical = (Citation(Provenance("r.pdf", 2), 1.0),)  # ranked by the question's words alone: said so
    assert note(CitationReport(lexical, 0.0, recalled=False)).startswith("Sources ranked by the question's words")
    assert "recall was off" in note(CitationReport(lexical, 0.0, recalled=False, recall_on=False))
    assert "conversation rather than to documents" in note(CitationReport((), 0.0, recalled=True))
    assert "than any question draws" in note(CitationReport((), 0.6, recalled=True))  # none above the neutral
    assert note(CitationReport((Citation(Provenance("r.pdf", 2), 1.0),), 0.6, recalled=True)) == ""


def test_citations_count_content_tokens_not_attention_sinks():
    """Measured shape (app/engine/citations.py): one " the" on page 13 draws more recall than the answer's words."""
    from app.engine.citations import content_token_ids, is_content_token

    spans = SpanIndex()
    spans.append(Span(0, 100, "document", where=Provenance("spec.pdf", page=1)))
    spans.append(Span(100, 200, "document", where=Provenance("spec.pdf", page=13)))
    texts = {12: "Thomas", 13: " Leonard", 150: " the", 151: "\n", 152: " "}
    tally = RecallTally()
    tally(TopKSelection(6, torch.tensor([300]), torch.tensor([[[[150, 151, 152, 12, 13]]]]),
                        torch.tensor([[[[0.30, 0.10, 0.08, 0.04, 0.03]]]])))
    everything = cite(tally, spans)
    assert everything.citations[0].where.page == 13  # sinks win when every token counts
    content = cite(tally, spans, counts=lambda position: is_content_token(texts[position]))
    assert [(c.where.page, round(c.share, 3)) for c in content.citations] == [(1, 1.0)]

    assert [is_content_token(t) for t in ("Thomas", " 50", " the", "The", "\n", " ", "---", "é")] == \
        [True, True, False, False, False, False, False, True]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(cli.DEMO_MODEL_DIR))
    ids = content_token_ids(tokenizer)
    assert tokenizer.bos_token_id not in ids and tokenizer.convert_tokens_to_ids("Q") in ids


def test_a_cut_quote_is_the_densest_part_of_its_chunk_with_its_relevant_tokens_in_the_middle():
    from app.engine.quoting import densest_window, quote_budget, quoted_question, smallest_quote

    assert densest_window({5: 1.0}, 0, 40, 64) == (0, 40)  # a short passage is quoted whole
    assert densest_window({}, 100, 400, 50) == (100, 150)  # nothing relevant: its start
    # Two clusters: 10 tokens at 150-159 (0.1 each, 1.0 in all) and 3 at 300-302 (0.5 each, 1.5): the second wins,
    # centred in its 50 tokens; negative relevance (below the neutral question) never counts.
    relevance = {**{p: 0.1 for p in range(150, 160)}, 300: 0.5, 301: 0.5, 302: 0.5, 303: -2.0}
    assert densest_window(relevance, 100, 400, 50) == (277, 327)
    assert densest_window(relevance, 100, 400, 200) == (127, 327)  # both fit: centred on 150-302
    assert densest_window(relevance, 100, 310, 50) == (260, 310)  # clipped to the passage's end
    assert densest_window({101: 1.0}, 100, 400, 50) == (100, 150)  # and to its start
    assert quote_budget(2048) == 1536 and quote_budget(1024) == 768 and quote_budget(64) == 48
    assert smallest_quote(1536) == 128 and smallest_quote(48) == 12
    assert quoted_question([], "What is the key?") == "What is the key?"  # every document switched off
    assert quoted_question([("r.pdf p. 3", "  The key is 7.\n")], "What is the key?") == \
        'Here is a part of r.pdf p. 3:\n"""\nThe key is 7.\n"""\n\nUsing the document, answer this question: ' \
        "What is the key?"


def test_citations_quote_the_best_chunks_whole_while_they_fit_and_cut_the_first_that_does_not():
    spans, chunks, tally = _three_pages_in_four_chunks()
    assert cite(tally, spans).quote_spans == ()  # not asked
    _check_a_short_budget_cuts_the_first_chunk(tally, spans)
    _check_room_for_all_quotes_each_chunk_whole(tally, spans)
    _check_bm25_orders_the_quotes(tally, spans, chunks)
    # Fewer tokens left than the smallest quote: quoting stops.
    assert len(cite(tally, spans, quote_budget=100).quote_spans) == 2  # 74 whole, then 26 of the next (≥ 25)
    assert len(cite(tally, spans, quote_budget=90).quote_spans) == 1  # 16 left < 22
    assert spans.around(125, lambda span: span.where is not None and span.where.page == 2) == (60, 160)
    assert spans.around(5, lambda span: span.where is not None) == (0, 210)  # a run after the span it starts in


def _three_pages_in_four_chunks():
    spans = SpanIndex()
    spans.append(Span(0, 10, "system"))
    chunks = [Span(start, start + 50, "document", where=Provenance("r.pdf", page=page))
              for start, page in ((10, 1), (60, 2), (110, 2), (160, 3))]  # p. 2 is read as two chunks
    for chunk in chunks:
        spans.append(chunk)
    spans.append(Span(210, 230, "question"))
    tally = RecallTally()
    tally(TopKSelection(6, torch.tensor([220]), torch.tensor([[[[20, 100, 120, 170]]]]),
                        torch.tensor([[[[0.1, 0.3, 0.3, 0.2]]]])))
    return spans, chunks, tally


def _check_a_short_budget_cuts_the_first_chunk(tally, spans):
    # Recall alone: p. 2 first, its chunks in context order; 40 tokens cut from the first chunk around its recall.
    report = cite(tally, spans, quote_budget=40)
    assert report.citations[0].where.page == 2 and report.quote_spans == ((91, 131),)
    assert report.quoted_passages == 1


def _check_room_for_all_quotes_each_chunk_whole(tally, spans):
    # Room for all: each chunk whole with its last word, fed with the next chunk (CARRIED_TOKENS), and what a
    # neighbour quotes already not quoted twice.
    report = cite(tally, spans, quote_budget=500)
    assert report.quote_spans == ((60, 110 + CARRIED_TOKENS), (110 + CARRIED_TOKENS, 160 + CARRIED_TOKENS),
                                  (160 + CARRIED_TOKENS, 210), (10, 60))
    assert [w.page for w in report.quote_sources] == [2, 2, 3, 1] and report.quoted_passages == 3
    assert [c.where.page for c in report.citations[:3]] == [2, 3, 1]  # the quoted passages are the first cited


def _check_bm25_orders_the_quotes(tally, spans, chunks):
    # BM25 ranks p. 2's second chunk first: it is quoted first, and its page still cited first.
    lexical = {chunks[2]: 3.0, chunks[3]: 1.0}
    report = cite(tally, spans, quote_budget=500, quotes=2, lexical=lexical)
    assert report.quote_spans == ((110, 160 + CARRIED_TOKENS), (160 + CARRIED_TOKENS, 210))
    assert [c.where.page for c in report.citations[:2]] == [2, 3]
    assert report.lexical_ranking[0].page == 2 and report.lexical_scores[0] == 3.0


def test_span_index_lookup_and_truncation():
    spans = SpanIndex()
    spans.append(Span(0, 5, "system"))
    spans.append(Span(5, 9, "document", where=Provenance("a")))
    with pytest.raises(ValueError):
        spans.append(Span(10, 12, "question"))  # a gap
    assert spans.at(4).kind == "system" and spans.at(5).where.source == "a" and spans.at(9) is None
    spans.truncate(1)
    assert spans.end == 5 and len(spans) == 1


def test_a_cited_page_carries_the_heading_of_its_best_chunk():
    spans = SpanIndex()
    chunks = [Span(0, 40, "document", where=Provenance("m.pdf", page=3, heading="2 Options")),
              Span(40, 80, "document", where=Provenance("m.pdf", page=3, heading="2 Options › 2.1 Colours")),
              Span(80, 120, "document", where=Provenance("m.pdf", page=4, heading="2 Options › 2.1 Colours"))]
    for span in chunks:
        spans.append(span)
    report = cite(RecallTally(), spans, lexical={chunks[0]: 1.0, chunks[1]: 3.0, chunks[2]: 2.0})
    assert [(c.where.page, c.where.heading) for c in report.citations] == [(3, "2 Options › 2.1 Colours"),
                                                                         (4, "2 Options › 2.1 Colours")]
    assert report.citations[0].where == Provenance("m.pdf", page=3)  # the same page, whatever its heading


def test_a_cited_page_carries_the_heading_of_the_chunk_its_snippet_shows():
    """Recall's most relevant token on a page can be in another chunk than the page's best by BM25: the snippet is
    around that token, and the heading shown over it is its section's."""
    spans = SpanIndex()
    chunks = [Span(0, 40, "document", where=Provenance("m.pdf", page=3, heading="2 Options")),
              Span(40, 80, "document", where=Provenance("m.pdf", page=3, heading="2 Options › 2.1 Colours")),
              Span(80, 90, "question")]
    for span in chunks:
        spans.append(span)
    tally = RecallTally()
    tally(TopKSelection(6, torch.tensor([90]), torch.tensor([[[[52, 10]]]]), torch.tensor([[[[0.6, 0.2]]]])))
    report = cite(tally, spans, lexical={chunks[0]: 3.0, chunks[1]: 1.0},
                  snippet=lambda position, span: f"around {position}")
    assert [(c.where.heading, c.snippet) for c in report.citations] == [("2 Options › 2.1 Colours", "around 52")]
    words_only = cite(RecallTally(), spans, lexical={chunks[0]: 3.0, chunks[1]: 1.0},
                      snippet=lambda position, span: f"around {position}", lexical_hits=lambda lo, hi: {lo + 5: 1.0})
    assert [(c.where.heading, c.snippet) for c in words_only.citations] == [("2 Options", "around 5")]


def test_contents_and_index_chunks_are_cited_and_quoted_after_every_chunk_that_answers():
    spans = SpanIndex()
    chunks = [Span(0, 40, "document", where=Provenance("m.pdf", page=2, listing=True)),  # the contents
              Span(40, 80, "document", where=Provenance("m.pdf", page=7)),
              Span(80, 120, "document", where=Provenance("m.pdf", page=9)),
              Span(120, 160, "document", where=Provenance("m.pdf", page=30, listing=True))]  # the index
    for span in chunks:
        spans.append(span)
    lexical = {chunks[0]: 9.0, chunks[1]: 2.0, chunks[2]: 3.0, chunks[3]: 5.0}
    report = cite(RecallTally(), spans, lexical=lexical, quote_budget=400, ranking=Ranking.LEXICAL)
    assert [c.where.page for c in report.citations] == [9, 7, 2, 30]  # still cited, by score among themselves
    assert [where.page for where in report.quote_sources] == [9, 7, 2, 30]
    alone = cite(RecallTally(), spans, lexical={chunks[3]: 5.0}, quote_budget=400, ranking=Ranking.LEXICAL)
    assert [c.where.page for c in alone.citations] == [30]  # the only match is not dropped


def _five_pages(listing_page: int | None = None):
    spans = SpanIndex()
    chunks = [Span(40 * i, 40 * i + 40, "document",
                   where=Provenance("m.pdf", page=i + 1, listing=i + 1 == listing_page)) for i in range(6)]
    chunks[5] = Span(200, 240, "document", where=Provenance("m.pdf", page=5))  # p. 5 read as two chunks
    for span in chunks:
        spans.append(span)
    spans.append(Span(240, 250, "question"))
    tally = RecallTally()  # recall: p. 5 far above the rest, p. 1 next
    tally(TopKSelection(6, torch.tensor([245]), torch.tensor([[[[170, 210, 5]]]]),
                        torch.tensor([[[[0.5, 0.3, 0.2]]]])))
    lexical = {chunks[0]: 9.0, chunks[1]: 8.0, chunks[2]: 7.5, chunks[3]: 7.0, chunks[5]: 0.5}  # BM25: p. 5 barely
    return spans, chunks, tally, lexical


def test_the_last_quote_is_the_best_chunk_of_recalls_best_passage_not_quoted_before_it(monkeypatch):
    """A question in other words than the document's: BM25 ranks four other pages far above the one recall finds,
    and the fusion (recall a quarter of BM25's weight) would not quote it."""
    spans, chunks, tally, lexical = _five_pages()
    report = cite(tally, spans, lexical=lexical, quote_budget=400)
    assert [w.page for w in report.quote_sources] == [1, 2, 3, 5]  # p. 1 is recall's second: quoted already
    assert report.quote_spans[3][0] == chunks[5].start  # p. 5's best chunk: BM25 breaks the page's tie
    assert [c.where.page for c in report.citations][:4] == [1, 2, 3, 5]
    monkeypatch.setattr(citations, "RECALL_SLOT", None)
    assert [w.page for w in cite(tally, spans, lexical=lexical, quote_budget=400).quote_sources] == [1, 2, 3, 4]
    monkeypatch.undo()
    assert cite(tally, spans, lexical=lexical, quote_budget=400, ranking=Ranking.LEXICAL).quote_sources[3].page == 4
    assert cite(RecallTally(), spans, lexical=lexical, quote_budget=400).quote_sources[3].page == 4  # no recall


def test_the_recall_slot_moves_nothing_already_quoted_and_no_contents_page():
    spans, chunks, tally, lexical = _five_pages(listing_page=5)
    ranked = [(chunk, 1.0) for chunk in chunks]
    assert citations.with_recall_slot(ranked, {Provenance("m.pdf", 5): 1.0}, 3)[3][0] == chunks[5]  # not the listing
    listed = [(chunks[i], 1.0) for i in range(5)]
    assert citations.with_recall_slot(listed, {Provenance("m.pdf", 5): 1.0}, 3) == listed  # only the listing's chunk
    assert citations.with_recall_slot(listed, {Provenance("m.pdf", 2): 1.0}, 3) == listed  # quoted already
    assert citations.with_recall_slot(listed, {Provenance("m.pdf", 4): 1.0}, 3) == listed  # in the slot already
    assert citations.with_recall_slot(listed, {Provenance("m.pdf", 9): 1.0, Provenance("m.pdf", 4): -1.0}, 3) == listed
    assert citations.with_recall_slot(listed[:3], {Provenance("m.pdf", 1): 1.0}, 3) == listed[:3]
