"""Tokenizers of the four chat-template families, built here from scratch (no download).

Byte-level BPE (GPT-2 style, as SmolLM2, Qwen2 and Llama-3 use) carries the ChatML and Llama-3 templates;
a SentencePiece-style BPE (Metaspace "▁", byte fallback, as Llama-2 and Mistral use) carries the Llama-2
and Mistral templates. The templates are those the models ship.
"""

from __future__ import annotations

import inspect
import textwrap
from functools import lru_cache

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)


def _training_text() -> list[str]:
    prose = ("The pass key is 71432. Remember it. Page twelve describes the directory layout.\n\n"
             "Questions end with a question mark? Answers are short.\n")
    return [inspect.getsource(textwrap), prose * 20]


@lru_cache(maxsize=None)
def byte_level(template: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>"]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(_training_text(), trainers.BpeTrainer(
        vocab_size=900, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    chatml = template == CHATML
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|im_start|>" if chatml else "<|begin_of_text|>",
        eos_token="<|im_end|>" if chatml else "<|eot_id|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.chat_template = template
    return tokenizer


@lru_cache(maxsize=None)
def sentencepiece_style(template: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    core.pre_tokenizer = pre_tokenizers.Sequence([  # newlines stand alone, as Llama's byte tokens <0x0A> do
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)])
    core.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                      decoders.Strip(" ", 1, 0)])
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    core.train_from_iterator(_training_text(), trainers.BpeTrainer(
        vocab_size=1200, special_tokens=["<unk>", "<s>", "</s>", *bytes_]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = template
    return tokenizer


FAMILIES = {
    "chatml": lambda: byte_level(CHATML),
    "llama3": lambda: byte_level(LLAMA3),
    "llama2": lambda: sentencepiece_style(LLAMA2),
    "mistral": lambda: sentencepiece_style(MISTRAL),
}
