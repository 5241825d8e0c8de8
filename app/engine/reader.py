"""The short context an answer is drawn in: the system prompt, the conversation's last exchange, the quoted passages
and the question, and nothing else (quoting.py says why the passages are quoted).

Drawn after the conversation instead, a small model copies its previous answers: SmolLM2 answered all twelve
questions about a zipped package "The answer is: 2022-03-24", its first answer, though the right passage was
quoted to it (issue "Right answers"). A reader holds what one answer needs; the session's context then reads
the question and the answer, so the conversation, and recall over it, stay whole for the next question.
"""

from __future__ import annotations

import torch

from .chat_format import ChatFormat
from .history import Exchange
from .metrics import LiveStats
from .runtime import ModelRuntime


# The earlier question and answer are each kept to their first this many tokens: the quotes take three quarters of
# the reader's window (quoting.quote_budget), and a follow-up needs the subject, not a long answer's every line.
EARLIER_TOKENS = 128


def _first_tokens(format: ChatFormat, text: str) -> str:
    ids = format.tokenizer.encode(text, add_special_tokens=False)
    return text if len(ids) <= EARLIER_TOKENS else format.tokenizer.decode(ids[:EARLIER_TOKENS])


class AnswerReader:
    """A fresh cache of the shared model, fed without recall; ``logits``: after the last token fed."""

    def __init__(self, runtime: ModelRuntime, owner: object, stats: LiveStats | None = None):
        self.runtime, self.owner, self.stats = runtime, owner, stats  # owner: the session's turn at the model
        self.cache = runtime.new_cache()
        self.decoder = runtime.decoder_for(self.cache)
        self.logits: torch.Tensor | None = None
        self.length = 0

    @staticmethod
    def opening(format: ChatFormat, system_prompt: str, user_turn: str, earlier: Exchange | None = None) -> list[int]:
        """The tokens of the system block, the ``earlier`` exchange (the conversation's last question and its
        answer, as they were asked and answered), then ``user_turn`` as a question with the answer's header.

        The earlier exchange is what a follow-up needs: "and what does it return?" names its subject there.
        Only the last one, and without its quotes: a short context that holds what this answer needs."""
        ids, carry = format.start(system_prompt)
        if earlier is not None:
            asked, carry = format.question(_first_tokens(format, earlier.question), carry)
            answer = list(earlier.answer_ids[:EARLIER_TOKENS])
            closing, carry = format.close_answer(answer, carry)
            opened, carry = format.open_turn(carry)
            ids = [*ids, *asked, *answer, *closing, *opened]
        question, _ = format.question(user_turn, carry)
        return [*ids, *question]

    def feed(self, ids: list[int], cancel=None) -> torch.Tensor:
        """Read ``ids``; once ``cancel`` is set, several tokens stop between layers (runtime.forward)."""
        self.logits = self.runtime.forward(ids, self.cache, topk=0, stats=self.stats, decoder=self.decoder,
                                           owner=self.owner, cancel=cancel)
        self.length += len(ids)
        return self.logits
