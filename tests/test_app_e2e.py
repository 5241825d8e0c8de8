"""End to end: `python app.py` on the demo model, driven over HTTP with gradio_client.

Each AppClient is its own browser session. Decoding is greedy, so "the same inputs" must give the same
answer in a fresh session, whatever was stopped or refused on the way.
"""

from __future__ import annotations

import pytest

from app_client import AppClient, answer_body, answers_in, message_text
from app_fixtures import make_corrupt_pdf, make_long_text, make_pdf, make_repo_zip, shared_server


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    base = tmp_path_factory.mktemp("docs")
    return {
        "pdf": make_pdf(base / "report.pdf"),
        "zip": make_repo_zip(base / "demo_repo.zip"),
        "corrupt": make_corrupt_pdf(base / "broken.pdf"),
        "long": make_long_text(base / "long_notes.txt"),
        "secret": make_pdf(base / "secret.pdf", pages=3, secret_page=2, secret="55555"),
        "big": _big_file(base / "big.txt"),
    }


def _big_file(path):
    path.write_text("x" * (3 * 1024 * 1024), encoding="utf-8")  # over the server's --max-file-size 2MB
    return path


def test_upload_ask_stream_with_sources_and_live_panel(server, files):
    app = AppClient(server.url)
    app.submit("What is the pass key?", [files["pdf"], files["zip"]])
    assert message_text(app.chat[0]).startswith("*Attached: report.pdf, demo_repo.zip*")
    app.read()
    assert app.row("report.pdf")[1] == "… waiting for the model"
    logo = app.row("demo_repo.zip/demo_repo/logo.png")  # archive entries are named with their archive
    assert logo[1] == "– skipped" and "binary" in logo[4]

    job = app.run_job()
    streamed = [answers_in(out) for out in job]
    app.view = job.result()
    _assert_streamed_as_it_grew(app, streamed)
    _assert_every_document_in_context(app)
    _assert_sources_said(app.last_answer())
    data = _assert_the_panel_shows_the_work(app)

    app.add_documents([files["secret"]])
    grown = app.panel()
    assert grown["context_tokens"] > data["context_tokens"] and grown["kv_middle"] > data["kv_middle"]
    assert (grown["kv_starting"], grown["kv_window"]) == (data["kv_starting"], data["kv_window"])  # bounded
    assert data["phase"] == "idle"


def _assert_streamed_as_it_grew(app, streamed):
    texts = [answer_body(answers[-1]) for answers in streamed if answers]
    final_text = answer_body(app.last_answer())
    assert len(texts) >= 2, "the answer was not streamed"
    assert texts[0] == "…"  # shown as soon as answering starts
    # Then what is guessed and read before the first token (views.progress_markdown), and only before it.
    reading = [i for i, t in enumerate(texts) if t.startswith(("*Guessing ", "*Reading ")) and t.endswith("…*")]
    answering = [i for i, t in enumerate(texts) if t != "…" and i not in reading]
    growing = [" ".join(texts[i].split()) for i in answering]  # Gradio's chatbot dedents (inspect.cleandoc)
    assert reading and growing and all(i < answering[0] for i in reading)
    final_words = " ".join(final_text.split())
    kept = final_words.split(" **Sources**")[0]
    cut = "cut where the answer began to repeat itself" in app.last_answer()
    for partial in growing:  # every streamed state is a prefix of the final answer, or, when the answer was cut
        if cut:              # where it began to repeat itself, the kept answer is a prefix of what was streamed
            assert partial.startswith(kept) or kept.startswith(partial), (partial, kept)
        else:
            assert final_words[: len(partial)] == partial


def _assert_every_document_in_context(app):
    repo = "demo_repo.zip/demo_repo/"
    for name, pages in (("report.pdf", 6), (repo + "README.md", ""), (repo + "src/greet.py", ""),
                        (repo + "src/util.py", "")):
        row = app.row(name)
        assert row[1] == "✓ in context" and row[2] == pages and int(row[3]) > 0, row
    document_tokens = sum(int(app.row(n)[3]) for n in ("report.pdf", repo + "README.md", repo + "src/greet.py",
                                                          repo + "src/util.py"))
    assert app.context_tokens > document_tokens


def _assert_sources_said(answer):
    assert "**Sources**, best first (the one the answer is read from, then by the question's words" in answer
    cited = answer.split("**Sources**")[1]
    assert "report.pdf p. " in cited or "demo_repo/" in cited
    assert "% of that score" in cited and "% · “" in cited  # what the percentage is; the text


def _assert_the_panel_shows_the_work(app) -> dict:
    """The live panel's numbers after the answer; returns them."""
    data = app.panel()
    assert data["context_tokens"] == app.context_tokens
    assert data["prefill_tps"] > 0 and data["decode_tps"] > 0 and data["ttft_s"] > 0
    assert data["memory"]["allocated"] > 0 and data["memory"]["total"] > data["memory"]["allocated"]
    assert data["kv_starting"] > 0 and data["kv_window"] > 0 and data["kv_middle"] > 0
    assert data["context_tokens"] > data["n_starting"] + data["window"]  # the context outgrew the window
    return data


def test_corrupt_file_is_reported_and_changes_nothing(server, files):
    app = AppClient(server.url)
    app.ask("What is the pass key?", [files["pdf"]])
    tokens, rows, answers = app.context_tokens, [r for r in app.rows], app.answers()
    app.add_documents([files["corrupt"]])
    row = app.row("broken.pdf")
    assert row[1] == "✗ error" and "not a readable PDF" in row[4]
    assert app.context_tokens == tokens and app.panel()["context_tokens"] == tokens
    assert app.rows[: len(rows)] == rows and app.answers() == answers
    assert any("broken.pdf" in message_text(m) for m in app.chat if m.get("metadata"))


def test_uploads_over_the_size_limit_are_refused(server, files):
    app = AppClient(server.url)
    with pytest.raises(Exception, match="exceeds the maximum file size"):
        app.add_files([files["big"]])
    app.show()
    assert app.context_tokens == 0 and app.rows == []


def test_sessions_never_see_each_others_documents(server, files):
    alice, bob = AppClient(server.url), AppClient(server.url)
    alice.ask("What is the pass key?", [files["secret"]])
    bob.show()
    assert bob.rows == [] and bob.context_tokens == 0
    bob.ask("What is the pass key?")
    assert bob.rows == []
    assert bob.context_tokens < alice.context_tokens - alice.row("secret.pdf")[3] // 2
    markdown, data = bob.export()
    assert "secret.pdf" not in markdown and "55555" not in markdown and data["documents"] == []
    markdown, data = alice.export()
    assert [d["path"] for d in data["documents"]] == ["secret.pdf"] and "What is the pass key?" in markdown


def test_stop_mid_prefill_leaves_the_context_of_a_fresh_session(server, files):
    stopped = AppClient(server.url)
    first = stopped.ask("What is the pass key?", [files["pdf"]])
    tokens = stopped.context_tokens
    stopped.add_files([files["long"]])
    stopped.read()
    job = stopped.run_job()
    stopped.wait_for_phase("prefill", "documents")
    assert "Stopping" in stopped.stop()
    stopped.view = job.result()
    row = stopped.row("long_notes.txt")
    assert row[1] == "■ cancelled" and "tokens were added" in row[4] and row[3] == ""
    assert stopped.context_tokens == tokens
    second = stopped.ask("Say the pass key once more.")

    fresh = AppClient(server.url)
    assert fresh.ask("What is the pass key?", [files["pdf"]]) == first
    assert fresh.ask("Say the pass key once more.") == second
    assert fresh.context_tokens == stopped.context_tokens


def _stopped_mid_answer(server, files) -> AppClient:
    """A session with the PDF whose next answer was stopped mid-way (sampled at temperature 2, an answer runs
    from a few tokens to 400; one that ends before Stop lands, or before the panel shows it, is tried again in a
    new session)."""
    for _ in range(10):
        app = AppClient(server.url)
        app.add_documents([files["pdf"]])
        app.submit("Write a long story about the sky, the sun and the grass.")
        app.read()
        job = app.run_job(temperature=2.0, top_p=1.0, max_new_tokens=400)
        if app.wait_for_phase("decode", job=job) is not None:
            app.stop()
        app.view = job.result()
        if "Stopped: this exchange was not kept in the context" in app.last_answer():
            return app
    pytest.fail("ten answers in a row ended before Stop reached the server")


def test_stop_mid_answer_leaves_the_context_of_a_fresh_session(server, files):
    stopped = _stopped_mid_answer(server, files)
    assert "not in the context" in message_text([m for m in stopped.chat if m["role"] == "user"][-1])
    documents_only = AppClient(server.url)
    documents_only.add_documents([files["pdf"]])
    assert stopped.context_tokens == documents_only.context_tokens
    second = stopped.ask("What is the pass key?")

    assert documents_only.ask("What is the pass key?") == second
    assert documents_only.context_tokens == stopped.context_tokens


def test_regenerate_clear_and_new_context(server, files):
    app = AppClient(server.url)
    app.add_documents([files["pdf"]])
    documents_only = app.context_tokens
    app.ask("What is the pass key?")
    app.call("/regenerate")
    app.run()
    regenerated = app.last_answer()  # greedy decoding would repeat itself: Regenerate samples, and says so
    assert len(app.answers()) == 1 and "regenerated with sampling, temperature 0.7" in regenerated
    assert app.context_tokens > documents_only

    app.call("/clear")
    app.run()
    assert app.answers() == [] and app.context_tokens == documents_only
    assert app.row("report.pdf")[1] == "✓ in context"

    app.call("/new_context")
    app.run()
    assert app.rows == [] and app.context_tokens == 0 and app.chat == []
