"""The real default model (SmolLM2-135M-Instruct from its package) answers a real PDF through ``/ask``.

``python app.py`` with no flags, as a user starts it; the document is the first pages of a specification
that a Debian package ships (or, without it, pages generated from a stdlib module's documentation).
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
def spec_pdf(tmp_path_factory) -> Path:
    """Pages 1-5 of the Shared MIME-info spec (about 3,000 tokens: more than the 2,048-token window)."""
    if not SPEC.is_file():
        pytest.skip(f"{SPEC} is not installed (apt-get install shared-mime-info)")
    import pymupdf

    out = tmp_path_factory.mktemp("real") / "shared-mime-info-spec.pdf"
    with pymupdf.open(SPEC) as doc:
        doc.select(range(5))
        doc.save(out)
    return out


def test_ask_answers_a_real_pdf_and_cites_the_page(server, spec_pdf):
    client = Client(server.url, verbose=False)
    reply = client.predict("Who is the author of the Shared MIME-info Database specification?",
                           [handle_file(str(spec_pdf))], api_name="/ask")
    assert "SmolLM2" in reply["model"]
    assert [d["status"] for d in reply["documents"]] == ["ingested"] and reply["documents"][0]["pages"] == 5
    assert reply["context_tokens"] > 2048 and reply["in_context"] and "error" not in reply
    assert "Thomas Leonard" in reply["answer"]
    top = reply["sources"][0]
    assert top["file"] == "shared-mime-info-spec.pdf" and top["page"] == 1, reply["sources"]
    assert 0 < top["weight"] <= 1 and top["snippet"]

    # The same client is the same session: the document stays, a second question costs no re-reading.
    again = client.predict("What version of the specification is this?", [], api_name="/ask")
    assert again["context_tokens"] > reply["context_tokens"] and again["documents"] == []
    assert "0.21" in again["answer"], again["answer"]


def test_the_header_names_the_real_model(server):
    import urllib.request

    page = urllib.request.urlopen(server.url, timeout=30).read().decode("utf-8", "replace")
    assert "SmolLM2-135M-Instruct" in page and "not a real reader" not in page
