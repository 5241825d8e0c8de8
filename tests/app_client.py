"""A small gradio_client driver for the launched app: the same steps the browser's event chain runs."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from gradio_client import Client, handle_file

SYSTEM = "You are a helpful assistant. Answer questions about the document."
SETTINGS = {"system_prompt": SYSTEM, "temperature": 0.0, "top_p": 0.9, "max_new_tokens": 48,
            "repetition_penalty": 1.0, "recall": True, "topk": 5, "quote": True, "guess": True}
SETTING_ORDER = list(SETTINGS)


def message_text(message: dict) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def answers_in(view) -> list[str]:
    """Answer messages (not status blocks) of a view tuple's chat."""
    return [message_text(m) for m in view[0] if m["role"] == "assistant" and not m.get("metadata")]


class AppClient:
    """One browser session (its own session hash) talking to the app over HTTP."""

    def __init__(self, url: str):
        self.client = Client(url, verbose=False)
        self.view = None  # (chat, documents, context html, activity html)

    # -- steps ---------------------------------------------------------------------------------
    def submit(self, text: str = "", files=()) -> tuple:
        message = {"text": text, "files": [handle_file(str(f)) for f in files]}
        out = self.client.predict(message, api_name="/submit")
        self.view = out[1:]
        return self.view

    def add_files(self, files) -> tuple:
        out = self.client.predict([handle_file(str(f)) for f in files], api_name="/add_files")
        self.view = out[1:]
        return self.view

    def read(self) -> tuple:
        self.view = self.client.predict(api_name="/read")
        return self.view

    def run_job(self, **settings):
        values = {**SETTINGS, **settings}
        return self.client.submit(*[values[k] for k in SETTING_ORDER], api_name="/run")

    def run(self, **settings) -> tuple:
        job = self.run_job(**settings)
        self.view = job.result()
        return self.view

    def ask(self, text: str, files=(), **settings) -> str:
        """Submit, read the attachments, run; returns the last answer's text without its timing footer."""
        self.submit(text, files)
        self.read()
        self.run(**settings)
        return answer_body(self.last_answer())

    def add_documents(self, files, **settings) -> tuple:
        self.add_files(files)
        self.read()
        return self.run(**settings)

    def stop(self) -> str:
        return self.client.predict(api_name="/stop")

    def panel(self) -> dict:
        return self.client.predict(api_name="/panel")[3]

    def show(self) -> tuple:
        self.view = self.client.predict(api_name="/show")
        return self.view

    def call(self, api_name: str) -> tuple:
        self.view = self.client.predict(api_name=api_name)
        return self.view

    def export(self) -> tuple[str, dict]:
        update = self.client.predict(api_name="/export")
        paths = update["value"] if isinstance(update, dict) else update
        md = next(p for p in paths if str(p).endswith(".md"))
        js = next(p for p in paths if str(p).endswith(".json"))
        return Path(md).read_text(encoding="utf-8"), json.loads(Path(js).read_text(encoding="utf-8"))

    def wait_for_phase(self, phase: str, detail: str | None = None, timeout_s: float = 60, job=None) -> dict | None:
        """The live panel once it shows ``phase`` under way; None when ``job`` ended first (between two polls)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            data = self.panel()
            if data["phase"] == phase and data["done"] > 0 and (detail is None or data["detail"] == detail):
                return data
            if job is not None and job.done():
                return None
            time.sleep(0.05)
        raise AssertionError(f"phase {phase!r} not reached within {timeout_s} s (last: {data})")

    # -- reading the view ----------------------------------------------------------------------
    @property
    def chat(self) -> list[dict]:
        return self.view[0]

    @property
    def rows(self) -> list[list]:
        """The Files table, with its token counts ("12,345" on screen) read back as numbers."""
        return [[_number(cell) if i == 3 else cell for i, cell in enumerate(row)] for row in self.view[1]["data"]]

    def row(self, name: str) -> list:
        matches = [r for r in self.rows if r[0] == name]
        assert matches, f"{name} not in {self.rows}"
        return matches[-1]

    @property
    def context_tokens(self) -> int:
        return int(re.search(r"<b>([\d,]+)</b> tokens in context", self.view[2]).group(1).replace(",", ""))

    def answers(self) -> list[str]:
        return answers_in(self.view)

    def last_answer(self) -> str:
        answers = self.answers()
        assert answers, f"no answer in {self.chat}"
        return answers[-1]


def _number(cell):
    """'12,345' -> 12345; an empty cell stays ''."""
    if isinstance(cell, str) and re.fullmatch(r"\d{1,3}(,\d{3})*", cell):
        return int(cell.replace(",", ""))
    return cell


SOURCE_LINK = re.compile(r"\]\(gradio_api/file=[^)#]*(#page=\d+)?\)")


def answer_body(markdown: str) -> str:
    """The answer and its sources, without the timing footer (timings differ between runs), each source's link
    kept as the page it opens (its folder is the session's own: source_files.py)."""
    body = markdown.split("\n\n<sub>first token")[0]
    return SOURCE_LINK.sub(lambda m: f"](opens{m.group(1) or ''})", body)
