"""A question's length is capped, and checked the moment it is asked, before it waits for the model.

An answer holds the shared model from its question's first token to its last (engine/model_gate.py): a 31.5 KB
question held it for 221 s while another user waited. Documents are read a chunk at a time and step aside for
other users' answers, so long text belongs in a file; a question longer than --max-question-tokens is refused
at once, saying so, and nothing of it is queued.
"""

from __future__ import annotations

import copy
import threading

MAX_CHARS_PER_TOKEN = 64  # text longer than the cap times this cannot fit: refused without being tokenised


class QuestionLimit:
    def __init__(self, tokenizer, max_tokens: int):
        self.max_tokens = max_tokens
        # Its own copy, used under a lock: the model queue encodes with the runtime's meanwhile, and a Rust
        # tokenizer must not be shared across threads (runtime.py).
        self._tokenizer = copy.deepcopy(tokenizer)
        self._lock = threading.Lock()

    def tokens(self, question: str) -> int:
        with self._lock:
            return len(self._tokenizer(question, add_special_tokens=False)["input_ids"])

    def refusal(self, question: str) -> str | None:
        """Why ``question`` is too long to ask (None when it is not), for the user."""
        if len(question) > self.max_tokens * MAX_CHARS_PER_TOKEN:
            length = f"{len(question):,} characters long"
        else:
            tokens = self.tokens(question)
            if tokens <= self.max_tokens:
                return None
            length = f"{tokens:,} tokens long"
        return (f"This question is {length}; a question may have at most {self.max_tokens:,} tokens "
                "(--max-question-tokens). Attach long text as a file instead: a document is read a chunk at a "
                "time, and other users' answers go between its chunks.")
