"""Reopening a saved workspace vs reading its documents again, on the app's own path.

A session reads a long real document (the Python standard library's modules, concatenated), answers a
question, and is saved. Then the next question is asked three ways: in the session that never closed, in
the workspace reopened from its file (exact), and reopened from a file whose middle store was saved in
bfloat16. Reported: prefill time vs reopen time (target: reopen <= 5 % of prefill), file sizes, and whether
each reopened context answers token for token as the never-closed one.

    python -m benchmarks.reopen --tokens 100000 --readme     # the default real model (SmolLM2 on CPU)
"""

from __future__ import annotations

import argparse
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import torch

from app.cli import AppConfig
from app.engine.model_loading import load_runtime
from app.web.server import build_app
from benchmarks.report import publish
from ingest.tables import markdown_table
from ingest.units import human_bytes

SETTINGS = ("You are a helpful assistant.", 0.0, 0.9, 48, 1.0, True, 5)  # greedy, recall on, as the panel starts
FIRST = "Which module defines the function that these docstrings call a heap queue?"
NEXT = "What does the shutil module's copyfile function do?"


def stdlib_document(folder: Path, chars: int) -> Path:
    """Real text: the standard library's modules in name order, up to ``chars`` characters."""
    parts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(f"# ---- {path.name} ----\n{text}")
        total += len(parts[-1])
        if total >= chars:
            break
    document = folder / "stdlib.py"
    document.write_text("".join(parts)[:chars], encoding="utf-8")
    return document


class PeakRSS:
    """The most private memory the process held above its level at the start of the block (sampled every 20 ms):
    resident minus shared pages, so a memory-mapped file being read (page cache the kernel can drop) does not
    count, only what the process allocated."""

    def __enter__(self):
        self.process, self.peak, self.done = psutil.Process(), 0, threading.Event()
        self.base = self._private()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _private(self) -> int:
        info = self.process.memory_info()
        return info.rss - info.shared

    def _sample(self):
        while not self.done.wait(0.02):
            self.peak = max(self.peak, self._private() - self.base)

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, self._private() - self.base)


def drain(generator):
    for _ in generator:
        pass


def ask(handlers, req, text, files=()):
    handlers.submit({"text": text, "files": [str(f) for f in files]}, req)
    drain(handlers.read(req))
    drain(handlers.run(*SETTINGS, req))
    session = handlers.registry.peek(req.session_hash)
    return next(c for c in reversed(session.chat) if c.kind == "answer")


def agreeing_words(a: str, b: str) -> int:
    """How many words two answers share before they first differ."""
    count = 0
    for x, y in zip(a.split(), b.split()):
        if x != y:
            break
        count += 1
    return count


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def server(runtime, folder: Path, save_middle: str):
    _, handlers = build_app(AppConfig(model="bench", workspaces=str(folder), save_middle=save_middle), runtime)
    handlers.upload_root = None
    return handlers


def run(tokens: int, model: str | None) -> dict:
    runtime = load_runtime(AppConfig(model=model))
    work = Path(tempfile.mkdtemp(prefix="reopen-bench-"))
    document = stdlib_document(work, chars=tokens * 4)
    results: dict = {"model": runtime.name, "date": time.strftime("%Y-%m-%d"), "variants": []}

    original = server(runtime, work / "exact", "exact")
    req = SimpleNamespace(session_hash="original", username=None)
    workspace_id = original.attach(None, req)[0]
    started = time.perf_counter()
    ask(original, req, FIRST, [document])
    results["prefill_s"] = time.perf_counter() - started
    session = original.registry.peek("original")
    results["tokens"] = session.context_tokens
    results["cache_bytes"] = sum(session.engine.memory().values())
    for save_middle in ("exact", "bfloat16"):
        original.registry.config.save_middle = save_middle
        original.registry.store.root = work / save_middle
        started = time.perf_counter()
        with PeakRSS() as peak:
            size = original.registry.save_now(session)
        results["variants"].append({"middle": save_middle, "save_s": time.perf_counter() - started, "bytes": size,
                                    "save_extra_rss": peak.peak})
    expected = ask(original, req, NEXT)
    session.in_browser = False  # its state after NEXT is not saved over the measured files
    original.registry.close("original")
    del session

    for variant in results["variants"]:
        reopened = server(runtime, work / variant["middle"], variant["middle"])
        tab = SimpleNamespace(session_hash=f"reopen-{variant['middle']}", username=None)
        started = time.perf_counter()
        with PeakRSS() as peak:
            shown = reopened.attach(workspace_id, tab)
        variant["reopen_s"] = time.perf_counter() - started
        variant["reopen_peak_over_cache"] = peak.peak - sum(reopened.registry.peek(tab.session_hash).engine.memory().values())
        assert shown[0] == workspace_id, "the workspace did not reopen"
        answer = ask(reopened, tab, NEXT)
        variant["same_answer"] = answer.text == expected.text and answer.stats["tokens"] == expected.stats["tokens"]
        variant["answer"] = answer.text
        variant["words_agreeing"] = agreeing_words(answer.text, expected.text)
        variant["reopen_share"] = variant["reopen_s"] / results["prefill_s"]
        reopened.registry.peek(tab.session_hash).in_browser = False
        reopened.registry.close(tab.session_hash)
    results["expected_answer"] = expected.text
    return results


def table(result: dict) -> str:
    rows = [["read the documents (prefill)", f"{result['prefill_s']:,.1f}", "", "", ""]]
    for v in result["variants"]:
        rows.append([f"reopen, middle store {v['middle']}", f"{v['reopen_s']:,.2f}", f"{v['reopen_share']:.1%}",
                     human_bytes(v["bytes"]),
                     "yes" if v["same_answer"] else f"no: it parts after {plural(v['words_agreeing'], 'word')}"])
    body = markdown_table(["", "seconds", "of the prefill", "file", "next answer identical"], rows)
    exact = result["variants"][0]
    return (f"{body}\n\nA workspace of **{result['tokens']:,} tokens** ({human_bytes(result['cache_bytes'])} of KV "
            f"cache) reopens in **{exact['reopen_share']:.1%}** of the time its prefill took (target ≤ 5 %); "
            f"saving took {exact['save_s']:.1f} s. Memory beyond the cache: saving held "
            f"{human_bytes(max(exact['save_extra_rss'], 0))} more at its peak, reopening "
            f"{human_bytes(max(exact['reopen_peak_over_cache'], 0))} more than the reopened cache itself "
            f"(sampled private memory, not the file's page cache). {result['model']} on this CPU, the app's own path (save, attach, ask), {result['date']}.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000, help="about this many tokens of documents")
    parser.add_argument("--model", default=None, help="what app.py --model gets (default: the app's default)")
    parser.add_argument("--readme", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    result = run(args.tokens, args.model)
    publish("reopen", result, table(result), readme=args.readme)


if __name__ == "__main__":
    main()
