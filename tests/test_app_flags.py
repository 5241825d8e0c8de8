"""Flags declared on dataclass fields (app.flags): one field is one flag, default, help and bound."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app import cli

from app import flags
from app.flags import flag


@dataclass
class Example:
    size: int = flag(5, "a size (default: 5)", group="things", type=int, at_least=1)
    budget: int | None = flag(None, "a budget", group="things", type=cli.parse_size, metavar="SIZE", at_least=1)
    minutes_s: float = flag(120.0, "minutes", group="time", name="--minutes", type=float, scale=60)
    mode: str | None = flag(None, group="time", switches={"--fast": ("fast", "go fast"), "--slow": ("slow", "go slow")})
    roots: list[str] = flag([], "roots", group="time", nargs="+", metavar="DIR")
    plain: str = "not a flag"


def parse(argv: list[str]) -> Example:
    config = Example(**flags.from_args(Example, flags.build_parser(Example, prog="x").parse_args(argv)))
    flags.check_bounds(config)
    return config


def test_fields_become_flags_and_back():
    assert parse([]) == Example()
    config = parse(["--size", "7", "--budget", "2MB", "--minutes", "1.5", "--slow", "--roots", "a", "b"])
    assert (config.size, config.budget, config.minutes_s, config.mode, config.roots) == (7, 2 << 20, 90.0, "slow",
                                                                                        ["a", "b"])
    assert Example().roots is not Example().roots
    text = flags.build_parser(Example, prog="x").format_help()
    assert "things:" in text and "--budget SIZE" in text and "--minutes MINUTES" in text and "--plain" not in text


@pytest.mark.parametrize("argv, message", [(["--size", "0"], "--size must be >= 1"),
                                           (["--budget", "0"], "--budget must be >= 1")])
def test_bounds_name_the_flag(argv, message):
    with pytest.raises(SystemExit, match=message):
        parse(argv)


def test_switches_exclude_each_other():
    with pytest.raises(SystemExit):
        parse(["--fast", "--slow"])


def test_app_session_timeout_is_minutes_on_the_command_line():
    assert cli.parse_args([]).session_timeout_s == 3600.0
    assert cli.parse_args(["--session-timeout", "2"]).session_timeout_s == 120.0


@pytest.mark.parametrize("argv, said", [
    (["--port", "0"], "--port must be >= 1"), (["--port", "70000"], "--port must be <= 65535"),
    (["--n-starting", "-1"], "--n-starting must be >= 0"), (["--window", "0"], "--window must be >= 1"),
    (["--topk-from-layer", "-1"], "--topk-from-layer must be >= 0"), (["--cpu-threads", "0"], "--cpu-threads must be >= 1"),
    (["--session-timeout", "nan"], "--session-timeout must be >= 1"),
    (["--session-timeout", "-1"], "--session-timeout must be >= 1"),
    (["--device", "foo"], "--device foo: use auto, cpu, cuda or cuda:N"),
    (["--auth-file", "/nonexistent/users"], "--auth-file /nonexistent/users: cannot be read"),
])
def test_app_flags_out_of_range_are_refused_naming_the_flag(argv, said):
    with pytest.raises(SystemExit, match=said.replace("(", r"\(")):
        cli.parse_args(argv)


@pytest.mark.parametrize("size", ["5iB", "99999999TB"])
def test_app_sizes_with_a_stray_i_or_past_64_bits_are_usage_errors(size, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--max-file-size", size])
    assert "--max-file-size" in capsys.readouterr().err


def test_app_startup_refuses_a_busy_port_an_unwritable_folder_and_a_missing_model_before_loading(tmp_path):
    import socket

    from app.startup import check_before_loading, load_or_explain

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit, match=f"--port {port}: cannot listen there"):
            check_before_loading(cli.parse_args(["--port", str(port), "--workspaces", str(tmp_path)]))
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    with pytest.raises(SystemExit, match="--workspaces .*a_file: workspaces cannot be saved there"):
        check_before_loading(cli.parse_args(["--port", str(port), "--workspaces", str(a_file)]))
    with pytest.raises(SystemExit, match="--model .*nope: no such file or folder"):
        load_or_explain(cli.parse_args(["--model", str(tmp_path / "nope")]))
    with pytest.raises(SystemExit, match="--model .*a_file: cannot be loaded"):
        load_or_explain(cli.parse_args(["--model", str(a_file)]))


def test_app_startup_makes_the_workspaces_folder_private_as_the_store_does(tmp_path):
    """The start-up check creates the folder first; it must not leave it readable by other users."""
    import stat

    from app.startup import check_before_loading

    from benchmarks.launched_app import free_port

    folder = tmp_path / "new" / "workspaces"
    check_before_loading(cli.parse_args(["--port", str(free_port()), "--workspaces", str(folder)]))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
