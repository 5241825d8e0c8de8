"""Feeding many small files vs one file of the same text, through the launched app over HTTP.

A user's zip of ten thousand tiny files must not feed much slower than one big file: every file is its
own span in the context (so answers can cite it), but the model should see the same few large prefill
chunks, and progress should not re-send a ten-thousand-row table. This measures the whole path a browser
drives (upload, read, feed, with streamed progress) in tokens added per second of wall time, both
variants side by side on one server.

    python -m benchmarks.many_files --files 10000 --readme
"""

from __future__ import annotations

import argparse
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

from benchmarks.launched_app import start_app
from benchmarks.report import publish
from ingest.tables import markdown_table
from ingest.units import human_bytes

SETTINGS = ("You are a helpful assistant.", 0.0, 0.9, 16, 1.0, True, 5)  # the /run inputs, as the panel starts


def stdlib_pieces(files: int, lines_per_file: int) -> list[tuple[str, str]]:
    """(name, text) pieces of real Python: consecutive lines of the standard library's modules."""
    names, lines = [], []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
        lines += text
        names += [path.stem] * len(text)
        if len(lines) >= files * lines_per_file:
            break
    pieces = []
    for i in range(files):
        lo = i * lines_per_file
        body = "\n".join(lines[lo : lo + lines_per_file]) + "\n"
        pieces.append((f"repo/{names[lo]}_{i:05d}.py", body))
    return pieces


def write_variants(pieces: list[tuple[str, str]], folder: Path) -> tuple[Path, Path]:
    """The pieces as a zip of files, and concatenated into one file."""
    archive, single = folder / f"{len(pieces)}-files.zip", folder / "one-file.py"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for name, body in pieces:
            z.writestr(name, body)
    single.write_text("".join(body for _, body in pieces), encoding="utf-8")
    return archive, single


def feed(url: str, path: Path) -> dict:
    """Upload, read and feed ``path`` in a new session as the browser's event chain does; time it."""
    from gradio_client import Client, handle_file

    client = Client(url, verbose=False)
    started = time.perf_counter()
    client.predict([handle_file(str(path))], api_name="/add_files")
    client.predict(api_name="/read")
    read_s = time.perf_counter() - started
    updates = sum(1 for _ in client.submit(*SETTINGS, api_name="/run"))
    seconds = time.perf_counter() - started
    tokens = client.predict(api_name="/panel")[3]["context_tokens"]
    return {"file": path.name, "bytes": path.stat().st_size, "tokens": tokens, "seconds": round(seconds, 2),
            "read_s": round(read_s, 2), "updates": updates, "tokens_per_s": round(tokens / seconds, 1)}


def run(files: int, lines_per_file: int, model: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="many-files-") as tmp:
        archive, single = write_variants(stdlib_pieces(files, lines_per_file), Path(tmp))
        server = start_app("--model", model, "--cpu-threads", "2", "--context-budget", "4000000")
        try:
            one = feed(server.url, single)
            many = feed(server.url, archive)
        finally:
            server.stop()
    return {"files": files, "lines_per_file": lines_per_file, "model": model, "one_file": one, "many_files": many,
            "ratio": round(many["tokens_per_s"] / one["tokens_per_s"], 3),
            "date": time.strftime("%Y-%m-%d")}


def table(result: dict) -> str:
    rows = []
    for label, r in (("one file", result["one_file"]), (f"{result['files']:,} files in a zip", result["many_files"])):
        rows.append([label, human_bytes(r["bytes"]), f"{r['tokens']:,}", f"{r['seconds']:,.1f}",
                     f"{r['tokens_per_s']:,.0f}"])
    body = markdown_table(["upload", "size", "tokens", "seconds (upload → fed)", "tokens/s"], rows)
    return (f"{body}\n\nMany small files feed at **{result['ratio']:.0%}** of one file's rate (target ≥ 70 %); "
            f"{result['model']} model, measured over HTTP on one launched app, {result['date']}.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--lines-per-file", type=int, default=3)
    parser.add_argument("--model", default="demo", help="what app.py --model gets (default: the demo model)")
    parser.add_argument("--readme", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    result = run(args.files, args.lines_per_file, args.model)
    publish("many_files", result, table(result), readme=args.readme)


if __name__ == "__main__":
    main()
