"""Quality checks for the demo model: held-out NLL per byte and task accuracy.

NLL is reported per UTF-8 byte so it does not depend on the tokenizer.  Task
accuracy uses greedy decoding and an exact match of the expected answer.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from .corpus import list_files, read_text
from .data import file_record
from .tasks import TaskMaker
from .tokenizer import token_byte_lengths


def heldout_windows(tokenizer, seq_len: int, n_windows: int) -> torch.Tensor:
    """``n_windows`` evenly spaced, non-overlapping windows of held-out stdlib code.

    Each row is <s> followed by ``seq_len - 1`` tokens; the split is fixed by
    file-path hash, so these files were never trained on.
    """
    texts = [file_record(rel, read_text(p)) for rel, p in list_files("heldout")]
    enc = tokenizer(texts, add_special_tokens=False)["input_ids"]
    stream = torch.tensor([i for ids in enc for i in ids], dtype=torch.long)
    n = seq_len - 1
    total = len(stream) // n
    if total == 0:
        raise ValueError("held-out split is empty")
    picks = torch.linspace(0, total - 1, min(n_windows, total)).long()
    rows = [stream[i * n : (i + 1) * n] for i in picks.tolist()]
    bos = torch.full((len(rows), 1), tokenizer.bos_token_id, dtype=torch.long)
    return torch.cat([bos, torch.stack(rows)], dim=1)


@torch.no_grad()
def nll_per_byte(model, tokenizer, windows: torch.Tensor, batch_size: int = 16) -> dict:
    """Total NLL of every predicted token divided by the bytes those tokens encode."""
    byte_len = torch.tensor(token_byte_lengths(tokenizer), dtype=torch.float64)
    nll_sum, n_bytes, n_tokens = 0.0, 0.0, 0
    was_training = model.training
    model.eval()
    for i in range(0, len(windows), batch_size):
        ids = windows[i : i + batch_size]
        logits = model(input_ids=ids).logits[:, :-1].float()
        target = ids[:, 1:]
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="sum")
        nll_sum += nll.item()
        n_bytes += byte_len[target].sum().item()
        n_tokens += target.numel()
    model.train(was_training)
    return {"nll_per_byte": nll_sum / n_bytes, "nll_per_token": nll_sum / n_tokens, "bytes_per_token": n_bytes / n_tokens}


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Chat-template ids up to and including the first ' [/INST]'."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return list(tokenizer.apply_chat_template(messages[:first], tokenize=True)["input_ids"])


@torch.no_grad()
def greedy_answer(model, tokenizer, ids: list[int], max_new_tokens: int = 32) -> str:
    """Greedy continuation of ``ids`` up to </s>, decoded."""
    was_training = model.training
    model.eval()
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.train(was_training)
    return tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True).strip()


def task_accuracy(model, tokenizer, maker: TaskMaker, task: str, n: int, seq_len: int, seed: int) -> float:
    """Share of ``n`` random chat samples of ``task`` answered exactly (first turn)."""
    rng = random.Random(seed)
    correct = done = 0
    while done < n:
        sample = getattr(maker, task)(rng, rng.randint(seq_len // 4, seq_len))
        if sample.messages is None:
            continue  # raw-text pass-key variant; the chat form is what we measure
        ids = prompt_ids(tokenizer, sample.messages)
        budget = len(tokenizer(" " + sample.answer + " ", add_special_tokens=False)["input_ids"]) + 1
        if len(ids) + budget > seq_len:
            continue  # keep prompt + answer within the training length
        correct += greedy_answer(model, tokenizer, ids, budget).startswith(sample.answer)
        done += 1
    return correct / n


@torch.no_grad()
def copy_gain(model, token_ids: list[int], length: int = 60, rows: int = 8) -> float:
    """NLL drop (nats/token) on the second copy of a repeated random token sequence.

    Near 0 means the model has no induction heads, and so cannot recall a pass
    key from far away; a trained copier scores several nats.
    """
    g = torch.Generator().manual_seed(0)
    pool = torch.tensor(token_ids)
    x = pool[torch.randint(0, len(pool), (rows, length), generator=g)]
    ids = torch.cat([torch.ones(rows, 1, dtype=torch.long), x, x], dim=1)
    was_training = model.training
    model.eval()
    logp = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), -1)
    nll = -logp.gather(-1, ids[:, 1:, None])[..., 0]
    model.train(was_training)
    return (nll[:, :length].mean() - nll[:, length + 1 :].mean()).item()
