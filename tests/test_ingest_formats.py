"""Notebooks, HTML, XML, office documents and the source-file languages."""

from __future__ import annotations

import json
import time

import pytest

import ingest
from ingest.formats import html_to_text, notebook_to_text
from ingest.languages import language_for
from ingest_fixtures import make_zip, report_for, write_tree


def _notebook(cells: list[dict], language: str = "python") -> str:
    return json.dumps({"cells": cells, "metadata": {"kernelspec": {"language": language, "name": "k"},
                                                    "language_info": {"name": language}},
                       "nbformat": 4, "nbformat_minor": 5}, indent=1)


CELLS = [
    {"cell_type": "markdown", "metadata": {}, "source": ["# Analysis\n", "\n", "We load the data."]},
    {"cell_type": "code", "execution_count": 1, "metadata": {}, "source": ["import math\n", "print(math.pi)"],
     "outputs": [{"output_type": "stream", "name": "stdout", "text": ["3.141592653589793 OUTPUT_TEXT\n"]},
                 {"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo" * 2000}, "metadata": {}}]},
    {"cell_type": "code", "execution_count": None, "metadata": {}, "source": "", "outputs": []},
    {"cell_type": "raw", "metadata": {}, "source": "raw cell text"},
    {"cell_type": "code", "execution_count": 2, "metadata": {}, "source": "def area(r):\n    return math.pi * r ** 2",
     "outputs": []},
]


def test_notebook_cells_become_text_with_markers_and_outputs_are_dropped(tmp_path):
    (tmp_path / "analysis.ipynb").write_text(_notebook(CELLS))
    corpus = ingest.ingest([tmp_path / "analysis.ipynb"])
    r = report_for(corpus, "analysis.ipynb")
    assert (r.status, r.language, r.reason) == ("ingested", "notebook", "cell outputs not read (2)")
    assert corpus.text == (
        "### analysis.ipynb (python)\n"
        "# %% [markdown] cell 1\n# Analysis\n\nWe load the data.\n\n"
        "# %% [code] cell 2\nimport math\nprint(math.pi)\n\n"
        "# %% [raw] cell 4\nraw cell text\n\n"
        "# %% [code] cell 5\ndef area(r):\n    return math.pi * r ** 2\n")
    assert "OUTPUT_TEXT" not in corpus.text and "iVBOR" not in corpus.text
    # line numbers refer to the produced text; the marker above a line names its cell
    assert corpus.locate(corpus.text.index("print(math.pi)")).cite() == "analysis.ipynb:8"
    assert corpus.chunks[0].language == "python"


def test_broken_notebook_is_read_as_text_and_says_so(tmp_path):
    (tmp_path / "broken.ipynb").write_text('{"cells": [ {"cell_type": "code", "source": "x = 1"\n')
    corpus = ingest.ingest([tmp_path / "broken.ipynb"])
    r = report_for(corpus, "broken.ipynb")
    assert (r.status, r.language) == ("ingested", "json")
    assert r.reason == "not a valid Jupyter notebook; read as plain text"
    assert '"x = 1"' in corpus.text
    other = notebook_to_text(_notebook([{"cell_type": "code", "source": "x <- 1", "outputs": []}], "R"))
    assert other.language == "r" and other.text == "# %% [code] cell 1\nx <- 1\n"
    js = notebook_to_text(_notebook([{"cell_type": "code", "source": "let x = 1", "outputs": []}], "javascript"))
    assert js.text.startswith("// %% [code] cell 1\n")


def test_notebook_of_an_unexpected_shape_is_read_as_text(tmp_path):
    shapes = {"count.ipynb": {"nbformat": 3, "worksheets": [{"cells": 5}], "note": "important text"},
              "string.ipynb": {"nbformat": 3, "worksheets": [{"cells": "print('hi')"}]},
              "bare.ipynb": {"nbformat": 3, "worksheets": [{"metadata": {}}, "sheet"]}}
    for name, nb in shapes.items():
        (tmp_path / name).write_text(json.dumps(nb))
        assert notebook_to_text(json.dumps(nb)) is None
    corpus = ingest.ingest([tmp_path / name for name in shapes])
    assert [(r.path, r.status, r.language, r.reason) for r in corpus.reports] == [
        (name, "ingested", "json", "not a valid Jupyter notebook; read as plain text") for name in shapes]
    assert '"note": "important text"' in corpus.text and '"cells": "print(\'hi\')"' in corpus.text


HTML = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Release notes</title>
<style>body { color: red } .secret { display: none }</style>
<script>var apiKey = "SCRIPT_SECRET"; document.write("<p>not text</p>");</script></head>
<body><nav><a href="/">Home</a></nav>
<h1>Version 2.0</h1>
<p>Faster   startup &amp; <b>lower</b> memory&nbsp;use.</p>
<ul><li>New <code>--plan</code> flag</li><li>Fixed &lt;tar&gt; reading</li></ul>
<pre>
$ python -m ingest --plan repo.tgz
    indented output
</pre>
<table><tr><th>Format</th><th>Status</th></tr><tr><td>zip</td><td>ok</td></tr></table>
<noscript>Enable JavaScript</noscript><template><p>TEMPLATE_TEXT</p></template>
</body></html>
"""


def test_html_becomes_readable_text(tmp_path):
    (tmp_path / "notes.html").write_text(HTML)
    corpus = ingest.ingest([tmp_path / "notes.html"])
    r = report_for(corpus, "notes.html")
    assert (r.status, r.language, r.reason) == ("ingested", "html", "")
    body = corpus.text
    for gone in ("SCRIPT_SECRET", "color: red", "<p>", "<b>", "TEMPLATE_TEXT", "Enable JavaScript", "&amp;"):
        assert gone not in body
    assert body.startswith("### notes.html\n# Release notes\n\nHome\n\n# Version 2.0\n\n")
    assert "Faster startup & lower memory\xa0use.\n" in body
    assert "- New --plan flag\n- Fixed <tar> reading\n" in body
    assert "$ python -m ingest --plan repo.tgz\n    indented output\n" in body
    assert "Format | Status\nzip | ok\n" in body
    assert html_to_text("").text == ""


def test_html_declared_charset_is_used_when_not_utf8(tmp_path):
    page = '<html><head><meta http-equiv="Content-Type" content="text/html; charset=Shift_JIS"></head>' \
           "<body><p>日本語のページです。</p></body></html>"
    (tmp_path / "ja.htm").write_bytes(page.encode("shift_jis"))
    corpus = ingest.ingest([tmp_path / "ja.htm"])
    r = report_for(corpus, "ja.htm")
    assert (r.status, r.reason) == ("ingested", "not UTF-8; decoded as shift_jis (declared in the file)")
    assert "日本語のページです。" in corpus.text


def test_declared_charset_that_cannot_be_the_files_gives_way_to_detection(tmp_path):
    # the declaration is ASCII, so UTF-16 and transforms that are not charsets cannot be true
    body = "<p>Caf\xe9 cr\xe8me: C:\\new\\table\\x41.txt</p>"
    paths = []
    for charset in ("utf-16", "utf-16le", "unicode_escape", "undefined", "idna", "punycode", "rot13", "base64"):
        for pad in ("", " "):  # an even length once: UTF-16 then decodes without an error
            path = tmp_path / f"{charset}{len(pad)}.html"
            page = f'<html><head><meta charset="{charset}"></head><body>{body}</body></html>{pad}'
            path.write_bytes(page.encode("cp1252"))
            paths.append(path)
    corpus = ingest.ingest(paths)
    assert {(r.status, r.reason) for r in corpus.reports} == {("ingested", "not UTF-8; decoded as cp1252 (detected)")}
    assert corpus.text.count("\nCaf\xe9 cr\xe8me: C:\\new\\table\\x41.txt\n") == len(paths)


def test_markup_left_open_at_the_end_shows_nothing_and_takes_linear_time():
    # html.parser's close() reads such a '<' as text and retries at every later '<', scanning to the end each
    # time: 60 KB of '<a ' took 3 s and 80 KB 55 s.  Browsers show nothing of markup cut off by the end.
    endings = ["<a " * 20_000, '<a b=<a <a b="x >!"' * 4_000, "<!--x>" * 10_000, "</" * 30_000, "<?x " * 15_000]
    started = time.perf_counter()
    for ending in endings:
        assert html_to_text("<p>kept</p>" + ending).text == "kept\n"
    assert time.perf_counter() - started < 5.0  # the old parser took over 5 s here; this one well under 0.5 s
    assert html_to_text("<p>1 < 2</p> and 3 <").text == "1 < 2\n\nand 3 <\n"  # a '<' that opens nothing is text


def test_an_unknown_marked_section_is_skipped_and_the_page_after_it_kept():
    # html.parser raises on '<![foo' (3.11); browsers read it as a comment up to the next '>'
    for section in ("<![foo bar]>", "<![<!x>", "<![if !IE]>"):
        assert html_to_text(f"<p>before</p>{section}<p>after</p>").text == "before\n\nafter\n", section


def test_xml_is_read_as_text_and_office_documents_are_refused_with_advice(tmp_path):
    (tmp_path / "pom.xml").write_text('<?xml version="1.0"?>\n<project><name>demo</name></project>\n')
    (tmp_path / "report.docx").write_bytes(b"PK\x03\x04" + bytes(60))
    corpus = ingest.ingest([tmp_path / "pom.xml", tmp_path / "report.docx"])
    xml = report_for(corpus, "pom.xml")
    assert (xml.status, xml.language) == ("ingested", "xml")
    assert "<name>demo</name>" in corpus.text
    docx = report_for(corpus, "report.docx")
    assert docx.status == "skipped"
    assert docx.reason == "Word documents (.docx) are not read; export the file as PDF or text"


@pytest.mark.parametrize("name,language", [
    ("a.rb", "ruby"), ("a.php", "php"), ("a.hpp", "cpp"), ("a.hh", "cpp"), ("a.cc", "cpp"), ("a.cxx", "cpp"),
    ("a.kt", "kotlin"), ("a.kts", "kotlin"), ("a.swift", "swift"), ("a.scala", "scala"), ("a.lua", "lua"),
    ("a.pl", "perl"), ("a.pm", "perl"), ("a.r", "r"), ("a.R", "r"), ("a.jl", "julia"), ("a.dart", "dart"),
    ("a.cs", "csharp"), ("a.fs", "fsharp"), ("a.m", "objc"), ("a.mm", "objc"), ("a.sql", "sql"),
    ("a.vue", "vue"), ("a.svelte", "svelte"), ("a.tsx", "ts"), ("a.jsx", "js"), ("a.mjs", "js"),
    ("a.cjs", "js"), ("a.ex", "elixir"), ("a.exs", "elixir"), ("a.erl", "erlang"), ("a.hs", "haskell"),
    ("a.ml", "ocaml"), ("a.clj", "clojure"), ("a.groovy", "groovy"), ("build.gradle", "groovy"),
    ("a.proto", "proto"), ("main.tf", "hcl"), ("a.ini", "ini"), ("setup.cfg", "ini"), ("nginx.conf", "ini"),
    (".env.example", "dotenv"), ("run.bat", "batch"), ("a.ps1", "powershell"), ("Makefile", "make"),
    ("Dockerfile", "docker"), ("Dockerfile.dev", "docker"), ("CMakeLists.txt", "cmake"), ("x.cmake", "cmake"),
    ("page.xhtml", "html"), ("nb.ipynb", "notebook"), ("BUILD.bazel", "starlark"), ("Vagrantfile", "ruby"),
])
def test_source_extensions_have_languages(name, language):
    assert language_for(f"src/{name}") == language


def test_env_templates_are_read_but_env_files_stay_secret(tmp_path):
    repo = write_tree(tmp_path / "app", {".env": "TOKEN=real\n", ".env.local": "TOKEN=local\n",
                                         ".env.example": "TOKEN=changeme\n", "main.go": "package main\n"})
    reasons = {r.path: (r.status, r.reason) for r in ingest.ingest([repo]).reports}
    assert reasons["app/.env.example"] == ("ingested", "")
    assert reasons["app/.env"] == reasons["app/.env.local"] == ("skipped", "may contain secrets")


def test_notebooks_and_html_inside_archives(tmp_path):
    archive = make_zip(tmp_path / "site.zip", {"docs/index.html": HTML, "nb/analysis.ipynb": _notebook(CELLS)})
    corpus = ingest.ingest([archive])
    assert [(r.path, r.status, r.language) for r in corpus.reports] == [
        ("site.zip/docs/index.html", "ingested", "html"), ("site.zip/nb/analysis.ipynb", "ingested", "notebook")]
    assert "SCRIPT_SECRET" not in corpus.text and "OUTPUT_TEXT" not in corpus.text
