"""Split section text into prefill/citation chunks at natural boundaries.

langchain's RecursiveCharacterTextSplitter picks the boundaries (class and
function starts for code via from_language, paragraphs and sentences for
prose) and measures length with the model's tokenizer.  We keep only the
boundaries: chunk k is text[start_k:start_k+1], so chunks tile the text
exactly and concatenating them gives back the section, byte for byte.

In prose a chunk never ends with a heading (``headings_start_chunks``): the
splitter cuts at the blank line after "7.1.1.3 SHA512" or
"--track-origins=<yes|no> [default: no]" as readily as before it, and the
heading then stands in one chunk and the words it names in the next.
"""

from __future__ import annotations

from typing import Any, Callable

from .languages import PROSE_LANGUAGES, splitter_languages

PROSE_SEPARATORS = ["\n\n", "\n", ". ", " ", ""]
# A chunk's last paragraph on one line of at most this many characters, not ending a sentence, is a heading or a
# lead-in ("Each match element has a number of attributes:"): it starts the next chunk instead. Such a line moves a
# chunk boundary in 65 of the Valgrind manual's 488 within a page, 24 of the Nettle manual's 167.
HEADING_CHARS = 100


class Splitter:
    """Token-measured splitters for one ingest call, one per language."""

    def __init__(self, chunk_tokens: int, length: Callable[[str], int]) -> None:
        if chunk_tokens <= 0:
            raise ValueError("chunk_tokens must be > 0")
        self.chunk_tokens = chunk_tokens
        self.length = length
        self._by_language: dict[str, Any] = {}

    def _for(self, language: str):
        if language not in self._by_language:
            from langchain_text_splitters import Language, RecursiveCharacterTextSplitter

            common = dict(chunk_size=self.chunk_tokens, chunk_overlap=0, length_function=self.length,
                          strip_whitespace=False)
            if language in splitter_languages():
                splitter = RecursiveCharacterTextSplitter.from_language(Language(language), **common)
            else:
                splitter = RecursiveCharacterTextSplitter(separators=PROSE_SEPARATORS, **common)
            self._by_language[language] = splitter
        return self._by_language[language]

    def spans(self, text: str, language: str) -> list[tuple[int, int]]:
        """(start, end) offsets of consecutive chunks covering all of `text`. A prose chunk may run over the
        token budget by the heading it starts with."""
        spans = split_spans(text, self._for(language).split_text(text) if text else [])
        return headings_start_chunks(text, spans) if language in PROSE_LANGUAGES else spans


def headings_start_chunks(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` with each boundary that follows a heading moved to before it: a chunk whose last paragraph is one
    short line that does not end a sentence (HEADING_CHARS) gives it to the next chunk, which then holds the
    heading and what it heads: a question naming an option finds the paragraph that explains it, and a quote of
    that paragraph says what it is about. A chunk that is only such a line keeps it."""
    moved = list(spans)
    for i in range(len(moved) - 1):
        start, end = moved[i]
        body = text[start:end].rstrip()
        cut = body.rfind("\n\n")
        heading = body[cut + 2:].strip()
        if (cut < 0 or not body[:cut].strip() or not heading or "\n" in heading or len(heading) > HEADING_CHARS
                or heading.endswith((".", "!", "?"))):
            continue
        moved[i] = (start, start + cut)
        moved[i + 1] = (start + cut, moved[i + 1][1])
    return moved


def split_spans(text: str, pieces: list[str]) -> list[tuple[int, int]]:
    """Chunk offsets from splitter pieces: each piece start becomes a boundary."""
    if not text:
        return []
    starts = [0]
    cursor = 0
    for piece in pieces:
        if not piece:
            continue
        at = text.find(piece, cursor)
        if at < 0:  # splitter changed the text (should not happen): keep what we have
            break
        if at > starts[-1]:
            starts.append(at)
        cursor = at + len(piece)
    return [(a, b) for a, b in zip(starts, starts[1:] + [len(text)]) if b > a]
