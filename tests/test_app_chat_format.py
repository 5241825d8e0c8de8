"""The append-only stream equals the tokenizer's own chat template for whole conversations, in four families."""

from __future__ import annotations

import inspect
import json

import pytest

from app.engine.chat_format import ChatFormat
from chat_templates import FAMILIES as BUILT


def _bundled(name: str):
    """A bundled model's own tokenizer and chat template (from its package, converted once)."""
    from transformers import AutoTokenizer

    from app.engine.bundled_model import BUNDLED, bundled_folder

    return lambda: AutoTokenizer.from_pretrained(bundled_folder(BUNDLED[name]))


FAMILIES = {**BUILT, "smollm2": _bundled("smollm2"), "qwen2.5-coder": _bundled("qwen2.5-coder-0.5b")}

SYSTEM = "You are a helpful assistant. Answer questions about the document."


def _documents() -> list[list[str]]:
    """Real text cut as ingest cuts it (at newlines, before blank lines) and once mid-word."""
    source = inspect.getsource(json)[:2400]
    cuts = [0, 310, source.index("\n\n", 600), source.index("\n", 1100), 1507, len(source)]
    first = ["### json/__init__.py (python)\n"] + [source[a:b] for a, b in zip(cuts, cuts[1:])]
    second = ["### report.pdf\n--- page 2 ---\nThe pass key is 71432.\n", "\nRemember it.  Twice:  71432.\n\n"]
    return [first, second]


CONVERSATION = [  # (documents, question, answer)
    (0, "What does the json module export?", "It exports dump, dumps, load and loads."),
    (1, "  What is the pass key?\n", "The pass key is 71432."),
    (None, "And twice that?", "142864"),
]


def _content(system_in_user: bool, system: str, docs: list[str] | None, question: str, first: bool) -> str:
    parts = [f"{system}\n\n"] if system_in_user and first else []
    if docs:
        text = "".join(docs).strip() if not parts else "".join(docs).rstrip()
        parts.append(text + "\n\n")
    return "".join(parts) + question.strip()


def _template_tokens(tokenizer, messages: list[dict]) -> list[int]:
    """The template's tokens for the conversation, asking for the next answer.

    The text is encoded in segments that start where each past answer starts: at question time the prompt
    ended there, and the model continued from those tokens (for Llama-3's tokenizer "\\n\\n" then "It" is
    not how "\\n\\nIt" encodes in one piece).
    """
    def render(upto):
        return tokenizer.apply_chat_template(messages[:upto], tokenize=False, add_generation_prompt=True)

    full = render(len(messages))
    starts = [len(render(i + 1)) for i, m in enumerate(messages) if m["role"] == "user"][:-1]
    assert all(full.startswith(render(i + 1)) for i, m in enumerate(messages) if m["role"] == "user")
    bounds = [0, *starts, len(full)]
    return [t for a, b in zip(bounds, bounds[1:]) for t in tokenizer.encode(full[a:b], add_special_tokens=False)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("turns", [1, 2, 3])
def test_stream_equals_the_template(family, turns):
    tokenizer = FAMILIES[family]()
    fmt = ChatFormat(tokenizer)
    docs = _documents()
    ids, carry = fmt.start(SYSTEM)
    stream = list(ids)
    messages = [] if fmt.markers.system_in_user else [{"role": "system", "content": SYSTEM}]
    for index, (doc_index, question, answer) in enumerate(CONVERSATION[:turns]):
        if index:
            ids, carry = fmt.open_turn(carry)
            stream += ids
        chunks = docs[doc_index] if doc_index is not None else []
        for chunk in chunks:
            ids, carry = fmt.document(chunk, carry)
            stream += ids
        ids, carry = fmt.question(question, carry)
        stream += ids
        messages.append({"role": "user", "content": _content(fmt.markers.system_in_user, SYSTEM, chunks, question,
                                                             index == 0)})
        if index == turns - 1:
            break
        answer_ids = tokenizer.encode(fmt.markers.answer_lead + answer, add_special_tokens=False)  # "the model's"
        closing, carry = fmt.close_answer(answer_ids, carry)
        stream += answer_ids + closing
        messages.append({"role": "assistant", "content": answer})
    expected = _template_tokens(tokenizer, messages)
    assert tokenizer.convert_ids_to_tokens(stream) == tokenizer.convert_ids_to_tokens(expected)


@pytest.mark.parametrize("family, end", [("smollm2", "<|im_end|>"), ("qwen2.5-coder", "<|im_end|>"), ("chatml", "<|im_end|>"), ("llama3", "<|eot_id|>"), ("llama2", "</s>"),
                                         ("mistral", "</s>")])
def test_end_of_turn_token_stops_generation(family, end):
    tokenizer = FAMILIES[family]()
    fmt = ChatFormat(tokenizer)
    assert fmt.markers.end_of_turn == end
    assert tokenizer.convert_tokens_to_ids(end) in fmt.stop_ids
    assert fmt.decode_answer(tokenizer.encode("Hello there", add_special_tokens=False)) == "Hello there"


def test_template_without_system_role_puts_the_prompt_in_the_first_turn():
    fmt = ChatFormat(FAMILIES["mistral"]())
    assert fmt.markers.system_in_user and fmt.markers.opening == "<s>[INST] "
    assert not ChatFormat(FAMILIES["llama2"]()).markers.system_in_user


def test_a_tokenizer_without_chat_template_is_refused():
    tokenizer = FAMILIES["chatml"]()
    plain = type(tokenizer)(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|im_end|>")
    with pytest.raises(ValueError, match="chat template"):
        ChatFormat(plain)
