"""Which source comes first once the answer is drawn (citations.lead_with_answer_source) and what its snippet shows
(ContextText.answered_at), how a follow-up's words reach the ranking (lexical.ChunkIndex with the question asked
before), and what a heading adds, without a model."""

from __future__ import annotations

from dataclasses import replace

from app.engine.citations import Citation, CitationReport, lead_with_answer_source
from app.engine.lexical import EARLIER_WEIGHT, ChunkIndex
from app.engine.context import answer_sources
from app.engine.context_text import ContextText
from app.engine.quoting import quoted_question
from app.engine.spans import Span, SpanIndex, SpanKind
from ingest import Provenance
from ingest.documents import without_page_markers

P = {n: Provenance("m.pdf", n) for n in range(1, 6)}


def chunk(page: int, part: int = 0) -> Provenance:
    """A chunk on ``page``: chunks of one PDF page share its provenance."""
    return P[page]


def report(cited=(1, 2, 3, 4), quoted=(1, 2, 3)) -> CitationReport:
    return CitationReport(tuple(Citation(P[n], 0.4 - 0.05 * i) for i, n in enumerate(cited)), 0.9, recalled=True,
                          quote_spans=tuple((100 * i, 100 * i + 50) for i in range(len(quoted))),
                          quote_sources=tuple(chunk(n) for n in quoted))


def pages(r: CitationReport) -> list[int]:
    return [c.where.page for c in r.citations]


def test_the_quoted_page_whose_chunk_the_answer_matches_best_is_cited_first_the_rest_in_their_order():
    moved = lead_with_answer_source(report(), [0.5, 0.0, 3.0])
    assert pages(moved) == [3, 1, 2, 4]
    assert moved.citations[0] == report().citations[2]  # the same citation, its share and snippet unchanged
    assert moved.quote_sources == report().quote_sources and moved.quote_spans == report().quote_spans


def test_the_order_stands_without_support_on_a_tie_or_when_the_first_is_already_best():
    assert pages(lead_with_answer_source(report(), [0.0, 0.0, 0.0])) == [1, 2, 3, 4]  # other words than the quotes'
    assert pages(lead_with_answer_source(report(), [])) == [1, 2, 3, 4]  # nothing quoted
    assert pages(lead_with_answer_source(report(), [2.0, 2.0, 1.0])) == [1, 2, 3, 4]  # a tie keeps the first
    assert pages(lead_with_answer_source(report(), [4.0, 1.0, 3.0])) == [1, 2, 3, 4]


def test_two_quoted_chunks_of_one_page_count_as_that_page_at_their_best():
    two_on_one = report(quoted=(1, 2, 2))
    assert pages(lead_with_answer_source(two_on_one, [1.0, 0.2, 1.5])) == [2, 1, 3, 4]
    assert pages(lead_with_answer_source(report(quoted=(2, 1, 1)), [0.1, 0.5, 0.3])) == [1, 2, 3, 4]


def test_a_page_quoted_but_not_cited_moves_nothing():
    assert pages(lead_with_answer_source(report(cited=(1, 2), quoted=(1, 5)), [0.1, 9.0])) == [1, 2]


def _index(texts: list[str]) -> tuple[ChunkIndex, list[Span]]:
    spans = [Span(i * 10, i * 10 + 10, SpanKind.DOCUMENT, Provenance("n.pdf", i + 1)) for i in range(len(texts))]
    index = ChunkIndex()
    index.refresh(spans, lambda span: texts[spans.index(span)])
    return index, spans


TEXTS = ["sha256 digest size is 32 octets", "sha384 digest size is 48 octets",
         "the update function adds more data to the hash context", "rc4 drops 512 bytes", "chacha nonce is 8 octets",
         "gcm mode recommended by nist", "ccm mode recommended by nist", "yarrow quick pool needs 100 bits"]


def test_the_question_before_breaks_a_follow_ups_near_ties_toward_the_conversations_passage():
    index, spans = _index(TEXTS)
    alone, followed = index.scores("And its size?"), index.scores("And its size?", "What is the sha256 digest?")
    assert alone[spans[0]] == alone[spans[1]]  # "size" alone cannot tell the two digests apart
    assert max(followed, key=followed.get) == spans[0]
    earlier = index.scores("What is the sha256 digest?")
    for span in spans:  # the question's own score, plus a tenth of the earlier question's
        assert abs(followed.get(span, 0.0) - alone.get(span, 0.0) - EARLIER_WEIGHT * earlier.get(span, 0.0)) < 1e-6


def test_a_question_on_another_topic_is_ranked_by_its_own_words():
    index, spans = _index(TEXTS)
    scores = index.scores("Which mode does nist recommend with ccm?", "What is the sha256 digest size?")
    assert max(scores, key=scores.get) == spans[6]
    assert index.scores("", "What is the sha256 digest?")  # a question without words: the earlier one's alone
    assert index.scores("the of and") == {} and index.scores("the of and", "") == {}


def test_a_chunk_is_found_by_the_words_of_its_heading_as_well_as_its_own():
    texts = ["trim the fraction of observations cut from each end"] * 2
    headings = ["mean › Arithmetic Mean", "median › Median Value"]
    spans = [Span(i * 10, i * 10 + 10, SpanKind.DOCUMENT, Provenance("ref.pdf", 7, heading=h))
             for i, h in enumerate(headings)]
    index = ChunkIndex()
    index.refresh(spans, lambda span: texts[spans.index(span)])
    scores = index.scores("What does trim do in the median?")
    assert scores[spans[1]] > scores[spans[0]] > 0  # the same words, told apart by the heading
    assert list(index.scores("arithmetic")) == [spans[0]]


class CharTokenizer:
    """One token per character: enough to read a context's text back."""

    @staticmethod
    def decode(ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def test_a_quote_is_labelled_with_its_page_not_its_heading():
    """The reader is told where a quote is from, not the heading it falls under: told it, the 1.5B answered fewer
    questions about outlined manuals (docs/answers.md)."""
    text = "--- page 7 (5) ---\nThe trimmed mean drops a fraction of each end."
    where = Provenance("ref.pdf", 7, "5", heading="mean › Arithmetic Mean")
    spans = SpanIndex()
    spans.append(Span(0, len(text), SpanKind.DOCUMENT, where))
    quoted = CitationReport((), 0.0, True, quote_spans=((0, len(text)),), quote_sources=(where,))
    turn = ContextText(CharTokenizer(), [ord(c) for c in text], spans).quoted_turn("What is dropped?", quoted)
    assert turn == quoted_question([("ref.pdf p. 7 (5)", without_page_markers(text))], "What is dropped?")
    assert "Arithmetic" not in turn and "--- page" not in turn


# Two functions described on one page, as Octave's manual does: the question's words ("value", "approximately")
# come first in the one before the answer's.
TWO_FUNCTIONS = ("--- page 7 (5) ---\nrealmax: the largest value, approximately 1.7977e+308 in double precision. "
                 + "Its use is as follows in the functions below. " * 3
                 + "realmin: the smallest value, 2.2251e-308 in double precision.\n")
QUESTION = "Approximately what value does realmin give?"


def _two_functions(quoted: tuple[tuple[int, int], ...] | None = None) -> tuple[ContextText, CitationReport]:
    where = Provenance("octave.pdf", 7, "5")
    spans = SpanIndex()
    spans.append(Span(0, len(TWO_FUNCTIONS), SpanKind.DOCUMENT, where))
    parts = quoted or ((0, len(TWO_FUNCTIONS)),)
    report = CitationReport((Citation(where, 0.6, "question's snippet"), Citation(P[2], 0.4, "other")), 0.0, True,
                            quote_spans=parts, quote_sources=(where,) * len(parts))
    return ContextText(CharTokenizer(), [ord(c) for c in TWO_FUNCTIONS], spans), report


def test_the_first_sources_snippet_is_where_the_answers_own_words_are_in_its_quote():
    text, report = _two_functions()
    at = text.answered_at(report, QUESTION, "According to the document, realmin is about 2.2251e-308.")
    shown = text.snippet(at, text.spans.at(at))
    assert "2.2251e-308" in shown and "largest" not in shown
    first_question_word = TWO_FUNCTIONS.index("value")  # where a snippet by the question's words alone would be
    assert "largest" in text.snippet(first_question_word, text.spans.at(0))


def test_no_snippet_is_chosen_without_the_answers_own_words_in_the_first_sources_quote():
    text, report = _two_functions()
    assert text.answered_at(report, QUESTION, "According to the document, realmin gives a value.") is None
    assert text.answered_at(report, QUESTION, "It is 6.02e23.") is None
    elsewhere = replace(report, quote_sources=(P[3],))  # quoted from another page than the one cited first
    assert text.answered_at(elsewhere, QUESTION, "about 2.2251e-308") is None
    start = TWO_FUNCTIONS.index("realmin:")  # only the part quoted counts: its own words are not in the first half
    half, _ = _two_functions(quoted=((0, start),))
    assert half.answered_at(replace(report, quote_spans=((0, start),)), QUESTION, "about 2.2251") is None


def test_a_word_the_quotes_hold_once_leads_a_word_they_hold_often():
    """Octave's "finish.m" under "which script does Octave run when I exit?", not the paragraph after it, where
    "function" (which the other quotes hold too) is twice."""
    parts = ["atexit registers a function; the function is called at exit.\n",
             "During shutdown Octave will search for the script file finish.m in the load path.\n",
             "A function handle names a function; function files hold one.\n"]
    text = "".join(parts)
    cut = [0, len(parts[0]), len(parts[0]) + len(parts[1]), len(text)]
    where, other = Provenance("octave.pdf", 20), Provenance("octave.pdf", 90)
    spans = SpanIndex()
    spans.append(Span(0, cut[2], SpanKind.DOCUMENT, where))
    spans.append(Span(cut[2], cut[3], SpanKind.DOCUMENT, other))
    report = CitationReport((Citation(where, 0.6), Citation(other, 0.4)), 0.0, True,
                            quote_spans=((cut[0], cut[1]), (cut[1], cut[2]), (cut[2], cut[3])),
                            quote_sources=(where, where, other))
    context = ContextText(CharTokenizer(), [ord(c) for c in text], spans)
    at = context.answered_at(report, "Which script file does Octave run when I exit?",
                             "It looks for finish.m, a function.")
    assert "finish.m" in context.snippet(at, spans.at(at))


def test_the_next_chunks_words_a_quote_reads_on_to_do_not_place_the_snippet():
    """A quote reads a few tokens into the next chunk for its last word (citations.CARRIED_TOKENS); words of the next
    page there are not where the answer was read from on this one."""
    first, second = "The key is kept on this page.", " safe.\n--- page 8 ---\nzanzibar is the word here.\n"
    text = first + second
    where = Provenance("m.pdf", 7)
    spans = SpanIndex()
    spans.append(Span(0, len(first), SpanKind.DOCUMENT, where))
    spans.append(Span(len(first), len(text), SpanKind.DOCUMENT, Provenance("m.pdf", 8)))
    report = CitationReport((Citation(where, 1.0),), 0.0, True, quote_spans=((0, len(first) + 30),),
                            quote_sources=(where,))
    context = ContextText(CharTokenizer(), [ord(c) for c in text], spans)
    assert context.answered_at(report, "Where is the key?", "It is zanzibar.") is None
    at = context.answered_at(report, "Where is the key?", "It is kept safe.")
    assert context.snippet(at, spans.at(at)).endswith("kept on this page. safe.")


def test_the_first_source_shows_the_heading_of_the_section_its_snippet_is_in():
    """A page read as two chunks under two headings: the cited page came under its best chunk's heading for the
    question ("Future Work" on XACE's p. 6), and the snippet moved to the answer's sentence under the other."""
    parts = ["Future work may add hooks for the core server.\n",
             "To register a callback with a hook, use XaceRegisterCallback with the hook's number.\n"]
    text = "".join(parts)
    headings = ("Future Work › Core X Server", "Using Hooks › Overview")
    spans = SpanIndex()
    spans.append(Span(0, len(parts[0]), SpanKind.DOCUMENT, Provenance("xace.pdf", 6, heading=headings[0])))
    spans.append(Span(len(parts[0]), len(text), SpanKind.DOCUMENT, Provenance("xace.pdf", 6, heading=headings[1])))
    where = replace(spans.at(0).where, heading=headings[0])
    asked = CitationReport((Citation(where, 1.0, "Future work may add hooks…"),), 0.0, True,
                           quote_spans=((0, len(parts[0])), (len(parts[0]), len(text))), quote_sources=(where, where))
    context = ContextText(CharTokenizer(), [ord(c) for c in text], spans)
    index = ChunkIndex()
    index.refresh(list(spans), lambda span: text[span.start:span.end])
    first = answer_sources(asked, "Which function plugs my handler into a hook?", "Use XaceRegisterCallback.", index,
                           context).citations[0]
    assert "register a callback" in first.snippet and first.where.heading == headings[1]
    unread = answer_sources(asked, "Which function plugs my handler into a hook?", "None is named.", index, context)
    assert unread.citations[0].where.heading == headings[0]  # no snippet of its own words: as the question cited it
