"""Language labels: langchain's Language enum decides which labels get code-aware splitting."""

from __future__ import annotations

from langchain_text_splitters import Language

import ingest
from ingest.chunking import Splitter
from ingest.languages import _BY_EXTENSION, language_for, splitter_languages
from ingest_fixtures import report_for, write_tree


def test_every_splitter_language_is_reachable_by_extension():
    assert splitter_languages() <= {language.value for language in Language}
    assert splitter_languages() <= set(_BY_EXTENSION.values())  # our labels use the enum's spelling
    assert {"python", "js", "cpp", "markdown"} <= splitter_languages()


def test_languages_langchain_cannot_split_are_split_as_prose(tmp_path):
    assert language_for("tool.pl") == "perl"  # in the enum, but 'not implemented yet' in langchain 1.1.3
    assert Splitter(50, len).spans("my $x = 1;\n\nprint $x;\n", "perl") == [(0, 22)]
    corpus = ingest.ingest([str(write_tree(tmp_path / "repo", {"tool.pl": "my $x = 1;\nprint $x;\n"}))])
    assert report_for(corpus, "repo/tool.pl").status == "ingested"
