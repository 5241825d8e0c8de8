"""Turning the corpus and the synthetic tasks into fixed-length training batches.

Every sequence starts with <s> at position 0 (the attention sink LM-Infinite's
n_starting tokens rely on) and is at most ``seq_len`` tokens long, so the model
never sees a position beyond its ``max_position_embeddings``.  Batches come
from one seeded ``random.Random``, so the data order is reproducible.
"""

from __future__ import annotations

import random

import torch

from .corpus import list_files, read_text
from .tasks import Sample, TaskMaker, collect_identifiers, index_definitions

IGNORE = -100


def file_record(rel: str, text: str) -> str:
    """How one source file appears in the stream: a `# File:` header, then the code."""
    return f"# File: {rel}\n{text}\n"


class Corpus:
    """One split of the stdlib, tokenized into a single stream, plus task material."""

    def __init__(self, tokenizer, split: str):
        files = [(rel, read_text(p)) for rel, p in list_files(split)]
        self.files = files
        enc = tokenizer([file_record(r, t) for r, t in files], add_special_tokens=False)["input_ids"]
        self.stream = torch.tensor([i for ids in enc for i in ids], dtype=torch.long)
        self.code_lines = [ln for _, t in files for ln in t.split("\n") if ln.strip()]
        self.defs = index_definitions(files)
        self.identifiers = collect_identifiers([t for _, t in files])

    def task_maker(self, tokenizer) -> TaskMaker:
        count = lambda s: len(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
        return TaskMaker(count, self.code_lines, self.defs, self.identifiers)


def encode_sample(tokenizer, sample: Sample) -> list[int]:
    """Token ids of a task sample, via the chat template (which writes <s> itself)."""
    if sample.messages is not None:
        return list(tokenizer.apply_chat_template(sample.messages, tokenize=True)["input_ids"])
    return [tokenizer.bos_token_id] + tokenizer(sample.text, add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]


def printable_ids(tokenizer) -> list[int]:
    """Token ids of the printable ASCII characters '!'..'~'."""
    return [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(chr(c))[0]) for c in range(33, 127)]


class BatchMaker:
    """Mixes code windows with synthetic tasks at a given task fraction."""

    TASKS = (("passkey", 0.4), ("kv_lookup", 0.2), ("which_file", 0.15), ("repeat", 0.25))

    def __init__(self, tokenizer, corpus: Corpus, seq_len: int, seed: int, tasks=None):
        self.tasks_mix = tuple(tasks or self.TASKS)
        self.tok = tokenizer
        self.corpus = corpus
        self.tasks = corpus.task_maker(tokenizer)
        self.seq_len = seq_len
        self.rng = random.Random(seed)
        self.printable = printable_ids(tokenizer)

    def code_window(self) -> list[int]:
        n = self.seq_len - 1
        start = self.rng.randrange(len(self.corpus.stream) - n)
        return [self.tok.bos_token_id] + self.corpus.stream[start : start + n].tolist()

    def task_ids(self, budget: int) -> list[int] | None:
        """One random task sample of at most ``budget`` tokens (None if none fits)."""
        r, acc = self.rng.random(), 0.0
        for name, p in self.tasks_mix:
            acc += p
            if r < acc:
                break
        target = budget
        for _ in range(20):
            ids = encode_sample(self.tok, getattr(self.tasks, name)(self.rng, target))
            if len(ids) <= budget:
                return ids
            target -= 16
        return None

    def task_sequence(self, min_sample: int = 48) -> list[int]:
        """Task samples packed back to back, as a Llama-2 multi-turn chat would be.

        The first sample's length is random, so the fact sits at many distances
        from its question; later samples fill the remaining room.
        """
        seq = None
        while seq is None:
            seq = self.task_ids(self.rng.randint(self.seq_len // 4, self.seq_len))
        while self.seq_len - len(seq) >= min_sample:
            more = self.task_ids(self.seq_len - len(seq))
            if more is None:
                break
            seq += more
        return seq

    def copy_sequence(self, length: int) -> list[int]:
        """<s>, then random printable-character strings, each followed by a repeat.

        Only an induction head can predict the repeats; a few hundred steps of
        this (with the hand-set previous-token head, see prev_token.py) is
        what teaches the model to copy from context at all.
        """
        seq = [self.tok.bos_token_id]
        while True:
            k = self.rng.randint(4, 16)
            if len(seq) + 2 * k > length:
                return seq
            chunk = [self.rng.choice(self.printable) for _ in range(k)]
            seq += chunk + chunk

    def batch(self, size: int, task_fraction: float, copy_fraction: float = 0.0,
              copy_len: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, labels), at most seq_len wide; padding is ignored by the loss."""
        ids = torch.full((size, self.seq_len), self.tok.pad_token_id, dtype=torch.long)
        labels = torch.full((size, self.seq_len), IGNORE, dtype=torch.long)
        width = 0
        for row in range(size):
            r = self.rng.random()
            if r < copy_fraction:
                seq = self.copy_sequence(min(copy_len, self.seq_len))
            elif r < copy_fraction + task_fraction:
                seq = self.task_sequence()
            else:
                seq = self.code_window()
            ids[row, : len(seq)] = torch.tensor(seq)
            labels[row, : len(seq)] = torch.tensor(seq)
            width = max(width, len(seq))
        return ids[:, :width], labels[:, :width]
