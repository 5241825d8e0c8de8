"""Any model's chat template as an append-only token stream.

The session is one conversation, fed as it happens: system prompt, then documents and a question inside
one user turn, the answer, then the next user turn. The tokens fed must be the tokens the tokenizer's own
chat template gives for the whole conversation (``apply_chat_template``), so the model sees exactly what it
was fine-tuned on, whatever the family (Llama-2 ``[INST]``, ChatML, Llama-3, Mistral).

Two ideas make that work without re-encoding anything already in the cache:

- The template's *markers* (the text around system, user and assistant content) are found once by
  rendering a conversation whose contents are sentinels and cutting the text at them.
- Text is encoded *in context*: a piece's tokens are those of ``anchor + piece`` minus those of ``anchor``,
  where the anchor is the end of the text already fed, so a word gets the tokens it has mid-sentence. The
  last word of a piece (and whitespace after it) is held back as ``pending`` until more text arrives,
  because it may merge with what follows ("\\n" + "\\n" is one token in some vocabularies).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

_SYSTEM, _USER1, _ANSWER1, _USER2, _ANSWER2 = "\ue000S\ue001", "\ue000U\ue001", "\ue000A\ue001", "\ue000V\ue001", "\ue000B\ue001"
ANCHOR_CHARS = 48
TAIL_CHARS = 4 * ANCHOR_CHARS  # the end of the fed text a Carry keeps, enough for any anchor


class TurnState(Enum):
    """Where the token stream stands, which decides how the next piece starts."""

    EMPTY = "empty"  # nothing fed yet
    IN_TURN = "in_turn"  # inside an open user turn (Carry.started: whether it has content yet)
    CLOSED = "closed"  # an answer ended with its end-of-turn token: the next user turn must be opened


@dataclass(frozen=True)
class Carry:
    """What the next piece must know of the stream: text held back, and the end of the text fed."""

    pending: str = ""
    tail: str = ""
    started: bool = False  # the open user turn has content (templates trim the content's start)


@dataclass(frozen=True)
class Markers:
    """The template's fixed text around contents, cut out of one rendering."""

    opening: str  # before the system prompt, or before the first user content when it has no system block
    system_to_user: str  # after the system prompt, before the first user content ("" without a system block)
    to_answer: str  # after user content: the generation prompt
    after_answer: str  # after the end-of-turn token that closes an answer, before the next user content
    end_of_turn: str  # the token text that closes an answer (<|im_end|>, <|eot_id|>, </s>)
    before_end: str  # text the template puts between an answer and its end-of-turn token (" " for Llama-2)
    answer_lead: str  # what the rendered answer opening adds to the generation prompt (" " for Llama-2)
    system_in_user: bool  # the template has no system role: the system prompt opens the first user content


def _cut(text: str, *sentinels: str) -> list[str]:
    parts = []
    for sentinel in sentinels:
        if text.count(sentinel) != 1:
            raise ValueError("the chat template does not render message contents verbatim")
        before, text = text.split(sentinel)
        parts.append(before)
    return parts + [text]


def find_markers(tokenizer) -> Markers:
    """Render a two-turn conversation of sentinels and read the template's markers off it."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template; pass a chat model (one with a chat_template)")

    def render(messages, generation_prompt=False) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    turns = [{"role": "user", "content": _USER1}, {"role": "assistant", "content": _ANSWER1},
             {"role": "user", "content": _USER2}, {"role": "assistant", "content": _ANSWER2}]
    try:
        text = render([{"role": "system", "content": _SYSTEM}, *turns])
        system_in_user = False
    except Exception:  # noqa: BLE001 - templates without a system role raise; the prompt then opens the user turn
        text = render(turns)
        system_in_user = True
    if system_in_user:
        opening, answer1_open, between, _, _ = _cut(text, _USER1, _ANSWER1, _USER2, _ANSWER2)
        system_to_user = ""
    else:
        opening, system_to_user, answer1_open, between, _, _ = _cut(text, _SYSTEM, _USER1, _ANSWER1, _USER2, _ANSWER2)
    end_of_turn = _end_of_turn(tokenizer, between)
    before_end, after_answer = between.split(end_of_turn, 1)
    first_user = [{"role": "user", "content": _USER1}]
    if not system_in_user:
        first_user.insert(0, {"role": "system", "content": _SYSTEM})
    to_answer = render(first_user, generation_prompt=True).split(_USER1, 1)[1]
    if not answer1_open.startswith(to_answer):
        raise ValueError(f"the generation prompt {to_answer!r} does not open the rendered answer {answer1_open!r}")
    return Markers(opening, system_to_user, to_answer, after_answer, end_of_turn, before_end,
                   answer1_open[len(to_answer):], system_in_user)


def _end_of_turn(tokenizer, between: str) -> str:
    """The first special token between an answer and the next user content: the answer's end-of-turn."""
    specials = sorted(set(tokenizer.all_special_tokens) | set(getattr(tokenizer, "added_tokens_encoder", {})),
                      key=len, reverse=True)
    for at in range(len(between)):
        for token in specials:
            if token and between.startswith(token, at):
                return token
    raise ValueError(f"the chat template closes answers without a special token ({between!r})")


class ChatFormat:
    """Token pieces of one tokenizer's chat template. Methods take and return the stream's ``Carry``."""

    def __init__(self, tokenizer, stop_ids: list[int] | tuple[int, ...] = ()):
        self.tokenizer = tokenizer
        self.markers = find_markers(tokenizer)
        self.end_of_turn = tokenizer.convert_tokens_to_ids(self.markers.end_of_turn)
        eos = tokenizer.eos_token_id
        self.stop_ids = frozenset({self.end_of_turn, *stop_ids, *([] if eos is None else [eos])})

    # -- encoding in context -------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def _in_context(self, text: str, tail: str) -> list[int]:
        """Tokens of ``text`` as it is tokenised right after ``tail``."""
        anchor = _anchor(tail)
        if not anchor:
            return self._encode(text)
        base, joined = self._encode(anchor), self._encode(anchor + text)
        if joined[: len(base)] == base:
            return joined[len(base):]
        return self._encode(text)  # the anchor itself merged with the text: fall back to encoding alone

    def _feed(self, text: str, carry: Carry, *, hold_back: bool, started: bool) -> tuple[list[int], Carry]:
        """Encode ``carry.pending + text``; with ``hold_back`` keep its last word for the next piece."""
        text = carry.pending + text
        pending = _last_word(text) if hold_back else ""
        now = text[: len(text) - len(pending)]
        ids = self._in_context(now, carry.tail)
        return ids, Carry(pending, (carry.tail + now)[-TAIL_CHARS:], started)

    # -- pieces --------------------------------------------------------------------------------
    # The user content of a turn is: its documents' text (leading and trailing whitespace removed), "\n\n",
    # the question; or just the question. Without a system role the system prompt and "\n\n" open it.
    def start(self, system: str) -> tuple[list[int], Carry]:
        """The first piece of a context: the template's opening and the system prompt."""
        m = self.markers
        system = system.strip()
        if m.system_in_user:
            return self._feed(m.opening + (f"{system}\n\n" if system else ""), Carry(), hold_back=True,
                              started=bool(system))
        return self._feed(m.opening + system + m.system_to_user, Carry(), hold_back=True, started=False)

    def open_turn(self, carry: Carry) -> tuple[list[int], Carry]:
        """A new user turn after a closed answer."""
        return self._feed(self.markers.after_answer, carry, hold_back=True, started=False)

    def document(self, text: str, carry: Carry) -> tuple[list[int], Carry]:
        """Document text inside the open user turn."""
        if not carry.started:
            text = text.lstrip()  # templates trim the content
        return self._feed(text, carry, hold_back=True, started=carry.started or bool(text))

    def question(self, text: str, carry: Carry) -> tuple[list[int], Carry]:
        """The question that closes the user turn, then the generation prompt; the answer follows."""
        text = text.strip()
        if carry.started:
            carry = Carry(carry.pending.rstrip(), carry.tail, True)
            text = "\n\n" + text
        return self._feed(text + self.markers.to_answer, carry, hold_back=False, started=True)

    def close_answer(self, answer_ids: list[int], carry: Carry) -> tuple[list[int], Carry]:
        """What the template puts after an answer up to its end-of-turn token, and the stream's new tail."""
        answered = Carry("", (carry.tail + self.tokenizer.decode(answer_ids, skip_special_tokens=False))[-TAIL_CHARS:])
        ids, after = self._feed(self.markers.before_end, answered, hold_back=False, started=False)
        ids.append(self.end_of_turn)
        return ids, Carry("", (after.tail + self.markers.end_of_turn)[-TAIL_CHARS:], False)

    def decode_answer(self, ids: list[int]) -> str:
        """Answer text so far; drops a trailing half-decoded multi-byte character while streaming."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text.rstrip("\ufffd").strip()


def _anchor(tail: str) -> str:
    """The end of the fed text, starting at a word boundary, for encoding the next piece in context."""
    anchor = tail[-ANCHOR_CHARS:]
    cut = next((i for i, ch in enumerate(anchor) if ch.isspace()), None)
    return anchor if cut is None or len(tail) <= ANCHOR_CHARS else anchor[cut:]


def _last_word(text: str) -> str:
    """The last run of non-space characters with the whitespace around it: what may still merge with the text
    that follows. Also the runs before it while the cut would fall between punctuation and a newline: Qwen2's
    pre-tokenizer joins punctuation with the newlines after it ("()" and "\\n" are one token), so that cut would
    split a token the whole text has."""
    i = len(text)
    while True:
        while i > 0 and text[i - 1].isspace():
            i -= 1
        while i > 0 and not text[i - 1].isspace():
            i -= 1
        end_of_previous = i
        while end_of_previous > 0 and text[end_of_previous - 1].isspace():
            end_of_previous -= 1
        joins = text[end_of_previous:i][:1] in ("\n", "\r") and not text[end_of_previous - 1:end_of_previous].isalnum()
        if end_of_previous == 0 or not joins:
            return text[end_of_previous:]
        i = end_of_previous
