"""Display paths say where an entry came from, the same way whatever else is ingested alongside."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import ingest
from ingest.__main__ import main
from ingest_fixtures import make_zip, report_for, write_tree

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO = {
    "demo_repo/README.md": "# Demo repo\n\nA tiny package.\n",
    "demo_repo/src/greet.py": "def greet(name):\n    return f'Hello, {name}!'\n",
    "demo_repo/logo.png": b"\x89PNG\r\n\x1a\n" + bytes(200),
}
DEMO_PATHS = ["repo.zip/demo_repo/README.md", "repo.zip/demo_repo/logo.png", "repo.zip/demo_repo/src/greet.py"]


def test_archive_entries_carry_the_archive_name_alone_or_with_other_sources(tmp_path):
    archive = make_zip(tmp_path / "repo.zip", DEMO)
    note = tmp_path / "note.txt"
    note.write_text("a note\n")
    alone = ingest.ingest([archive])
    together = ingest.ingest([archive, note])
    assert [r.path for r in alone.reports] == DEMO_PATHS
    assert [r.path for r in together.reports] == DEMO_PATHS + ["note.txt"]
    for corpus in (alone, together):
        assert {c.source for c in corpus.chunks} >= {"repo.zip/demo_repo/README.md", "repo.zip/demo_repo/src/greet.py"}
        assert corpus.text.startswith("### repo.zip/demo_repo/README.md\n# Demo repo\n")
        where = corpus.locate(corpus.text.index("return f'Hello"))
        assert where.cite() == "repo.zip/demo_repo/src/greet.py:2"
    assert report_for(alone, "repo.zip/demo_repo/logo.png").reason == "binary file (.png)"


def test_tar_entries_are_shown_like_zip_entries(tmp_path):
    with tarfile.open(tmp_path / "repo.tar.gz", "w:gz") as tf:
        for name, data in DEMO.items():
            path = tmp_path / "src" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data if isinstance(data, bytes) else data.encode())
            tf.add(path, arcname=name)
    corpus = ingest.ingest([tmp_path / "repo.tar.gz"])
    assert [r.path for r in corpus.reports] == [p.replace("repo.zip", "repo.tar.gz") for p in DEMO_PATHS]


def test_folders_carry_their_name_alone_or_with_other_sources(tmp_path):
    folder = write_tree(tmp_path / "proj", {"README.md": "# P\n", "src/a.py": "A = 1\n"})
    other = write_tree(tmp_path / "other", {"b.txt": "b\n"})
    alone = ingest.ingest([folder])
    together = ingest.ingest([other, folder])
    assert [r.path for r in alone.reports] == ["proj/README.md", "proj/src/a.py"]
    assert [r.path for r in together.reports] == ["other/b.txt", "proj/README.md", "proj/src/a.py"]
    assert ingest.ingest([str(folder) + "/"]).reports[0].path == "proj/README.md"  # trailing slash


def test_cli_report_names_the_archive(tmp_path, capsys):
    archive = make_zip(tmp_path / "x.zip", {"README.md": "hello\n", "lib/util.py": "X = 1\n"})
    assert main([str(archive)]) == 0
    out = capsys.readouterr().out
    assert "x.zip/README.md" in out and "x.zip/lib/util.py" in out
    done = subprocess.run([sys.executable, "-m", "ingest", str(archive), "--json"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"path": "x.zip/README.md"' in done.stdout
