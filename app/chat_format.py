"""The Llama-2 chat format as append-only token pieces.

The whole session is one token stream that only grows:

    <s>[INST] <<SYS>>\\n{system}\\n<</SYS>>\\n\\n{documents...}{question} [/INST] {answer} </s><s>[INST] ...

Pieces are encoded one at a time, yet should give the tokens the chat template gives for the whole text,
so the model sees what it was fine-tuned on. With byte-level BPE (the demo model) whitespace at the end of
a piece would merge differently than before the text that follows it ("\\n\\n" alone is one token, before a
word it is two), so a piece's trailing whitespace is carried over and encoded with the next piece.
SentencePiece tokenizers (Llama-2) start every separately encoded piece at a word boundary of their own;
there pieces keep their whitespace, as Meta's reference code encodes each turn on its own.
"""

from __future__ import annotations

from enum import Enum


class TurnState(Enum):
    """Where the token stream stands, which decides how the next piece starts."""

    EMPTY = "empty"  # nothing fed yet
    IN_TURN = "in_turn"  # inside an open user turn
    CLOSED = "closed"  # the last answer ended with </s>: a new "<s>[INST]" must open the next turn


class ChatFormat:
    """Token pieces of the Llama-2 chat format for one tokenizer.

    Every method that ends a piece returns the whitespace ``carry`` owed to the next piece.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.bos = tokenizer.bos_token_id
        self.eos = tokenizer.eos_token_id
        if self.bos is None or self.eos is None:
            raise ValueError("the tokenizer needs <s> and </s> tokens for the Llama-2 chat format")
        first = tokenizer.convert_ids_to_tokens(self.encode("a"))[0]
        self.sentencepiece = first.startswith("\u2581")  # "▁a": the tokenizer marks word boundaries itself

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def _split(self, text: str) -> tuple[str, str]:
        """(text to encode now, whitespace to carry): a single final newline stays, it never merges."""
        if self.sentencepiece:
            return text, ""
        body = text.rstrip()
        trailing = text[len(body):]
        if trailing == "\n" or not body:
            return text, ""
        return body, trailing

    def start(self, system: str) -> tuple[list[int], str]:
        """The first piece of a context: BOS, "[INST]" and the system block when there is one."""
        system = system.strip()
        if system:
            text, carry = self._split(f"[INST] <<SYS>>\n{system}\n<</SYS>>\n\n")
        else:
            text, carry = "[INST]", ("" if self.sentencepiece else " ")
        return [self.bos, *self.encode(text)], carry

    def open_turn(self) -> tuple[list[int], str]:
        """A new user turn after a closed answer."""
        return [self.bos, *self.encode("[INST]")], ("" if self.sentencepiece else " ")

    def document(self, text: str, carry: str) -> tuple[list[int], str]:
        """Document text inside the open user turn."""
        if carry == " ":  # right after "[INST]": the template writes "[INST] " + content.strip()
            text = text.lstrip()
        body, carry = self._split(carry + text)
        return self.encode(body), carry

    def question(self, text: str, carry: str) -> list[int]:
        """The question that closes the user turn with " [/INST]"; the answer follows."""
        return self.encode(f"{carry}{text.strip()} [/INST]")

    def close_answer(self) -> list[int]:
        return [self.eos]

    def decode_answer(self, ids: list[int]) -> str:
        """Answer text so far; drops a trailing half-decoded multi-byte character while streaming."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text.rstrip("\ufffd").strip()
