"""Fast unit tests of the command line and of launching: flags, help, the share warning. No model, no server."""

from __future__ import annotations

import pytest

from app import cli
from app.engine import bundled_model


# -- command line --------------------------------------------------------------------------------
def test_cli_defaults_are_safe():
    config = cli.parse_args([])
    assert config.host == "127.0.0.1" and not config.share and not config.allow_local_paths
    assert config.quantization is None and config.topk == 5 and config.model is None
    assert config.max_file_size == 200 * 1024**2


def test_cli_parses_auth_sizes_and_quantization(tmp_path):
    auth_file = tmp_path / "users.txt"
    auth_file.write_text("# team\nbob:s3cret\n\ncarol:pa:ss\n")
    config = cli.parse_args(["--auth", "alice:pw", "--auth-file", str(auth_file), "--max-file-size", "1.5GB",
                             "--load-in-8bit", "--share", "--topk", "8", "--window", "2048"])
    assert config.auth == [("alice", "pw"), ("bob", "s3cret"), ("carol", "pa:ss")]
    assert config.max_file_size == int(1.5 * 1024**3)
    assert config.quantization == "8bit" and config.topk == 8 and config.window == 2048
    assert not config.share_without_auth
    assert cli.parse_args(["--share"]).share_without_auth
    assert cli.parse_size("10KiB") == 10240 and cli.parse_size("5000") == 5000


@pytest.mark.parametrize("argv", [["--auth", "nopassword"], ["--load-in-4bit", "--no-quant"], ["--max-file-size", "x"]])
def test_cli_rejects_bad_flags(argv):
    with pytest.raises(SystemExit):
        cli.parse_args(argv)


def test_help_lists_every_flag_of_the_issue(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    text = capsys.readouterr().out
    for flag in ("--model", "--load-in-4bit", "--load-in-8bit", "--no-quant", "--device", "--n-starting", "--window",
                 "--topk", "--topk-from-layer", "--host", "--port", "--share", "--auth", "--auth-file",
                 "--max-file-size", "--allow-local-paths", "--context-budget"):
        assert flag in text


def test_help_lists_the_bundled_models_and_whether_each_is_installed(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in bundled_model.BUNDLED:
        assert name in text
    assert "installed" in text


# -- launching -----------------------------------------------------------------------------------
def test_share_without_auth_warns_loudly(capsys, monkeypatch):
    from app.web import server
    from app.web.ui import LayoutInfo, header_html

    info = dict(notice="Model: demo", allow_local_paths=False, budget_tokens=10, max_file_size="1 MB",
                system_prompt="", temperature=0.0, top_p=0.9, max_new_tokens=16, repetition_penalty=1.0,
                recall=True, topk=5, quote=True, window=256, n_starting=10, browser_secret="test")
    assert "share-banner" in header_html(LayoutInfo(share_warning=True, **info))
    assert "share-banner" not in header_html(LayoutInfo(share_warning=False, **info))
    # The header says how questions are answered by default.
    assert "quoted before the answer" in header_html(LayoutInfo(share_warning=False, **info))
    info.update(quote=False)
    assert "recall while answering" in header_html(LayoutInfo(share_warning=False, **info))
    info.update(recall=False)
    assert "recall off" in header_html(LayoutInfo(share_warning=False, **info))

    launched = {}

    class FakeDemo:
        def launch(self, **kwargs):
            launched.update(kwargs)

        def block_thread(self):
            pass

    server.launch(cli.parse_args(["--share"]), FakeDemo())
    assert "WARNING: --share without --auth" in capsys.readouterr().err
    assert launched["share"] is True and launched["auth"] is None and launched["server_name"] == "127.0.0.1"
    server.launch(cli.parse_args(["--share", "--auth", "a:b", "--max-file-size", "5MB"]), FakeDemo())
    assert "WARNING" not in capsys.readouterr().err
    assert launched["auth"]("a", "b") is True and launched["auth"]("a", "c") is False  # login.LoginGuard
    assert launched["max_file_size"] == 5 * 1024**2


def test_launch_is_quiet_and_prints_the_apps_own_lines(capsys):
    """Gradio's start-up lines told users to "set `share=True` in `launch()`"; the app has --share."""
    from app.web import server

    launched = {}

    class FakeDemo:
        local_url = share_url = None

        def launch(self, **kwargs):
            launched.update(kwargs)
            self.local_url = "http://127.0.0.1:7860/"
            self.share_url = "https://abc123.gradio.live" if kwargs["share"] else None

        def block_thread(self):
            launched["blocked"] = True

    server.launch(cli.parse_args([]), FakeDemo())
    out = capsys.readouterr().out
    assert launched["quiet"] is True and launched["blocked"] and launched["prevent_thread_lock"] is True
    assert "Running on http://127.0.0.1:7860/" in out and "Add --share for a public link." in out
    assert "share=True" not in out
    server.launch(cli.parse_args(["--share", "--auth", "a:b"]), FakeDemo(), block=False)
    out = capsys.readouterr().out
    assert "Public link: https://abc123.gradio.live" in out and "Add --share" not in out
