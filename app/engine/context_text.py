"""The text of a context's tokens: a passage's words, the snippet a source shows, where the question's words are,
and the quotes an answer is drawn from.

One view over token ids and their spans, so the same code reads the context as it is and the context as it will
be once a feed under way ends (``ContextEngine.planned_text``: a question answered while a document is fed).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ingest.documents import PAGE_MARKER, without_page_markers

from .citations import CARRIED_TOKENS, CitationReport
from .lexical import matched_terms, terms, token_matches
from .quoting import densest_window, quoted_question
from .spans import Span, SpanIndex, SpanKind

FILE_HEADER = re.compile(r"(?:\A|\n)### [^\n]*\n")  # ingest's "### name" before a file's first chunk
HEADER_TOKENS = 128  # tokens from a span's start within which its file's header ends
CARRY_CHARS = 120  # at most this much text before a header: what the chat format carried (a "### " further on is
# the document's own Markdown)
SNIPPET_BEFORE, SNIPPET_AFTER = 16, 24  # tokens of context shown around a cited passage's most relevant token
MARKER_TOKENS = 16  # more than a page marker's ("--- page 1234 (1218) ---"): read around a snippet to see one it cuts
# Words an answer says about its quotes, not about what they say ("According to the information provided in the
# document, ..."): they never tell where in a quote it was answered.
ABOUT_THE_QUOTES = frozenset(terms("according documents document information provided context text mentioned "
                                   "stated states says excerpt excerpts part parts using answer question"))


def words_after_header(text: str) -> str:
    """A span's text from its document's own words. A file's first chunk starts with its header ("### name"), and
    the first chunk fed in a turn with the chat format's last tokens too (the carry: "document.\nuser\n" after a
    Qwen system prompt), both the context's, not the document's: a snippet showed "document. user ### spec.pdf"."""
    match = FILE_HEADER.search(text)
    return text[match.end():] if match and match.start() <= CARRY_CHARS else text


@dataclass(frozen=True)
class ContextText:
    """Token ids and the spans over them, read as text with ``tokenizer``."""

    tokenizer: object
    token_ids: Sequence[int]
    spans: SpanIndex

    def span_text(self, span: Span) -> str:
        return self._decode(span.start, span.end)

    def snippet(self, position: int, span: Span) -> str:
        """The passage's text around ``position``, as the model read it (decoded from the tokens), from its
        document's own words on (words_start), less the page markers the model reads: the citation's label names
        the page. A marker the window cuts is left out whole: "…239) --- 239 12 Errors" was shown."""
        first, last = self.words_start(span), self._carried_end(span)
        lo = max(first, position - SNIPPET_BEFORE)
        hi = min(span.end, max(position, first) + SNIPPET_AFTER)
        hi = last if hi == span.end else hi
        wide_lo, wide_hi = max(first, lo - MARKER_TOKENS), min(last, hi + MARKER_TOKENS)
        text = self._decode(wide_lo, wide_hi)
        start, end = len(self._decode(wide_lo, lo)), len(text) - len(self._decode(hi, wide_hi))
        for marker in PAGE_MARKER.finditer(text):
            if marker.start() < start < marker.end():
                start = marker.end()
            if marker.start() < end < marker.end():
                end = marker.start()
        shown = " ".join(without_page_markers(text[start:max(start, end)]).split())
        return ("…" if lo > first else "") + shown + ("…" if hi < span.end else "")

    def _carried_end(self, span: Span) -> int:
        """Where ``span``'s last word ends: it was fed with the next document span (citations.CARRIED_TOKENS), so
        a snippet that reaches the span's end would stop a word short ("…was later changed to"). The span's end
        when nothing follows or the word does not end within CARRIED_TOKENS."""
        following = self.spans.at(span.end)
        if following is None or following.kind != SpanKind.DOCUMENT:
            return span.end
        text = ""
        for position in range(span.end, min(following.end, span.end + CARRIED_TOKENS)):
            piece = self._decode(position, position + 1)
            if text.strip() and piece[:1].isspace():
                return position
            text += piece
            if text.strip() and text[-1].isspace():
                return position + 1
        return span.end

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self.token_ids[start:end], skip_special_tokens=True)

    def _pieces(self, start: int, end: int) -> list[str]:
        """Each token of ``[start, end)`` decoded alone: where in a passage a word is (lexical.matched_terms)."""
        return [self.tokenizer.decode([t]) for t in self.token_ids[start:end]]

    def words_start(self, span: Span) -> int:
        """The first token of ``span`` after its file's header and what the chat format carried before it
        (words_after_header), or its start where it has neither."""
        decode = self.tokenizer.decode
        reach = min(span.end, span.start + HEADER_TOKENS)
        head = decode(self.token_ids[span.start:reach], skip_special_tokens=True)
        header_end = len(head) - len(words_after_header(head))
        if not header_end:
            return span.start
        return next((t for t in range(span.start + 1, reach)
                     if len(decode(self.token_ids[span.start:t], skip_special_tokens=True)) >= header_end), reach)

    def question_words_in(self, start: int, end: int, question: str) -> dict[int, float]:
        """Positions in ``[start, end)`` whose word is one of the question's (lexical.token_matches)."""
        return {start + i: 1.0 for i, hit in enumerate(token_matches(self._pieces(start, end), question)) if hit}

    def answered_at(self, citations: CitationReport, question: str, answer: str) -> int | None:
        """Where, in what the reader was quoted of the first source's page, the answer's own words are densest: the
        words of two letters or more it uses that the question did not, each term weighing one in all the quotes
        however often it is there, so a rare one leads (realmin's "1.1755e-38", not the "approximately" that
        realmax's sentence before it shares with the question; "finish.m", not "function" twice in the paragraph
        after). None where the quotes hold none of those words."""
        own = {t for t in terms(answer) if len(t) > 1} - set(terms(question)) - ABOUT_THE_QUOTES  # "e" of "1e-5"
        if not citations.citations or not own:
            return None
        page = citations.citations[0].where.page_only()
        # Not the next chunk's words a quote reads on to (citations.CARRIED_TOKENS): the snippet is of this one's span.
        parts = [(lo, min(hi, self._carried_end(self.spans.at(lo)))) for lo, hi in citations.quote_spans]
        found = {(lo, hi): matched_terms(self._pieces(lo, hi), own) for lo, hi in parts}
        tokens_of = Counter(term for terms_found in found.values() for term in terms_found)  # in all the quotes
        best, at = 0.0, None
        for (lo, hi), where in zip(parts, citations.quote_sources):
            if where.page_only() != page:
                continue
            relevance = {lo + i: 1.0 / tokens_of[term] for i, term in enumerate(found[lo, hi]) if term is not None}
            start, end = densest_window(relevance, lo, hi, SNIPPET_BEFORE + SNIPPET_AFTER)
            mass = sum(weight for position, weight in relevance.items() if start <= position < end)
            if mass > best:  # the snippet is of the chunk's span, which shows its last word (snippet)
                best, at = mass, min(start + SNIPPET_BEFORE, self.spans.at(lo).end - 1)
        return at

    def quoted_turn(self, question: str, citations: CitationReport) -> str:
        """The user turn the answer is drawn from: the best chunks' quoted parts, then the question. Without the
        page markers the context holds: each quote is labelled with its page, and a marker quoted was answered
        back ("--- page 34 (30) ---" in an answer about counting dashes). Not with the outline's heading its chunk
        falls under: told it, the 1.5B answered 4 fewer of 62 questions about outlined PDFs, and none more
        (docs/answers.md); ranking reads it, and a source shows it."""
        excerpts = []
        for (lo, hi), where in zip(citations.quote_spans, citations.quote_sources):
            text = self.tokenizer.decode(self.token_ids[lo:hi], skip_special_tokens=True)
            excerpts.append((where.label(), without_page_markers(text)))
        return quoted_question(excerpts, question)
