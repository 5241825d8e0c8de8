"""A passage the model writes for each development question before it has read the document, for BM25 to search
with beside the question (the idea of HyDE and query2doc): the manual's own words for a question asked in others.

Why a benchmark and not the app: it costs an answer's worth of decoding before each question (about 6 s for 64
tokens with the 1.5B on 2 CPU threads), so it is measured offline first (``benchmarks.first_chunks --written``,
docs/answers.md). Each question is written after the one before it, as a follow-up needs; greedy decoding, and
the passages cached in ``--out`` so that a stopped run goes on where it stopped.

    python -m benchmarks.written_passages --out passages.json [--threads 2]
    python -m benchmarks.first_chunks --written passages.json --weight 0.25
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import devset

SYSTEM = ("You write the passage of a software manual that answers the user's question: two or three sentences "
          "in the manual's own terms, naming the options, functions and values it would name. No preamble.")
NEW_TOKENS = 64


def user_turn(question: str, earlier: str) -> str:
    """The question, after the one asked before it when there is one (what a follow-up is about)."""
    return f"(Asked just before: {earlier})\n{question}" if earlier else question


def write(documents, model, tokenizer, passages: dict, out: Path) -> dict:
    """Fill ``passages`` ("document/number" -> text) for every question not in it yet, saving after each."""
    import torch

    for document in documents:
        earlier = ""
        for number, question in enumerate(document.questions):
            key = f"{document.name}/{number}"
            if key not in passages:
                messages = [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": user_turn(question.question, earlier)}]
                prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                       return_dict=True)
                with torch.no_grad():
                    ids = model.generate(**prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
                passages[key] = tokenizer.decode(ids[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
                out.write_text(json.dumps(passages, indent=1), encoding="utf-8")
                print(key, passages[key][:100].replace("\n", " "), flush=True)
            earlier = question.question
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
