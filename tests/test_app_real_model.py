"""The real default model (SmolLM2-135M-Instruct from its package) answers a real PDF through ``/ask``.

``python app.py`` with no flags, as a user starts it; the document is a specification
that a Debian package ships. The questions are two the model answers right in the document-QA benchmark
(benchmarks/docqa_set.py), where it answers about one in five.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gradio_client import Client, handle_file

from app_fixtures import start_server

SPEC = Path("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf")


@pytest.fixture(scope="module")
def server():
    app = start_server(real_model=True)
    yield app
    app.stop()


@pytest.fixture(scope="module")
def spec_pdf() -> Path:
    """The Shared MIME-info spec: 17 pages, about 9,700 tokens, nine times the 1,024-token window."""
    if not SPEC.is_file():
        pytest.skip(f"{SPEC} is not installed (apt-get install shared-mime-info)")
    return SPEC


def test_ask_answers_a_real_pdf_and_cites_the_page(server, spec_pdf):
    client = Client(server.url, verbose=False)
    reply = client.predict("Who is the author of the Shared MIME-info Database specification?",
                           [handle_file(str(spec_pdf))], api_name="/ask")
    assert "SmolLM2" in reply["model"]
    assert [d["status"] for d in reply["documents"]] == ["ingested"] and reply["documents"][0]["pages"] == 17
    assert reply["context_tokens"] > 9 * 1024 and reply["in_context"] and "error" not in reply
    assert "Thomas Leonard" in reply["answer"]
    top = reply["sources"][0]
    assert top["file"] == "shared-mime-info-spec.pdf" and top["page"] == 1, reply["sources"]
    assert 0 < top["weight"] <= 1 and top["snippet"]

    # The same client is the same session: the document stays, a second question costs no re-reading.
    again = client.predict("What is the default weight value of a glob element?", [], api_name="/ask")
    assert again["context_tokens"] > reply["context_tokens"] and again["documents"] == []
    assert "50" in again["answer"], again["answer"]


def test_the_header_names_the_real_model(server):
    import urllib.request

    page = urllib.request.urlopen(server.url, timeout=30).read().decode("utf-8", "replace")
    assert "SmolLM2-135M-Instruct" in page and "not a real reader" not in page
