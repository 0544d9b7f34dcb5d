"""One chunk of CSV / JSON Lines text -> its mapped columns as text, for pass 1 of
``recd logs ingest``.

Lines longer than the line limit or not UTF-8 would fail a reader's whole input with no line
number, so they are found first (vectorised) and set aside as bad lines; the rest goes to the
format's reader (``ingest_csv``, ``ingest_jsonl``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from recd.errors import BadLineError
from recd.logs.ingest_csv import csv_field_name, csv_header, read_csv
from recd.logs.ingest_jsonl import json_field_name, read_jsonl
from recd.logs.ingest_text import BadLine, Lines, TextColumns

_UTF8_SCAN_LINES = 256  # below this many lines, find non-UTF-8 lines one by one


def read_text(
    path: Path,
    lines: Lines,
    fmt: str,
    names: dict[str, str],
    delimiter: str,
    max_line_bytes: int,
    first_only: bool,
    separator: str = "|",
) -> tuple[TextColumns, list[BadLine]]:
    """The mapped columns as text, and the lines rejected before parsing (too long, not UTF-8).

    ``first_only`` (the input fails at its first bad line): only the first rejected line is
    found, and the lines from there on are not read.
    """
    drop, rejected = _reject_lines(
        path,
        lines,
        fmt=fmt,
        delimiter=delimiter,
        max_line_bytes=max_line_bytes,
        first_only=first_only,
    )
    readable = lines.without(drop) if drop.size else lines
    if fmt == "csv":
        return read_csv(path, readable, names, delimiter), rejected
    return read_jsonl(path, readable, names, separator), rejected


_FieldAt = Callable[[bytes, int | None], str | None]
"""(line bytes, byte position or None) -> the field holding that byte (None: the longest)."""


def _reject_lines(
    path: Path,
    lines: Lines,
    *,
    fmt: str,
    delimiter: str,
    max_line_bytes: int,
    first_only: bool,
) -> tuple[np.ndarray, list[BadLine]]:
    """The lines the readers must not see: longer than ``max_line_bytes`` or not UTF-8.

    Either would fail the reader's whole input with no line number (a row bigger than its
    block; a string that is not UTF-8), so both are found first: one length comparison, and
    one UTF-8 check of the whole buffer that is halved down to the failing lines only when it
    fails. Returns the 0-based indices to drop and one bad line per rejected line (with
    ``first_only``: the first rejected line, and every line from there on is dropped). A CSV
    header cannot be quarantined: a bad one raises ``BadLineError``.
    """
    too_long = np.flatnonzero(lines.sizes() > max_line_bytes)
    not_utf8 = _non_utf8_lines(lines, first_only=first_only)
    rejected = np.union1d(too_long, not_utf8)
    if first_only:
        rejected = rejected[:1]
    if rejected.size == 0:
        return rejected, []
    long_lines = set(too_long.tolist())

    def problem(index: int, field_at: _FieldAt | None) -> tuple[str | None, str]:
        raw = lines.raw(index)
        if index in long_lines:
            return _too_long_problem(raw, max_line_bytes, field_at)
        return _utf8_problem(raw, field_at)

    if fmt == "csv":
        index = int(np.flatnonzero(~lines.empty())[0])
        if index == rejected[0]:
            line = int(lines.numbers[index])
            raise BadLineError(str(path), line, None, "header: " + problem(index, None)[1])
        header = csv_header(path, lines, index, delimiter)

        def field_at(raw: bytes, position: int | None) -> str | None:
            return csv_field_name(raw, position, header, delimiter)

    else:
        field_at = json_field_name
    bad = [BadLine(int(lines.numbers[i]), *problem(i, field_at)) for i in rejected.tolist()]
    if first_only:
        return np.arange(rejected[0], len(lines)), bad
    return rejected, bad


def _too_long_problem(raw: bytes, limit: int, field_at: _FieldAt | None) -> tuple[str | None, str]:
    name = field_at(raw, None) if field_at is not None else None
    return name, (
        f"line of {len(raw):,} bytes is over the limit of {limit:,} bytes per line "
        "(--max-line-bytes)"
    )


def _utf8_problem(raw: bytes, field_at: _FieldAt | None) -> tuple[str | None, str]:
    expected = "(the input must be UTF-8 text)"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        name = field_at(raw, exc.start) if field_at is not None else None
        byte = raw[exc.start]
        return (
            name,
            f"not valid UTF-8: byte 0x{byte:02x} at byte {exc.start + 1} of the line {expected}",
        )
    return None, f"not valid UTF-8 {expected}"  # only if Arrow's check and Python's disagree


def _non_utf8_lines(lines: Lines, *, first_only: bool = False) -> np.ndarray:
    """0-based indices of the lines that are not valid UTF-8 (only the first: ``first_only``),
    in order.

    Valid input costs one vectorised check of the whole buffer; otherwise line ranges are
    halved, first half first, down to a few hundred lines, which are checked one by one.
    """
    bounds = np.append(lines.starts, len(lines.buf)).tolist()
    buffer = pa.py_buffer(lines.data)
    found: list[int] = []
    pending = [(0, len(lines))]
    while pending and not (first_only and found):
        lo, hi = pending.pop()
        if _is_utf8(buffer, bounds[lo], bounds[hi]):
            continue
        if hi - lo <= _UTF8_SCAN_LINES:
            view = memoryview(lines.data)
            for i in range(lo, hi):
                try:
                    str(view[bounds[i] : bounds[i + 1]], "utf-8")
                except UnicodeDecodeError:
                    found.append(i)
            continue
        mid = (lo + hi) // 2
        pending.extend([(mid, hi), (lo, mid)])
    return np.array(found[:1] if first_only else found, dtype=np.int64)


def _is_utf8(buffer: pa.Buffer, start: int, end: int) -> bool:
    offsets = pa.py_buffer(np.array([0, end - start], dtype=np.int64))
    value = pa.Array.from_buffers(
        pa.large_binary(), 1, [None, offsets, buffer.slice(start, end - start)]
    )
    try:
        value.cast(pa.large_string())
    except pa.ArrowInvalid:
        return False
    return True
