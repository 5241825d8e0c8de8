"""The app's method on a Qwen2 model (the bundled default's architecture), built here at random with a ChatML
tokenizer: a window not taken from its training length (and said so), sources and quoting for a document that
fits inside the window and one far longer, and memory that grows by the tokens read, not by a window per question.
"""

from __future__ import annotations

import pytest
import torch

from app.cli import AppConfig
from app.engine.citations import Ranking
from app.engine.context import ContextEngine
from app.engine.context_records import AnswerResult
from app.engine.generation import GenerationSettings
from app.engine.model_loading import UNMEASURED_WINDOW, ModelChoice, load_runtime
from chat_templates import CHATML, byte_level
from ingest import Provenance
from lminfinite.kv_bytes import KVShape
from lminfinite_models import held_bytes

ASK = GenerationSettings(temperature=0.0, max_new_tokens=6, recall=True, topk=4, quote=True)
TRAINED = 32768


class Chunk:
    def __init__(self, text: str, source: str, page: int):
        self.text, self.where = text, Provenance(source, page)


def pages(count: int, words: int = 60) -> list[Chunk]:
    """A report whose page 7 (of ``count``) alone speaks of the magnetron; every other page is filler."""
    chunks = []
    for page in range(1, count + 1):
        body = " ".join(f"filler{(page * 31 + i) % 97}" for i in range(words))
        if page == 7:
            body += " The magnetron calibration constant is 4471."
        chunks.append(Chunk(f"--- page {page} ---\n{body}\n", "report.pdf", page))
    return chunks


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = byte_level(CHATML)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=TRAINED,
                         eos_token_id=end, tie_word_embeddings=False)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    Qwen2ForCausalLM(config).save_pretrained(folder)
    GenerationConfig(eos_token_id=end).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def runtime_of(folder: str, window: int | None = None):
    config = AppConfig(model=folder, window=window, prefill_chunk=64, cpu_threads=1, dtype="float32", topk=4)
    return load_runtime(config, ModelChoice(folder, "test", "tiny Qwen2"))


def ask(engine: ContextEngine, question: str) -> AnswerResult:
    result = None
    for result in engine.ask(question, ASK):
        pass
    assert isinstance(result, AnswerResult)
    return result


def test_an_unmeasured_model_gets_a_window_below_its_training_length_and_the_header_says_so(qwen_dir):
    runtime = runtime_of(qwen_dir)
    assert runtime.window == UNMEASURED_WINDOW < TRAINED
    assert f"window {UNMEASURED_WINDOW:,}, not measured for this model (trained on {TRAINED:,}" in runtime.notice
    chosen = runtime_of(qwen_dir, window=256)
    assert chosen.window == 256 and "window 256 (--window; trained on 32,768)" in chosen.notice


def test_a_document_inside_the_window_still_gets_sources_and_a_quote(qwen_dir):
    runtime = runtime_of(qwen_dir)
    engine = ContextEngine(runtime, system_prompt="Answer from the document.")
    for _ in engine.feed_documents(pages(10)):
        pass
    assert engine.length < runtime.window  # nothing is recalled: the document is all in the window
    result = ask(engine, "What is the magnetron calibration constant?")
    report = result.citations
    assert not report.recalled and report.citations[0].where == Provenance("report.pdf", 7)
    assert result.quoted and "4471" in engine.turns[-1].quoted


def test_a_snippet_shows_the_documents_words_not_the_chat_format_or_the_file_header(qwen_dir):
    runtime = runtime_of(qwen_dir)
    engine = ContextEngine(runtime, system_prompt="Answer questions about the document.")
    chunk = Chunk("### notes.txt\nThe magnetron calibration constant is 4471 units.", "notes.txt", 1)
    for _ in engine.feed_documents([chunk]):
        pass
    assert "user" in engine.format.tokenizer.decode(engine.token_ids[engine.spans[1].start:engine.spans[1].end])
    snippet = ask(engine, "What is the magnetron calibration constant?").citations.citations[0].snippet
    assert snippet.startswith("The magnetron") and "###" not in snippet and "user" not in snippet


def test_a_document_far_beyond_the_window_gets_recalled_sources_fused_with_its_words(qwen_dir):
    runtime = runtime_of(qwen_dir, window=128)
    engine = ContextEngine(runtime, system_prompt="Answer from the document.")
    for _ in engine.feed_documents(pages(30)):
        pass
    assert engine.length > 10 * runtime.window
    result = ask(engine, "What is the magnetron calibration constant?")
    report = result.citations
    assert report.recalled and report.attention_ranking and report.lexical_ranking[0] == Provenance("report.pdf", 7)
    assert Provenance("report.pdf", 7) in [c.where for c in report.citations]  # a random model's recall is noise
    engine.ranking = Ranking.LEXICAL
    result = ask(engine, "What is the magnetron calibration constant?")
    assert result.citations.citations[0].where == Provenance("report.pdf", 7)
    assert result.quoted and "4471" in engine.turns[-1].quoted


def test_twenty_questions_grow_memory_by_the_tokens_read_not_by_a_window_each(qwen_dir):
    """Each answered question used to keep its undo points, each holding the window ring as it was: a ring per
    question (0.8 GB a question at a 32K window). Now the growth is bounded by what was read, with room for one
    ring (the first turn's undo point) and the middle store's quarter of spare capacity."""
    runtime = runtime_of(qwen_dir, window=128)
    engine = ContextEngine(runtime, system_prompt="Answer from the document.")
    for _ in engine.feed_documents(pages(30)):
        pass
    ask(engine, "What is the magnetron calibration constant?")
    held, length = held_bytes(engine), engine.length
    for i in range(19):
        ask(engine, f"What does filler{i} on page {i % 30 + 1} say?")
    config = runtime.model.config
    token = KVShape.from_config(config).token_bytes(torch.float32)  # every layer's key and value of one token
    ring = (runtime.lm_config.n_starting + runtime.window) * token
    read = engine.length - length
    grown = held_bytes(engine) - held
    assert len(engine.turns) == 20 and read > 0
    assert grown <= 1.25 * read * token + ring + (1 << 16), (grown, read * token, ring)
    assert sum(turn.before is not None for turn in engine.turns) == 2  # the first turn's and the last's
