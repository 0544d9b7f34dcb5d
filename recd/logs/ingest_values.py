"""Value parsers of ``recd logs ingest``: text columns (Arrow strings) -> typed columns.

Every parser is vectorised (Arrow compute and numpy over a whole chunk) and returns the
values of every row plus which rows failed, with a function that words the problem for a
raw value (:class:`Parsed`): the caller reports the first bad field of each bad line. A cast
that fails on a few values is narrowed down by halving (:func:`cast_where`), never by a
per-row loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recd.logs.hashing import hash_strings

QUOTE_CHARS = 40  # characters of an input value quoted in a message
INT_RE = r"^-?\d{1,19}$"
NUMBER_RE = r"^-?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"
ISO_RE = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}(:\d{2}(:\d{2}(\.\d{1,9})?)?)?(Z|[+-]\d{2}(:?\d{2})?)?)?$"
ISO_ZONED_RE = r"[T ]\d{2}(:\d{2}(:\d{2}(\.\d{1,9})?)?)?(Z|[+-]\d{2}(:?\d{2})?)$"
MS_THRESHOLD = 1e11  # epoch seconds reach 1e11 in year 5138, epoch ms passed it in 1973
TS_EXPECTED = {
    "auto": "epoch ms, epoch s or ISO 8601",
    "ms": "epoch ms",
    "s": "epoch s",
    "iso": "ISO 8601",
}


def shorten(text: str) -> str:
    """``text`` cut to ``QUOTE_CHARS`` characters + "…": how messages show input values."""
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "…"


def quote(value: str) -> str:
    return repr(shorten(value))


# ----------------------------------------------------------------------------- parsing


@dataclass(slots=True)
class Parsed:
    """One column parsed: values for every row, and which rows failed with what problem."""

    values: Any
    failed: np.ndarray  # (N,) bool
    problem: Callable[[str], str]  # raw text -> message


def is_missing(values: pa.Array) -> np.ndarray:
    empty = pc.fill_null(pc.equal(values, ""), True)
    return np.asarray(empty.to_numpy(zero_copy_only=False), dtype=bool)


def matches(values: pa.Array, pattern: str) -> np.ndarray:
    matched = pc.fill_null(pc.match_substring_regex(values, pattern), False)
    return np.asarray(matched.to_numpy(zero_copy_only=False), dtype=bool)


def cast_where(values: pa.Array, ok: np.ndarray, typ: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    """Cast the ``ok`` entries of ``values`` to ``typ``; others become null.

    Returns the cast array and the updated ``ok`` mask: an entry the cast rejects (e.g. an
    integer out of range, 30 February) is isolated by halving the failing range, so a few odd
    values cost O(log N) casts each instead of a per-row loop.
    """
    masked = pc.if_else(pa.array(ok), values, pa.scalar(None, values.type))
    cast, failed = _cast_bisect(masked, typ)
    return cast, ok & ~failed


def _cast_bisect(values: pa.Array, typ: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    try:
        return pc.cast(values, typ), np.zeros(len(values), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if len(values) == 1:
            return pa.nulls(1, typ), np.ones(1, dtype=bool)
    mid = len(values) // 2
    left, left_failed = _cast_bisect(values.slice(0, mid), typ)
    right, right_failed = _cast_bisect(values.slice(mid), typ)
    return pa.concat_arrays([left, right]), np.concatenate([left_failed, right_failed])


def to_int64(values: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(values, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def parse_session(values: pa.Array, mode: str) -> tuple[Parsed, str]:
    present = ~is_missing(values)
    is_int = matches(values, INT_RE) & present
    if mode == "auto":
        mode = "int" if is_int.sum() == present.sum() else "hash"
    if mode == "hash":
        return Parsed(
            values=hash_strings(values), failed=np.zeros(len(values), bool), problem=str
        ), mode
    cast, ok = cast_where(values, is_int, pa.int64())
    return (
        Parsed(
            values=to_int64(cast),
            failed=~ok,
            problem=lambda raw: (
                f"cannot parse {quote(raw)} as an integer session id "
                "(use --session-ids hash for string ids)"
            ),
        ),
        mode,
    )


def parse_item(values: pa.Array) -> Parsed:
    cast, ok = cast_where(values, matches(values, INT_RE), pa.int64())
    ints = to_int64(cast)
    negative = ok & (ints < 0)

    def problem(raw: str) -> str:
        if raw.lstrip().startswith("-") and matches(pa.array([raw]), INT_RE)[0]:
            return f"item id {raw} is negative (ids must be >= 0)"
        return f"cannot parse {quote(raw)} as an integer item id"

    return Parsed(values=ints, failed=~ok | negative, problem=problem)


@dataclass(frozen=True, slots=True)
class UnitMix:
    """The numeric timestamps of a log read with ``ts_unit="auto"``: how many look like epoch
    milliseconds (magnitude >= ``MS_THRESHOLD``) and how many like epoch seconds."""

    ms: int
    s: int

    @property
    def unit(self) -> str:
        """The log's unit: the one most of its numeric timestamps have (a tie: ms)."""
        return "ms" if self.ms and self.ms >= self.s else "s"

    @property
    def mixed(self) -> bool:
        """Both kinds occur: the values of the other kind than ``unit`` are bad."""
        return self.ms > 0 and self.s > 0


def parse_ts(
    values: pa.Array, unit: str, number_unit: str | None = None, mix: UnitMix | None = None
) -> tuple[Parsed, str]:
    """Timestamps to epoch ms: (N,) int64, and the resolved unit (ms, s or iso).

    ``unit`` ``number``: numbers, read as ``number_unit`` (ms or s; None: ms if any magnitude
    here is >= 1e11), with the messages of ``auto``; ``mix`` (the whole log's counts, when it
    has both kinds) makes each value of the other kind than ``number_unit`` a bad value. A
    number is also bad when its date falls outside the years 1 to 9999 (``TS_MIN_MS`` ..
    ``TS_MAX_MS``): the message then says which unit would read it.
    """
    present = ~is_missing(values)
    numeric = matches(values, NUMBER_RE) & present
    iso = matches(values, ISO_RE) & present
    chosen = unit
    if unit == "auto":
        unit = "iso" if iso.sum() > numeric.sum() else "number"
    expected = TS_EXPECTED["auto" if unit == "number" else unit]

    def cannot_parse(raw: str) -> str:
        return f"cannot parse {quote(raw)} as a timestamp (expected {expected})"

    if unit == "iso":
        zoned = matches(values, ISO_ZONED_RE) & iso
        naive_ns, naive_ok = cast_where(values, iso & ~zoned, pa.timestamp("ns"))
        zoned_ns, zoned_ok = cast_where(values, zoned, pa.timestamp("ns", tz="UTC"))
        ns = np.where(zoned, to_int64(pc.cast(zoned_ns, pa.int64())), 0)
        ns = np.where(naive_ok, to_int64(pc.cast(naive_ns, pa.int64())), ns)
        ok = naive_ok | zoned_ok
        return (
            Parsed(values=np.floor_divide(ns, 1_000_000), failed=~ok, problem=cannot_parse),
            "iso",
        )
    cast, ok = cast_where(values, numeric, pa.float64())
    number = np.asarray(pc.fill_null(cast, 0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
    if unit == "number" and number_unit is not None:
        unit = number_unit
    elif unit == "number":
        big = np.abs(number[ok]).max(initial=0.0) >= MS_THRESHOLD
        unit = "ms" if big else "s"
    ms = number if unit == "ms" else number * 1000.0
    ok &= np.isfinite(ms)
    in_range = (ms >= TS_MIN_MS) & (ms <= TS_MAX_MS)
    mixed = mix is not None and mix.mixed
    if mixed:
        looks_ms = np.abs(number) >= MS_THRESHOLD
        ok &= looks_ms if unit == "ms" else ~looks_ms
    ok &= in_range
    ms_int = np.rint(np.where(ok, ms, 0.0)).astype(np.int64)
    how = f"--ts-unit {unit}" if chosen in ("ms", "s") else f"--ts-unit auto read the log as {unit}"

    def problem(raw: str) -> str:
        value = _finite_number(raw)
        if value is None:
            return cannot_parse(raw)
        if mixed and mix is not None and (abs(value) >= MS_THRESHOLD) != (unit == "ms"):
            return _mixed_problem(raw, value, unit, mix)
        return _range_problem(raw, value, unit, how)

    return Parsed(values=ms_int, failed=~ok, problem=problem), unit


TS_MIN_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z
TS_MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
MS_PER_YEAR = 31_556_952_000  # a mean Gregorian year
UNIT_NAMES = {"ms": "epoch milliseconds", "s": "epoch seconds"}


def _finite_number(raw: str) -> float | None:
    """``raw`` (trimmed) as a finite number, or None when it is not one."""
    text = raw.strip()
    if not matches(pa.array([text]), NUMBER_RE)[0]:
        return None
    value = float(text)
    return value if np.isfinite(value) else None


def _year(ms: float) -> str:
    year = math.floor(1970 + ms / MS_PER_YEAR)
    return f"the year {year:,}" if year >= 1 else "before the year 1"


def _range_problem(raw: str, value: float, unit: str, how: str) -> str:
    """A number whose date, read in ``unit``, is outside the years 1 to 9999."""
    ms = value if unit == "ms" else value * 1000.0
    message = (
        f"timestamp {quote(raw)} is out of range as {UNIT_NAMES[unit]} ({how}): that is "
        f"{_year(ms)}, and dates must fall in the years 1 to 9999"
    )
    if unit == "s" and TS_MIN_MS <= value <= TS_MAX_MS:
        return message + "; are these epoch milliseconds? use --ts-unit ms (or auto)"
    if value > 0:
        return message + (
            "; epoch microseconds or nanoseconds? recd reads epoch seconds or milliseconds: "
            "convert the column"
        )
    return message


def _mixed_problem(raw: str, value: float, unit: str, mix: UnitMix) -> str:
    """A number of the other kind than the log's unit (``--ts-unit auto`` on a mixed log)."""
    kind = "ms" if abs(value) >= MS_THRESHOLD else "s"
    most = mix.ms if unit == "ms" else mix.s
    bound = "1e11 or more" if kind == "ms" else "below 1e11"
    return (
        f"timestamp {quote(raw)} looks like {UNIT_NAMES[kind]} ({bound}), but {most:,} of the "
        f"log's {mix.ms + mix.s:,} numeric timestamps look like {UNIT_NAMES[unit]}: the log "
        f"mixes units, and --ts-unit auto reads a whole log in one unit ({unit}); convert these "
        "lines (or quarantine them: --on-bad-rows quarantine)"
    )


TRUE_FALSE = {"true": 1.0, "false": 0.0}


def parse_number(values: pa.Array, kind: str, fill: float | None) -> Parsed:
    """Numbers (labels also true / false) -> (N,) float64; missing: ``fill`` or failed."""
    missing = is_missing(values)
    lowered = pc.utf8_lower(values)
    is_bool = np.asarray(
        pc.fill_null(pc.is_in(lowered, value_set=pa.array(list(TRUE_FALSE))), False).to_numpy(
            zero_copy_only=False
        ),
        dtype=bool,
    ) & (kind == "label")
    cast, ok = cast_where(values, matches(values, NUMBER_RE) & ~missing, pa.float64())
    number = np.asarray(pc.fill_null(cast, 0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
    ok &= np.isfinite(number)
    if is_bool.any():
        words = np.array(lowered.to_pylist(), dtype=object)
        number = np.where(is_bool, [TRUE_FALSE.get(w, 0.0) for w in words], number)
        ok |= is_bool
    failed = ~ok
    if fill is not None:
        number = np.where(missing, fill, number)
        failed &= ~missing
    expected = "a number or true/false" if kind == "label" else "a number"
    return Parsed(
        values=number.astype(np.float32),
        failed=failed,
        problem=lambda raw: f"cannot parse {quote(raw)} as {expected}",
    )


def parse_ids(values: pa.Array, is_list: bool, separator: str) -> Parsed:
    """Ids (>= 0) -> (N,) list<int64>: an id column gives [id] (missing: []); a list column
    gives its ids (``3|17|42``, ``[3|17|42]``; missing or empty: [])."""
    n = len(values)
    if is_list:
        lengths, flat = split_lists(values, separator)
    else:
        empty = is_missing(values)
        lengths = (~empty).astype(np.int64)
        flat = pc.fill_null(values, "").filter(pa.array(~empty))
    cast, ok = cast_where(flat, matches(flat, INT_RE), pa.int64())
    ids = to_int64(cast)
    ok &= ids >= 0

    def problem(raw: str) -> str:
        what = "a list of integer ids (>= 0)" if is_list else "an integer id (>= 0)"
        return f"cannot parse {quote(raw)} as {what}"

    return Parsed(
        values=_list_array(lengths, pa.array(np.where(ok, ids, 0))),
        failed=_rows_with(~ok, lengths, n),
        problem=problem,
    )


def parse_number_lists(values: pa.Array, kind: str, separator: str) -> Parsed:
    """Lists of numbers (``120.5|89|240``; labels also true / false) -> (N,) list<float32>;
    missing or empty: []. ``kind``: ``dense`` or ``label`` (what :func:`parse_number` takes)."""
    lengths, flat = split_lists(values, separator)
    parsed = parse_number(flat, kind, None)
    expected = "a list of numbers or true/false" if kind == "label" else "a list of numbers"
    return Parsed(
        values=_list_array(lengths, pa.array(parsed.values, pa.float32())),
        failed=_rows_with(parsed.failed, lengths, len(values)),
        problem=lambda raw: f"cannot parse {quote(raw)} as {expected}",
    )


def split_lists(values: pa.Array, separator: str) -> tuple[np.ndarray, pa.Array]:
    """(N,) lengths and the flat trimmed items of list values ``a|b|c`` (surrounding ``[ ]``
    allowed; missing or empty: no items)."""
    text = pc.utf8_trim(pc.fill_null(values, ""), characters="[]")
    parts = pc.split_pattern(text, pattern=separator)
    split = np.asarray(pc.list_value_length(parts).to_numpy(zero_copy_only=False))
    empty = np.asarray(pc.equal(text, "").to_numpy(zero_copy_only=False), dtype=bool)
    flat = pc.utf8_trim_whitespace(pc.list_flatten(parts)).filter(
        pa.array(np.repeat(~empty, split))
    )
    return np.where(empty, 0, split).astype(np.int64), flat


def _list_array(lengths: np.ndarray, flat: pa.Array) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), flat)


def _rows_with(failed_items: np.ndarray, lengths: np.ndarray, n: int) -> np.ndarray:
    """(N,) bool: the rows holding a failed item."""
    failed = np.zeros(n, dtype=bool)
    failed[np.repeat(np.arange(n), lengths)[failed_items]] = True
    return failed


def parse_request_keys(values: pa.Array) -> np.ndarray:
    """(N,) int64 request ids of request-key values: an integer key as it is, any other
    string as its stable 63-bit hash (``recd.logs.hashing``); a missing key: 0."""
    cast, ok = cast_where(values, matches(values, INT_RE), pa.int64())
    hashed = hash_strings(pc.fill_null(values, ""))
    return np.where(ok, to_int64(cast), hashed).astype(np.int64)
