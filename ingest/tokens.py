"""Token counting with the model's tokenizer, or a cheap estimate without one.

The estimate keeps ingest usable without torch/transformers (CLI, tests,
progress before the model is loaded).  It mimics a Llama SentencePiece
tokenizer: ASCII words cost 1 token plus 1 per 4 letters beyond the fourth,
every digit, punctuation mark, newline and non-ASCII character costs 1,
every run of 2+ spaces/tabs (indentation) costs 1, and a single space is
free (it merges into the next word).  Typical error is within ~25% on English
prose and source code; use a real tokenizer when the number matters.
"""

from __future__ import annotations

import re
from typing import Any, Callable

_WORD = re.compile(r"[A-Za-z]+")
_DIGIT = re.compile(r"[0-9]")
_PUNCT = re.compile(r"[!-/:-@\[-`{-~]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_INDENT = re.compile(r"[ \t]{2,}")


def estimate_tokens(text: str) -> int:
    """Approximate Llama token count of `text` (see module docstring)."""
    if not text:
        return 0
    words = _WORD.findall(text)
    letters = sum(map(len, words))
    word_tokens = len(words) + max(0, letters - 4 * len(words)) // 4
    return (
        word_tokens
        + len(_DIGIT.findall(text))
        + len(_PUNCT.findall(text))
        + len(_NON_ASCII.findall(text))
        + len(_INDENT.findall(text))
        + text.count("\n")
    )


class TokenCounter:
    """Counts tokens with `tokenizer.encode(text, add_special_tokens=False)`.

    Without a tokenizer it falls back to estimate_tokens; `exact` tells which.
    """

    def __init__(self, tokenizer: Any | None = None) -> None:
        self.tokenizer = tokenizer
        self.exact = tokenizer is not None
        self._count: Callable[[str], int] = self._encode_len if tokenizer is not None else estimate_tokens

    def _encode_len(self, text: str) -> int:
        if not text:
            return 0
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def __call__(self, text: str) -> int:
        return self._count(text)
