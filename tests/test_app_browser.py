"""The app in headless Chromium: drop a PDF into the chat box, ask, wait for the answer, save a screenshot.

The screenshot (docs/screenshot.png) is the one the README shows.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from app_fixtures import ROOT, make_pdf, shared_server

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = ROOT / "docs" / "screenshot.png"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]

# A real drop: the same DragEvent sequence a user's drag and drop fires, with the file in its DataTransfer.
DROP_FILE = """async ({selector, name, b64, mime}) => {
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const dataTransfer = new DataTransfer();
  dataTransfer.items.add(new File([bytes], name, {type: mime}));
  const target = document.querySelector(selector);
  for (const type of ["dragenter", "dragover", "drop"]) {
    target.dispatchEvent(new DragEvent(type, {bubbles: true, cancelable: true, dataTransfer}));
  }
}"""


@pytest.mark.browser
def test_drop_ask_answer_and_screenshot(tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is not installed (apt-get install chromium)")
    playwright = pytest.importorskip("playwright.sync_api")
    server = shared_server()
    pdf = make_pdf(tmp_path / "annual_report.pdf", pages=8, secret_page=5)

    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1100})
            page.goto(server.url)
            page.wait_for_selector("#chat-input textarea", timeout=60_000)

            page.evaluate(DROP_FILE, {"selector": "#chat-input .full-container", "name": pdf.name,
                                      "b64": base64.b64encode(pdf.read_bytes()).decode(), "mime": "application/pdf"})
            page.wait_for_selector("#chat-input .thumbnail-item, #chat-input .thumbnails", timeout=30_000)
            page.fill("#chat-input textarea", "What is the pass key?")
            page.keyboard.press("Enter")

            # The answer arrives with its sources; the documents table and the live panel are updated.
            page.wait_for_function(
                "() => [...document.querySelectorAll('#chat .message')].some(m => m.innerText.includes('Sources'))",
                timeout=120_000)
            page.wait_for_function(
                "() => document.querySelector('#documents-table').innerText.includes('in context')", timeout=30_000)
            page.wait_for_function(
                "() => /decode\\n[0-9]/i.test(document.querySelector('#live-panel').innerText)", timeout=10_000)
            page.wait_for_timeout(1500)  # one more panel tick so the numbers are the final ones

            chat = page.inner_text("#chat")
            assert "annual_report.pdf" in chat and "What is the pass key?" in chat
            assert "annual_report.pdf p. " in chat  # a cited page
            table = page.inner_text("#documents-table")
            assert "annual_report.pdf" in table and "in context" in table
            panel = page.inner_text("#live-panel").lower()
            assert "tok/s" in panel and "kv cache" in panel and "decode\n–" not in panel

            SCREENSHOT.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
        finally:
            browser.close()
    assert SCREENSHOT.stat().st_size > 20_000
