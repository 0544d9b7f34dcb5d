"""What every config section shares: its TOML loader, its key checks and its value checks.

Every config section (``[reader]``, ``[train]``, ``[etl]``, ...) is a dataclass. A field's
allowed values are part of its annotation: a range as ``Annotated[int, msgspec.Meta(ge=1)]``
(:data:`PositiveInt`, ...), choices as a Literal, an Enum or :class:`OneOf`. The section's
``__post_init__`` checks them with :func:`check_fields`, so a config built in Python and one
read from TOML fail alike; docs/config.md and the ``recd`` flags read the same annotations.

A TOML section is read with :func:`load_toml`, its keys checked with :func:`check_keys`, and
each value converted to its field's type by ``msgspec.convert(..., strict=True)``
(:func:`typed_values`: a string where a number belongs, a string where a flag belongs, a bad
enum value) before the dataclass is built. Every error is one line naming the key and the
value (:class:`recd.errors.ConfigError`: ``recd`` exits 2).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import re
import tomllib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar

import msgspec

from recd.errors import ConfigError

__all__ = [
    "NonNegativeFloat",
    "NonNegativeInt",
    "OneOf",
    "PositiveInt",
    "build_section",
    "check_fields",
    "check_keys",
    "check_value",
    "field_default",
    "field_hints",
    "load_toml",
    "parse_toml",
    "range_text",
    "typed_values",
    "value_type",
]

T = TypeVar("T")

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0.0)]
"""A finite number >= 0 (a float with a range must be finite: NaN and infinity are refused)."""

Wording = Literal["expected", "must"]
"""How a message reads: ``KEY: expected an integer >= 1, got 0`` or ``KEY must be >= 1, got 0``
(the sections keep the wording their messages always had)."""


@dataclasses.dataclass(frozen=True, slots=True)
class OneOf:
    """Annotation metadata of a ``str`` field whose values are a tuple kept in another module
    (``Annotated[str, OneOf(LAYOUTS)]``); a Literal where the values can be written out."""

    values: tuple[str, ...]


# ----------------------------------------------------------------------------------- TOML
def parse_toml(text: str, source: str) -> dict[str, Any]:
    """``text`` parsed; ConfigError ``SOURCE: invalid TOML: ...`` otherwise."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from exc


def load_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The TOML file ``path`` (a ``what``, e.g. ``train config``), parsed; one-line
    ConfigError when it does not exist, cannot be read or is not TOML."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {path} does not exist")
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from exc
    return parse_toml(text, str(path))


# ----------------------------------------------------------------------------------- keys
def check_keys(
    data: dict[str, Any], known: type | Sequence[str], where: str, *, what: str = "key"
) -> None:
    """ConfigError ``WHERE unknown WHAT(s) a, b; expected x, y`` for a key of ``data`` not in
    ``known`` (a dataclass: its fields), then ``WHERE missing WHAT 'x'`` for a field of the
    dataclass ``known`` without a default that ``data`` lacks."""
    if isinstance(known, type):
        fields = [f for f in dataclasses.fields(known) if f.init]
        names = [f.name for f in fields]
        required = [
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
    else:
        names, required = list(known), []
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(
            f"{where}unknown {what}(s) {', '.join(unknown)}; expected {', '.join(names)}"
        )
    missing = [name for name in required if name not in data]
    if missing:
        raise ConfigError(f"{where}missing {what} {missing[0]!r}")


def build_section(cls: type[T], data: Any, section: str, *, source: str | None = None) -> T:
    """``cls(**data)`` for one TOML section: a table, no unknown or missing key, every value
    of its field's type, then ``cls``'s own checks; one-line ConfigError ``SOURCE: [section]
    ...`` otherwise."""
    where = f"{source}: " if source else ""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}[{section}] must be a table, got {_show(data)}")
    check_keys(data, cls, f"{where}[{section}] ")
    try:
        return cls(**typed_values(cls, data, section))
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None


def field_default(cls: type, name: str) -> Any:
    """The default of field ``name`` of dataclass ``cls`` (another config reuses it)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            break
    raise KeyError(f"{cls.__name__}.{name} has no default")


# ---------------------------------------------------------------------------------- types
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
    """The values a Literal, Enum or OneOf annotation (possibly inside a union) allows."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return [member.value for member in hint]
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return list(typing.get_args(hint))
    if origin is Annotated:
        base, *extras = typing.get_args(hint)
        return [v for e in extras if isinstance(e, OneOf) for v in e.values] or _choices(base)
    if isinstance(hint, types.UnionType) or origin is typing.Union:
        return [c for arg in typing.get_args(hint) for c in _choices(arg)]
    return []


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def typed_values(cls: type, data: dict[str, Any], section: str) -> dict[str, Any]:
    """``data`` (the keys of one section) with each value converted to its field's type;
    ConfigError ``[section] key = value: what was expected`` on the first that does not fit.
    Ranges and choices are left to the section's :func:`check_fields`; keys that are not
    fields to the caller."""
    try:
        hints = typing.get_type_hints(cls)  # Annotated stripped: ranges are check_fields'
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


# --------------------------------------------------------------------------------- values
@functools.cache
def field_hints(cls: type) -> dict[str, Any]:
    """Field name -> annotation (``Annotated`` kept) of the dataclass ``cls``."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _optional(hint: Any) -> tuple[Any, bool]:
    """``(X, True)`` for ``X | None``, else ``(hint, False)``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = typing.get_args(hint)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return rest[0], True
    return hint, False


def _meta(hint: Any) -> tuple[Any, msgspec.Meta | None]:
    """``(base, Meta)`` of ``Annotated[base, msgspec.Meta(...)]``; ``(hint, None)`` otherwise."""
    if typing.get_origin(hint) is not Annotated:
        return hint, None
    base, *extras = typing.get_args(hint)
    metas = [e for e in extras if isinstance(e, msgspec.Meta)]
    return base, metas[0] if metas else None


def value_type(hint: Any) -> tuple[Any, list[Any]]:
    """A field's annotation as ``(type, choices)``: the type without ``None`` and
    ``Annotated`` (``int``, ``Path``, ``list[str]``, ...), and the values a Literal, Enum or
    :class:`OneOf` allows ([] for none)."""
    inner = _optional(hint)[0]
    return _meta(inner)[0], _choices(inner)


def _number(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def range_text(hint: Any) -> str | None:
    """The range of a field's annotation (``>= 1``, ``in 1..22``, ``> 0 and < 1``, ``a
    non-empty string``); None when it has none."""
    base, meta = _meta(_optional(hint)[0])
    if meta is None:
        return None
    if base is str:
        if meta.min_length == 1 and meta.pattern is None:
            return "a non-empty string"
        if meta.pattern is not None:
            return f"a string matching {meta.pattern!r}"
        return None
    if base is int and meta.ge is not None and meta.le is not None:
        return f"in {meta.ge}..{meta.le}"
    parts = [
        f"{op} {_number(bound)}"
        for op, bound in ((">=", meta.ge), (">", meta.gt), ("<=", meta.le), ("<", meta.lt))
        if bound is not None
    ]
    return " and ".join(parts) or None


def _in_range(value: float, meta: msgspec.Meta) -> bool:
    return (
        (meta.ge is None or value >= meta.ge)
        and (meta.gt is None or value > meta.gt)
        and (meta.le is None or value <= meta.le)
        and (meta.lt is None or value < meta.lt)
    )


def check_value(key: str, value: Any, hint: Any, *, wording: Wording = "expected") -> None:
    """ConfigError naming ``key`` and ``value`` when ``value`` is outside what ``hint`` (a
    field's annotation) allows: a ``msgspec.Meta`` range (a float with one must be finite), a
    Literal / Enum / :class:`OneOf` choice, a ``bool``; list items are checked one by one.
    Anything else is not checked here."""
    hint, optional = _optional(hint)
    if value is None and optional:
        return
    choices = _choices(hint)
    if choices:
        plain = value.value if isinstance(value, enum.Enum) else value
        if plain not in choices:
            listed = ", ".join(str(c) for c in choices)
            raise ConfigError(
                f"{key}: {_show(value)} is not one of {listed}"
                if wording == "expected"
                else f"{key} must be one of {listed}, got {_show(value)}"
            )
        return
    base, meta = _meta(hint)
    if typing.get_origin(base) is list and isinstance(value, list):
        (item,) = typing.get_args(base) or (Any,)
        for each in value:
            check_value(key, each, item, wording=wording)
        return
    if base is bool:
        if not isinstance(value, bool):
            _fail(key, value, "true or false", None, wording)
        return
    bounds = range_text(hint)
    if meta is None or bounds is None:
        return
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(key, value, f"an integer {bounds}", None, wording)
        if not _in_range(value, meta):
            _fail(key, value, f"an integer {bounds}", bounds, wording)
    elif base is float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            _fail(key, value, f"a finite number {bounds}", None, wording)
        if not _in_range(value, meta):
            _fail(key, value, f"a finite number {bounds}", bounds, wording)
    elif base is str:
        if not isinstance(value, str):
            _fail(key, value, "a string", None, wording)
        too_short = meta.min_length is not None and len(value) < meta.min_length
        if too_short or (meta.pattern is not None and not re.search(meta.pattern, value)):
            _fail(key, value, bounds, bounds, wording)


def _fail(key: str, value: Any, expected: str, bounds: str | None, wording: Wording) -> NoReturn:
    """``KEY: expected EXPECTED, got V`` or ``KEY must be BOUNDS, got V`` (``BOUNDS`` when the
    value has the right type, else ``EXPECTED``)."""
    if wording == "expected":
        raise ConfigError(f"{key}: expected {expected}, got {_show(value)}")
    raise ConfigError(f"{key} must be {bounds or expected}, got {_show(value)}")


def _has_rule(hint: Any) -> bool:
    """Whether :func:`check_value` has something to check for ``hint`` (or its list items)."""
    base = _meta(_optional(hint)[0])[0]
    if typing.get_origin(base) is list:
        return _has_rule((typing.get_args(base) or (Any,))[0])
    return base is bool or bool(_choices(hint)) or range_text(hint) is not None


@functools.cache
def _checked_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """The fields of ``cls`` that :func:`check_value` has something to check in."""
    return tuple((name, hint) for name, hint in field_hints(cls).items() if _has_rule(hint))


def check_fields(obj: Any, prefix: str = "", *, wording: Wording = "expected") -> None:
    """:func:`check_value` for every field of the dataclass instance ``obj`` (in field order),
    its key named ``PREFIX + field``: a config section's ``__post_init__`` calls it first."""
    cls: type = type(obj)
    for name, hint in _checked_fields(cls):
        check_value(prefix + name, getattr(obj, name), hint, wording=wording)
