"""What the context engine (context.py) takes and gives: its errors, the pieces and plans it feeds, its undo points and
turns, and the events of an answer. Kept apart so the engine's file holds the engine."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from ingest import Provenance

from .chat_format import Carry, TurnState
from .citations import CitationReport
from .generation import Finish
from .history import Exchange
from .spans import SpanKind


class EngineError(Exception):
    """A refused or failed operation; the context is unchanged. The message is for the user."""


class Stopped(EngineError):
    def __init__(self, during: str):
        super().__init__(f"Stopped during {during}; the context is back where it was before.")
        self.during = during


class ContextFull(EngineError):
    pass


class ContextOutOfMemory(EngineError):
    pass


class DocumentChunk(Protocol):
    """What the engine needs of an ingested chunk (``ingest.Chunk`` has it): its text and where it came from."""

    text: str
    where: Provenance


@dataclass(frozen=True)
class Piece:
    """Tokens to feed, the span they will occupy, and the turn state and carry once they are fed."""

    ids: list[int]
    kind: SpanKind
    state: TurnState
    carry: Carry = Carry()
    chunk: DocumentChunk | None = None


@dataclass(frozen=True)
class DocumentPlan:
    """Documents as they would be fed now: the pieces (with the opening a turn needs), and the context they
    were planned against (a plan is only fed unchanged while the context has not moved since)."""

    pieces: tuple[Piece, ...]
    version: tuple[int, int]

    @property
    def tokens(self) -> int:
        return sum(len(p.ids) for p in self.pieces)

    @property
    def chunks(self) -> list:
        return [p.chunk for p in self.pieces if p.chunk is not None]

    def tokens_by_source(self) -> dict[str, int]:
        """Document tokens per file; the opening's tokens are under None."""
        totals: dict = {}
        for piece in self.pieces:
            source = piece.chunk.where.source if piece.chunk is not None else None
            totals[source] = totals.get(source, 0) + len(piece.ids)
        return totals


@dataclass(frozen=True)
class Saved:
    """A consistent state of the context: cache snapshot, token count, spans, turn state, logits."""

    snapshot: object
    n_tokens: int
    n_spans: int
    state: TurnState
    carry: Carry  # text held back for the next piece, and the end of the text fed (see chat_format)
    n_turns: int
    n_history: int
    logits: object = None  # next-token logits, kept only right after a question's prefill


@dataclass
class Turn:
    """An answered question: states before the question and between question and answer (regenerate), and
    the sources its question's recall found (an answer drawn again cites the same question). Only the first
    turn's ``before`` (clearing the chat) and the last turn's states (regenerate) are kept: each holds the window
    as it was, so keeping every turn's would grow memory by a window per question (``_keep_undo_points``)."""

    before: Saved | None
    after_question: Saved | None
    citations: CitationReport
    question_tokens: int  # the question as the context keeps it (its opening, the question, the answer's header)
    end: int = 0  # context length after the answer's </s> (set as the answer is committed: ContextEngine._answer)
    quoted: str = ""  # the user turn the answer was drawn from when it quoted sources (quoting.py), read in a
    # context of its own (AnswerReader): regenerate reads it there again
    earlier: Exchange | None = None  # the exchange the reader held before that turn (reader.py)


class AnswerStage(StrEnum):
    """What an answer reads before its first token: the passage the model guesses the documents hold (guess.py),
    the question, into the session's context (its recall ranks the sources), then the quoted passages with the
    question, in the answer's own reader (reader.py). On a CPU without bfloat16 units the last took about a minute
    for the 1.5B: the user is shown which passages, and how far."""

    GUESS = "guess"
    QUESTION = "question"
    QUOTES = "quotes"


@dataclass(frozen=True)
class AnswerProgress:
    """How far an answer's reading before its first token has come (``stage``)."""

    stage: AnswerStage
    done: int  # tokens of this stage read so far
    total: int  # tokens this stage reads
    seconds: float  # since this stage began
    context_tokens: int = 0  # QUESTION: the context the question is read into
    rate: float = 0.0  # tokens/s so far, once it means something (metrics.RateMeter); 0: not yet
    eta_s: float | None = None  # seconds left at that rate
    sources: tuple[Provenance, ...] = ()  # QUOTES: the passages quoted, best first (none: the question alone)
    text: str = ""  # GUESS: the passage written so far


@dataclass(frozen=True)
class AnswerDelta:
    text: str
    tokens: int
    ttft_s: float | None


@dataclass(frozen=True)
class AnswerResult:
    text: str
    tokens: int
    finish: Finish
    citations: CitationReport
    ttft_s: float
    prefill_tps: float
    decode_tps: float
    question_tokens: int
    answer_ids: tuple[int, ...] = ()  # as sampled, without the end of turn (history.Exchange)
    quoted: bool = False  # drawn with the first source quoted before the question, recall off (quoting.py)
    # Asked while documents were fed (ContextEngine.ask_while_feeding): the turn to keep once the context reads the
    # question and the answer after them (read_answered), whose quotes draw it again. None for any other answer.
    while_feeding: "Turn | None" = None
    guess: str = ""  # the passage the sources were also searched with (guess.py); none when it was not written
