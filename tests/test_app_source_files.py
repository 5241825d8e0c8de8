"""Citations that open what they cite (app/session/source_files.py): an uploaded PDF is kept as a hard link in a
session folder named by a random token and linked at the cited page; text and code as a page of their lines, linked
at the first cited line (line_view.py), or as .txt when large; HTML-like and compressed uploads are not linked; a
freed session's files go."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote

from app.session import source_files
from app.session.source_files import FILE_ROUTE, SourceFiles, keep_uploads
from app.session.state import ChatItem, ItemKind
from app.web import views
from ingest.results import FileReport, Provenance


def kept_path(url: str) -> Path:
    return Path(unquote(url.removeprefix(FILE_ROUTE).split("#")[0]))


def test_a_pdf_opens_at_the_cited_page_and_text_as_text(tmp_path):
    pdf, code = tmp_path / "manual.pdf", tmp_path / "app.py"
    pdf.write_bytes(b"%PDF-1.4 fake"), code.write_text("print('hi')\n")
    files = SourceFiles()
    keep_uploads(files, [str(pdf), str(code)], [FileReport("manual.pdf", "ingested", pages=9),
                                                FileReport("app.py", "ingested")])
    url = files.url(Provenance("manual.pdf", page=7, page_label="vii"))
    assert url.startswith(FILE_ROUTE) and url.endswith("#page=7")
    kept = kept_path(url)
    assert kept.read_bytes() == pdf.read_bytes() and kept.stat().st_ino == pdf.stat().st_ino  # linked, not copied
    assert kept.parent.parent == source_files.served_root() and len(kept.parent.name) == 32  # a random token
    text_url = files.url(Provenance("app.py", line_start=1, line_end=1))
    assert text_url.endswith("#L1") and kept_path(text_url).suffix == ".html"  # the file's lines (line_view.py)
    assert files.url(Provenance("other.pdf", page=1)) is None
    files.release()
    assert not kept.exists() and files.url(Provenance("manual.pdf", page=7)) is None


def test_pages_html_archives_and_unread_files_get_no_link(tmp_path):
    names = ["page.html", "drawing.svg", "repo.zip", "manual.pdf.gz", "broken.pdf"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    files = SourceFiles()
    keep_uploads(files, [str(tmp_path / n) for n in names],
                 [FileReport(n, "ingested") for n in names[:4]] + [FileReport("broken.pdf", "error", "damaged")])
    assert all(files.url(Provenance(n, page=1)) is None for n in names)
    assert not list(source_files.served_root().glob("*/*page.html*"))


def test_each_session_has_its_own_unguessable_folder(tmp_path):
    pdf = tmp_path / "a.pdf"
    pdf.write_bytes(b"%PDF")
    first, second = SourceFiles(), SourceFiles()
    for files in (first, second):
        files.keep("a.pdf", pdf)
    one, two = (kept_path(f.url(Provenance("a.pdf", page=1))) for f in (first, second))
    assert one.parent != two.parent and oct(os.stat(one.parent).st_mode)[-3:] == "700"
    first.release()
    assert not one.exists() and two.exists()
    second.release()


def test_the_chat_links_a_kept_source_and_an_export_does_not():
    from app.engine.citations import Citation

    where = Provenance("manual.pdf", page=3)
    item = ChatItem("assistant", ItemKind.ANSWER, "It is 42.", citations=[Citation(where, 0.8, "snippet")])
    linked = views.answer_markdown(item, lambda w: f"{FILE_ROUTE}/x/manual.pdf#page={w.page}")
    assert f"[manual.pdf p. 3]({FILE_ROUTE}/x/manual.pdf#page=3)" in linked
    plain = views.chat_messages([item])[0]["content"]
    assert "`manual.pdf p. 3`" in plain and FILE_ROUTE not in plain


def test_code_opens_at_its_cited_line_numbered_as_ingest_numbers_it_and_shown_as_text(tmp_path):
    from ingest import ingest

    source = tmp_path / "tool.py"
    body = ["# a tool", "<script>alert(1)</script>", "", "def run():\r", "    return '&amp;'"] + \
        [f"x_{n} = {n}" for n in range(200)]
    source.write_bytes("\n".join(body).encode() + b"\n")
    files = SourceFiles()
    keep_uploads(files, [str(source)], [FileReport("tool.py", "ingested")])
    chunk = ingest(source, chunk_tokens=64).chunks[2]  # a chunk further down, as ingest numbered its lines
    url = files.url(chunk.where)
    assert url.endswith(f"#L{chunk.where.line_start}")
    page = kept_path(url).read_text()
    start, end = chunk.where.line_start, chunk.where.line_end
    assert f'<li id="L{start}">{body[start - 1]}</li>' in page and body[end - 1] in chunk.text  # ingest's line
    assert f'<li id="L{len(body)}">x_199 = 199</li>' in page and f'id="L{len(body) + 1}"' not in page
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown, never run
    assert "&amp;amp;" in page and "default-src 'none'" in page
    assert '<li id="L3"> </li>' in page and '<li id="L4">def run():</li>' in page  # \r\n ends one line
    files.release()


def test_a_text_file_too_large_for_a_page_of_lines_is_linked_as_text(tmp_path, monkeypatch):
    from app.session import line_view

    monkeypatch.setattr(line_view, "MAX_BYTES", 10)
    big = tmp_path / "notes.md"
    big.write_text("line one\nline two\n")
    files = SourceFiles()
    files.keep("notes.md", big)
    url = files.url(Provenance("notes.md", line_start=2, line_end=2))
    assert "#" not in url and kept_path(url).suffix == ".txt" and kept_path(url).stat().st_ino == big.stat().st_ino
    files.release()
