"""Split section text into prefill/citation chunks at natural boundaries.

langchain's RecursiveCharacterTextSplitter picks the boundaries (class and
function starts for code via from_language, paragraphs and sentences for
prose) and measures length with the model's tokenizer.  We keep only the
boundaries: chunk k is text[start_k:start_k+1], so chunks tile the text
exactly and concatenating them gives back the section, byte for byte.
"""

from __future__ import annotations

from typing import Any, Callable

from .languages import splitter_languages

PROSE_SEPARATORS = ["\n\n", "\n", ". ", " ", ""]


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
        """(start, end) offsets of consecutive chunks covering all of `text`."""
        return split_spans(text, self._for(language).split_text(text) if text else [])


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
