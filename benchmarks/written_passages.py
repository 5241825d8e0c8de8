"""A passage the model writes for each development question before it has read the document, for BM25 to search
with beside the question (the idea of HyDE and query2doc): the manual's own words for a question asked in others.

Measured offline first, as here, because it costs a short decode before each question (about 3 s for the median
22 tokens with the 1.5B on 2 CPU threads): ``benchmarks.first_chunks --written``, docs/answers.md. The app now
writes one before each question (app/engine/guess.py, with this prompt), there after the previous answer itself. Each question is written after the one before it, as a follow-up needs; greedy decoding, and
the passages cached in ``--out`` so that a stopped run goes on where it stopped.

    python -m benchmarks.written_passages --out passages.json [--threads 2]
    python -m benchmarks.first_chunks --written passages.json --weight 0.25
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.engine.guess import GUESS_TOKENS, SYSTEM
from benchmarks import devset


def messages_for(question: str, earlier: tuple[str, str] | None) -> list[dict]:
    """The question as the last user turn, after the exchange before it as chat turns (what a follow-up is about).
    Not folded into the user turn: written "(Asked just before: …)" above the question, the 1.5B answered the earlier
    question instead for about one question in ten (docs/answers.md)."""
    turns = [{"role": "system", "content": SYSTEM}]
    if earlier is not None:
        turns += [{"role": "user", "content": earlier[0]}, {"role": "assistant", "content": earlier[1]}]
    return turns + [{"role": "user", "content": question}]


def write(documents, model, tokenizer, passages: dict, out: Path) -> dict:
    """Fill ``passages`` ("document/number" -> text) for every question not in it yet, saving after each."""
    import torch

    for document in documents:
        earlier = None
        for number, question in enumerate(document.questions):
            key = f"{document.name}/{number}"
            if key not in passages:
                prompt = tokenizer.apply_chat_template(messages_for(question.question, earlier), add_generation_prompt=True,
                                                       return_tensors="pt", return_dict=True)
                with torch.no_grad():
                    ids = model.generate(**prompt, max_new_tokens=GUESS_TOKENS, do_sample=False)
                passages[key] = tokenizer.decode(ids[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
                out.write_text(json.dumps(passages, indent=1), encoding="utf-8")
                print(key, passages[key][:100].replace("\n", " "), flush=True)
            earlier = (question.question, passages[key])
    return passages


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="a bundled model's short name")
    p.add_argument("--split", choices=(*devset.SPLITS, "all"), default="all")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, required=True, help="the passages as JSON (read first when it exists)")
    args = p.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from app.cli import AppConfig
    from app.engine.model_loading import choose_model

    torch.set_num_threads(args.threads)
    path = choose_model(AppConfig(model=args.model)).name_or_path
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    names = sum(devset.SPLITS.values(), ()) if args.split == "all" else devset.SPLITS[args.split]
    passages = json.loads(args.out.read_text(encoding="utf-8")) if args.out.exists() else {}
    write(devset.load(names), model, tokenizer, passages, args.out)


if __name__ == "__main__":
    main()
