"""A passage the model writes before the documents are searched: the manual's likely words for a question asked in
the user's own (the idea of HyDE and query2doc), searched with beside the question (lexical.ChunkIndex.scores).

Why: asked "which variable makes bash log itself out when nobody has typed anything?", BM25 finds nothing, for the
manual says ``TMOUT`` and "idle"; the model, before reading anything, writes "… is `TMOUT`". Over the development
set's 306 questions, BM25's first four chunks held the answer for 255 with the passage's words at half the
question's weight, 244 without; its first chunk 194 against 191; on the five language and library manuals (70
questions), the nearest in kind to R's, 50 against 44 and 35 against 29 (``benchmarks.first_chunks --written``,
docs/answers.md). The passage is often wrong in its specifics: it only chooses what is quoted, and the answer is
drawn from the quotes, never from it.

It costs a short decode before the first token (its median is 22 tokens: about 3 s for the 1.5B on two CPU
threads), so the Settings panel can turn it off (``GenerationSettings.guess``).
"""

from __future__ import annotations

from typing import Generator

from .chat_format import ChatFormat
from .context_records import AnswerProgress, AnswerStage, Stopped
from .history import Exchange
from .layer_stop import StoppedMidForward
from .metrics import Feeding, LiveStats, RateMeter
from .reader import AnswerReader
from .runtime import ModelRuntime

SYSTEM = ("You write the passage of a software manual that answers the user's question: two or three sentences "
          "in the manual's own terms, naming the options, functions and values it would name. No preamble.")
# At most this many tokens: 12 of the 306 passages reached it; their first 32 tokens alone found 253 and 192.
GUESS_TOKENS = 64


def write_guess(runtime: ModelRuntime, format: ChatFormat, question: str, earlier: Exchange | None, owner: object,
                stats: LiveStats, cancel=None) -> Generator[AnswerProgress, None, str]:
    """The passage, greedy, in a reader of its own (the guess system prompt, the ``earlier`` exchange, the
    question): its progress is yielded before each token; Stop ends it within one token."""
    reader = AnswerReader(runtime, owner, stats)
    ids = reader.opening(format, SYSTEM, question, earlier)
    stats.prefilling(Feeding.GUESS, len(ids))
    yield AnswerProgress(AnswerStage.GUESS, 0, GUESS_TOKENS, 0.0)
    written: list[int] = []
    meter = RateMeter()
    try:
        logits = reader.feed(ids, cancel)
        stats.prefilling(Feeding.GUESS, GUESS_TOKENS)  # the activity box counts the tokens written from here on
        while len(written) < GUESS_TOKENS:
            if cancel is not None and cancel.is_set():
                raise Stopped(Feeding.GUESS)
            token = int(logits.argmax())
            if token in format.stop_ids:
                break
            written.append(token)
            stats.done = len(written)
            yield AnswerProgress(AnswerStage.GUESS, len(written), GUESS_TOKENS, meter.elapsed, rate=meter.rate,
                                 text=format.decode_answer(written))
            logits = reader.feed([token], cancel)
            meter.add(1)
    except StoppedMidForward:
        raise Stopped(Feeding.GUESS) from None
    return format.decode_answer(written)
