"""Command-line flags declared once, on the fields of a config dataclass.

A field made with flag() carries its help text, argparse group and options
in its metadata; build_parser() turns the fields into flags (in field
order) and from_args() turns the parsed flags back into field values.  So
adding a flag is adding one field, with its default, help and lower bound
in one place.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

_KEY = "flag"


@dataclass(frozen=True)
class FlagSpec:
    """How one config field appears on the command line."""

    help: str | None
    group: str
    name: str | None = None  # '--session-timeout'; None: '--' + the field name with dashes
    scale: float = 1  # field value = flag value * scale (a flag in minutes for a field in seconds)
    at_least: float | None = None  # smaller values (None excepted) are refused after parsing
    at_most: float | None = None  # and larger ones
    switches: dict[str, tuple[Any, str]] | None = None  # '--load-in-4bit': (stored value, help), one of them
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # passed on to add_argument

    def option(self, field_name: str) -> str:
        return self.name or "--" + field_name.replace("_", "-")


def flag(default: Any, help: str | None = None, *, group: str, name: str | None = None, scale: float = 1,
         at_least: float | None = None, at_most: float | None = None,
         switches: dict[str, tuple[Any, str]] | None = None, **options: Any) -> Any:
    """A dataclass field that is also a flag; `options` go to argparse (type, choices, nargs, action, metavar)."""
    spec = FlagSpec(help=help, group=group, name=name, scale=scale, at_least=at_least, at_most=at_most,
                    switches=switches, options=options)
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={_KEY: spec})
    return field(default=default, metadata={_KEY: spec})


def _flag_fields(config_class: type) -> list[tuple[dataclasses.Field, FlagSpec]]:
    return [(f, f.metadata[_KEY]) for f in dataclasses.fields(config_class) if _KEY in f.metadata]


def _default(f: dataclasses.Field, spec: FlagSpec) -> Any:
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return value / spec.scale if spec.scale != 1 and value is not None else value


def _add(group: argparse._ArgumentGroup, f: dataclasses.Field, spec: FlagSpec) -> None:
    default = _default(f, spec)
    if spec.switches:
        exclusive = group.add_mutually_exclusive_group()
        for option, (value, help_text) in spec.switches.items():
            exclusive.add_argument(option, dest=f.name, action="store_const", const=value, default=default,
                                   help=help_text)
        return
    option = spec.option(f.name)
    options = dict(spec.options)
    if options.get("action", "store") in ("store", "append") and "choices" not in options:
        options.setdefault("metavar", option[2:].upper().replace("-", "_"))
    group.add_argument(option, dest=f.name, default=default, help=spec.help, **options)


def build_parser(config_class: type, **parser_options: Any) -> argparse.ArgumentParser:
    """An ArgumentParser with one flag per flag() field, in groups named by the fields, in field order."""
    parser = argparse.ArgumentParser(**parser_options)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f, spec in _flag_fields(config_class):
        if spec.group not in groups:
            groups[spec.group] = parser.add_argument_group(spec.group)
        _add(groups[spec.group], f, spec)
    return parser


def from_args(config_class: type, args: argparse.Namespace) -> dict[str, Any]:
    """Field values from parsed flags (scaled back to the field's unit), ready for config_class(**values)."""
    values = {}
    for f, spec in _flag_fields(config_class):
        value = getattr(args, f.name)
        values[f.name] = value * spec.scale if spec.scale != 1 and value is not None else value
    return values


def check_bounds(config: Any) -> None:
    """SystemExit('--flag must be >= N' or '<= N') for the first field outside its `at_least` / `at_most`
    bounds (in the flag's own units, before `scale`; NaN is outside every bound)."""
    for f, spec in _flag_fields(type(config)):
        value = getattr(config, f.name)
        if value is None:
            continue
        if spec.at_least is not None and not value / spec.scale >= spec.at_least:
            raise SystemExit(f"{spec.option(f.name)} must be >= {spec.at_least:g}")
        if spec.at_most is not None and not value / spec.scale <= spec.at_most:
            raise SystemExit(f"{spec.option(f.name)} must be <= {spec.at_most:g}")
