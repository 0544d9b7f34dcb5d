"""Type checks of config values against the dataclass fields they fill (msgspec).

Every config section (``[reader]``, ``[train]``, ``[model]``, ...) is a dataclass whose
``__post_init__`` checks values and their relations. Before it runs, each key given in the
TOML is converted to its field's annotated type by ``msgspec.convert(..., strict=True)``: a
string where a number belongs (``lr = "fast"``), a number where a time belongs
(``end = 2026``), a string where a flag belongs (``drop_last = "no"``, which plain Python
would read as true) or a bad enum value ends in one line naming the section, the key and
the value (a :class:`recd.errors.ConfigError`: ``recd`` exits 2). Integers are accepted for
floats (``lr = 1``); ``Path`` fields take strings. msgspec is used key by key rather than on
the whole section so that the sections keep their own checks and their messages.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from recd.errors import ConfigError

__all__ = ["build_section", "typed_values"]

T = TypeVar("T")


def _paths_as_str(hint: Any) -> Any:
    """``hint`` with ``Path`` replaced by ``str`` (TOML has no path type)."""
    if hint is Path:
        return str
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = tuple(_paths_as_str(a) for a in typing.get_args(hint))
        out = args[0]
        for arg in args[1:]:
            out = out | arg
        return out
    return hint


def _choices(hint: Any) -> list[Any]:
    """The values a Literal or Enum annotation (possibly inside a union) allows."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return [member.value for member in hint]
    if typing.get_origin(hint) is typing.Literal:
        return list(typing.get_args(hint))
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return [c for arg in typing.get_args(hint) for c in _choices(arg)]
    return []


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def typed_values(cls: type, data: dict[str, Any], section: str) -> dict[str, Any]:
    """``data`` (the keys of one section) with each value converted to its field's type;
    ConfigError ``[section] key = value: what was expected`` on the first that does not fit.
    Keys that are not fields are left for the caller to report."""
    try:
        hints = typing.get_type_hints(cls)
    except NameError:  # an annotation only importable for type checkers: no check
        return dict(data)
    fields = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        hint = hints.get(key)
        if key not in fields or hint is None or dataclasses.is_dataclass(value):
            out[key] = value
            continue
        target = _paths_as_str(hint)
        try:
            converted = msgspec.convert(value, type=target, strict=True)
        except msgspec.ValidationError as exc:
            message = str(exc)
            choices = _choices(target)
            if choices and message.startswith("Invalid enum value"):
                message += "; expected one of " + ", ".join(repr(c) for c in choices)
            raise ConfigError(
                f"[{section}] {key} = {_show(value)}: {message[:1].lower()}{message[1:]}"
            ) from None
        out[key] = value if target is not hint else converted
    return out


def build_section(cls: type[T], data: Any, section: str, *, source: str | None = None) -> T:
    """``cls(**data)`` for one TOML section: a table, no unknown key, every value of its
    field's type, then ``cls``'s own checks; one-line ConfigError ``SOURCE: [section] ...``
    otherwise."""
    where = f"{source}: " if source else ""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}[{section}] must be a table, got {_show(data)}")
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(
            f"{where}[{section}] unknown key(s) {', '.join(unknown)}; expected {', '.join(known)}"
        )
    try:
        return cls(**typed_values(cls, data, section))
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None
