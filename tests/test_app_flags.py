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
