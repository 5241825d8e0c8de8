"""Tokenizers for the demo model, both with the Llama-2 chat template.

The shipped model is byte-level (``byte_tokenizer``): 256 byte tokens, so any
UTF-8 text round-trips exactly and a pass key is one token per digit.  A small
locally trained BPE (``train_tokenizer``, ``--tokenizer bpe``) packs ~3 bytes
per token and reaches a lower NLL per byte in the same time; the byte-level one
was kept because every digit of a key is then one token, the same unit the
copy phase (train.py) teaches the model to repeat.
The chat markers [INST], [/INST], <<SYS>>, <</SYS>> are ordinary (non-special)
added tokens: one token each, and kept by ``decode(skip_special_tokens=True)``.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
CHAT_MARKERS = ["[INST]", "[/INST]", "<<SYS>>", "<</SYS>>"]

# Llama-2 chat format: <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {answer} </s><s>[INST] ...
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` and wrap it as a Hugging Face fast tokenizer.

    ``vocab_size`` counts everything: 3 special tokens, 256 bytes, merges and
    the 4 chat markers.  Digits are always split into single tokens.
    Training is deterministic for the same texts.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(CHAT_MARKERS),
        special_tokens=[UNK, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return _wrap(tok)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Pure byte-level tokenizer: 3 special tokens, 256 bytes, 4 chat markers.

    A BPE model with no merges over GPT-2's byte alphabet, so every UTF-8 byte
    is one token and any text round-trips exactly.
    """
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda ch: _byte_decoder()[ch])
    vocab = {UNK: 0, BOS: 1, EOS: 2}
    vocab.update({ch: 3 + i for i, ch in enumerate(alphabet)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.add_special_tokens([UNK, BOS, EOS])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return _wrap(tok)


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """Add chat markers, Llama-style <s> prefix and the chat template."""
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in CHAT_MARKERS])
    # Like Llama: plain encode() prepends <s>; chat templates write <s> themselves.
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=UNK,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode map used by the ByteLevel pre-tokenizer."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_byte_lengths(tokenizer) -> list[int]:
    """Number of UTF-8 bytes each token id stands for (0 for special tokens).

    Needed to report NLL per byte, which is comparable across tokenizers.
    """
    dec = _byte_decoder()
    special = set(tokenizer.all_special_ids)
    lengths = [0] * len(tokenizer)
    for token, idx in tokenizer.get_vocab().items():
        if idx in special:
            continue
        if token in CHAT_MARKERS:
            lengths[idx] = len(token.encode("utf-8"))
        else:
            lengths[idx] = sum(1 for ch in token if ch in dec)
    return lengths
