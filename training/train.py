"""The training loop: a tiny Llama taught to copy, pre-trained on code, then fine-tuned on chat tasks.

It starts with a hand-set previous-token head (prev_token.py) and a short phase
of repeated random strings, so induction heads form; without them the model
never retrieves a pass key.  Every phase is a fixed step count (never
wall-clock) drawn from one seeded data stream, so a rerun with the same
arguments and thread count reproduces the weights.  The last phase raises the
share of synthetic chat tasks.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from .card import write_model_card
from .corpus import list_files, read_text
from .data import BatchMaker, Corpus, printable_ids
from .prev_token import install_previous_token_head
from .evaluate import copy_gain, heldout_windows, nll_per_byte, task_accuracy
from .tokenizer import byte_tokenizer, train_tokenizer


@dataclass
class Phase:
    name: str
    steps: int
    lr: float
    warmup: int
    task_fraction: float
    copy_fraction: float = 0.0
    decay: bool = True  # cosine decay after warm-up; else constant


@dataclass
class TrainConfig:
    out: str = "demo_model"
    seed: int = 1234
    threads: int = 1
    seq_len: int = 256
    batch_size: int = 16
    tokenizer: str = "bytes"  # "bytes" or "bpe"
    vocab_size: int = 2048  # BPE only
    layers: int = 4
    hidden: int = 192
    heads: int = 4
    ffn: int = 512
    prev_token_head: bool = True
    prev_token_offsets: str = "1"  # comma-separated; head i of layer 0 looks offsets[i] back
    copy_steps: int = 1200
    copy_lr: float = 1e-3
    copy_len: int = 64
    pretrain_steps: int = 1100
    pretrain_lr: float = 2e-3
    finetune_steps: int = 400
    finetune_lr: float = 1e-3
    pretrain_task_fraction: float = 0.25
    finetune_task_fraction: float = 0.6
    pretrain_copy_fraction: float = 0.0
    finetune_copy_fraction: float = 0.0
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.05
    log_every: int = 25
    eval_every: int = 300
    eval_tasks: int = 50
    eval_windows: int = 64


def lr_at(step: int, phase: Phase, min_ratio: float) -> float:
    """Linear warm-up, then cosine decay to ``min_ratio`` of the peak."""
    if step < phase.warmup:
        return phase.lr * (step + 1) / phase.warmup
    if not phase.decay:
        return phase.lr
    t = (step - phase.warmup) / max(1, phase.steps - phase.warmup)
    return phase.lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def build_model(cfg: TrainConfig, tokenizer) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden,
        intermediate_size=cfg.ffn,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.heads,
        max_position_embeddings=cfg.seq_len,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM._from_config(config, attn_implementation="sdpa")


def make_optimizer(model, weight_decay: float) -> torch.optim.AdamW:
    """AdamW; norms are not decayed."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)


def evaluate(model, tokenizer, windows, maker, cfg: TrainConfig, n_tasks: int, seed: int) -> dict:
    metrics = nll_per_byte(model, tokenizer, windows)
    metrics["copy_gain"] = copy_gain(model, printable_ids(tokenizer))
    for task in ("passkey", "kv_lookup", "which_file", "repeat"):
        metrics[f"{task}_acc"] = task_accuracy(model, tokenizer, maker, task, n_tasks, cfg.seq_len, seed)
    return metrics


def train(cfg: TrainConfig) -> dict:
    torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    t_start = time.time()

    if cfg.tokenizer == "bpe":
        tokenizer = train_tokenizer((read_text(p) for _, p in list_files("train")), cfg.vocab_size)
    else:
        tokenizer = byte_tokenizer()
    corpus = Corpus(tokenizer, "train")
    heldout = Corpus(tokenizer, "heldout")
    eval_maker = heldout.task_maker(tokenizer)  # which-file questions over unseen files
    windows = heldout_windows(tokenizer, cfg.seq_len, cfg.eval_windows)
    batches = BatchMaker(tokenizer, corpus, cfg.seq_len, cfg.seed)
    print(f"tokenizer {len(tokenizer)} tokens; train stream {len(corpus.stream):,} tokens "
          f"({time.time() - t_start:.0f}s)", flush=True)

    model = build_model(cfg, tokenizer)
    if cfg.prev_token_head:
        for head, offset in enumerate(int(o) for o in cfg.prev_token_offsets.split(",")):
            install_previous_token_head(model, head=head, offset=offset)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model {n_params:,} parameters", flush=True)
    opt = make_optimizer(model, cfg.weight_decay)
    phases = [
        Phase("copy", cfg.copy_steps, cfg.copy_lr, 50, 0.0, copy_fraction=1.0, decay=False),
        Phase("pretrain", cfg.pretrain_steps, cfg.pretrain_lr, 50, cfg.pretrain_task_fraction,
              cfg.pretrain_copy_fraction),
        Phase("finetune", cfg.finetune_steps, cfg.finetune_lr, 20, cfg.finetune_task_fraction,
              cfg.finetune_copy_fraction),
    ]
    history = []
    t_train = time.time()
    global_step = 0
    model.train()
    for phase in phases:
        running = 0.0
        for step in range(phase.steps):
            lr = lr_at(step, phase, cfg.min_lr_ratio)
            for group in opt.param_groups:
                group["lr"] = lr
            ids, labels = batches.batch(cfg.batch_size, phase.task_fraction, phase.copy_fraction, cfg.copy_len)
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            global_step += 1
            running += loss.item()
            if (step + 1) % cfg.log_every == 0:
                el = time.time() - t_train
                print(f"{phase.name} step {step + 1}/{phase.steps} loss {running / cfg.log_every:.3f} "
                      f"lr {lr:.2e} {global_step / el:.2f} step/s elapsed {el / 60:.1f} min", flush=True)
                running = 0.0
            if global_step % cfg.eval_every == 0:
                m = evaluate(model, tokenizer, windows[:16], eval_maker, cfg, 10, seed=7)
                m.update(step=global_step, phase=phase.name, minutes=(time.time() - t_train) / 60)
                history.append(m)
                print("eval", json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in m.items()}),
                      flush=True)
    train_minutes = (time.time() - t_train) / 60

    final = evaluate(model, tokenizer, windows, eval_maker, cfg, cfg.eval_tasks, seed=2024)
    final.update(train_minutes=train_minutes, total_minutes=(time.time() - t_start) / 60, parameters=n_params)
    print("final", json.dumps(final), flush=True)
    save(model, tokenizer, cfg, final, history)
    return final


def save(model, tokenizer, cfg: TrainConfig, final: dict, history: list) -> None:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # Name the generic class so older transformers releases can load it too.
    tok_cfg = out / "tokenizer_config.json"
    tok_cfg.write_text(tok_cfg.read_text().replace('"TokenizersBackend"', '"PreTrainedTokenizerFast"'))
    info = {"config": asdict(cfg), "final": final, "history": history}
    (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    write_model_card(out, cfg, final)
