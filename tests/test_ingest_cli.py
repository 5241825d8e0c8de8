"""`python -m ingest`: table, JSON, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ingest.__main__ import main
from ingest_fixtures import make_pdf, page_text, write_tree

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_table_lists_every_file_with_status_reason_pages_and_tokens(tmp_path, capsys):
    repo = write_tree(tmp_path / "r", {"README.md": "hello\n", "a.lock": "x\n", "node_modules/m.js": "y\n"})
    pdf = make_pdf(tmp_path / "doc.pdf", [page_text(1), page_text(2), page_text(3)])
    assert main([str(repo), str(pdf), str(tmp_path / "missing.txt")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["STATUS", "PAGES", "TOKENS", "(est.)", "SIZE", "LANG", "PATH", "REASON"]

    def row(path: str) -> list[str]:
        [line] = [line for line in out[1:6] if f"  {path}  " in line + "  "]
        return line.split("  ")

    def cells(path: str) -> list[str]:
        return [c.strip() for c in row(path) if c.strip()]

    assert cells("r/README.md")[0] == "ingested"
    assert cells("r/a.lock")[0] == "skipped" and cells("r/a.lock")[-1] == "generated or minified file"
    assert cells("r/node_modules/")[-1] == "dependency/vendored folder (not read)"
    assert cells("doc.pdf")[:2] == ["ingested", "3"] and cells("doc.pdf")[4:] == ["pdf", "doc.pdf"]
    assert cells(str(tmp_path / "missing.txt"))[0] == "error" and cells(str(tmp_path / "missing.txt"))[-1] == "not found"
    assert "5 files: 2 ingested, 0 partial, 2 skipped, 1 errors" in out
    assert any(line.startswith("3 pages, ") and "tokens (estimated)" in line for line in out)
    assert any(line.startswith("KV cache, Llama-2-7B estimate (fp16, from estimated token counts): vanilla ")
               for line in out)
    assert out[-1].startswith("(est.) token counts are estimates") and "--tokenizer" in out[-1]


def test_json_output_and_password(tmp_path, capsys):
    pdf = make_pdf(tmp_path / "locked.pdf", ["top secret"], user_pw="pw")
    assert main([str(pdf), "--json", "--password", "pw"]) == 0
    data = json.loads(capsys.readouterr().out)
    [report] = data["reports"]
    assert (report["path"], report["status"], report["pages"]) == ("locked.pdf", "ingested", 1)
    assert data["totals"]["tokens"] == report["tokens"] > 0
    assert data["kv_cache_llama2_7b"]["n_tokens"] == report["tokens"]


def test_usage_errors_exit_non_zero(capsys):
    with pytest.raises(SystemExit) as no_paths:
        main([])
    assert no_paths.value.code == 2
    with pytest.raises(SystemExit) as bad_size:
        main(["x", "--chunk-tokens", "0"])
    assert bad_size.value.code == 2


def test_module_entry_point_runs(tmp_path):
    (tmp_path / "n.txt").write_text("entry point works\n")
    done = subprocess.run([sys.executable, "-m", "ingest", str(tmp_path / "n.txt"), str(tmp_path / "gone")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "2 files: 1 ingested, 0 partial, 0 skipped, 1 errors" in done.stdout


def _local_tokenizer_folder(path: Path) -> Path:
    """A tiny Hugging Face tokenizer saved to a folder (no download): one id per word or punctuation mark."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab={"[UNK]": 0}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]").save_pretrained(path)
    return path


def test_estimated_counts_are_labelled_and_tokenizer_folder_counts_exactly(tmp_path, capsys):
    pytest.importorskip("transformers")
    note = tmp_path / "n.txt"
    note.write_text("alpha beta, gamma\n")
    assert main([str(note)]) == 0
    estimated = capsys.readouterr().out.splitlines()
    assert "TOKENS (est.)" in estimated[0]
    assert estimated[-1].startswith("(est.) token counts are estimates")
    assert any("KV cache, Llama-2-7B estimate (fp16, from estimated token counts)" in line for line in estimated)

    folder = _local_tokenizer_folder(tmp_path / "tok")
    assert main([str(note), "--tokenizer", str(folder)]) == 0
    exact = capsys.readouterr().out.splitlines()
    assert exact[0].split()[:3] == ["STATUS", "PAGES", "TOKENS"] and "(est.)" not in exact[0]
    # '### n.txt\n' -> ### n . txt, then alpha beta , gamma (whitespace pre-tokenizer: newlines are free)
    assert any(line.startswith("ingested") and "  8  " in line for line in exact)
    assert any(f"8 tokens (counted with {folder})" in line for line in exact)
    assert any(line.startswith("KV cache, Llama-2-7B estimate (fp16): vanilla ") for line in exact)
    assert not any("token counts are estimates" in line for line in exact)

    with pytest.raises(SystemExit) as bad:
        main([str(note), "--tokenizer", str(tmp_path / "no-such-folder")])
    assert bad.value.code == 2
    assert "cannot load tokenizer" in capsys.readouterr().err


def test_help_describes_formats_estimates_and_plan(capsys):
    with pytest.raises(SystemExit) as shown:
        main(["--help"])
    assert shown.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in (".tar.gz", "notebooks", "--tokenizer NAME_OR_FOLDER", "local folder", "--plan",
                  "Token counts are estimates", "Llama-2-7B estimate", "<archive or folder name>/<path inside>"):
        assert words in text, words
