"""``recd`` options made from config fields: a flag that sets a field takes its type, choices,
default and help from the dataclass (annotation, default, docstring), and its value is checked
against the field's range, so no flag restates what the config defines.

A value out of range ends in one line naming the flag and the value (``--steps: expected an
integer >= 1, got 0``; exit 2), before the command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from recd.config_reference import field_docs
from recd.config_types import check_value, field_hints, range_text, value_type

__all__ = ["add_field_option", "check_field_options", "field_help"]

_CHECKS = "_field_options"
"""The namespace attribute listing ``(flag, dest, annotation)`` of a parser's field options."""


def field_help(cls: type, name: str) -> str:
    """The docstring of field ``name`` of ``cls`` as argparse help (one line, no markup)."""
    return field_docs(cls)[name].replace("`", "").replace("%", "%%")


def add_field_option(
    parser: argparse.ArgumentParser,
    flag: str,
    cls: type,
    name: str,
    *,
    override: str | None = None,
    **kwargs: Any,
) -> argparse.Action:
    """Add ``flag`` (or a positional argument: a name without ``-``) setting field ``name`` of
    the config dataclass ``cls``: its type (choices for a Literal / Enum / OneOf, a switch for
    a ``bool`` defaulting to false), default and help (the field's docstring, and its range)
    come from the field. ``override`` (e.g. ``"[train] steps"``): the flag overrides a value
    of a config file, so it defaults to None (keep the file's). ``kwargs`` go to
    ``add_argument`` (``metavar``, ``required``, a ``type`` that parses differently)."""
    hint = field_hints(cls)[name]
    base, choices = value_type(hint)
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    options: dict[str, Any] = {}
    if base is bool:
        options["action"] = "store_true"
    elif choices:
        options["choices"] = tuple(choices)
    elif base in (int, float, str, Path):
        options["type"] = base
    if override is not None:
        options["default"] = None
    elif field.default is not dataclasses.MISSING:
        options["default"] = field.default
    help_text = field_help(cls, name)
    bounds = range_text(hint)
    if bounds:
        help_text = f"{help_text.removesuffix('.')} ({bounds})"
    options["help"] = f"override {override}: {help_text}" if override else help_text
    options.update(kwargs)
    action = parser.add_argument(flag, **options)
    if bounds:
        checks = parser.get_default(_CHECKS) or []
        parser.set_defaults(**{_CHECKS: [*checks, (flag, action.dest, hint)]})
    return action


def check_field_options(args: argparse.Namespace) -> None:
    """ConfigError naming the flag and the value for the first field option given a value
    outside its field's range (what ``recd`` checks after parsing, before a command runs)."""
    for flag, dest, hint in getattr(args, _CHECKS, None) or ():
        value = getattr(args, dest, None)
        if value is not None:
            check_value(flag, value, hint)
