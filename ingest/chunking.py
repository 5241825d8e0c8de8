"""Split section text into prefill/citation chunks at natural boundaries.

langchain's RecursiveCharacterTextSplitter picks the boundaries (class and
function starts for code via from_language, paragraphs and sentences for
prose) and measures length with the model's tokenizer.  We keep only the
boundaries: chunk k is text[start_k:start_k+1], so chunks tile the text
exactly and concatenating them gives back the section, byte for byte.

A chunk never ends with what introduces the next one (``heads_start_chunks``):
the splitter cuts at the blank line after a heading ("7.1.1.3 SHA512",
"--track-origins=<yes|no> [default: no]") as readily as before it, and at
"\nclass " after "@dataclass(frozen=True)" or the comment above a function;
the heading or the decorator then stood in one chunk and what it heads in the
next.
"""

from __future__ import annotations

from typing import Any, Callable

from .languages import PROSE_LANGUAGES, splitter_languages

PROSE_SEPARATORS = ["\n\n", "\n", ". ", " ", ""]
# A chunk's last paragraph on one line of at most this many characters, not ending a sentence, is a heading or a
# lead-in ("Each match element has a number of attributes:"): it starts the next chunk instead. Such a line moves a
# chunk boundary in 65 of the Valgrind manual's 488 within a page, 24 of the Nettle manual's 167.
HEADING_CHARS = 100
# ... or a short block of such lines: a definition's signatures ("realmin\nrealmin (n)\nrealmin (n, m)", texinfo's
# "[Function]" and its prototype), a heading broken over two lines. At most this many.
HEADING_LINES = 6
# In code, a chunk's last lines that are comments or decorators, with no blank line after them, belong to the
# definition the next chunk starts with: at most this many lines. The splitter left them behind at 15 of 336 chunk
# boundaries of 34 modules (argparse, http.cookiejar, tarfile, h11's, twenty of asyncio's): h11's
# "@dataclass(init=False, frozen=True)" ended the chunk before each event class.
LEADING_LINES = 12
LEADING_MARKS = ("#", "//", "/*", "*", "@")  # comments in most languages; decorators, annotations, Rust attributes


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
        """(start, end) offsets of consecutive chunks covering all of `text`. A chunk may run over the token
        budget by the heading, comments or decorators it starts with (``heads_start_chunks``)."""
        spans = split_spans(text, self._for(language).split_text(text) if text else [])
        return heads_start_chunks(text, spans, prose=language in PROSE_LANGUAGES)


def heads_start_chunks(text: str, spans: list[tuple[int, int]], prose: bool) -> list[tuple[int, int]]:
    """``spans`` with each boundary that follows what introduces the next chunk moved to before it: in ``prose`` a
    heading (``heading_start``), in code comments and decorators (``leading_lines_start``). The next chunk then
    holds the heading and what it heads: a question naming an option finds the paragraph that explains it, a
    quote of that paragraph says what it is about, and a class is cited with its decorator. A chunk that is only
    such lines (and blank lines) joins the next."""
    moved = list(spans)
    find = heading_start if prose else leading_lines_start
    for i in range(len(moved) - 1):
        start, end = moved[i]
        cut = find(text[start:end], text[end:end + 2])
        if cut is not None:
            cut = cut if text[start:start + cut].strip() else 0
            moved[i] = (start, start + cut)
            moved[i + 1] = (start + cut, moved[i + 1][1])
    return [(a, b) for a, b in moved if b > a]


def heading_start(body: str, after: str) -> int | None:
    """Where ``body``'s last paragraph starts (its blank line) when it heads what follows: at most HEADING_LINES
    lines of at most HEADING_CHARS, none ending a sentence. (What comes ``after`` it does not matter.)"""
    body = body.rstrip()
    cut = body.rfind("\n\n")
    heading = body[cut + 2:].strip()
    if cut < 0 or not heading:
        return None
    lines = heading.split("\n")
    if len(lines) > HEADING_LINES or any(len(line) > HEADING_CHARS or line.rstrip().endswith((".", "!", "?"))
                                         for line in lines):
        return None
    return cut


def leading_lines_start(body: str, after: str) -> int | None:
    """Where ``body``'s last lines start (the line break before them) when they are at most LEADING_LINES comments
    or decorators that run on into the next chunk (``after``, its start: no blank line between)."""
    if body.endswith("\n") or after == "\n\n":
        return None
    lines = body.split("\n")
    count = 0
    while count < min(LEADING_LINES, len(lines) - 1) and lines[-1 - count].lstrip().startswith(LEADING_MARKS):
        count += 1
    if not count or lines[-1 - count].lstrip().startswith(LEADING_MARKS):
        return None  # none, or more than LEADING_LINES: a block of its own
    return len("\n".join(lines[:-count]))


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
