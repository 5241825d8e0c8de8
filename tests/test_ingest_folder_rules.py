"""One set of repository rules for folders, zips and tars: the same tree lists the same way in each."""

from __future__ import annotations

import os
import tarfile

import pytest

import ingest
from ingest.archive import list_archive
from ingest.folder_rules import FolderRules, may_be_read
from ingest.repo import walk_folder
from ingest_fixtures import make_zip, write_tree

TREE = {
    "README.md": "# Demo\n",
    ".gitignore": "*.log\n!keep.log\ngenerated/\n",
    "src/app.py": "print(1)\n",
    "src/sub/.gitignore": "*.txt\n!notes.txt\n",
    "src/sub/a.txt": "ignored\n",
    "src/sub/notes.txt": "kept\n",
    "app.log": "noise\n",
    "keep.log": "kept\n",
    "generated/out.py": "x = 1\n",
    "node_modules/pkg/index.js": "x\n",
    "poetry.lock": "lock\n",
    "logo.png": b"\x89PNG",
    "a/b/c/deep.md": "deep\n",
}


def _verdicts(listing) -> dict[str, str]:
    """Path below the source's own name -> 'read' or the skip reason (folder counts left out)."""
    out = {}
    for item in listing.items:
        rel = item.path.split("/", 1)[1]
        reason = getattr(item, "reason", None)
        out[rel] = "read" if reason is None else reason.split(" (")[0]
    listing.close()
    return out


@pytest.mark.parametrize("limits", [ingest.IngestLimits(), ingest.IngestLimits(max_depth=2)])
def test_folder_zip_and_tar_agree(tmp_path, limits):
    root = write_tree(tmp_path / "demo", TREE)
    make_zip(tmp_path / "demo.zip", TREE)
    with tarfile.open(tmp_path / "demo.tar.gz", "w:gz") as tar:
        tar.add(root, arcname="demo")
    folder = _verdicts(walk_folder(root, limits, prefix="demo/"))
    assert folder["app.log"] == "ignored by .gitignore" and folder["keep.log"] == "read"
    assert folder["src/sub/a.txt"] == "ignored by .gitignore" and folder["src/sub/notes.txt"] == "read"
    assert folder["generated/"] == "ignored by .gitignore" and folder["node_modules/"] == "dependency/vendored folder"
    assert folder["poetry.lock"] == "lock file" and folder["logo.png"] == "binary file"
    assert ("a/b/c/" in folder) == (limits.max_depth == 2)  # three folders deep
    assert _verdicts(list_archive(tmp_path / "demo.zip", limits)) == folder
    tar = _verdicts(list_archive(tmp_path / "demo.tar.gz", limits))
    assert {rel.removeprefix("demo/"): why for rel, why in tar.items()} == folder


def test_rules_answer_once_per_folder():
    asked = []
    rules = FolderRules(lambda folder: asked.append(folder) or (["*.tmp"] if folder == "" else None),
                        ingest.IngestLimits(max_depth=3))
    assert rules.pruned_ancestor("build/x/y.py") == ("build", "build output or cache folder")
    assert rules.pruned_ancestor("a/b/c/d/e.py") == ("a/b/c/d", "nested deeper than 3 folders")
    assert rules.file_reason("a/x.tmp") == "ignored by .gitignore" and rules.file_reason("a/.git") is not None
    assert rules.file_reason("a/x.py") is None
    assert asked.count("") == 1 and asked.count("a") == 1
    assert may_be_read("src/.gitignore") and not may_be_read("node_modules/x.js") and not may_be_read("a.png")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.timeout(30)
def test_a_fifo_named_gitignore_does_not_block_the_walk(tmp_path):
    root = write_tree(tmp_path / "repo", {"README.md": "# hi\n"})
    os.mkfifo(root / ".gitignore")
    os.makedirs(root / ".git" / "info")
    os.mkfifo(root / ".git" / "info" / "exclude")
    verdicts = _verdicts(walk_folder(root, ingest.IngestLimits(), prefix="repo/"))
    assert verdicts["README.md"] == "read" and verdicts[".gitignore"] == "not a regular file"
