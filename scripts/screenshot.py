"""README's screenshot: the default (real) model answering a question about a real PDF, with the page it cites.

    python scripts/screenshot.py [--pdf PATH] [--question TEXT] [--out docs/screenshot.png]

Starts ``python app.py`` as a user would (no flags), drops the PDF into the chat box in headless Chromium,
asks, waits for the answer and its sources, and saves a full-page screenshot; then opens the first cited source
as a click on it does (the PDF at the cited page: ``…-source.png``) and shows the same workspace on a phone's
screen (390 × 844: ``…-phone.png``). Prints the answer and the cited sources so whoever refreshes the pictures
can check them before committing them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the app and benchmarks packages, and the tests' helpers

from app_fixtures import start_server  # noqa: E402
from test_app_browser import CHROMIUM, CHROMIUM_ARGS, drop_pdf_and_ask  # noqa: E402

SPEC = "/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf"
# The chat scrolls to its newest line; the picture starts at the question instead, so none of it is cut off.
FRAME_THE_QUESTION = """() => {
    const question = [...document.querySelectorAll('#chat .message')].find(m => m.innerText.includes('?'));
    let box = question.parentElement;
    while (box && box.scrollHeight <= box.clientHeight) box = box.parentElement;
    box.scrollTop += question.getBoundingClientRect().top - box.getBoundingClientRect().top - 8;
}"""


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pdf", default=SPEC)
    p.add_argument("--question", default="Who is the author of the Shared MIME-info Database specification?")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshot.png")
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    pdf = Path(args.pdf)
    server = start_server(real_model=True)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1440, "height": 1100})  # one browser: one workspace
            page = context.new_page()
            drop_pdf_and_ask(page, server.url, pdf, args.question)
            page.wait_for_function(
                "() => [...document.querySelectorAll('#chat .message')].some(m => m.innerText.includes('Sources'))",
                timeout=900_000)
            page.wait_for_timeout(2500)  # two more panel ticks: the final numbers
            page.evaluate(FRAME_THE_QUESTION)
            answer = page.inner_text("#chat")
            args.out.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(args.out), full_page=True)
            link = page.locator("#chat a[href*='#page=']").first
            href = page.evaluate("(href) => new URL(href, document.baseURI).href", link.get_attribute("href"))
            print(f"first source opens {href}")
            opened = context.new_page()
            opened.set_viewport_size({"width": 1100, "height": 1100})
            opened.goto(href)
            opened.wait_for_timeout(4000)  # the PDF viewer draws the page
            opened.screenshot(path=str(args.out.with_name(args.out.stem + "-source.png")))
            phone = context.new_page()
            phone.set_viewport_size({"width": 390, "height": 844})
            phone.goto(server.url)  # the same browser: the same workspace, reopened
            phone.wait_for_function(
                "() => [...document.querySelectorAll('#chat .message')].some(m => m.innerText.includes('Sources'))",
                timeout=300_000)
            phone.wait_for_timeout(2500)
            phone.evaluate(FRAME_THE_QUESTION)
            phone.screenshot(path=str(args.out.with_name(args.out.stem + "-phone.png")))
            browser.close()
        print(answer[-1500:])
        print(f"saved {args.out}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
