"""Git URLs: only https, quick refusal offline, clone under limits (local repo, no network)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

import ingest
from ingest.git_url import CloneRefused, check_https_url, clone, repo_name
from ingest.repo import walk_folder
from ingest_fixtures import Flag, write_tree

GIT = ["git", "-c", "user.name=Test", "-c", "user.email=test@example.invalid", "-c", "init.defaultBranch=main"]


@pytest.mark.parametrize("url", [
    "http://github.com/o/r.git", "ssh://git@github.com/o/r.git", "git://github.com/o/r.git",
    "file:///etc", "git@github.com:o/r.git", "ftp://example.com/r.git",
])
def test_only_https_urls_are_accepted(url):
    corpus = ingest.ingest([url])
    [report] = corpus.reports
    assert (report.path, report.status) == (url, "skipped")
    assert report.reason.startswith("only https:// git URLs are accepted")
    assert corpus.text == ""


def test_urls_can_be_disabled_and_credentials_are_refused():
    [off] = ingest.ingest(["https://github.com/o/r.git"], allow_urls=False).reports
    assert (off.status, off.reason) == ("skipped", "URL sources are disabled")
    with pytest.raises(CloneRefused, match="credentials"):
        check_https_url("https://user:secret@github.com/o/r.git")
    assert check_https_url("https://github.com/o/r.git") == "github.com"
    assert repo_name("https://github.com/o/my-repo.git/") == "my-repo"


def test_unreachable_host_is_refused_within_seconds(tmp_path):
    start = time.monotonic()
    corpus = ingest.ingest(["https://no-such-host.invalid/o/r.git"], limits=ingest.IngestLimits(dns_timeout_s=2))
    assert time.monotonic() - start < 5
    [report] = corpus.reports
    assert report.status == "error"
    assert report.reason == "cannot resolve no-such-host.invalid (offline or unknown host); nothing cloned"


@pytest.fixture
def local_repo(tmp_path):
    root = write_tree(tmp_path / "origin", {"README.md": "# Origin\n", "pkg/mod.py": "VALUE = 42\n",
                                             "big.bin.txt": "x" * 200_000})
    subprocess.run(GIT + ["init", "-q", str(root)], check=True)
    subprocess.run(GIT + ["-C", str(root), "add", "."], check=True)
    subprocess.run(GIT + ["-C", str(root), "commit", "-q", "-m", "init"], check=True)
    return root


def test_clone_then_ingest_a_local_repository(local_repo, tmp_path):
    dest = tmp_path / "clone"
    clone(str(local_repo), str(dest), ingest.IngestLimits(), allowed_protocols="file")
    listing = walk_folder(dest, ingest.IngestLimits())
    paths = [item.path for item in listing.items]
    assert paths == ["README.md", ".git/", "big.bin.txt", "pkg/mod.py"]
    corpus = ingest.ingest([dest])
    assert "VALUE = 42" in corpus.text and corpus.reports[1].reason == "version-control folder (not read)"


def test_clone_size_limit_and_failures_are_reported(local_repo, tmp_path):
    with pytest.raises(CloneRefused, match="larger than"):
        clone(str(local_repo), str(tmp_path / "small"), ingest.IngestLimits(max_clone_bytes=10_000),
              allowed_protocols="file")
    with pytest.raises(CloneRefused, match="git clone failed"):
        clone(str(tmp_path / "does-not-exist"), str(tmp_path / "x"), ingest.IngestLimits(),
              allowed_protocols="file")
    with pytest.raises(CloneRefused, match="git clone failed"):  # local paths are not https
        clone(str(local_repo), str(tmp_path / "y"), ingest.IngestLimits(), allowed_protocols="https")


@pytest.fixture
def hanging_git(tmp_path, monkeypatch):
    """A `git` on PATH that never finishes, like a clone stuck on a slow network."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "git"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_stuck_clone_is_killed_at_the_timeout(hanging_git, tmp_path):
    start = time.monotonic()
    with pytest.raises(CloneRefused, match="took longer than 0.6 s"):
        clone("https://example.invalid/r.git", str(tmp_path / "c"), ingest.IngestLimits(clone_timeout_s=0.6))
    assert time.monotonic() - start < 10  # the fake git sleeps 30 s


def test_cancel_kills_a_running_clone(hanging_git, tmp_path):
    start = time.monotonic()
    with pytest.raises(ingest.IngestCancelled):
        clone("https://example.invalid/r.git", str(tmp_path / "c"), ingest.IngestLimits(), cancel=Flag(after=2))
    assert time.monotonic() - start < 10  # the fake git sleeps 30 s
