"""Session state to component values: chat messages, table rows, HTML panels and plot frames.

Pure formatting: plain Python in, plain Python (and pandas for the plots) out.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

import pandas as pd

from ingest.results import Provenance
from ingest.units import human_bytes

from ..engine.budget import Budget
from ..engine.context_records import AnswerProgress, AnswerStage
from ..engine.generation import Finish
from ..engine.metrics import DeviceMemory, LiveStats, Phase, Sample, human_seconds
from ..session.uploads import STATUS_LABELS, DocumentRow, plural
from ..session.state import ChatItem, ItemKind, Session
from .messages import markdown_text

DOCUMENT_HEADERS = ["File", "Status", "Pages", "Tokens", "Note"]
# The Files table's column widths (of the table's width): the file and the note (a skipped file's reason) get
# the room and wrap; status, pages and tokens stay narrow but never break their header.
DOCUMENT_COLUMN_WIDTHS = ["29%", "19%", "12%", "13%", "27%"]
PHASE_LABELS = {Phase.IDLE: "Idle", Phase.READING: "Reading documents", Phase.PREFILL: "Feeding the model",
                Phase.DECODE: "Answering", Phase.WAITING: "Waiting for the model", Phase.SAVING: "Saving the workspace"}


Opens = Callable[[Provenance], "str | None"]  # a citation's link, or None (source_files.SourceFiles.url)
# An answer's saved numbers hold the Finish's value (a saved workspace's too): a StrEnum key finds it.
FINISH_NOTES = {Finish.LENGTH: " · stopped at max tokens",
                Finish.REPETITION: " · cut where the answer began to repeat itself"}




fmt_seconds = human_seconds  # the panel's, the chat's and the reading line's durations are written alike


def _fmt_rate(rate: float) -> str:
    return f"{rate:,.0f} tok/s" if rate >= 10 else (f"{rate:.1f} tok/s" if rate > 0 else "–")


# -- chat --------------------------------------------------------------------------------------
# Said once per answer, so short: how the passages are ranked (citations.py) and what the percentage is. A quoted
# answer's own passage leads (citations.lead_with_answer_source).
SOURCES_HEADING = ("**Sources**, best first (the one the answer is read from, then by the question's words and the "
                   "attention it drew; % of that score):")
# Why a context read without recall has the budget it has (the context box's note).
WITHOUT_RECALL_WHY = "read without recall: the model keeps no tokens that left its window, so memory stays flat"
# Sources found by the question's words alone: asked while its documents were still fed, with recall off, or in a
# context read without recall (model_work.py).
WORDS_ONLY_HEADING = ("**Sources**, best first (the one the answer is read from, then by the question's words; % of "
                      "that score):")


def cited(where: Provenance, opens: Opens | None) -> str:
    """A citation's label, a link that opens its PDF at the page (or its file) where the file was kept."""
    url = opens(where) if opens is not None else None
    return f"[{markdown_text(where.label())}]({url})" if url else f"`{where.label()}`"


def progress_markdown(progress: AnswerProgress) -> str:
    """What a pending answer is doing before its first token: guessing the documents' words (what it has written),
    reading the question, then the passages quoted for it, how far, and (once a chunk is read) how fast and how long
    is left, as the engine's RateMeter measured them."""
    if progress.stage is AnswerStage.GUESS:
        written = f": “{_guess_words(progress.text)}”" if progress.text.strip() else ""
        return f"*Guessing what the documents say, to search them with{written}…*"
    if progress.stage is AnswerStage.QUESTION:
        return f"*Reading the question into the context of {progress.context_tokens:,} tokens…*"
    labels = list(dict.fromkeys(markdown_text(where.label()) for where in progress.sources))
    what = (f"the {plural(len(labels), 'passage')} quoted for the answer ({', '.join(labels)})" if labels
            else "the question in the answer's own context")
    if not progress.done:
        return f"*Reading {what}: {progress.total:,} tokens…*"
    rate = f" · {_fmt_rate(progress.rate)}" if progress.rate > 0 else ""
    left = f" · about {fmt_seconds(progress.eta_s)} left" if progress.eta_s and progress.eta_s >= 1 else ""
    return f"*Reading {what}: {progress.done:,} of {progress.total:,} tokens{rate}{left}…*"


def guess_markdown(guess: str) -> str:
    """The passage the model wrote before reading, whose words the sources were also searched with (guess.py):
    shown so that a source without the question's words is explained, and marked as not the answer, which it often
    contradicts in its specifics."""
    return (f"<sub>Also searched with a guess the model wrote before reading (not the answer): "
            f"“{_guess_words(guess)}”</sub>")


def _guess_words(guess: str) -> str:
    """The guess on one line, its Markdown escaped: the model writes code blocks and lists there."""
    return markdown_text(" ".join(guess.split()))


def answer_markdown(item: ChatItem, opens: Opens | None = None) -> str:
    """An answer, its sources (each a link where ``opens`` gives one: source_files.py) and its numbers; while it is
    pending, before its first token, what it is reading."""
    waiting = progress_markdown(item.progress) if item.progress is not None else "…"
    parts = [item.text or (waiting if item.pending else "(empty answer)")]
    if item.citations:
        lines = [f"- {cited(c.where, opens)}" + (f" · *{markdown_text(c.where.heading)}*" if c.where.heading else "")
                 + f" · {c.share:.0%}" + (f" · “{c.snippet}”" if c.snippet else "") for c in item.citations]
        if item.stats.get("quoted"):  # the answer was drawn with the first passages quoted before the question
            for index in range(min(item.stats.get("quoted_sources", 1), len(lines))):
                lines[index] += " · *quoted to the model*"
        # With sources, the answer has a note only when they were ranked by the question's words alone (asked
        # while its documents were fed, recall off, or nothing to recall: model_work._finish_answer): say so.
        words_only = bool(item.recall_note)
        parts.append(f"{WORDS_ONLY_HEADING if words_only else SOURCES_HEADING}\n" + "\n".join(lines))
        if words_only:
            parts.append(f"*{item.recall_note}*")
    elif item.recall_note:
        parts.append(f"*{item.recall_note}*")
    if item.stats.get("guess"):
        parts.append(guess_markdown(item.stats["guess"]))
    if item.stats:
        s = item.stats
        sampling = f" · {s['sampling']}" if s.get("sampling") else ""
        parts.append(f"<sub>first token {fmt_seconds(s.get('ttft_s'))} · {_fmt_rate(s.get('decode_tps', 0))} · "
                     f"{s.get('tokens', 0)} tokens{FINISH_NOTES.get(s.get('finish'), '')}"
                     f"{sampling}</sub>")
    if item.stopped:
        parts.append("*■ Stopped: this exchange was not kept in the context.*")
    return "\n\n".join(parts)


def user_text(text: str) -> str:
    """The user's words as they typed them: the Chatbot renders Markdown and drops HTML tags, so a question about
    ``<edit>`` or ``a*b*c`` is escaped to show literally, its line breaks kept."""
    return markdown_text(text).replace("\n", "  \n")


ATTACHED = re.compile(r"\A\*Attached: .*?\*(\n\n|\Z)", re.S)
NOT_IN_CONTEXT = "\n\n<sub>not in the context</sub>"
_ESCAPED = re.compile(r"\\([\\`*_\[\]()!#|~{}+\-])")


def typed_text(content: str) -> str:
    """The words of a question as the user typed them, from its chat message (user_text's Markdown, with what
    chat_messages adds around it), as the Chatbot's edit box gives it back."""
    content = ATTACHED.sub("", str(content)).removesuffix(NOT_IN_CONTEXT).replace("  \n", "\n")
    return _ESCAPED.sub(r"\1", html.unescape(content))


def chat_messages(items: list[ChatItem], opens: Opens | None = None) -> list[dict]:
    """Messages for gr.Chatbot; status and notices render as titled, collapsible blocks. ``opens``: where a
    citation links to (none in an export: its links would lead nowhere outside this server)."""
    messages = []
    for item in items:
        if item.kind == ItemKind.QUESTION:
            text = user_text(item.text)
            if item.files:
                text = "*Attached: " + ", ".join(item.files) + "*" + ("\n\n" + text if text else "")
            if not item.in_context and item.text:
                text += NOT_IN_CONTEXT
            messages.append({"role": "user", "content": text})
        elif item.kind == ItemKind.ANSWER:
            messages.append({"role": "assistant", "content": answer_markdown(item, opens)})
        else:
            metadata = {"title": item.title or ""}
            metadata["status"] = "pending" if item.pending else "done"
            messages.append({"role": "assistant", "content": item.text or " ", "metadata": metadata})
    return messages


# -- documents ---------------------------------------------------------------------------------
def session_view(session: Session, budget: Budget) -> tuple:
    """Chat, documents table, context summary and activity: the outputs of every work event."""
    engine = session.engine
    # Counted from the context, as its tokens are: the table's rows say "reading" while their tokens go in
    # (it showed "5,049 from 0 documents").
    return (
        chat_messages(session.chat, session.sources.url),
        document_rows(session.documents),
        context_html(session.context_tokens, engine.document_tokens if engine else 0, session.budget_tokens,
                     budget.why if session.recall_kept else WITHOUT_RECALL_WHY,
                     engine.document_sources if engine else 0),
        activity_html(session.stats, len(session.pending)),
    )


def document_rows(rows: list[DocumentRow]) -> list[list]:
    """Table rows; token counts with thousands separators ("12,345"), empty when none were added."""
    return [[r.path, STATUS_LABELS.get(r.status, r.status), r.pages or "", f"{r.tokens:,}" if r.tokens else "",
             r.reason] for r in rows]




def context_html(context_tokens: int, document_tokens: int, budget: int, budget_why: str, files: int) -> str:
    share = context_tokens / budget if budget else 0.0
    return (
        '<div class="ctx-summary">'
        f'<div class="ctx-line"><b>{context_tokens:,}</b> tokens in context of a <b>{budget:,}</b>-token budget '
        f'({share:.1%}) · {document_tokens:,} from {files} document{"s" if files != 1 else ""}</div>'
        f'<div class="bar"><div class="bar-fill" style="width:{min(100.0, share * 100):.2f}%"></div></div>'
        f'<div class="ctx-note">Budget: {html.escape(budget_why)}</div></div>'
    )


def reopening_activity(name: str) -> str:
    """The activity line while a saved workspace is read back from disk."""
    return ('<div class="activity busy"><div class="activity-label">Reopening workspace</div>'
            '<div class="bar"><div class="bar-fill striped" style="width:100%"></div></div>'
            f'<div class="activity-detail">{html.escape(name)}</div></div>')


def activity_html(stats: LiveStats, queued: int = 0) -> str:
    """Progress of the running work: what, how far, how fast, how long left; ``queued``: the session's actions
    not finished (between two steps of one, the line said "Idle" while Cancel was active).

    The engine updates ``stats`` from another thread: each figure is read once, so the bar's width and its
    text are computed from the same numbers.
    """
    reading, phase, detail, done, total = stats.reading, stats.phase, stats.detail, stats.done, stats.total
    blocks = []
    if reading:
        blocks.append(
            '<div class="activity busy"><div class="activity-label">Reading documents</div>'
            '<div class="bar"><div class="bar-fill striped" style="width:100%"></div></div>'
            f'<div class="activity-detail">{html.escape(reading)}</div></div>')
    if phase != Phase.IDLE:
        label = PHASE_LABELS.get(phase, phase)
        if phase == Phase.PREFILL:
            fraction = min(1.0, done / total) if total else 0.0
            bits = [f"{done:,} / {total:,} tokens ({fraction:.0%})", _fmt_rate(stats.prefill_tps if done else 0.0),
                    f"ETA {fmt_seconds(stats.eta_s)}"]
            striped = ""
        elif phase == Phase.WAITING:  # behind another session: the detail says behind what, and for how long
            fraction, bits, striped = 1.0, [], " striped"
        else:
            fraction = 1.0
            bits = [f"{done:,} tokens", _fmt_rate(stats.decode_tps), f"first token {fmt_seconds(stats.ttft_s)}"]
            striped = " striped"
        detail = f" ({html.escape(detail)})" if detail else ""
        blocks.append(
            f'<div class="activity busy"><div class="activity-label">{label}{detail}</div>'
            f'<div class="bar"><div class="bar-fill{striped}" style="width:{fraction * 100:.1f}%"></div></div>'
            f'<div class="activity-detail">{" · ".join(bits)}</div></div>')
    if not blocks and queued:
        return ('<div class="activity busy"><div class="activity-label">Waiting for its turn at the model</div>'
                '<div class="bar"><div class="bar-fill striped" style="width:100%"></div></div>'
                f'<div class="activity-detail">{plural(queued, "action")} queued</div></div>')
    if not blocks:
        return '<div class="activity idle">Idle: drop files here or in the chat box.</div>'
    return "".join(blocks)


# -- live panel --------------------------------------------------------------------------------
def _card(title: str, value: str, sub: str = "") -> str:
    return (f'<div class="stat-card"><div class="stat-title">{title}</div><div class="stat-value">{value}</div>'
            f'<div class="stat-sub">{sub}</div></div>')


def panel_html(stats: LiveStats, memory: DeviceMemory, budget: int, vanilla_kv: int | None) -> str:
    if memory.kind == "cuda":
        mem = _card("GPU memory", human_bytes(memory.allocated),
                    f"allocated · reserved {human_bytes(memory.reserved or 0)} · peak {human_bytes(memory.peak)} · "
                    f"total {human_bytes(memory.total)}")
    else:
        mem = _card("Process memory (RSS)", human_bytes(memory.allocated),
                    f"peak {human_bytes(memory.peak)} · machine {human_bytes(memory.total)}")
    vanilla = f" · a full cache would hold {human_bytes(vanilla_kv)}" if vanilla_kv else ""
    kv = _card("KV cache", human_bytes(stats.kv_total),
               f"starting {human_bytes(stats.kv_starting)} · window {human_bytes(stats.kv_window)} · "
               f"middle store {human_bytes(stats.kv_middle)} · rotation tables and spare "
               f"{human_bytes(stats.kv_other)}{vanilla}")
    ctx = _card("Context", f"{stats.context_tokens:,} tokens", f"budget {budget:,}")
    prefill = _card("Prefill", _fmt_rate(stats.prefill_tps), "documents and questions")
    decode = _card("Decode", _fmt_rate(stats.decode_tps), f"time to first token {fmt_seconds(stats.ttft_s)}")
    reading_only = stats.phase == Phase.IDLE and stats.reading
    now = PHASE_LABELS[Phase.READING] if reading_only else PHASE_LABELS.get(stats.phase, stats.phase)
    phase = _card("Now", now, html.escape(stats.reading if reading_only else stats.detail))
    return f'<div class="stat-grid">{mem}{kv}{ctx}{prefill}{decode}{phase}</div>'


def panel_key(html_text: str, data: dict) -> tuple:
    """What makes a panel tick new: its HTML and numbers, less the raw memory bytes, which move on every
    tick (the HTML shows memory to 0.1 MB)."""
    return html_text, {k: v for k, v in data.items() if k != "memory"}


def plot_frames(samples: list[Sample], memory_kind: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Long-format frames for the memory, prefill and decode line plots (each on its own scale)."""
    mem_name = "GPU allocated" if memory_kind == "cuda" else "process RSS"
    memory_rows, prefill_rows, decode_rows = [], [], []
    for s in samples:
        memory_rows += [(s.t, s.memory_mb, mem_name), (s.t, s.kv_mb, "KV cache")]
        prefill_rows.append((s.t, s.prefill_tps, "prefill"))
        decode_rows.append((s.t, s.decode_tps, "decode"))
    columns = ["seconds", "value", "series"]
    return tuple(pd.DataFrame(rows, columns=columns) for rows in (memory_rows, prefill_rows, decode_rows))
