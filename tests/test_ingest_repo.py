"""Repository folders: .gitignore, skip rules, ordering, symlinks, limits."""

from __future__ import annotations

import os

import pytest

import ingest
from ingest.gitignore import GitIgnoreMatcher
from ingest_fixtures import report_for, write_tree

UTIL = "def helper(x):\n    return x * 2\n"


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "proj"
    write_tree(root, {
        "README.md": "# Project\n\nRead me first.\n",
        "src/app.py": "from util import helper\n\nprint(helper(2))\n",
        "src/util.py": UTIL,
        "src/zz_copy.py": UTIL,
        "src/sub/.gitignore": "generated.py\n",
        "src/sub/generated.py": "GENERATED = True\n",
        "src/generated.py": "NOT_IGNORED_HERE = True\n",
        "docs/guide.md": "## Guide\n\nSteps.\n",
        ".gitignore": "*.log\n!keep.log\nsecrets/\n",
        "app.log": "noise\n",
        "keep.log": "important log\n",
        "secrets/key.txt": "hunter2\n",
        "node_modules/pkg/index.js": "module.exports = 1;\n",
        "build/out.txt": "built\n",
        ".git/config": "[core]\n",
        "package-lock.json": "{}\n",
        "logo.png": b"\x89PNG\r\n\x1a\n\x00\x00",
        "data.dat": b"\x00\x01\x02\x03" * 10,
        "bundle.zip": b"PK\x03\x04rest",
        ".env": "TOKEN=abc\n",
        "Makefile": "all:\n\techo hi\n",
    })
    return root


def test_repository_skip_rules_each_with_a_reason(repo):
    corpus = ingest.ingest([repo])
    assert all(r.path.startswith("proj/") for r in corpus.reports)  # the folder's name, even alone
    reasons = {r.path.removeprefix("proj/"): (r.status, r.reason) for r in corpus.reports}
    assert reasons == {
        "README.md": ("ingested", ""),
        ".env": ("skipped", "may contain secrets"),
        ".git/": ("skipped", "version-control folder (not read)"),
        ".gitignore": ("ingested", ""),
        "app.log": ("skipped", "ignored by .gitignore"),
        "build/": ("skipped", "build output or cache folder (not read)"),
        "bundle.zip": ("skipped", "archive inside a repository or archive (not opened)"),
        "data.dat": ("skipped", "binary file"),
        "docs/guide.md": ("ingested", ""),
        "keep.log": ("ingested", ""),
        "logo.png": ("skipped", "binary file (.png)"),
        "Makefile": ("ingested", ""),
        "node_modules/": ("skipped", "dependency/vendored folder (not read)"),
        "package-lock.json": ("skipped", "lock file"),
        "secrets/": ("skipped", "ignored by .gitignore (not read)"),
        "src/app.py": ("ingested", ""),
        "src/generated.py": ("ingested", ""),
        "src/sub/.gitignore": ("ingested", ""),
        "src/sub/generated.py": ("skipped", "ignored by .gitignore"),
        "src/util.py": ("ingested", ""),
        "src/zz_copy.py": ("skipped", "duplicate of proj/src/util.py"),
    }
    assert "hunter2" not in corpus.text and "TOKEN=abc" not in corpus.text
    assert report_for(corpus, "proj/src/app.py").language == "python"
    assert report_for(corpus, "proj/Makefile").language == "make"


def test_readme_first_then_files_by_path_with_headers(repo):
    corpus = ingest.ingest([repo])
    order = [r.path.removeprefix("proj/") for r in corpus.reports if r.status == "ingested"]
    assert order == ["README.md", ".gitignore", "docs/guide.md", "keep.log", "Makefile", "src/app.py",
                     "src/generated.py", "src/sub/.gitignore", "src/util.py"]
    assert corpus.text.startswith("### proj/README.md\n# Project\n")
    assert "\n\n### proj/src/app.py (python)\nfrom util import helper\n" in corpus.text
    assert [c.source for c in corpus.chunks] == ["proj/" + p for p in order]


def test_symlinks_never_escape_the_root_and_fifos_are_not_opened(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("private data outside the repo\n")
    root = write_tree(tmp_path / "r", {"real.txt": "real content\n", "dir/inner.txt": "inner\n"})
    os.symlink(outside, root / "escape.txt")
    os.symlink(root / "real.txt", root / "alias.txt")
    os.symlink(root / "dir", root / "dirlink")
    os.symlink(root / "missing.txt", root / "broken.txt")
    os.mkfifo(root / "pipe")
    corpus = ingest.ingest([root])
    reasons = {r.path.removeprefix("r/"): (r.status, r.reason) for r in corpus.reports}
    assert reasons["escape.txt"] == ("skipped", "symlink points outside the repository (not followed)")
    assert reasons["dirlink/"] == ("skipped", "symlink to a folder (not followed)")
    assert reasons["broken.txt"] == ("skipped", "broken symlink")
    assert reasons["pipe"] == ("skipped", "not a regular file (device, socket or pipe)")
    assert reasons["alias.txt"] == ("ingested", "")  # inside the root: read once ...
    assert reasons["real.txt"] == ("skipped", "duplicate of r/alias.txt")  # ... and deduplicated
    assert "private data" not in corpus.text


def test_file_count_total_bytes_and_depth_limits(tmp_path):
    root = write_tree(tmp_path / "many", {f"f{i}.txt": f"file number {i}\n" for i in range(6)})
    few = ingest.ingest([root], limits=ingest.IngestLimits(max_files=4))
    assert [r.path for r in few.reports if r.status == "ingested"] == [
        "many/f0.txt", "many/f1.txt", "many/f2.txt", "many/f3.txt"]
    assert few.reports[-1].status == "skipped" and "more than 4 files" in few.reports[-1].reason

    small = ingest.ingest([root], limits=ingest.IngestLimits(max_total_bytes=40))
    statuses = [(r.path, r.status, r.reason) for r in small.reports]
    assert statuses[:2] == [("many/f0.txt", "ingested", ""), ("many/f1.txt", "ingested", "")]
    assert statuses[3] == ("many/f3.txt", "skipped", "total input limit of 40 B reached")

    deep = write_tree(tmp_path / "deep", {"a/b/c/d/e.txt": "deep\n", "a/top.txt": "top\n"})
    shallow = ingest.ingest([deep], limits=ingest.IngestLimits(max_depth=2))
    assert {(r.path, r.status) for r in shallow.reports} == {("deep/a/top.txt", "ingested"),
                                                             ("deep/a/b/c/", "skipped")}


def test_several_sources_are_prefixed_and_kept_in_the_given_order(tmp_path):
    a = write_tree(tmp_path / "alpha", {"README": "alpha readme\n", "m.py": "A = 1\n"})
    b = write_tree(tmp_path / "beta", {"README.md": "beta readme\n"})
    lone = tmp_path / "yarn.lock"
    lone.write_text("# lock file picked on purpose\n")
    corpus = ingest.ingest([b, a, lone])
    assert [r.path for r in corpus.reports] == ["beta/README.md", "alpha/README", "alpha/m.py", "yarn.lock"]
    assert report_for(corpus, "yarn.lock").status == "ingested"  # repository rules do not apply to picked files
    assert corpus.text.index("### beta/README.md") < corpus.text.index("### alpha/m.py")


def test_empty_folder_is_reported(tmp_path):
    (tmp_path / "void").mkdir()
    corpus = ingest.ingest([tmp_path / "void"])
    assert [(r.path, r.status, r.reason) for r in corpus.reports] == [("void/", "skipped", "empty folder")]
    assert corpus.text == "" and corpus.n_tokens == 0


def test_gitignore_matcher_nested_negation_and_directories():
    files = {"": ["*.tmp", "build/", "/only_root.txt"], "pkg": ["!keep.tmp", "local.txt"]}
    m = GitIgnoreMatcher(lambda folder: files.get(folder))
    assert m.ignored("x.tmp") and m.ignored("pkg/x.tmp")
    assert not m.ignored("pkg/keep.tmp")  # deeper negation wins
    assert m.ignored("build", is_dir=True) and m.ignored("pkg/build", is_dir=True)
    assert not m.ignored("build")  # a file named build is not the folder pattern
    assert m.ignored("only_root.txt") and not m.ignored("pkg/only_root.txt")
    assert m.ignored("pkg/local.txt") and not m.ignored("local.txt")
