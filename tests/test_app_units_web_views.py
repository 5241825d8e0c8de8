"""Fast unit tests of what the page shows: chat messages, the panel, activity, rates, charts, the progress bar. No
model, no server."""

from __future__ import annotations

import re

import pytest

from app.engine.citations import Citation
from app.engine.context_records import AnswerProgress, AnswerStage
from app.engine.metrics import DeviceMemory, Feeding, LiveStats, RateMeter, SessionSeries, device_memory
from app.session.state import ChatItem, ItemKind
from app.web import views
from ingest import Provenance


# -- views ---------------------------------------------------------------------------------------
def test_chat_messages_render_answers_sources_and_stops():
    items = [
        ChatItem("user", "question", "What is the key?", files=["r.pdf"]),
        ChatItem("assistant", "status", "r.pdf: ✓ in context", title="Added 1 file"),
        ChatItem("assistant", "answer", "It is 42.", citations=[Citation(Provenance("r.pdf", 3), 0.6, "the key is 42")],
                 stats={"ttft_s": 0.25, "decode_tps": 31.0, "tokens": 5, "finish": "eos"}),
        ChatItem("user", "question", "More?", in_context=False),
        ChatItem("assistant", "answer", "Well", stopped=True, in_context=False),
    ]
    messages = views.chat_messages(items)
    assert messages[0] == {"role": "user", "content": "*Attached: r.pdf*\n\nWhat is the key?"}
    assert messages[1]["metadata"] == {"title": "Added 1 file", "status": "done"}
    assert (f"It is 42.\n\n{views.SOURCES_HEADING}\n"
            "- `r.pdf p. 3` · 60% · “the key is 42”") in messages[2]["content"]
    assert "first token 250 ms · 31 tok/s · 5 tokens</sub>" in messages[2]["content"]
    assert "not in the context" in messages[3]["content"]
    assert "Stopped: this exchange was not kept" in messages[4]["content"]


def test_panel_and_activity_show_the_numbers():
    stats = LiveStats(phase="prefill", detail="documents", context_tokens=1234, kv_starting=1024, kv_window=2048,
                      kv_middle=4096, prefill_tps=812.0, decode_tps=0.0, done=500, total=1000, eta_s=0.6)
    memory = device_memory("cpu")
    html = views.panel_html(stats, memory, 10_000, vanilla_kv=50_000)
    assert "1,234 tokens" in html and "812 tok/s" in html and "7.0 KB" in html and "48.8 KB" in html
    activity = views.activity_html(stats)
    assert "500 / 1,000 tokens" in activity and "ETA 600 ms" in activity and "width:50.0%" in activity
    assert memory.kind == "cpu" and memory.allocated > 0 and memory.peak >= memory.allocated


def test_an_eta_reads_the_same_in_the_chat_and_in_the_panel():
    """Issue "What a user sees", item 5: the chat's reading line said '948.0 s' while the panel said '15.8 min'."""
    from app.session.model_work import feeding_line

    stats = LiveStats(phase="prefill", detail="documents", prefill_tps=80.0, done=500, total=76_000, eta_s=948.0)
    assert feeding_line(stats) == "500 / 76,000 tokens · 80 tok/s · ETA 15.8 min"
    assert "ETA 15.8 min" in views.activity_html(stats)


# -- rates, charts and progress (the rough edges a real browser showed) --------------------------
def test_rates_need_real_work_over_real_time():
    """One decoded token 10 µs after the meter started once read as 100,000 tok/s and squashed the chart."""
    now = [0.0]
    meter = RateMeter(clock=lambda: now[0])
    now[0] = 1e-5
    meter.add(1)
    assert meter.rate == 0 and meter.final_rate == 0 and meter.eta(100) is None
    now[0] = 0.1
    meter.add(9)
    assert meter.rate == 0  # not yet 0.25 s of work
    assert meter.final_rate == pytest.approx(100)  # a finished phase is measured over its whole real duration
    now[0] = 0.5
    meter.add(40)
    assert meter.rate == pytest.approx(100) and meter.eta(100) == pytest.approx(1.0)


def test_a_feed_paused_for_a_question_keeps_its_own_rate_and_its_figures():
    """A feed waits between two chunks while a question asked meanwhile is answered: a minute there is not the
    feed's, and its phase and progress come back however the answer ends."""
    now = [0.0]
    meter = RateMeter(clock=lambda: now[0])
    now[0] = 2.0
    meter.add(60)
    with meter.paused():
        now[0] = 62.0
    assert meter.rate == pytest.approx(30) and meter.eta(300) == pytest.approx(10)
    stats = LiveStats()
    stats.prefilling(Feeding.DOCUMENTS, 9000)
    stats.done, stats.eta_s, stats.prefill_tps = 1024, 265.0, 30.0
    with pytest.raises(RuntimeError), stats.aside():
        stats.decoding(128)
        stats.done, stats.prefill_tps = 7, 1.0
        raise RuntimeError("the answer failed")
    assert (stats.phase, stats.feeding, stats.done, stats.total, stats.eta_s, stats.prefill_tps) == (
        "prefill", Feeding.DOCUMENTS, 1024, 9000, 265.0, 30.0)


def test_charts_plot_only_the_running_phase_and_idle_ticks_add_nothing():
    series = SessionSeries()
    memory = DeviceMemory("cpu", 2**20, None, 2**20, 2**30, "CPU")
    stats = LiveStats(prefill_tps=5000.0, decode_tps=90.0)  # the last values of phases that are over
    first = series.record(memory, stats)
    assert (first.prefill_tps, first.decode_tps) == (0, 0)
    assert series.record(memory, stats) is None and series.version == 1  # idle and unchanged: no new sample
    stats.prefilling(Feeding.QUESTION, 0)  # a question's prefill measures latency, not throughput
    assert (series.record(memory, stats).prefill_tps, series.record(memory, stats).decode_tps) == (0, 0)
    stats.prefilling(Feeding.DOCUMENTS, 0)
    sample = series.record(memory, stats)
    assert (sample.prefill_tps, sample.decode_tps) == (5000, 0)
    stats.phase, stats.detail = "decode", "answer"
    sample = series.record(memory, stats)
    assert (sample.prefill_tps, sample.decode_tps) == (0, 90)
    stats.phase = "idle"
    sample = series.record(memory, stats)
    assert (sample.prefill_tps, sample.decode_tps) == (0, 0)  # the lines drop to 0 when the work ends
    assert series.record(memory, stats) is None
    stats.kv_window = 4096  # work shorter than a tick still shows: it changed the cache
    assert series.record(memory, stats) is not None and series.record(memory, stats) is None


class _RacingStats(LiveStats):
    """The engine's thread moves ``done`` on between any two reads of it, as it does while prefilling."""

    def __getattribute__(self, name):
        value = object.__getattribute__(self, name)
        if name == "done":
            object.__setattr__(self, "done", value + 710)
        return value


def test_progress_bar_width_and_its_text_come_from_the_same_numbers():
    html = views.activity_html(_RacingStats(phase="prefill", detail="documents", done=140, total=1000))
    width = float(re.search(r"width:([\d.]+)%", html).group(1))
    done, total = (int(n.replace(",", "")) for n in re.search(r"([\d,]+) / ([\d,]+) tokens", html).groups())
    assert width == pytest.approx(100 * done / total) and f"({done / total:.0%})" in html


def test_regenerated_answer_says_it_was_sampled():
    item = ChatItem("assistant", "answer", "Another take.",
                    stats={"ttft_s": 0.4, "decode_tps": 50.0, "tokens": 3, "finish": "eos",
                           "sampling": "regenerated with sampling, temperature 0.7"})
    assert ("first token 400 ms · 50 tok/s · 3 tokens · regenerated with sampling, temperature 0.7</sub>"
            in views.answer_markdown(item))


def test_a_pending_answer_says_what_it_reads_until_its_first_token():
    page, lines = Provenance("report_v2.pdf", 5, "v"), Provenance("src/x_y.py", None, None, 3, 40)
    item = ChatItem("assistant", ItemKind.ANSWER, pending=True)
    assert views.answer_markdown(item) == "…"
    item.progress = AnswerProgress(AnswerStage.QUESTION, 0, 30, 0.0, context_tokens=94210)
    assert views.answer_markdown(item) == "*Reading the question into the context of 94,210 tokens…*"
    # Two chunks of one page are one passage; labels are escaped as citations are.
    quoted = "*Reading the 2 passages quoted for the answer (report\\_v2.pdf p. 5 \\(v\\), src/x\\_y.py:3\\-40): "
    item.progress = AnswerProgress(AnswerStage.QUOTES, 0, 1536, 0.0, sources=(page, page, lines))
    assert views.answer_markdown(item) == quoted + "1,536 tokens…*"
    item.progress = AnswerProgress(AnswerStage.QUOTES, 512, 1536, 16.0, sources=(page, lines), rate=32.0, eta_s=32.0)
    assert views.answer_markdown(item) == quoted + "512 of 1,536 tokens · 32 tok/s · about 32.0 s left…*"
    item.progress = AnswerProgress(AnswerStage.QUOTES, 1536, 1536, 48.0, rate=32.0, eta_s=0.0)  # the question alone
    assert views.answer_markdown(item) == ("*Reading the question in the answer's own context: 1,536 of 1,536 tokens "
                                           "· 32 tok/s…*")
    item.text = "The pass key is 71432."  # the first token replaces it
    assert views.answer_markdown(item) == "The pass key is 71432."


def test_a_source_shows_the_heading_its_best_chunk_falls_under_as_text():
    item = ChatItem("assistant", "answer", "Use --track-origins=yes.", citations=[
        Citation(Provenance("manual.pdf", 82, "70", heading="4. Memcheck › 4.3. *Flags* <b>x</b>"), 0.6, "origin"),
        Citation(Provenance("src/a.py", None, None, 3, 9), 0.4, "")])
    lines = views.answer_markdown(item).splitlines()
    assert lines[-2] == ("- `manual.pdf p. 82 (70)` · *4. Memcheck › 4.3. \\*Flags\\* &lt;b&gt;x&lt;/b&gt;* · "
                         "60% · “origin”")
    assert lines[-1] == "- `src/a.py:3-9` · 40%"
