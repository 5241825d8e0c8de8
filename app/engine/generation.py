"""Choosing the next token: greedy at temperature 0, otherwise temperature, top-p and repetition penalty.

The app runs its own decode loop (one forward per token) so Stop can halt within one token and every
token can be streamed; this module is only the per-token choice.  The penalty, temperature and top-p are
transformers' own logits processors, the ones ``generate()`` uses, applied to one row of logits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Callable, Sequence

import torch
from transformers.generation.logits_process import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopPLogitsWarper)


@dataclass(frozen=True)
class GenerationSettings:
    """What the Settings panel controls for one answer."""

    temperature: float = 0.0
    top_p: float = 0.9
    max_new_tokens: int = 512
    repetition_penalty: float = 1.0
    recall: bool = True  # top-k middle-token recall while reading the question (and answering, unless quoting)
    topk: int = 5
    quote: bool = True  # quote the top source before the question and answer without recall (quoting.py)
    guess: bool = True  # search with a passage the model writes first, beside the question's words (guess.py)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.topk < 0:
            raise ValueError("topk must be >= 0")

    @property
    def answer_topk(self) -> int:
        return self.topk if self.recall else 0

    @classmethod
    def from_ui(cls, temperature, top_p, max_new_tokens, repetition_penalty, recall, topk,
                quote=True, guess=True) -> "GenerationSettings":
        """Settings from slider/checkbox values (floats from JSON clients included)."""
        return cls(
            temperature=float(temperature), top_p=float(top_p), max_new_tokens=int(max_new_tokens),
            repetition_penalty=float(repetition_penalty), recall=bool(recall), topk=int(topk), quote=bool(quote),
            guess=bool(guess),
        )


def _processors(settings: GenerationSettings) -> LogitsProcessorList:
    """The logits processors ``generate()`` would use for these settings, in its order; none that do nothing."""
    processors = LogitsProcessorList()
    if settings.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(float(settings.repetition_penalty)))
    if settings.temperature > 0:
        processors.append(TemperatureLogitsWarper(float(settings.temperature)))
        if settings.top_p < 1.0:  # keeps the smallest top set holding >= top_p of the mass (at least one token)
            processors.append(TopPLogitsWarper(float(settings.top_p)))
    return processors


def next_token_scores(logits: torch.Tensor, answer_so_far: list[int], settings: GenerationSettings) -> torch.Tensor:
    """``logits`` (vocab,) after the processors: what next_token picks from; -inf for tokens top-p removed.

    The processors see only this answer's tokens as the "input ids", never the documents: penalising
    every token of a 300-page context would stop the model from quoting it.
    """
    answer = torch.tensor(answer_so_far, dtype=torch.long, device=logits.device).reshape(1, -1)
    return _processors(settings)(answer, logits.unsqueeze(0))[0]


def next_token(logits: torch.Tensor, answer_so_far: list[int], settings: GenerationSettings,
               generator: torch.Generator | None = None) -> int:
    """One token id from float32 ``logits`` (vocab,): the best at temperature 0, else sampled with ``generator``."""
    scores = next_token_scores(logits, answer_so_far, settings)
    if settings.temperature == 0:
        return int(scores.argmax())
    return int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator))


class Finish(StrEnum):
    """How an answer's decode stopped; the value is what an answer's saved numbers say (``stats["finish"]``)."""

    EOS = "eos"  # the model ended its turn
    LENGTH = "length"  # max new tokens, or the context budget
    REPETITION = "repetition"  # it began to repeat itself (LoopGuard)


@dataclass(frozen=True)
class Decoded:
    """What a decode drew: the tokens sampled (without the end of turn), how it stopped, and its timings. What
    the context keeps of it is the caller's to decide (context.py)."""

    tokens: list[int]
    finish: Finish
    repeat_from: int | None  # where the repeat began (Finish.REPETITION: LoopGuard.repeat_from)
    ttft_s: float
    decode_tps: float  # the sampling's rate, not what follows it

    @property
    def fed(self) -> int:
        """Tokens fed back while decoding: all of them, unless it stopped on a token it sampled (never fed)."""
        return len(self.tokens) if self.finish is Finish.EOS else len(self.tokens) - 1


class LoopGuard:
    """Ends an answer that repeats itself: small models (SmolLM2-135M) often restate a sentence until max tokens.

    An answer that has produced the same ``n`` tokens twice is looping; stopping there saves the user the
    rest and the context the tokens, and cutting the second copy off shows the answer once. O(1) per token:
    the answer's n-grams are kept in a set.
    """

    def __init__(self, n: int = 16):
        self.n = n
        self._seen: set[tuple[int, ...]] = set()

    def repeat_from(self, answer: list[int]) -> int | None:
        """Call after each token appended to ``answer``: once its last ``n`` tokens occurred before, where
        that second copy begins (the length of the answer worth keeping); None until then."""
        if self.n <= 0 or len(answer) < self.n:
            return None
        gram = tuple(answer[-self.n:])
        if gram in self._seen:
            return len(answer) - self.n
        self._seen.add(gram)
        return None


SENTENCE_ENDS = (".", "!", "?", "…", "。", "！", "？")
CLOSERS = "\"')]}”’»*`"  # after a sentence's end mark: "…it said." (see p. 3). **Bold.**
LIST_MARKER = re.compile(r"(?:^|\n)[ \t]*\d+\.$")  # "2." opening a numbered item ends no sentence


def whole_sentences(answer: Sequence[int], decode: Callable[[Sequence[int]], str]) -> int:
    """How much of ``answer`` (a token count) to keep when it is cut short mid-way: up to the end of its last
    whole sentence or line, without the blank space after it, so the user is not left with "The document is
    not"; all of it where no sentence or line ends in it. ``decode`` turns tokens into text."""
    for keep in range(len(answer), 0, -1):
        text = decode(answer[:keep])
        if _ends_a_sentence_or_line(text):
            while keep > 1 and decode(answer[: keep - 1]).rstrip() == text.rstrip():
                keep -= 1
            return keep
    return len(answer)


def _ends_a_sentence_or_line(text: str) -> bool:
    if text.rstrip(" \t").endswith("\n"):
        return True
    text = text.rstrip().rstrip(CLOSERS)
    return text.endswith(SENTENCE_ENDS) and not LIST_MARKER.search(text)
