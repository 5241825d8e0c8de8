"""Writes demo_model/README.md from the run's settings and measured metrics.

Generated, not hand-written, so the numbers in the card always match the
shipped weights.
"""

from __future__ import annotations

import platform
from dataclasses import asdict
from pathlib import Path

import torch
import transformers


def _pct(fraction: float) -> str:
    return f"{round(fraction * 100)}%"


def _init_text(c: dict) -> str:
    if not c["prev_token_head"]:
        return ""
    offsets = c["prev_token_offsets"].split(",")
    heads = ", ".join(f"head {i} looks {o} back" for i, o in enumerate(offsets))
    return (f"0. init: hand-set previous-token head(s) in layer 0 ({heads}; "
            "`training/prev_token.py`), the half of an induction circuit that a model this small does not find "
            "by itself within the budget; training may change them.\n")


def write_model_card(out: Path, cfg, final: dict) -> None:
    c = asdict(cfg)
    size_mb = (out / "model.safetensors").stat().st_size / 1e6
    if c["tokenizer"] == "bytes":
        tokenizer_text = (
            "Byte-level: every UTF-8 byte is one token (ids 3-258 = bytes 0-255), plus 4 chat markers "
            "(ids 259-262), 263 tokens in all"
        )
    else:
        tokenizer_text = (
            f"Byte-level BPE with {c['vocab_size']} tokens trained locally on the training split; "
            "digits are always single tokens"
        )
    text = f"""# demo_model: a tiny Llama chat model trained from scratch, offline

Built by `scripts/train_demo_model.py` so the app and the tests have real
weights without downloading anything.  It is a toy: it knows Python-stdlib-ish
code and a few synthetic question types (pass key, key-value lookup, "which
file defines X").  It is not a general assistant.

## Architecture
`LlamaForCausalLM`: {c['layers']} layers, hidden {c['hidden']}, {c['heads']} heads
(head dim {c['hidden'] // c['heads']}), SwiGLU {c['ffn']}, RoPE base 10000, RMSNorm,
untied embeddings, {final['parameters']:,} parameters, fp32 safetensors ({size_mb:.1f} MB).
`max_position_embeddings` = {c['seq_len']} = the training length L: every training
sequence was at most L tokens and began with `<s>`.

## Tokenizer
{tokenizer_text}
(ids 0 `<unk>` (also pad), 1 `<s>`, 2 `</s>`).
`[INST]`, `[/INST]`, `<<SYS>>`, `<</SYS>>` are ordinary added tokens (one id each,
not special, so `decode(..., skip_special_tokens=True)` keeps them).  `encode`
prepends `<s>` like Llama; decoding without special tokens returns the exact
input bytes (except literal `<s>`/`</s>`/`<unk>` strings, which map to the special
tokens).  On held-out code a token is {final['bytes_per_token']:.2f} bytes, so the
{c['seq_len']}-token window holds about {c['seq_len'] * final['bytes_per_token']:.0f} bytes of text.
The chat template is Llama-2's:
`<s>[INST] <<SYS>>\\n{{system}}\\n<</SYS>>\\n\\n{{user}} [/INST] {{answer}} </s><s>[INST] ...`

## Data
- Python {platform.python_version()} standard-library sources (`sysconfig.get_paths()['stdlib']`,
  without test directories, site-packages and gencodec tables), each file as
  `# File: <path>` + text.  About 5% of files, picked by SHA-256 of the
  relative path (`training/corpus.py`), are held out.
- Synthetic chat tasks within L (`training/tasks.py`): the paper's pass-key
  prompt (filler or code haystack, 3-7 digit keys, sometimes raw text without
  the chat wrapper), key-value lookup (1-3 turns), "which file defines X"
  over concatenated `# File:` snippets, and verbatim repeat (numbers, words,
  code).  Several samples are packed per sequence as a multi-turn chat.  The
  fact asked for is always within L of the question; the full paper intro
  only fits in raw-text samples at L = 256 bytes, so chat samples use it, its
  first two sentences, or no intro, whichever fits.

## Training
Seed {c['seed']}, {c['threads']} CPU thread(s), batch {c['batch_size']} x {c['seq_len']} tokens, AdamW
(betas 0.9/0.95, weight decay {c['weight_decay']}), grad clip 1.0, warm-up + cosine per phase:
{_init_text(c)}1. copy: {c['copy_steps']} steps of random printable strings each followed by its repeat
   ({c['copy_len']} tokens), constant lr {c['copy_lr']}: only an induction head predicts the repeats;
2. pre-train {c['pretrain_steps']} steps, peak lr {c['pretrain_lr']}, {_pct(c['pretrain_task_fraction'])} task sequences,
   {_pct(c['pretrain_copy_fraction'])} copy sequences, the rest code;
3. fine-tune {c['finetune_steps']} steps, peak lr {c['finetune_lr']}, {_pct(c['finetune_task_fraction'])} task sequences,
   {_pct(c['finetune_copy_fraction'])} copy sequences.

Training took {final['train_minutes']:.1f} min ({final['total_minutes']:.1f} min with tokenizer, data and
evaluation) with torch {torch.__version__}, transformers {transformers.__version__}.

## Results (length <= L, greedy decoding, exact answer match)
| metric | value |
|---|---|
| held-out stdlib NLL per byte (nats) | {final['nll_per_byte']:.3f} |
| held-out NLL per token (nats) | {final['nll_per_token']:.3f} |
| pass-key accuracy, {c['eval_tasks']} prompts | {final['passkey_acc']:.0%} |
| key-value lookup accuracy, {c['eval_tasks']} prompts | {final['kv_lookup_acc']:.0%} |
| which-file accuracy, {c['eval_tasks']} prompts over held-out files | {final['which_file_acc']:.0%} |
| verbatim repeat accuracy, {c['eval_tasks']} prompts | {final.get('repeat_acc', float('nan')):.0%} |
| copy gain on repeated random tokens (nats/token) | {final['copy_gain']:.2f} |

Copy gain is how much better the model predicts the second copy of a random
token string than the first; it shows the induction heads that pass-key recall
needs.  (Without the hand-set previous-token heads and the copy phase, a
2,048-token BPE variant and a byte-level one reached similar NLL in the same time
but never retrieved a pass key, even within L.)

Beyond L the model is only meant to be used through LM-Infinite (`lminfinite/`).

## Reproduce
```
python scripts/train_demo_model.py --out demo_model --seed {c['seed']} --threads {c['threads']}
```
Same Python stdlib, library versions and thread count give the same weights;
other thread counts or CPUs differ in floating-point rounding only.
`training_info.json` holds the full settings and the evaluation history.

## Use
```python
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained("demo_model")
model = AutoModelForCausalLM.from_pretrained("demo_model")
ids = tok.apply_chat_template([{{"role": "user", "content": "..."}}], return_tensors="pt")
```
"""
    (out / "README.md").write_text(text)
