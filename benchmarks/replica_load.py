"""How many users one replica serves: 1, 2, 4... users at once, each with a document of its own, asking questions
back to back through ``/ask``, behind nginx as deploy/ configures it (docs/deploy.md).

    python -m benchmarks.replica_load --users 1 2 4 --questions 3 [--model qwen2.5-coder-1.5b] [--readme]

One model step runs at a time (the model is shared fairly, app/engine/model_gate.py), so a replica's answers per
minute stay about the same as users are added and each user's wait grows with them; the table says by how much.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.launched_app import start_app, start_proxy
from benchmarks.report import publish
from ingest.tables import markdown_table

QUESTIONS = ["Which function parses the header?", "What does it return when the value is empty?",
             "Which exception does it raise for a bad date?", "What is the default port?"]


def document(folder: Path, user: int) -> Path:
    """A user's own file: a part of a real module of Python's standard library (about 1,500 tokens)."""
    lines = Path(http.cookiejar.__file__).read_text(encoding="utf-8").splitlines()
    start = 40 + 120 * user
    path = folder / f"user{user}_cookiejar_part.py"
    path.write_text("\n".join(lines[start:start + 150]) + "\n", encoding="utf-8")
    return path


def one_user(url: str, doc: Path, questions: int, waits: list, failures: list) -> None:
    from gradio_client import Client, handle_file

    client = Client(url, verbose=False)
    for number in range(questions):
        files = [handle_file(str(doc))] if number == 0 else []
        started = time.perf_counter()
        reply = client.predict(QUESTIONS[number % len(QUESTIONS)], files, api_name="/ask")
        (failures if reply.get("error") else waits).append((number, time.perf_counter() - started))


def round_of(url: str, users: int, questions: int, folder: Path) -> dict:
    waits, failures = [], []
    threads = [threading.Thread(target=one_user, args=(url, document(folder, u), questions, waits, failures))
               for u in range(users)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    follow = [w for n, w in waits if n > 0]  # questions after the first, which also reads the document
    return {"users": users, "answers": len(waits), "failed": len(failures), "wall_s": wall,
            "per_minute": 60 * len(waits) / wall, "first_median_s": statistics.median(w for n, w in waits if n == 0),
            "next_median_s": statistics.median(follow) if follow else None, "next_max_s": max(follow, default=None)}


def table(rows: list[dict], model: str, threads: int) -> str:
    body = [[r["users"], r["answers"], r["failed"], f"{r['per_minute']:.1f}", f"{r['first_median_s']:.0f} s",
             f"{r['next_median_s']:.0f} s" if r["next_median_s"] else "–",
             f"{r['next_max_s']:.0f} s" if r["next_max_s"] else "–"] for r in rows]
    head = ["users at once", "answers", "failed", "answers / min", "first answer (reads the file), median",
            "next answers, median", "next answers, slowest"]
    cpu = Path("/proc/cpuinfo").read_text().split("model name")[1].split("\n")[0].strip(" :\t")
    return (f"One replica behind nginx, {model}, {threads} CPU threads ({cpu}), `python -m benchmarks.replica_load`, "
            f"{time.strftime('%Y-%m-%d')}:\n\n" + markdown_table(head, body))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--questions", type=int, default=3)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--cpu-threads", type=int, default=2)
    parser.add_argument("--readme", action="store_true", help="splice the table into docs/deploy.md")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="replica-load-"))
    server = start_app("--model", args.model, "--cpu-threads", str(args.cpu_threads), "--workspaces",
                       str(folder / "ws"), "--replica", "r1", timeout_s=900)
    nginx, url = start_proxy({"r1": int(server.url.rsplit(":", 1)[1].strip("/"))}, folder)
    try:
        rows = []
        for users in args.users:
            rows.append(round_of(url, users, args.questions, folder))
            print(rows[-1], flush=True)
    finally:
        nginx.terminate()
        server.stop()
    publish("replica_load", rows, table(rows, args.model, args.cpu_threads), readme=args.readme)


if __name__ == "__main__":
    main()
