"""Turn real event logs (CSV or JSON Lines) into raw logs of the recd sample schema.

Input: one event per line with a session (or user) id, a timestamp, an item id and an event
type (the column names are options). Timestamps are epoch milliseconds, epoch seconds (may have
a fraction) or ISO 8601 strings (``2024-05-01T12:00:00Z``, ``2024-05-01 12:00:00.250+02:00``;
no zone means UTC); ``ts_unit="auto"`` picks per file whichever of numeric / ISO parses more
values, and for numbers ms if any magnitude is >= 1e11, else seconds. Session ids are integers,
or any strings, which become a stable 63-bit hash (FNV-1a + SplitMix64 of the UTF-8 bytes, the
same id on every run and machine); ``session_ids="auto"`` uses the integers when every id is
one. Item ids must be integers >= 0. Event types are strings, trimmed and lower-cased.

Output: a raw-log directory (``rawlog.RawLogWriter``) with catalogue ``ingest`` and one sample
per event, in timestamp (arrival) order:

    session_id             int64   the session id (or its hash)
    request_id             int64   the event's 1-based line number in the input (+ request_id_base)
    ts                     int64   epoch milliseconds (UTC)
    label                  float32 1 if the event type is one of ``positive_events``, else 0
    hist_len               float32 number of earlier events in hist_item_ids (<= history)
    secs_since_prev_event  float32 seconds since the session's previous event (0 for the first)
    item_id                list    [the event's item id]
    hist_item_ids          list    item ids of the session's last N earlier events, oldest first
    hist_event_types       list    their event types (vocabulary ids), same rows, same order

``hist_item_ids`` and ``hist_event_types`` form the synchronised group ``history``: both gain one
entry on every event of a session. "Earlier" means earlier in (ts, line) order, so ties in ts
keep the file order. The current event's type is not a feature: the label derives from it.
Event types map to ids 1..V (0 is never used) by sorted name; pass ``event_vocabulary`` (e.g.
the ``event_vocabulary`` of an earlier run's ``_ingest.json``) to keep ids stable across files;
new names get the next ids. ``OUT/_ingest.json`` records the vocabulary, the label definition,
the resolved timestamp unit and session-id mode, and the counts.

Bad input rows (a CSV line with the wrong number of fields or an unmatched quote, invalid JSON
or not an object, a missing session id / timestamp / item id / event type, a timestamp or item
id that does not parse, bytes that are not UTF-8, a line longer than ``max_line_bytes``) are
found with vectorised checks and reported by file, 1-based line number (as an editor shows it;
a CSV header is line 1) and field. ``on_bad_rows="fail"`` (default) raises ``BadLineError`` for
the first one; ``"quarantine"`` writes every bad line with its line number, field, reason and
text (cut at ``max_line_bytes``) to ``OUT/_quarantine.jsonl`` and counts it: rows in = rows out
+ quarantined, always. Empty (CSV) or blank (JSON Lines) lines are not rows and are skipped.
Messages quote at most ``QUOTE_CHARS`` characters of a value.

Lines are bounded: one longer than ``max_line_bytes`` (default ``MAX_LINE_BYTES``, 1 MiB), and
so any value longer than that, is a bad line; it is found before parsing, as are lines that are
not UTF-8, since either would fail the whole parse without a line number.

An input with no events (0 bytes, only blank lines, only a CSV header, or, when quarantining,
only bad lines) raises ``NoEventsError`` and leaves ``OUT`` untouched; ``allow_empty=True``
writes an empty ``OUT`` instead (a 0-byte CSV then has no header to check).

The whole input is held in memory (a few times its size); split big inputs, e.g. by day. Lines
end with ``\\n`` or ``\\r\\n``; CSV values must not contain line breaks.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
from tqdm import tqdm

from recd.errors import BadLineError, ConfigError, NoEventsError, SchemaError
from recd.logs import rawlog
from recd.logs.hashing import hash_strings
from recd.logs.shard import replace_dir_atomically
from recd.progress import progress_bar
from recd.schema import (
    Catalogue,
    DenseFeature,
    SessionModel,
    SparseFeature,
    SparseKind,
)

log = logging.getLogger(__name__)

FORMATS = ("csv", "jsonl")
TS_UNITS = ("auto", "ms", "s", "iso")
SESSION_ID_MODES = ("auto", "int", "hash")
BAD_ROW_POLICIES = ("fail", "quarantine")
DEFAULT_POSITIVE_EVENTS = (
    "cart",
    "purchase",
    "order",
    "add_to_cart",
    "addtocart",
    "transaction",
)
QUARANTINE_FILE = "_quarantine.jsonl"
INGEST_FILE = "_ingest.json"
CATALOGUE_NAME = "ingest"
HISTORY_GROUP = "history"
LABEL = "label"
LABEL_DEFINITION = "label = 1 if the event type is one of positive_events, else 0"
OUTPUT_BATCH_ROWS = 1 << 16
MAX_LINE_BYTES = 1 << 20  # default bound on one input line (and so on any value in it)
QUOTE_CHARS = 40  # characters of an input value quoted in a message
_SUFFIX_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
_ROLES = ("session", "ts", "item", "event")
_INT_RE = r"^-?\d{1,19}$"
_NUMBER_RE = r"^-?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"
_ISO_RE = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}(:\d{2}(:\d{2}(\.\d{1,9})?)?)?(Z|[+-]\d{2}(:?\d{2})?)?)?$"
_ISO_ZONED_RE = r"[T ]\d{2}(:\d{2}(:\d{2}(\.\d{1,9})?)?)?(Z|[+-]\d{2}(:?\d{2})?)$"
_MS_THRESHOLD = 1e11  # epoch seconds reach 1e11 in year 5138, epoch ms passed it in 1973
_UTF8_BOM = b"\xef\xbb\xbf"
_UTF8_SCAN_LINES = 256  # below this many lines, find non-UTF-8 lines one by one
_ESCAPED = re.compile("[\udc80-\udcff]")  # bytes that were not UTF-8, after surrogateescape
_TS_EXPECTED = {
    "auto": "epoch ms, epoch s or ISO 8601",
    "ms": "epoch ms",
    "s": "epoch s",
    "iso": "ISO 8601",
}


@dataclass(kw_only=True, slots=True)
class IngestReport:
    """What ``ingest_events`` read and wrote."""

    source: str
    """The input file."""
    out_dir: str
    """The raw-log directory written."""
    format: str
    """``csv`` or ``jsonl``."""
    rows_in: int
    """Data lines read (CSV: non-empty lines after the header; JSON Lines: non-blank lines)."""
    rows_out: int
    """Samples written (one per good event)."""
    quarantined: int
    """Bad lines written to ``_quarantine.jsonl`` (0 unless on_bad_rows is quarantine)."""
    sessions: int
    """Distinct sessions among the rows written."""
    positives: int
    """Rows with label 1."""
    ts_unit: str
    """Timestamp format used: ``ms``, ``s`` or ``iso`` (``auto`` resolved)."""
    session_ids: str
    """Session-id mode used: ``int`` or ``hash`` (``auto`` resolved)."""
    history: int
    """N: length of the history features."""
    event_vocabulary: dict[str, int] = field(default_factory=dict)
    """Event type name -> id used in ``hist_event_types``."""
    positive_events: list[str] = field(default_factory=list)
    """Event types that give label 1."""
    quarantine_path: str | None = None
    """``OUT/_quarantine.jsonl`` when rows were quarantined."""
    elapsed_s: float = 0.0
    """Wall-clock time of the run."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "out_dir": self.out_dir,
            "format": self.format,
            "rows_in": self.rows_in,
            "rows_out": self.rows_out,
            "quarantined": self.quarantined,
            "sessions": self.sessions,
            "positives": self.positives,
            "ts_unit": self.ts_unit,
            "session_ids": self.session_ids,
            "history": self.history,
            "label": LABEL_DEFINITION,
            "positive_events": self.positive_events,
            "event_vocabulary": self.event_vocabulary,
            "quarantine_path": self.quarantine_path,
            "elapsed_s": round(self.elapsed_s, 3),
        }


@dataclass(slots=True)
class _BadLine:
    line: int
    field: str | None
    problem: str


@dataclass(slots=True)
class _TextColumns:
    """The four input columns as text, for the data lines that parsed, plus the lines that didn't."""

    lines: np.ndarray  # (N,) int64 1-based line numbers
    columns: dict[str, pa.Array]  # role -> (N,) string
    malformed: list[_BadLine]  # bad lines, whether or not they are among the rows
    rows_in: int
    flagged: np.ndarray | None = None  # (N,) bool: rows already in ``malformed``


class _Lines:
    """Line boundaries of a byte buffer (lines end with \\n; a trailing \\r is not content).

    ``numbers`` (L,) holds each line's 1-based number in the input file: ``1..L`` unless the
    buffer is what ``without`` left of a bigger one.
    """

    def __init__(self, data: bytes, numbers: np.ndarray | None = None) -> None:
        self.data = data
        self.buf = np.frombuffer(data, dtype=np.uint8)
        newlines = np.flatnonzero(self.buf == ord("\n"))
        self.starts = np.concatenate([[0], newlines + 1]).astype(np.int64)
        self.ends = np.concatenate([newlines, [len(self.buf)]]).astype(np.int64)
        if self.starts[-1] == len(self.buf):  # the file ends with a newline
            self.starts, self.ends = self.starts[:-1], self.ends[:-1]
        has_cr = (self.ends > self.starts) & (self.buf[np.maximum(self.ends - 1, 0)] == ord("\r"))
        self.content_ends = self.ends - has_cr
        self.numbers = np.arange(1, len(self.starts) + 1) if numbers is None else numbers
        self._blank: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def sizes(self) -> np.ndarray:
        """(L,) int64: bytes of each line, without its line break."""
        return self.content_ends - self.starts

    def without(self, drop: np.ndarray) -> _Lines:
        """The lines other than ``drop`` (0-based indices), keeping their line numbers.

        Copies the kept bytes once; only called when some lines are rejected before parsing.
        """
        keep = np.ones(len(self), dtype=bool)
        keep[drop] = False
        sizes_with_break = np.diff(np.append(self.starts, len(self.buf)))
        kept = self.buf[np.repeat(keep, sizes_with_break)].tobytes()
        return _Lines(kept, self.numbers[keep])

    def empty(self) -> np.ndarray:
        """(L,) bool: the line has no characters (as a CSV reader skips)."""
        return self.content_ends == self.starts

    def blank(self) -> np.ndarray:
        """(L,) bool: the line has only whitespace (as a JSON reader skips)."""
        if self._blank is None:
            is_content = np.ones(256, dtype=bool)
            is_content[list(b" \t\r\n")] = False
            # any content byte from a line's start up to the next line's start
            self._blank = (
                ~np.logical_or.reduceat(is_content[self.buf], self.starts)
                if len(self)
                else np.zeros(0, dtype=bool)
            )
        return self._blank

    def raw(self, index: int) -> bytes:
        """The bytes of line ``index`` (0-based), without its line break."""
        return self.data[self.starts[index] : self.content_ends[index]]

    def text(self, index: int, max_bytes: int | None = None) -> str:
        """The text of line ``index`` (0-based), without its line break; bytes that are not
        UTF-8 become U+FFFD. With ``max_bytes``, a longer line is cut there and ends in "…"."""
        start, end = int(self.starts[index]), int(self.content_ends[index])
        if max_bytes is not None and end - start > max_bytes:
            return self.data[start : start + max_bytes].decode("utf-8", "replace") + "…"
        return self.data[start:end].decode("utf-8", "replace")


def ingest_events(
    path: Path,
    out_dir: Path,
    *,
    fmt: str | None = None,
    session_col: str = "session_id",
    ts_col: str = "ts",
    item_col: str = "item_id",
    event_col: str = "event_type",
    ts_unit: str = "auto",
    history: int = 20,
    positive_events: Sequence[str] = DEFAULT_POSITIVE_EVENTS,
    on_bad_rows: str = "fail",
    session_ids: str = "auto",
    event_vocabulary: Mapping[str, int] | None = None,
    request_id_base: int = 0,
    delimiter: str = ",",
    max_line_bytes: int = MAX_LINE_BYTES,
    allow_empty: bool = False,
    show_progress: bool = True,
) -> IngestReport:
    """Read the event log at ``path`` and write it as a raw-log directory ``out_dir``.

    See the module docstring for the input, the output schema, the label and bad-row handling.
    ``out_dir`` is replaced atomically, and only when there are events to write: an input with
    none (empty, only blank lines, only a CSV header, or only bad lines in quarantine mode)
    raises ``NoEventsError`` and leaves ``out_dir`` as it was, unless ``allow_empty``. Raises
    ``BadLineError`` on the first bad line when ``on_bad_rows == "fail"``, ``SchemaError`` for
    a missing column or unreadable file and ``ConfigError`` for bad options.
    """
    start = time.perf_counter()
    path = Path(path)
    fmt = _resolve_format(path, fmt)
    _check_options(ts_unit, history, on_bad_rows, session_ids, delimiter, max_line_bytes)
    names = {"session": session_col, "ts": ts_col, "item": item_col, "event": event_col}
    if not path.is_file():
        raise ConfigError(f"event log {path} does not exist")
    data = path.read_bytes()
    if data.startswith(_UTF8_BOM):
        data = data[len(_UTF8_BOM) :]
    lines = _Lines(data)
    rejected: list[_BadLine] = []
    if not lines.blank().all():
        text, rejected = _read_text(
            path, lines, fmt, names, delimiter, max_line_bytes, on_bad_rows == "fail"
        )
    elif allow_empty:
        text = _no_text()
    else:
        raise _no_events(path, "the file is empty" if not data else "only blank lines")
    events, parse_bad = _parse_columns(text, names, ts_unit=ts_unit, session_ids=session_ids)
    bad = rejected + parse_bad
    if bad and on_bad_rows == "fail":
        first = min(bad, key=lambda b: b.line)
        raise BadLineError(str(path), first.line, first.field, first.problem)
    rows_in = text.rows_in + len(rejected)
    if len(events.lines) == 0 and not allow_empty:
        if bad:
            first = min(bad, key=lambda b: b.line)
            where = f"field {first.field!r}: " if first.field else ""
            reason = f"all {rows_in:,} data lines are bad, the first: line {first.line}: {where}"
            raise _no_events(path, reason + first.problem)
        raise _no_events(path, "only a header line" if fmt == "csv" else "only blank lines")
    vocabulary = _event_vocabulary(events.event, event_vocabulary)
    positives = sorted({p.strip().lower() for p in positive_events if p.strip()})
    with replace_dir_atomically(out_dir) as tmp:
        written = _write_samples(
            tmp, events, vocabulary, positives, history, request_id_base, show_progress
        )
        quarantine_path = None
        if bad:
            _write_quarantine(tmp / QUARANTINE_FILE, path, lines, bad, max_line_bytes)
            quarantine_path = str(Path(out_dir) / QUARANTINE_FILE)
        report = IngestReport(
            source=str(path),
            out_dir=str(out_dir),
            format=fmt,
            rows_in=rows_in,
            rows_out=written.rows,
            quarantined=len(bad),
            sessions=written.sessions,
            positives=written.positives,
            ts_unit=events.ts_unit,
            session_ids=events.session_mode,
            history=history,
            event_vocabulary=vocabulary,
            positive_events=positives,
            quarantine_path=quarantine_path,
        )
        if report.rows_out + report.quarantined != report.rows_in:  # an invariant, not input
            raise AssertionError(
                f"{path}: {report.rows_in} rows in != {report.rows_out} out + "
                f"{report.quarantined} quarantined"
            )
        report.elapsed_s = time.perf_counter() - start
        (tmp / INGEST_FILE).write_text(json.dumps(report.to_dict(), indent=1))
    log.info(
        "ingested %s: %d rows in, %d out, %d quarantined",
        path,
        report.rows_in,
        report.rows_out,
        report.quarantined,
    )
    return report


def read_ingest_info(raw_dir: Path) -> dict[str, Any]:
    """The ``_ingest.json`` of a directory written by ``ingest_events``."""
    path = Path(raw_dir) / INGEST_FILE
    if not path.is_file():
        raise ConfigError(f"{raw_dir}: no {INGEST_FILE}: not written by recd logs ingest")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _resolve_format(path: Path, fmt: str | None) -> str:
    if fmt is None:
        fmt = _SUFFIX_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise ConfigError(
                f"{path}: cannot tell the format from the suffix {path.suffix!r}: "
                f"use .csv / .jsonl or pass the format ({', '.join(FORMATS)})"
            )
    if fmt not in FORMATS:
        raise ConfigError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def _check_options(
    ts_unit: str,
    history: int,
    on_bad_rows: str,
    session_ids: str,
    delimiter: str,
    max_line_bytes: int,
) -> None:
    if ts_unit not in TS_UNITS:
        raise ConfigError(f"ts_unit must be one of {', '.join(TS_UNITS)}, got {ts_unit!r}")
    if history < 1:
        raise ConfigError(f"history must be >= 1, got {history}")
    if on_bad_rows not in BAD_ROW_POLICIES:
        raise ConfigError(
            f"on_bad_rows must be one of {', '.join(BAD_ROW_POLICIES)}, got {on_bad_rows!r}"
        )
    if session_ids not in SESSION_ID_MODES:
        raise ConfigError(
            f"session_ids must be one of {', '.join(SESSION_ID_MODES)}, got {session_ids!r}"
        )
    if len(delimiter.encode()) != 1 or delimiter in '\r\n"':
        raise ConfigError(f"delimiter must be one single-byte character, got {delimiter!r}")
    if max_line_bytes < 1:
        raise ConfigError(f"max_line_bytes must be >= 1, got {max_line_bytes}")


def _no_events(path: Path, reason: str) -> NoEventsError:
    return NoEventsError(
        f"{path}: no events ({reason}); --allow-empty writes an empty output instead"
    )


def shorten(text: str) -> str:
    """``text`` cut to ``QUOTE_CHARS`` characters + "…": how messages show input values."""
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "…"


def _quote(value: str) -> str:
    return repr(shorten(value))


# ----------------------------------------------------------------------------- reading


def _no_text() -> _TextColumns:
    return _TextColumns(
        lines=np.zeros(0, np.int64),
        columns={role: pa.array([], pa.string()) for role in _ROLES},
        malformed=[],
        rows_in=0,
    )


def _read_text(
    path: Path,
    lines: _Lines,
    fmt: str,
    names: dict[str, str],
    delimiter: str,
    max_line_bytes: int,
    first_only: bool,
) -> tuple[_TextColumns, list[_BadLine]]:
    """The four columns as text, and the lines rejected before parsing (too long, not UTF-8).

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
        return _read_csv(path, readable, names, delimiter), rejected
    return _read_jsonl(path, readable, names), rejected


_FieldAt = Callable[[bytes, int | None], str | None]
"""(line bytes, byte position or None) -> the field holding that byte (None: the longest)."""


def _reject_lines(
    path: Path,
    lines: _Lines,
    *,
    fmt: str,
    delimiter: str,
    max_line_bytes: int,
    first_only: bool,
) -> tuple[np.ndarray, list[_BadLine]]:
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
        header = _csv_header(path, lines, index, delimiter)

        def field_at(raw: bytes, position: int | None) -> str | None:
            return _csv_field_name(raw, position, header, delimiter)

    else:
        field_at = _json_field_name
    bad = [_BadLine(int(lines.numbers[i]), *problem(i, field_at)) for i in rejected.tolist()]
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


def _non_utf8_lines(lines: _Lines, *, first_only: bool = False) -> np.ndarray:
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


def _csv_field_name(
    raw: bytes, position: int | None, header: list[str], delimiter: str
) -> str | None:
    """The header name of the field of CSV line ``raw`` that holds byte ``position`` (None: the
    longest field). Fields are split at delimiters outside double quotes."""
    if position is not None and b'"' not in raw[:position]:
        index = raw.count(delimiter.encode(), 0, position)
    else:
        buf = np.frombuffer(raw, dtype=np.uint8)
        quoted = (np.cumsum(buf == ord('"'), dtype=np.uint8) & 1) == 1  # wraps, keeps parity
        cuts = np.flatnonzero((buf == ord(delimiter)) & ~quoted)
        if position is None:
            index = int(np.argmax(np.diff(np.concatenate([[-1], cuts, [len(buf)]]))))
        else:
            index = int(np.searchsorted(cuts, position))
    return shorten(header[index]) if index < len(header) else None


def _json_field_name(raw: bytes, position: int | None) -> str | None:
    """The key of JSON line ``raw`` whose value holds byte ``position`` (None: the biggest
    value), or None when the line is not a JSON object or the byte is not in a value."""
    try:
        value = json.loads(raw.decode("utf-8", "surrogateescape"))
    except ValueError:
        return None
    if not isinstance(value, dict) or not value:
        return None
    texts = {key: json.dumps(v, ensure_ascii=False) for key, v in value.items()}
    if position is None:
        key = max(texts, key=lambda k: len(texts[k]))
    else:
        holding = [k for k, text in texts.items() if _ESCAPED.search(text)]
        if not holding or _ESCAPED.search(holding[0]):
            return None
        key = holding[0]
    return shorten(key)


def _csv_header(path: Path, lines: _Lines, index: int, delimiter: str) -> list[str]:
    try:
        return next(csv.reader([lines.text(index)], delimiter=delimiter))
    except csv.Error as exc:
        raise SchemaError(
            f"{path}: line {lines.numbers[index]}: cannot read the CSV header: {exc}"
        ) from exc


def _read_csv(path: Path, lines: _Lines, names: dict[str, str], delimiter: str) -> _TextColumns:
    """Read the four columns as strings, keeping each row's line number.

    The reader cannot say which line a row came from, so every non-empty line gets a
    zero-padded line number prepended as an extra first field (one vectorised ``np.insert``);
    malformed lines then carry their number into the invalid-row handler too.
    """
    content = np.flatnonzero(~lines.empty())
    if content.size == 0:
        raise SchemaError(f"{path}: empty file: no CSV header line")
    header_index, data_index = int(content[0]), content[1:]
    header = _csv_header(path, lines, header_index, delimiter)
    missing = [(role, col) for role, col in names.items() if col not in header]
    if missing:
        wanted = ", ".join(f"{col!r}" for _, col in missing)
        raise SchemaError(
            f"{path}: line {lines.numbers[header_index]}: no column {wanted} in the header "
            f"(columns: {', '.join(shorten(h) for h in header[:50])}); "
            "set the column names with --*-col"
        )
    width = max(9, len(str(int(lines.numbers[-1]))))
    line_col = "recd_line".ljust(width, "_")
    if line_col in header:
        raise SchemaError(f"{path}: the column name {line_col!r} is reserved")
    prefixed = _prefix_line_numbers(lines, content, line_col, delimiter)

    malformed: list[_BadLine] = []

    def on_invalid(row: pa_csv.InvalidRow) -> str:
        number = int(row.text[:width]) if row.text[:width].isdigit() else -1
        malformed.append(
            _BadLine(
                number,
                None,
                f"malformed line: expected {row.expected_columns - 1} fields, "
                f"found {row.actual_columns - 1}",
            )
        )
        return "skip"

    columns = [line_col, *dict.fromkeys(names.values())]
    longest = int(lines.sizes().max()) + width + 3  # a line with its prefix and line break
    try:
        table = pa_csv.read_csv(
            pa.BufferReader(prefixed),
            # a row must fit in one block, or the whole read fails
            read_options=pa_csv.ReadOptions(block_size=max(1 << 20, 2 * longest)),
            parse_options=pa_csv.ParseOptions(delimiter=delimiter, invalid_row_handler=on_invalid),
            convert_options=pa_csv.ConvertOptions(
                column_types={line_col: pa.int64(), **{c: pa.string() for c in columns[1:]}},
                include_columns=columns,
                strings_can_be_null=False,
            ),
        )
    except pa.ArrowInvalid as exc:
        raise SchemaError(f"{path}: cannot read as CSV: {exc}") from exc
    table = table.combine_chunks()
    numbers = table.column(line_col).to_numpy()
    text = (
        {role: table.column(col).chunk(0) for role, col in names.items()}
        if table.num_rows
        else {role: pa.array([], pa.string()) for role in names}
    )
    return _TextColumns(
        lines=numbers,
        columns=text,
        malformed=malformed,
        rows_in=len(data_index),
        flagged=_unclosed_quotes(lines, data_index, numbers, text, names, malformed),
    )


def _unclosed_quotes(
    lines: _Lines,
    data_index: np.ndarray,
    numbers: np.ndarray,
    columns: dict[str, pa.Array],
    names: dict[str, str],
    malformed: list[_BadLine],
) -> np.ndarray | None:
    """Add the lines an unclosed quote spoiled to ``malformed``; returns the (N,) mask of the
    rows among them, or None when there are none.

    A ``"`` that does not close on its line makes the reader go on to the next ``"`` (or the
    end of its block), so the lines in between are no rows: they are the data lines
    (``data_index``) that neither a row (``numbers``) nor a malformed line carries. The row
    where the value began is bad when the value is one of the wanted ``columns``.
    """
    seen = np.concatenate([numbers, [b.line for b in malformed]]).astype(np.int64)
    if len(seen) == len(data_index):
        return None
    unmatched = (
        'an unmatched " on this line: a quoted value runs across lines '
        "(CSV values must not hold line breaks)"
    )
    inside = (
        'not read: inside a quoted value that runs across lines from an unmatched " before it '
        "(CSV values must not hold line breaks)"
    )
    for index in data_index[~np.isin(lines.numbers[data_index], seen)].tolist():
        problem = unmatched if lines.raw(index).count(b'"') % 2 else inside
        malformed.append(_BadLine(int(lines.numbers[index]), None, problem))
    flagged = np.zeros(len(numbers), dtype=bool)
    for role, column in columns.items():
        has_break = pc.fill_null(pc.match_substring(column, "\n"), False)
        rows = np.asarray(has_break.to_numpy(zero_copy_only=False), dtype=bool) & ~flagged
        for i in np.flatnonzero(rows).tolist():
            malformed.append(_BadLine(int(numbers[i]), names[role], unmatched))
        flagged |= rows
    return flagged


def _prefix_line_numbers(
    lines: _Lines, content: np.ndarray, line_col: str, delimiter: str
) -> pa.Buffer:
    """The CSV text from the header on, each line prefixed with a field holding its number.

    The header gets ``line_col``; the data lines their zero-padded 1-based line number, all
    ``len(line_col)`` characters wide. One element-wise binary join (C++) builds the result.
    """
    width = len(line_col)
    numbers = lines.numbers[content[1:]]
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    digits = ((numbers[:, None] // powers) % 10 + ord("0")).astype(np.uint8)
    header = np.frombuffer(line_col.encode(), dtype=np.uint8)[None, :]
    prefix = np.concatenate(
        [np.concatenate([header, digits]), np.full((len(content), 1), ord(delimiter), np.uint8)],
        axis=1,
    )
    # (M,) prefixes of width + 1 bytes, and (M,) segments: from a line to the next non-empty one
    prefixes = _binary_array(prefix.reshape(-1), np.arange(len(content) + 1) * (width + 1))
    bounds = np.append(lines.starts[content], len(lines.buf))
    segments = _binary_array(lines.buf, bounds)
    joined = pc.binary_join_element_wise(prefixes, segments, pa.scalar(b"", pa.large_binary()))
    total = prefix.size + len(lines.buf) - int(bounds[0])
    values = joined.buffers()[2]
    return values.slice(0, total) if values is not None else pa.py_buffer(b"")


def _binary_array(data: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """A large_binary array whose entry i is ``data[offsets[i]:offsets[i + 1]]`` (no copy)."""
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(offsets) - 1,
        [None, pa.py_buffer(offsets.astype(np.int64)), pa.py_buffer(data)],
    )


def _read_jsonl(path: Path, lines: _Lines, names: dict[str, str]) -> _TextColumns:
    """Read the four fields as strings, keeping each row's line number.

    The whole file is parsed at once; if the reader rejects it (invalid JSON, a line that is not
    an object, a field whose JSON type changes), the line range is halved until each failing
    range is a single line, which is malformed. Valid ranges are parsed independently, so a
    field may be a number on some lines and a string on others.
    """
    content = np.flatnonzero(~lines.blank())
    longest = int((lines.ends - lines.starts).max()) if len(lines) else 0
    options = pa_json.ReadOptions(block_size=max(1 << 20, 2 * longest + 16))
    malformed: list[_BadLine] = []
    parts: list[tuple[np.ndarray, dict[str, pa.Array], np.ndarray]] = []
    pending = [(0, len(content))] if content.size else []
    while pending:
        lo, hi = pending.pop()
        chunk = lines.data[lines.starts[content[lo]] : lines.ends[content[hi - 1]]]
        try:
            table = pa_json.read_json(io.BytesIO(chunk), read_options=options)
            ok = table.num_rows == hi - lo
            error = f"expected {hi - lo} rows, read {table.num_rows}"
        except pa.ArrowInvalid as exc:
            ok, error = False, str(exc)
        if ok:
            line_numbers = lines.numbers[content[lo:hi]]
            columns, bad, flagged = _json_columns_as_text(table, names, line_numbers)
            parts.append((line_numbers, columns, flagged))
            malformed.extend(bad)
        elif hi - lo == 1:
            index = int(content[lo])
            number = int(lines.numbers[index])
            malformed.append(_BadLine(number, None, _json_problem(lines.text(index), error)))
        else:
            mid = (lo + hi) // 2
            pending.extend([(mid, hi), (lo, mid)])
    parts.sort(key=lambda part: int(part[0][0]) if part[0].size else 0)
    return _TextColumns(
        lines=np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64),
        columns={
            role: pa.concat_arrays([p[1][role] for p in parts])
            if parts
            else pa.array([], pa.string())
            for role in names
        },
        malformed=malformed,
        rows_in=len(content),
        flagged=np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, bool),
    )


def _json_columns_as_text(
    table: pa.Table, names: dict[str, str], line_numbers: np.ndarray
) -> tuple[dict[str, pa.Array], list[_BadLine], np.ndarray]:
    """Each wanted field as strings (numbers, booleans, timestamps formatted).

    A field holding a JSON object or array makes its line bad (first such field per line);
    returns the columns, those bad lines and the (N,) mask of rows they flag.
    """
    out: dict[str, pa.Array] = {}
    bad: list[_BadLine] = []
    flagged = np.zeros(table.num_rows, dtype=bool)
    for role, col in names.items():
        if col not in table.column_names:
            out[role] = pa.nulls(table.num_rows, pa.string())
            continue
        column = table.column(col).combine_chunks()
        typ = column.type
        if pa.types.is_nested(typ):
            kind = "an array" if pa.types.is_list(typ) else "an object"
            present = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            for i in np.flatnonzero(present & ~flagged):
                bad.append(
                    _BadLine(int(line_numbers[i]), col, f"expected a string or number, got {kind}")
                )
            flagged |= present
            out[role] = pa.nulls(table.num_rows, pa.string())
        elif pa.types.is_null(typ):
            out[role] = pa.nulls(table.num_rows, pa.string())
        else:
            out[role] = pc.cast(column, pa.string())
    return out, bad, flagged


def _json_problem(text: str, arrow_error: str) -> str:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"invalid JSON: {exc.msg} (column {exc.colno})"
    if not isinstance(value, dict):
        return f"not a JSON object (got {type(value).__name__})"
    return f"cannot read line: {arrow_error.removeprefix('JSON parse error: ')}"


# ----------------------------------------------------------------------------- parsing


@dataclass(slots=True)
class _Events:
    """The good events, in input order."""

    lines: np.ndarray  # (N,) int64
    session: np.ndarray  # (N,) int64
    ts: np.ndarray  # (N,) int64 ms
    item: np.ndarray  # (N,) int64
    event: pa.Array  # (N,) string, lower-case
    ts_unit: str
    session_mode: str


@dataclass(slots=True)
class _Parsed:
    """One column parsed: values for every row, and which rows failed with what problem."""

    values: Any
    failed: np.ndarray  # (N,) bool
    problem: Callable[[str], str]  # raw text -> message


def _parse_columns(
    text: _TextColumns, names: dict[str, str], *, ts_unit: str, session_ids: str
) -> tuple[_Events, list[_BadLine]]:
    """Parse the text columns; returns the good events and every bad line (malformed first)."""
    trimmed = {role: pc.utf8_trim_whitespace(text.columns[role]) for role in _ROLES}
    session, session_mode = _parse_session(trimmed["session"], session_ids)
    ts, resolved_unit = _parse_ts(trimmed["ts"], ts_unit)
    parsed = {
        "session": session,
        "ts": ts,
        "item": _parse_item(trimmed["item"]),
        "event": _Parsed(
            values=pc.utf8_lower(trimmed["event"]),
            failed=np.zeros(len(text.lines), dtype=bool),
            problem=str,
        ),
    }
    bad = list(text.malformed)
    row_bad = np.zeros(len(text.lines), dtype=bool)
    if text.flagged is not None:
        row_bad |= text.flagged
    for role in _ROLES:  # report the first failing field of each line
        missing = _missing(trimmed[role])
        for mask, problem in (
            (missing, None),
            (parsed[role].failed & ~missing, parsed[role].problem),
        ):
            for i in np.flatnonzero(mask & ~row_bad):
                raw = trimmed[role][int(i)].as_py()
                message = "missing value" if problem is None else problem(raw)
                bad.append(_BadLine(int(text.lines[i]), names[role], message))
            row_bad |= mask
    good = np.flatnonzero(~row_bad)
    events = _Events(
        lines=text.lines[good],
        session=np.asarray(parsed["session"].values)[good],
        ts=np.asarray(parsed["ts"].values)[good],
        item=np.asarray(parsed["item"].values)[good],
        event=parsed["event"].values.take(pa.array(good)),
        ts_unit=resolved_unit,
        session_mode=session_mode,
    )
    return events, bad


def _missing(values: pa.Array) -> np.ndarray:
    empty = pc.fill_null(pc.equal(values, ""), True)
    return np.asarray(empty.to_numpy(zero_copy_only=False), dtype=bool)


def _matches(values: pa.Array, pattern: str) -> np.ndarray:
    matched = pc.fill_null(pc.match_substring_regex(values, pattern), False)
    return np.asarray(matched.to_numpy(zero_copy_only=False), dtype=bool)


def _cast_where(values: pa.Array, ok: np.ndarray, typ: pa.DataType) -> tuple[pa.Array, np.ndarray]:
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


def _to_int64(values: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(values, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _parse_session(values: pa.Array, mode: str) -> tuple[_Parsed, str]:
    present = ~_missing(values)
    is_int = _matches(values, _INT_RE) & present
    if mode == "auto":
        mode = "int" if is_int.sum() == present.sum() else "hash"
    if mode == "hash":
        return _Parsed(
            values=hash_strings(values), failed=np.zeros(len(values), bool), problem=str
        ), mode
    cast, ok = _cast_where(values, is_int, pa.int64())
    return (
        _Parsed(
            values=_to_int64(cast),
            failed=~ok,
            problem=lambda raw: (
                f"cannot parse {_quote(raw)} as an integer session id "
                "(use --session-ids hash for string ids)"
            ),
        ),
        mode,
    )


def _parse_item(values: pa.Array) -> _Parsed:
    cast, ok = _cast_where(values, _matches(values, _INT_RE), pa.int64())
    ints = _to_int64(cast)
    negative = ok & (ints < 0)

    def problem(raw: str) -> str:
        if raw.lstrip().startswith("-") and _matches(pa.array([raw]), _INT_RE)[0]:
            return f"item id {raw} is negative (ids must be >= 0)"
        return f"cannot parse {_quote(raw)} as an integer item id"

    return _Parsed(values=ints, failed=~ok | negative, problem=problem)


def _parse_ts(values: pa.Array, unit: str) -> tuple[_Parsed, str]:
    """Timestamps to epoch ms: (N,) int64, and the resolved unit (ms, s or iso)."""
    present = ~_missing(values)
    numeric = _matches(values, _NUMBER_RE) & present
    iso = _matches(values, _ISO_RE) & present
    if unit == "auto":
        unit = "iso" if iso.sum() > numeric.sum() else "number"
    expected = _TS_EXPECTED["auto" if unit == "number" else unit]

    def problem(raw: str) -> str:
        return f"cannot parse {_quote(raw)} as a timestamp (expected {expected})"

    if unit == "iso":
        zoned = _matches(values, _ISO_ZONED_RE) & iso
        naive_ns, naive_ok = _cast_where(values, iso & ~zoned, pa.timestamp("ns"))
        zoned_ns, zoned_ok = _cast_where(values, zoned, pa.timestamp("ns", tz="UTC"))
        ns = np.where(zoned, _to_int64(pc.cast(zoned_ns, pa.int64())), 0)
        ns = np.where(naive_ok, _to_int64(pc.cast(naive_ns, pa.int64())), ns)
        ok = naive_ok | zoned_ok
        return _Parsed(values=np.floor_divide(ns, 1_000_000), failed=~ok, problem=problem), "iso"
    cast, ok = _cast_where(values, numeric, pa.float64())
    number = np.asarray(pc.fill_null(cast, 0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
    if unit == "number":
        big = np.abs(number[ok]).max(initial=0.0) >= _MS_THRESHOLD
        unit = "ms" if big else "s"
    ms = number if unit == "ms" else number * 1000.0
    ok &= np.isfinite(ms) & (np.abs(ms) < 2.0**62)
    ms_int = np.rint(np.where(ok, ms, 0.0)).astype(np.int64)
    return _Parsed(values=ms_int, failed=~ok, problem=problem), unit


# ----------------------------------------------------------------------------- writing


def _event_vocabulary(events: pa.Array, given: Mapping[str, int] | None) -> dict[str, int]:
    """Ids of event types: ``given`` ones kept, new names appended in sorted order (ids >= 1)."""
    vocabulary = {str(k).strip().lower(): int(v) for k, v in (given or {}).items()}
    if any(v < 1 for v in vocabulary.values()) or len(set(vocabulary.values())) != len(vocabulary):
        raise ConfigError("event_vocabulary: ids must be distinct integers >= 1")
    next_id = max(vocabulary.values(), default=0) + 1
    for name in sorted(pc.unique(events).to_pylist()):
        if name not in vocabulary:
            vocabulary[name] = next_id
            next_id += 1
    return vocabulary


@dataclass(slots=True)
class _Written:
    rows: int
    sessions: int
    positives: int


def _write_samples(
    out_dir: Path,
    events: _Events,
    vocabulary: dict[str, int],
    positives: list[str],
    history: int,
    request_id_base: int,
    show_progress: bool,
) -> _Written:
    """Compute labels and histories and write the samples in (ts, line) order."""
    n = len(events.lines)
    encoded = pc.dictionary_encode(events.event)
    names = encoded.dictionary.to_pylist()
    event_ids = np.array([vocabulary[s] for s in names], dtype=np.int64)[_indices(encoded)]
    labels = np.isin(np.array(names, dtype=object), positives)[_indices(encoded)]
    # Session order: (session, ts, line); positions inside each session.
    by_session = np.lexsort((events.lines, events.ts, events.session))
    session_sorted = events.session[by_session]
    new_session = np.ones(n, dtype=bool)
    new_session[1:] = session_sorted[1:] != session_sorted[:-1]
    session_start = np.maximum.accumulate(np.where(new_session, np.arange(n), 0))
    position = np.arange(n) - session_start  # earlier events of the session
    rank = np.empty(n, dtype=np.int64)
    rank[by_session] = np.arange(n)  # input row -> index in session order
    items_sorted = events.item[by_session]
    repeats = (position[1:] > 0) & (items_sorted[1:] == items_sorted[:-1])
    same_item = float(repeats.sum() / max(1, int((position > 0).sum())))
    hist = _Histories(
        items=items_sorted,
        types=event_ids[by_session],
        ts=events.ts[by_session],
        position=position,
        history=history,
    )
    catalogue = _catalogue(events, labels, position, history, vocabulary, same_item)
    arrival = np.lexsort((events.lines, events.ts))
    bar = (
        progress_bar(desc="ingest: write samples", total=n, unit="rows")
        if show_progress
        else tqdm(disable=True)
    )
    with rawlog.RawLogWriter(out_dir, catalogue) as writer, bar:
        for lo in range(0, n, OUTPUT_BATCH_ROWS):
            rows = arrival[lo : lo + OUTPUT_BATCH_ROWS]
            writer.write(
                hist.batch(
                    rows,
                    rank[rows],
                    session=events.session,
                    request_id=events.lines + request_id_base,
                    label=labels,
                    schema=catalogue.arrow_schema().remove_metadata(),
                )
            )
            bar.update(len(rows))
    return _Written(rows=n, sessions=int(new_session.sum()), positives=int(labels.sum()))


def _indices(encoded: pa.DictionaryArray) -> np.ndarray:
    return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)


@dataclass(slots=True)
class _Histories:
    """Columns in session order, from which each event's last-N history is a slice."""

    items: np.ndarray  # (N,) int64
    types: np.ndarray  # (N,) int64
    ts: np.ndarray  # (N,) int64 ms
    position: np.ndarray  # (N,) int64: earlier events in the session
    history: int

    def batch(
        self,
        rows: np.ndarray,
        ranks: np.ndarray,
        *,
        session: np.ndarray,
        request_id: np.ndarray,
        label: np.ndarray,
        schema: pa.Schema,
    ) -> pa.RecordBatch:
        """The samples of input ``rows`` (B,) whose session-order indices are ``ranks`` (B,)."""
        lengths = np.minimum(self.position[ranks], self.history)  # (B,)
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # history of row b = session-order slice [rank_b - len_b, rank_b)
        within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
        take = np.repeat(ranks - lengths, lengths) + within
        first = self.position[ranks] == 0
        prev_ts = self.ts[np.maximum(ranks - 1, 0)]
        secs = np.where(first, 0.0, (self.ts[ranks] - prev_ts) / 1000.0)
        list_offsets = pa.array(offsets.astype(np.int32))
        one = pa.array(np.arange(len(rows) + 1, dtype=np.int32))
        columns = [
            pa.array(session[rows]),
            pa.array(request_id[rows]),
            pa.array(self.ts[ranks]),
            pa.array(label[rows].astype(np.float32)),
            pa.array(lengths.astype(np.float32)),
            pa.array(secs.astype(np.float32)),
            pa.ListArray.from_arrays(one, pa.array(self.items[ranks])),
            pa.ListArray.from_arrays(list_offsets, pa.array(self.items[take])),
            pa.ListArray.from_arrays(list_offsets, pa.array(self.types[take])),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=schema)


def _catalogue(
    events: _Events,
    labels: np.ndarray,
    position: np.ndarray,
    history: int,
    vocabulary: dict[str, int],
    same_item: float,
) -> Catalogue:
    """The ``ingest`` catalogue, with statistics measured on this input.

    ``same_item`` is d(item_id): the fraction of events (after a session's first) whose item
    equals the previous event's. The history features change on every event (d = 0).
    """
    n = len(events.lines)
    item_cardinality = int(events.item.max(initial=-1)) + 1 or 1
    mean_hist = float(np.minimum(position, history).mean()) if n else 0.0
    sessions = int((position == 0).sum())

    def history_feature(name: str, cardinality: int) -> SparseFeature:
        return SparseFeature(
            name=name,
            kind=SparseKind.HISTORY,
            mean_length=max(mean_hist, 1e-3),
            unchanged_prob=0.0,
            cardinality=cardinality,
            max_length=history,
            group=HISTORY_GROUP,
        )

    start_ms = int(events.ts.min()) if n else 0
    span_s = (int(events.ts.max()) - start_ms) // 1000 if n else 0
    rate = float(labels.mean()) if n else 0.5
    return Catalogue(
        name=CATALOGUE_NAME,
        labels=[LABEL],
        dense=[DenseFeature(name="hist_len"), DenseFeature(name="secs_since_prev_event")],
        sparse=[
            SparseFeature(
                name="item_id",
                kind=SparseKind.ITEM,
                mean_length=1.0,
                unchanged_prob=same_item,
                cardinality=item_cardinality,
            ),
            history_feature("hist_item_ids", item_cardinality),
            history_feature("hist_event_types", max(vocabulary.values(), default=0) + 1),
        ],
        sessions=SessionModel(
            num_sessions=max(1, sessions),
            mean_samples=max(1.0, n / max(1, sessions)),
            start=datetime.fromtimestamp(start_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S"),
            duration_s=max(1, span_s),
            label_rate=min(max(rate, 1e-6), 1 - 1e-6),
        ),
    )


def _write_quarantine(
    target: Path, source: Path, lines: _Lines, bad: Iterable[_BadLine], max_line_bytes: int
) -> None:
    """One JSON object per bad line: file, line, field, reason and the line's text (a line
    over ``max_line_bytes`` cut there, ending in "…"; bytes that are not UTF-8 as U+FFFD)."""
    with target.open("w") as f:
        for b in sorted(bad, key=lambda b: b.line):
            record = {
                "file": str(source),
                "line": b.line,
                "field": b.field,
                "reason": b.problem,
                "text": lines.text(b.line - 1, max_line_bytes)
                if 1 <= b.line <= len(lines)
                else None,
            }
            f.write(json.dumps(record) + "\n")
