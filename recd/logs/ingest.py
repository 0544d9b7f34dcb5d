"""Turn real event logs (CSV, JSON Lines or Parquet) into raw logs of the recd sample schema.

Input: one event per line (Parquet: per row) with a session (or user) id, a timestamp, an item
id and an event type, plus any label, dense and sparse columns an ``IngestMapping``
(``recd.logs.ingest_mapping``) names. Timestamps are epoch milliseconds, epoch seconds (may
have a fraction) or ISO 8601 strings (``2024-05-01T12:00:00Z``, ``2024-05-01 12:00:00.250+02:00``;
no zone means UTC); ``ts_unit="auto"`` picks per file whichever of numeric / ISO parses more
values, and for numbers the unit most of them have (ms for a magnitude >= 1e11, else seconds;
``UnitMix``): in a file of both kinds each value of the other kind is a bad line. A number whose
date falls outside the years 1 to 9999 is a bad line (the message names the unit that reads
it). A log whose every sample is dated before 1990 is refused when it was read as ms and would
be dated 1990 to 2099 as seconds (epoch seconds given ``ts_unit="ms"``), and gets a warning
otherwise (``_early_dates``). Session ids are integers (any int64, negative ones too: every
hash downstream mixes their two's complement bits), or any strings, which become a stable
63-bit hash (FNV-1a + SplitMix64 of the UTF-8 bytes, the same id on every run and machine);
``session_ids="auto"`` uses the integers when every id is one. Item ids must be integers >= 0. Event types are strings, trimmed and lower-cased; the
event column is optional when the labels come from label columns.

Impression logs (one request scores several candidate items) come in two shapes: one row per
request with a candidate list (``candidates``) and parallel per-candidate lists, or one row
per candidate with a request key (``request``); either way each candidate becomes one sample
of its request's ``request_id``, ``ts`` and request-level features, in list (file) order, and
rows with no candidates (no key) are interaction events that feed the histories with their
items. ``recd.logs.ingest_requests`` builds the events and samples of each shape; its
docstring has the rules.

Output: a raw-log directory (``rawlog.RawLogWriter``) with catalogue ``ingest`` and one sample
per event that has an item, in timestamp (arrival) order, (ts, line) for ties:

    session_id             int64   the session id (or its hash)
    request_id             int64   the event's 1-based line (Parquet: row) number (+ base);
                                   impression logs: the request key, if mapped
    ts                     int64   epoch milliseconds (UTC)
    label                  float32 1 if the event type is one of ``positive_events``, else 0
                                   (or one float32 per mapped label column, named like it;
                                   impression logs: per candidate, or 1 on the clicked one)
    hist_len               float32 number of earlier events in hist_item_ids (<= history)
    secs_since_prev_event  float32 seconds since the session's previous event (0 for the first)
    <dense columns>        float32 the mapped numeric columns (and per-candidate ones)
    position               float32 impression logs: the candidate's place in its list
    item_id                list    [the event's item id] (impression logs: the candidate's)
    hist_item_ids          list    item ids of the session's last N earlier events, oldest first
    hist_event_types       list    their event types (vocabulary ids), same rows, same order
    <sparse columns>       list    [id] of a mapped id column; the ids of a mapped list column
                                   (and of declared history columns, and per-candidate ids)

``hist_item_ids`` and ``hist_event_types`` form the synchronised group ``history``: both gain one
entry on every event of a session. "Earlier" means earlier in (ts, line) order, so ties in ts
keep the file order. With ``history = 0`` the three history columns are left out. Events with no
item (``keep_itemless``) are entries of the histories (item ``itemless_item_id``) but no
samples. The current event's type is not a feature: the label derives from it.
Event types map to ids 1..V (0 is never used) by sorted name; pass ``event_vocabulary`` (e.g.
the ``event_vocabulary`` of an earlier run's ``_ingest.json``) to keep ids stable across files;
new names get the next ids. ``OUT/_ingest.json`` records the vocabulary, the label definition,
the mapping, the resolved timestamp unit and session-id mode, warnings and the counts. A label
with one value on every sample is logged as a warning (one line, naming it and the value); so
is a log of fewer than ``SPARSE_SAMPLES_PER_HOUR`` samples per hour over more than two days
(hourly partitions would be tiny: partition the table by day, ``recd etl --partition-by day``),
unless the caller says the table is partitioned by day already (``partition_by``).

Bad input rows (a CSV line with the wrong number of fields or an unmatched quote, invalid JSON
or not an object, a missing session id / timestamp / item id / event type, a timestamp, id or
number that does not parse, bytes that are not UTF-8, a line longer than ``max_line_bytes``)
are found with vectorised checks and reported by file, 1-based line number (as an editor shows
it; a CSV header is line 1; Parquet: the row number) and field. ``on_bad_rows="fail"``
(default) raises ``BadLineError`` for the first one; ``"quarantine"`` writes every bad line with
its line number, field, reason and text (cut at ``max_line_bytes``; none for Parquet) to
``OUT/_quarantine.jsonl`` and counts it: rows in = rows out + history only + quarantined,
always. Empty (CSV) or blank (JSON Lines) lines are not rows and are skipped. Messages quote at
most ``QUOTE_CHARS`` characters of a value.

Lines are bounded: one longer than ``max_line_bytes`` (default ``MAX_LINE_BYTES``, 1 MiB), and
so any value longer than that, is a bad line; it is found before parsing, as are lines that are
not UTF-8, since either would fail the whole parse without a line number. A "line" of more
than ``LINE_CAP_LINES`` line limits with no line break ends the read (SchemaError).

An input with no events (0 bytes, only blank lines, only a CSV header, or, when quarantining,
only bad lines) raises ``NoEventsError`` and leaves ``OUT`` untouched; ``allow_empty=True``
writes an empty ``OUT`` instead (a 0-byte CSV then has no header to check).

Streaming, with memory bounded by ``memory_budget_bytes`` (M), not by the file::

    pass 1  read chunks of max(M / 16, 1 MiB, 2 x max_line_bytes) bytes of whole lines (CSV:
            the header line put in front of each; Parquet: record batches of about that many
            decoded bytes); check, parse the mapped features, count what the auto modes need;
            append each row to bucket hash(session) mod B, a temporary Arrow file beside OUT
            (B = ceil(file bytes x 8 / (M / 2)), at most 256; B = 1 keeps the rows in memory)
    pass 2  per bucket (whole sessions): parse the core columns with the resolved modes, sort
            by (session, ts, line), cut the histories, write its samples in (ts, line) order
    merge   merge the buckets' sorted files, 16 at a time, into OUT in (ts, line) order

Peak memory (RSS growth of the process) stays within ``memory_bound_bytes(M)`` = M + 192 MiB
(measured: +132 to +153 MiB at M = 16 MiB on a 38 MiB CSV, whose whole-file read takes +420
to +475 MiB; 36 MiB of the fixed part is pandas, which pyarrow's ``Array.to_numpy`` imports on
first use) as long as no single session holds a large part of M (a bucket is never split),
plus the bad lines kept for the report (~200 bytes each). Temporary files take about twice
the input. The rows written are the same for every M; the catalogue's Zipf exponents are
fitted on the first bucket's sessions and its sums are float sums in bucket order, so they
differ with B in the last digits. Lines end with ``\\n`` or ``\\r\\n``; CSV values must not contain line breaks.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.ipc as ipc
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from tqdm import tqdm

from recd.durable import replace_dir_atomically
from recd.errors import BadLineError, ConfigError, NoEventsError, SchemaError
from recd.logs import rawlog
from recd.logs.hashing import hash_strings
from recd.logs.ingest_mapping import (
    DEFAULT_POSITIVE_EVENTS,
    HISTORY_GROUP,
    HISTORY_SPARSE,
    LABEL,
    SESSION_ID_MODES,
    TS_UNITS,
    IngestMapping,
)
from recd.logs.ingest_requests import GoodRows, build_events, empty_events, key_conflicts
from recd.logs.ingest_samples import (
    CATALOGUE_NAME,
    MERGE_FAN_IN,
    BucketEvents,
    BucketSamples,
    SampleStats,
    build_catalogue,
    merge_files,
    remap_values,
    write_sorted,
)
from recd.logs.ingest_values import (
    INT_RE,
    ISO_RE,
    MS_THRESHOLD,
    NUMBER_RE,
    QUOTE_CHARS,
    UNIT_NAMES,
    UnitMix,
    cast_where,
    is_missing,
    matches,
    parse_ids,
    parse_item,
    parse_number,
    parse_number_lists,
    parse_request_keys,
    parse_session,
    parse_ts,
    quote,
    shorten,
)
from recd.progress import progress_bar

__all__ = [
    "BAD_ROW_POLICIES",
    "CATALOGUE_NAME",
    "DEFAULT_MEMORY_BUDGET_BYTES",
    "DEFAULT_POSITIVE_EVENTS",
    "FORMATS",
    "HISTORY_GROUP",
    "LABEL",
    "MAX_LINE_BYTES",
    "QUOTE_CHARS",
    "SESSION_ID_MODES",
    "TS_UNITS",
    "IngestMapping",
    "IngestReport",
    "ingest_events",
    "memory_bound_bytes",
    "read_ingest_info",
    "shorten",
]

log = logging.getLogger(__name__)

FORMATS = ("csv", "jsonl", "parquet")
BAD_ROW_POLICIES = ("fail", "quarantine")
QUARANTINE_FILE = "_quarantine.jsonl"
INGEST_FILE = "_ingest.json"
LABEL_DEFINITION = "label = 1 if the event type is one of positive_events, else 0"
LABEL_COLUMNS_DEFINITION = "labels = the label columns (numbers; true/false = 1/0)"
LABEL_CLICKED_DEFINITION = "label = 1 on the candidate equal to the clicked item, else 0"
OUTPUT_BATCH_ROWS = 1 << 16  # most samples per output batch
MIN_BATCH_ROWS = 1024  # fewest samples per output batch (and per batch of a bucket's file)
MIB = 1 << 20
DEFAULT_MEMORY_BUDGET_BYTES = 512 * MIB
FIXED_OVERHEAD_BYTES = 192 * MIB  # on top of the budget: imports done lazily, Arrow pools, slack
MIN_CHUNK_BYTES = 1 * MIB
CHUNK_SHARE = 16  # a text chunk is budget / CHUNK_SHARE bytes
BUCKET_SHARE = 2  # one bucket's events take budget / BUCKET_SHARE at most (for small sessions)
BUCKET_BYTES_PER_INPUT_BYTE = 8  # measured peak bytes of pass 2 per input byte of a bucket
MERGE_SHARE = 4  # the merge's batches (one per bucket) take budget / MERGE_SHARE
MAX_BUCKETS = 256
ROW_BYTES = 512  # planning figure of one sample's bytes (with a history of ~20)
LINE_CAP_LINES = 64  # a "line" of 64 line limits with no line break: not a text file
MAX_LINE_BYTES = 1 << 20  # default bound on one input line (and so on any value in it)
SPARSE_SAMPLES_PER_HOUR = 1000  # below this (over > 2 days), ingest suggests day partitions
_SUFFIX_FORMATS = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_CORE = ("session", "ts", "item", "event", "request")  # text roles; the last three optional
_LIST_KINDS = ("list", "hist", "cand", "cdense", "csparse", "clabel")  # list-valued roles
_UTF8_BOM = b"\xef\xbb\xbf"
_UTF8_SCAN_LINES = 256  # below this many lines, find non-UTF-8 lines one by one
_ESCAPED = re.compile("[\udc80-\udcff]")  # bytes that were not UTF-8, after surrogateescape


@dataclass(kw_only=True, slots=True)
class IngestReport:
    """What ``ingest_events`` read and wrote."""

    source: str
    """The input file."""
    out_dir: str
    """The raw-log directory written."""
    format: str
    """``csv``, ``jsonl`` or ``parquet``."""
    rows_in: int
    """Data lines read (CSV: non-empty lines after the header; JSON Lines: non-blank lines;
    Parquet: rows)."""
    rows_out: int
    """Samples written (one per good event that has an item; impression logs: one per
    candidate)."""
    quarantined: int
    """Bad lines written to ``_quarantine.jsonl`` (0 unless on_bad_rows is quarantine)."""
    sessions: int
    """Distinct sessions among the rows written."""
    positives: int
    """Samples whose (first) label is 1."""
    ts_unit: str
    """Timestamp format used: ``ms``, ``s`` or ``iso`` (``auto`` resolved)."""
    session_ids: str
    """Session-id mode used: ``int`` or ``hash`` (``auto`` resolved)."""
    history: int
    """N: length of the history features (0: none)."""
    history_only: int = 0
    """Good events kept for the histories only (``keep_itemless`` events with no item;
    impression logs: the interaction events): rows in = sample rows + history only +
    quarantined."""
    requests: int = 0
    """Requests written (impression logs; an event log: = rows out)."""
    sample_rows: int = 0
    """Input rows the samples came from (= rows out, but for a log of one row per request:
    the request rows)."""
    labels: list[str] = field(default_factory=lambda: [LABEL])
    """Label columns of the output."""
    event_vocabulary: dict[str, int] = field(default_factory=dict)
    """Event type name -> id used in ``hist_event_types``."""
    positive_events: list[str] = field(default_factory=list)
    """Event types that give label 1 ([] with label columns)."""
    mapping: dict[str, Any] = field(default_factory=dict)
    """The column mapping used (``IngestMapping`` as a dict)."""
    buckets: int = 1
    """Session buckets of the streaming read (1: the events were held in memory)."""
    memory_budget_bytes: int = 0
    """The memory budget the read was planned for."""
    warnings: list[str] = field(default_factory=list)
    """Warnings also logged (e.g. a label that is constant)."""
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
            "requests": self.requests,
            "sample_rows": self.sample_rows,
            "history_only": self.history_only,
            "quarantined": self.quarantined,
            "sessions": self.sessions,
            "positives": self.positives,
            "ts_unit": self.ts_unit,
            "session_ids": self.session_ids,
            "history": self.history,
            "label": self._label_definition(),
            "labels": self.labels,
            "positive_events": self.positive_events,
            "event_vocabulary": self.event_vocabulary,
            "mapping": self.mapping,
            "buckets": self.buckets,
            "memory_budget_bytes": self.memory_budget_bytes,
            "warnings": self.warnings,
            "quarantine_path": self.quarantine_path,
            "elapsed_s": round(self.elapsed_s, 3),
        }

    def _label_definition(self) -> str:
        if self.mapping.get("clicked"):
            return LABEL_CLICKED_DEFINITION
        if self.mapping.get("labels") or self.mapping.get("candidate_labels"):
            return LABEL_COLUMNS_DEFINITION
        return LABEL_DEFINITION


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
    mapping: IngestMapping | None = None,
    fmt: str | None = None,
    session_col: str | None = None,
    ts_col: str | None = None,
    item_col: str | None = None,
    event_col: str | None = None,
    ts_unit: str | None = None,
    history: int | None = None,
    positive_events: Sequence[str] | None = None,
    on_bad_rows: str = "fail",
    session_ids: str | None = None,
    event_vocabulary: Mapping[str, int] | None = None,
    request_id_base: int = 0,
    delimiter: str = ",",
    max_line_bytes: int = MAX_LINE_BYTES,
    allow_empty: bool = False,
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES,
    show_progress: bool = True,
    partition_by: str | None = None,
) -> IngestReport:
    """Read the event log at ``path`` and write it as a raw-log directory ``out_dir``.

    See the module docstring for the input, the output schema, the label, bad-row handling and
    the memory bound. ``mapping`` names the columns and features; the older keyword options
    (``session_col`` ... ``session_ids``) build one when it is not given (giving both is an
    error). ``out_dir`` is replaced atomically, and only when there are events to write: an
    input with none (empty, only blank lines, only a CSV header, or only bad lines in
    quarantine mode) raises ``NoEventsError`` and leaves ``out_dir`` as it was, unless
    ``allow_empty``. Raises ``BadLineError`` on the first bad line when ``on_bad_rows ==
    "fail"``, ``SchemaError`` for a missing column or unreadable file and ``ConfigError`` for
    bad options. ``delimiter``: one character, or ``\\t`` / ``tab`` for a tab
    (``resolve_delimiter``). ``partition_by``: how the table will be partitioned, when the
    caller knows (``day``: no day-partition hint).
    """
    start = time.perf_counter()
    path = Path(path)
    _check_input(path)
    fmt = _resolve_format(path, fmt)
    delimiter = resolve_delimiter(delimiter)
    mapping = _mapping_of(
        mapping,
        session=session_col,
        ts=ts_col,
        item=item_col,
        event=event_col,
        ts_unit=ts_unit,
        history=history,
        positive_events=None if positive_events is None else list(positive_events),
        session_ids=session_ids,
    )
    _check_options(on_bad_rows, delimiter, max_line_bytes, memory_budget_bytes)
    if fmt == "csv" and mapping.sparse_lists and mapping.list_separator == delimiter:
        raise ConfigError(
            f"mapping.list_separator {mapping.list_separator!r} is the CSV delimiter: pick another"
        )
    plan = _plan(path, memory_budget_bytes, max_line_bytes)
    with tempfile.TemporaryDirectory(
        prefix=f".{Path(out_dir).name}.ingest-", dir=_parent(out_dir)
    ) as scratch:
        spill = _Spill(Path(scratch), plan.buckets)
        read = _read_into_buckets(
            path,
            fmt,
            mapping,
            spill,
            plan=plan,
            delimiter=delimiter,
            max_line_bytes=max_line_bytes,
            first_only=on_bad_rows == "fail",
            show_progress=show_progress,
        )
        spill.close()
        modes = read.modes(mapping)
        provisional = sorted(read.event_names)
        done = _samples_per_bucket(
            spill, mapping, modes, provisional, plan, read.schema, request_id_base
        )
        bad = read.bad + done.bad
        if bad and on_bad_rows == "fail":
            first = min(bad, key=lambda b: b.line)
            raise BadLineError(str(path), first.line, first.field, first.problem)
        stats = done.stats
        if stats.samples == 0 and not allow_empty:
            raise _no_events(path, _why_no_events(read, bad, fmt, stats))
        early = _early_dates(path, mapping, modes, stats)
        vocabulary = _event_vocabulary(done.event_names, event_vocabulary)
        lookup = np.array([0, *(vocabulary.get(name, 0) for name in provisional)], dtype=np.int64)
        catalogue = build_catalogue(stats, mapping, event_types=max(vocabulary.values(), default=0))
        warnings = _constant_label_warnings(stats, mapping) + early
        if partition_by != "day":
            warnings += _partition_hint(stats)
        with replace_dir_atomically(out_dir) as tmp:
            with rawlog.RawLogWriter(tmp, catalogue) as writer:
                for batch in done.batches():
                    if HISTORY_SPARSE[1] in mapping.hist_sparse:
                        batch = remap_values(batch, HISTORY_SPARSE[1], lookup)
                    writer.write(batch)
            quarantine_path = None
            if bad:
                texts = _bad_line_texts(path, fmt, bad, max_line_bytes)
                _write_quarantine(tmp / QUARANTINE_FILE, path, bad, texts)
                quarantine_path = str(Path(out_dir) / QUARANTINE_FILE)
            report = IngestReport(
                source=str(path),
                out_dir=str(out_dir),
                format=fmt,
                rows_in=read.rows_in,
                rows_out=stats.samples,
                requests=stats.requests,
                sample_rows=stats.sample_lines,
                quarantined=len(bad),
                history_only=stats.history_only,
                sessions=stats.sessions,
                positives=int(stats.label_sum.get(mapping.label_names[0], 0.0)),
                ts_unit=modes.ts_unit,
                session_ids=modes.session_ids,
                history=mapping.history,
                labels=mapping.label_names,
                event_vocabulary=vocabulary,
                positive_events=mapping.positives,
                mapping=mapping.to_dict(),
                buckets=plan.buckets,
                memory_budget_bytes=memory_budget_bytes,
                warnings=warnings,
                quarantine_path=quarantine_path,
            )
            if report.sample_rows + report.history_only + report.quarantined != report.rows_in:
                raise AssertionError(  # an invariant, not input
                    f"{path}: {report.rows_in} rows in != {report.sample_rows} sample rows + "
                    f"{report.history_only} history-only + {report.quarantined} quarantined"
                )
            report.elapsed_s = time.perf_counter() - start
            (tmp / INGEST_FILE).write_text(json.dumps(report.to_dict(), indent=1))
    for warning in warnings:
        log.warning("%s", warning)
    log.info(
        "ingested %s: %d rows in, %d out, %d history-only, %d quarantined, %d bucket(s)",
        path,
        report.rows_in,
        report.rows_out,
        report.history_only,
        report.quarantined,
        plan.buckets,
    )
    return report


def read_ingest_info(raw_dir: Path) -> dict[str, Any]:
    """The ``_ingest.json`` of a directory written by ``ingest_events``."""
    path = Path(raw_dir) / INGEST_FILE
    if not path.is_file():
        raise ConfigError(f"{raw_dir}: no {INGEST_FILE}: not written by recd logs ingest")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def memory_bound_bytes(memory_budget_bytes: int) -> int:
    """The stated bound on the growth of an ingest process's peak memory (RSS) for any input
    whose lines are under the line limit and whose largest session is small next to the
    budget: the budget plus ``FIXED_OVERHEAD_BYTES`` (allocator slack, Arrow pools)."""
    return memory_budget_bytes + FIXED_OVERHEAD_BYTES


def _mapping_of(mapping: IngestMapping | None, **options: Any) -> IngestMapping:
    given = {k: v for k, v in options.items() if v is not None}
    if mapping is None:
        return IngestMapping(**given)
    if given:
        raise ConfigError(
            f"give either a mapping or the column options ({', '.join(sorted(given))}), not both"
        )
    return mapping


def _parent(out_dir: Path) -> Path:
    parent = Path(out_dir).absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    return parent


def _why_no_events(read: _ReadResult, bad: list[_BadLine], fmt: str, stats: SampleStats) -> str:
    if read.bytes_read == 0:
        return "the file is empty"
    if not read.content:
        return "only blank lines"
    if bad:
        first = min(bad, key=lambda b: b.line)
        where = f"field {first.field!r}: " if first.field else ""
        reason = f"all {read.rows_in:,} data lines are bad, the first: line {first.line}: {where}"
        return reason + first.problem
    if stats.history_only:
        return f"all {stats.history_only:,} events have no item (history only)"
    return "only a header line" if fmt == "csv" else "only blank lines"


def _partition_hint(stats: SampleStats) -> list[str]:
    """One line when the samples are too sparse in time for hourly partitions (fewer than
    ``SPARSE_SAMPLES_PER_HOUR`` per hour over more than two days): day partitions then."""
    if stats.samples == 0 or stats.ts_min is None or stats.ts_max is None:
        return []
    hours = (stats.ts_max - stats.ts_min) // 3_600_000 + 1
    per_hour = stats.samples / hours
    if hours <= 48 or per_hour >= SPARSE_SAMPLES_PER_HOUR:
        return []
    return [
        f"{stats.samples:,} samples over {hours:,} hours ({per_hour:,.0f} per hour): hourly "
        "partitions would be small; partition the table by day (recd etl --partition-by day, "
        'or [etl] partition_by = "day" in a recd run pipeline)'
    ]


EPOCH_1990_MS = 631_152_000_000  # 1990-01-01T00:00:00Z
EPOCH_2100_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z


def _early_dates(
    path: Path, mapping: IngestMapping, modes: _Modes, stats: SampleStats
) -> list[str]:
    """The check of a log whose every sample's timestamp falls before 1990.

    Read as epoch ms while every value, read as epoch seconds, falls in 1990..2099: epoch
    seconds given ``--ts-unit ms``, certainly (the dates would all be in January 1970):
    ``ConfigError``. Any other log dated before 1990 (relative times? ms read as ms that start
    near 0): one warning line, as its partitions will be dated 1970.
    """
    if stats.samples == 0 or stats.ts_min is None or stats.ts_max is None:
        return []
    if stats.ts_max >= EPOCH_1990_MS:
        return []
    span = f"{_date(stats.ts_min)} to {_date(stats.ts_max)}"
    if (
        modes.ts_unit == "ms"
        and stats.ts_min * 1000 >= EPOCH_1990_MS
        and stats.ts_max * 1000 < EPOCH_2100_MS
    ):
        raise ConfigError(
            f"{path}: field {mapping.ts!r}: every timestamp falls before 1990 read as epoch "
            f"milliseconds ({span}), and from 1990 on read as epoch seconds "
            f"({_date(stats.ts_min * 1000)} to {_date(stats.ts_max * 1000)}): these are epoch "
            "seconds; use --ts-unit s (or auto)"
        )
    unit = UNIT_NAMES.get(modes.ts_unit, "ISO 8601")
    return [
        f"every timestamp (column {mapping.ts!r}, read as {unit}) falls before 1990 ({span}): "
        "relative times rather than epoch times? the table's partitions will carry these dates"
    ]


def _date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _constant_label_warnings(stats: SampleStats, mapping: IngestMapping) -> list[str]:
    """One line per label with a single value on every sample (a typo in positive_events, or
    the wrong label column)."""
    out = []
    for name, value in stats.constant_labels().items():
        hint = (
            f"the label column {name!r} is right"
            if mapping.labels
            else f"--positive-events ({','.join(mapping.positives) or 'none'}) names event "
            "types of this log (see event_vocabulary in _ingest.json)"
        )
        out.append(
            f"label {name!r} is {value:g} on all {stats.samples:,} samples: a model cannot "
            f"learn from it; check that {hint}"
        )
    return out


# ----------------------------------------------------------------------------- plan


@dataclass(slots=True)
class _Plan:
    """How the input is read: chunk size, buckets, rows per output batch."""

    file_bytes: int
    chunk_bytes: int
    buckets: int
    batch_rows: int


def _plan(path: Path, budget: int, max_line_bytes: int) -> _Plan:
    """Split ``budget``: a text chunk of ``budget / CHUNK_SHARE`` bytes (at least one line
    limit), and enough buckets that one bucket's events take ``budget / BUCKET_SHARE``."""
    size = path.stat().st_size
    chunk = max(MIN_CHUNK_BYTES, budget // CHUNK_SHARE, 2 * max_line_bytes)
    per_bucket = max(1, budget // BUCKET_SHARE)
    buckets = min(MAX_BUCKETS, max(1, math.ceil(size * BUCKET_BYTES_PER_INPUT_BYTE / per_bucket)))
    fan_in = min(buckets, MERGE_FAN_IN)
    batch_rows = max(
        MIN_BATCH_ROWS, min(OUTPUT_BATCH_ROWS, budget // (MERGE_SHARE * fan_in * ROW_BYTES))
    )
    return _Plan(file_bytes=size, chunk_bytes=chunk, buckets=buckets, batch_rows=batch_rows)


# ----------------------------------------------------------------------------- pass 1


class _Spill:
    """Rows of the first pass, by bucket (hash of the session id): Arrow IPC stream files
    under ``root``, or with one bucket the record batches in memory."""

    def __init__(self, root: Path, buckets: int) -> None:
        self.root = root
        self.buckets = buckets
        self.memory: list[pa.RecordBatch] = []
        self._writers: list[ipc.RecordBatchStreamWriter] = []

    def path(self, bucket: int) -> Path:
        return self.root / f"bucket-{bucket:04d}.arrow"

    def write(self, batch: pa.RecordBatch, bucket_of: np.ndarray) -> None:
        if self.buckets == 1:
            self.memory.append(batch)
            return
        if not self._writers:
            self._writers = [
                ipc.new_stream(str(self.path(b)), batch.schema) for b in range(self.buckets)
            ]
        order = np.argsort(bucket_of, kind="stable")
        bounds = np.searchsorted(bucket_of[order], np.arange(self.buckets + 1))
        for b in range(self.buckets):
            if bounds[b + 1] > bounds[b]:
                rows = pa.array(order[bounds[b] : bounds[b + 1]])
                self._writers[b].write_batch(batch.take(rows))

    def close(self) -> None:
        for writer in self._writers:
            writer.close()

    def read(self, bucket: int, schema: pa.Schema | None) -> pa.Table:
        if schema is None:  # no rows were read
            return pa.table({})
        if self.buckets == 1:
            batches, self.memory = self.memory, []
            return pa.Table.from_batches(batches, schema=schema).combine_chunks()
        if not self._writers:
            return pa.Table.from_batches([], schema=schema)
        with pa.OSFile(str(self.path(bucket))) as source:
            table = ipc.open_stream(source).read_all().combine_chunks()
        self.path(bucket).unlink()
        return table


@dataclass(slots=True)
class _Modes:
    ts_unit: str
    session_ids: str
    ts_mix: UnitMix | None = None  # ts_unit auto on numbers: the log's counts of each kind


@dataclass(slots=True)
class _ReadResult:
    """What the first pass saw: counts for the auto modes, event names, bad lines."""

    rows_in: int = 0
    bytes_read: int = 0
    content: bool = False  # a line that is not blank
    bad: list[_BadLine] = field(default_factory=list)
    event_names: set[str] = field(default_factory=set)
    session_present: int = 0
    session_ints: int = 0
    ts_numeric: int = 0
    ts_iso: int = 0
    ts_ms_like: int = 0  # numeric timestamps of magnitude >= MS_THRESHOLD
    ts_s_like: int = 0  # the others
    schema: pa.Schema | None = None

    def modes(self, mapping: IngestMapping) -> _Modes:
        """The timestamp unit and session-id mode, ``auto`` resolved over the whole file:
        numbers are read in the unit most of them look like (``UnitMix``); when both kinds
        occur, ``ts_mix`` makes the values of the other kind bad lines."""
        unit = mapping.ts_unit
        mix = None
        if unit == "auto":
            unit = "iso" if self.ts_iso > self.ts_numeric else "number"
        if unit == "number":
            mix = UnitMix(ms=self.ts_ms_like, s=self.ts_s_like)
            unit = mix.unit
        session = mapping.session_ids
        if session == "auto":
            session = "int" if self.session_ints == self.session_present else "hash"
        return _Modes(ts_unit=unit, session_ids=session, ts_mix=mix)


def _roles(mapping: IngestMapping) -> dict[str, str]:
    """Role -> input column: the core roles (session, ts, and those mapped of item, event,
    request), then the mapped features' ``KIND:COLUMN`` roles (kinds: ``_FEATURE_KINDS``)."""
    names = {"session": mapping.session, "ts": mapping.ts}
    names.update({role: getattr(mapping, role) for role in _CORE[2:] if getattr(mapping, role)})
    for prefix, columns in (
        ("label", mapping.labels),
        ("dense", mapping.dense),
        ("sparse", mapping.sparse),
        ("list", mapping.sparse_lists),
        ("hist", mapping.history_columns),
        ("cand", [mapping.candidates] if mapping.candidates else []),
        ("cdense", mapping.candidate_dense),
        ("csparse", mapping.candidate_sparse),
        ("clabel", mapping.candidate_labels),
        ("clicked", [mapping.clicked] if mapping.clicked else []),
    ):
        names.update({f"{prefix}:{c}": c for c in columns})
    return names


def _read_into_buckets(
    path: Path,
    fmt: str,
    mapping: IngestMapping,
    spill: _Spill,
    *,
    plan: _Plan,
    delimiter: str,
    max_line_bytes: int,
    first_only: bool,
    show_progress: bool,
) -> _ReadResult:
    """Pass 1: read the input chunk by chunk; spill each chunk's rows to their buckets."""
    names = _roles(mapping)
    result = _ReadResult()
    bar = (
        progress_bar(desc="ingest: read", total=plan.file_bytes, unit="B")
        if show_progress
        else tqdm(disable=True)
    )
    with bar:
        if fmt == "parquet":
            chunks = _iter_parquet(path, names, mapping, plan, result)
        else:
            chunks = _iter_text(
                path,
                fmt,
                names,
                plan,
                result,
                delimiter,
                max_line_bytes,
                first_only,
                mapping.list_separator,
            )
        for text, size in chunks:
            _spill_chunk(text, names, mapping, spill, result)
            bar.update(size)
    return result


def _iter_text(
    path: Path,
    fmt: str,
    names: dict[str, str],
    plan: _Plan,
    result: _ReadResult,
    delimiter: str,
    max_line_bytes: int,
    first_only: bool,
    separator: str,
) -> Iterator[tuple[_TextColumns, int]]:
    """CSV / JSON Lines: the text columns of each chunk of whole lines (a CSV chunk after the
    first gets the header line in front, numbered as in the file)."""
    header: tuple[bytes, int] | None = None
    for data, before, size in _iter_line_chunks(path, plan.chunk_bytes, max_line_bytes):
        result.bytes_read += len(data)
        lines = _Lines(data)
        lines.numbers = lines.numbers + before
        if lines.blank().all():
            yield _no_text(), size
            continue
        result.content = True
        if fmt == "csv" and header is not None:
            lines = _Lines(header[0] + b"\n" + data)
            lines.numbers = np.concatenate(
                [[header[1]], before + np.arange(1, len(lines), dtype=np.int64)]
            )
        elif fmt == "csv":
            index = int(np.flatnonzero(~lines.empty())[0])
            header = (lines.raw(index), int(lines.numbers[index]))
        text, rejected = _read_text(
            path, lines, fmt, names, delimiter, max_line_bytes, first_only, separator
        )
        result.rows_in += text.rows_in + len(rejected)
        result.bad.extend(rejected)
        yield text, size
        if first_only and rejected:
            return  # the old whole-file read dropped every line after the first rejected one


def _iter_line_chunks(
    path: Path, chunk_bytes: int, max_line_bytes: int
) -> Iterator[tuple[bytes, int, int]]:
    """(bytes of whole lines, lines before them, input bytes they cover) of ``path``, about
    ``chunk_bytes`` at a time; a leading UTF-8 BOM is dropped. A line with no line break
    within ``LINE_CAP_LINES`` line limits (and the chunk size) is refused: the input is not
    line-oriented text."""
    cap = max(chunk_bytes, LINE_CAP_LINES * max_line_bytes)
    pending = b""
    before = 0
    first = True
    with path.open("rb") as f:
        while True:
            block = f.read(chunk_bytes)
            size = len(block)
            if first:
                first = False
                if block.startswith(_UTF8_BOM):
                    block = block[len(_UTF8_BOM) :]
            if not block:
                if pending:
                    yield pending, before, 0
                return
            data = pending + block if pending else block
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(data) > cap:
                    raise SchemaError(
                        f"{path}: line {before + 1}: no line break in {len(data):,} bytes (over "
                        f"{LINE_CAP_LINES} x --max-line-bytes): not a line-oriented text file?"
                    )
                pending = data
                continue
            chunk, pending = data[: cut + 1], data[cut + 1 :]
            yield chunk, before, size
            before += chunk.count(b"\n")


def _iter_parquet(
    path: Path,
    names: dict[str, str],
    mapping: IngestMapping,
    plan: _Plan,
    result: _ReadResult,
) -> Iterator[tuple[_TextColumns, int]]:
    """Parquet: record batches of about ``plan.chunk_bytes`` decoded bytes, as text columns;
    a row's "line" is its 1-based row number."""
    try:
        source = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SchemaError(f"{path}: cannot read as Parquet: {exc}") from exc
    columns = source.schema_arrow.names
    missing = [c for c in dict.fromkeys(names.values()) if c not in columns]
    if missing:
        raise SchemaError(
            f"{path}: no column {', '.join(repr(c) for c in missing)} "
            f"(columns: {', '.join(shorten(c) for c in columns[:50])}); "
            "set the column names with --*-col or the mapping"
        )
    meta = source.metadata
    row_bytes = max(1, meta.serialized_size // max(1, meta.num_rows)) if meta.num_rows else 1
    if meta.num_rows and meta.num_row_groups:
        total = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        row_bytes = max(1, total // meta.num_rows)
    batch_rows = max(1024, plan.chunk_bytes // (4 * row_bytes))
    line = 0
    for batch in source.iter_batches(
        batch_size=batch_rows, columns=list(dict.fromkeys(names.values()))
    ):
        table = pa.Table.from_batches([batch])
        numbers = np.arange(line + 1, line + 1 + batch.num_rows, dtype=np.int64)
        line += batch.num_rows
        text, bad, flagged = _json_columns_as_text(table, names, numbers, mapping.list_separator)
        result.rows_in += batch.num_rows
        result.bytes_read += batch.nbytes
        result.content = True
        yield (
            _TextColumns(
                lines=numbers, columns=text, malformed=bad, rows_in=batch.num_rows, flagged=flagged
            ),
            int(plan.file_bytes * batch.num_rows / max(1, meta.num_rows)),
        )


def _spill_chunk(
    text: _TextColumns,
    names: dict[str, str],
    mapping: IngestMapping,
    spill: _Spill,
    result: _ReadResult,
) -> None:
    """Trim the core columns, count for the auto modes, parse the mapped features (their bad
    values are kept for pass 2 to report when the core fields are good), spill by bucket."""
    result.bad.extend(text.malformed)
    n = len(text.lines)
    if n == 0:
        return
    trimmed = {
        role: pc.utf8_trim_whitespace(text.columns[role])
        if role in names
        else pa.nulls(n, pa.string())
        for role in _CORE
    }
    trimmed["event"] = pc.utf8_lower(trimmed["event"])
    _count_modes(trimmed, mapping, result)
    parsed = _parse_features(text.columns, trimmed, names, mapping)
    result.event_names.update(name for name in pc.unique(trimmed["event"]).to_pylist() if name)
    flagged = text.flagged if text.flagged is not None else np.zeros(n, dtype=bool)
    columns = {
        "line": pa.array(text.lines.astype(np.int64)),
        "flagged": pa.array(flagged),
        "history_only": pa.array(parsed.history_only),
        "bad_field": pa.array(parsed.bad_field, pa.string()),
        "bad_problem": pa.array(parsed.bad_problem, pa.string()),
        **{role: trimmed[role].cast(pa.string()) for role in _CORE},
        **parsed.columns,
    }
    batch = pa.RecordBatch.from_pydict(columns)
    if result.schema is None:
        result.schema = batch.schema
    spill.write(batch, _bucket_of(trimmed["session"], spill.buckets))


def _count_modes(trimmed: dict[str, pa.Array], mapping: IngestMapping, result: _ReadResult) -> None:
    """Add this chunk's counts that resolve ``ts_unit`` / ``session_ids`` ``auto``."""
    if mapping.session_ids == "auto":
        present = ~is_missing(trimmed["session"])
        result.session_present += int(present.sum())
        result.session_ints += int((matches(trimmed["session"], INT_RE) & present).sum())
    if mapping.ts_unit == "auto":
        values = trimmed["ts"]
        present = ~is_missing(values)
        numeric = matches(values, NUMBER_RE) & present
        result.ts_numeric += int(numeric.sum())
        result.ts_iso += int((matches(values, ISO_RE) & present).sum())
        cast, ok = cast_where(values, numeric, pa.float64())
        number = np.asarray(pc.fill_null(cast, 0.0).to_numpy(zero_copy_only=False))
        ms_like = int((ok & (np.abs(number) >= MS_THRESHOLD)).sum())
        result.ts_ms_like += ms_like
        result.ts_s_like += int(ok.sum()) - ms_like


def _bucket_of(session: pa.Array, buckets: int) -> np.ndarray:
    """(N,) bucket of each row: a hash of the session id, the same for every spelling of one
    integer (``007`` and ``7``), so that a session never spans two buckets in either mode."""
    if buckets == 1:
        return np.zeros(len(session), dtype=np.int64)
    cast, ok = cast_where(session, matches(session, INT_RE), pa.int64())
    canonical = pc.if_else(pa.array(ok), pc.cast(cast, pa.string()), session)
    return hash_strings(pc.fill_null(canonical, "")) % buckets


# ----------------------------------------------------------------------------- features


@dataclass(slots=True)
class _Features:
    """The mapped feature columns of one chunk (N rows), parsed, and its rows' first bad
    feature (None where all are good)."""

    columns: dict[str, pa.Array]  # role -> (N,) typed column (see _parse_features)
    history_only: np.ndarray  # (N,) bool: the row is an event for histories only, no sample
    bad_field: list[str | None]
    bad_problem: list[str | None]

    def fail(self, rows: np.ndarray, column: str, problem: Callable[[int], str]) -> None:
        """Record ``problem(row)`` for ``column`` on each of ``rows`` (indices) that has no
        bad feature yet."""
        for i in rows.tolist():
            if self.bad_field[i] is None:
                self.bad_field[i] = shorten(column)
                self.bad_problem[i] = problem(i)


def _parse_features(
    columns: dict[str, pa.Array],
    trimmed: dict[str, pa.Array],
    names: dict[str, str],
    mapping: IngestMapping,
) -> _Features:
    """Parse the mapped features of one chunk (N rows) and tell samples from history-only
    rows.

    Typed columns by role: ``label:`` / ``dense:`` float32; ``sparse:`` / ``list:`` /
    ``hist:`` / ``cand:`` / ``csparse:`` list<int64>; ``cdense:`` / ``clabel:`` list<float32>;
    ``clicked:`` int64 (-1: no click). History-only rows (an event log's kept itemless events;
    an impression log's interaction events: no candidates, or no request key) are no samples:
    their features are not checked. A request's parallel lists must have one value per
    candidate and its clicked item must be one of them.
    """
    n = len(trimmed["session"])
    out = _Features(
        columns={},
        history_only=np.zeros(n, dtype=bool),
        bad_field=[None] * n,
        bad_problem=[None] * n,
    )
    no_item = is_missing(trimmed["item"])
    lengths = np.zeros(n, dtype=np.int64)  # candidates of each row (request form)
    cand_role = f"cand:{mapping.candidates}"
    if mapping.candidates:
        cand_text = pc.utf8_trim_whitespace(columns[cand_role])
        cand = parse_ids(cand_text, True, mapping.list_separator)
        out.columns[cand_role] = cand.values
        lengths = np.asarray(pc.list_value_length(cand.values).to_numpy(zero_copy_only=False))
        if mapping.item:  # a row without candidates is an interaction event
            out.history_only = lengths == 0
        else:  # every row must be a request
            out.fail(
                np.flatnonzero(lengths == 0),
                mapping.candidates,
                lambda i: "empty candidate list (with no mapping.item every row is a request)",
            )
    elif mapping.request:
        out.history_only = is_missing(trimmed["request"])
    elif mapping.keep_itemless:
        out.history_only = no_item
    if mapping.candidates and mapping.item and not mapping.keep_itemless:
        out.fail(
            np.flatnonzero((lengths == 0) & no_item),
            mapping.candidates,
            lambda i: (
                f"empty candidate list and no {mapping.item}: neither a request nor an "
                "interaction event"
            ),
        )
    row_bad = out.history_only | np.array([f is not None for f in out.bad_field], dtype=bool)
    if mapping.candidates:
        out.fail(
            np.flatnonzero(cand.failed & ~row_bad),
            mapping.candidates,
            lambda i: cand.problem(cand_text[i].as_py()),
        )
        row_bad |= cand.failed
    clicked: np.ndarray | None = None
    for role, col in names.items():
        kind = role.split(":", 1)[0]
        if kind not in _FEATURE_KINDS or role == cand_role:
            continue
        values = pc.utf8_trim_whitespace(columns[role])
        if kind in ("label", "dense"):
            parsed = parse_number(values, kind, mapping.missing_dense if kind == "dense" else None)
            out.columns[role] = pa.array(parsed.values, pa.float32())
        elif kind in ("cdense", "clabel"):
            number_kind = "label" if kind == "clabel" else "dense"
            parsed = parse_number_lists(values, number_kind, mapping.list_separator)
            out.columns[role] = parsed.values
        elif kind == "clicked":
            parsed = parse_ids(values, False, mapping.list_separator)
            got = np.asarray(pc.list_value_length(parsed.values).to_numpy(zero_copy_only=False))
            flat = np.asarray(pc.list_flatten(parsed.values).to_numpy(zero_copy_only=False))
            clicked = np.full(n, -1, dtype=np.int64)
            clicked[got > 0] = flat
            out.columns[role] = pa.array(clicked)
            parsed.failed &= ~is_missing(values)  # no click is no error
        else:
            parsed = parse_ids(values, kind not in ("sparse",), mapping.list_separator)
            out.columns[role] = parsed.values
        for i in np.flatnonzero(parsed.failed & ~row_bad).tolist():
            raw = values[i].as_py()
            out.bad_field[i] = shorten(col)
            out.bad_problem[i] = "missing value" if raw in (None, "") else parsed.problem(raw)
        row_bad |= parsed.failed
        if kind in ("cdense", "csparse", "clabel"):
            got = np.asarray(pc.list_value_length(out.columns[role]).to_numpy(zero_copy_only=False))
            wrong = np.flatnonzero((got != lengths) & ~row_bad)
            out.fail(wrong, col, _parallel_problem(got, lengths, mapping.candidates))
            row_bad[wrong] = True
    if clicked is not None:
        cand_values = out.columns[f"cand:{mapping.candidates}"]
        hits = _clicked_hits(cand_values, clicked)
        missed = np.flatnonzero((clicked >= 0) & (hits == 0) & ~row_bad)
        out.fail(
            missed,
            mapping.clicked,
            lambda i: (
                f"clicked item {clicked[i]} is not among the row's {lengths[i]} "
                f"candidates ({mapping.candidates})"
            ),
        )
    return out


_FEATURE_KINDS = ("label", "dense", "sparse", *_LIST_KINDS, "clicked")


def _parallel_problem(got: np.ndarray, want: np.ndarray, candidates: str) -> Callable[[int], str]:
    """The problem of row i of a parallel list with ``got[i]`` values for ``want[i]``
    candidates."""

    def problem(i: int) -> str:
        return (
            f"{got[i]} values for {want[i]} candidates: a list parallel to {candidates} has one "
            "value per candidate"
        )

    return problem


def _clicked_hits(candidates: pa.Array, clicked: np.ndarray) -> np.ndarray:
    """(N,) int64: how many of each row's candidates equal its clicked item (-1: none)."""
    lengths = np.asarray(pc.list_value_length(candidates).to_numpy(zero_copy_only=False))
    flat = np.asarray(pc.list_flatten(candidates).to_numpy(zero_copy_only=False))
    row = np.repeat(np.arange(len(clicked)), lengths)
    return np.bincount(row[flat == clicked[row]], minlength=len(clicked))


# ----------------------------------------------------------------------------- pass 2


@dataclass(slots=True)
class _Done:
    """Pass 2 over every bucket: bad lines, good event types, statistics, samples."""

    bad: list[_BadLine]
    event_names: set[str]
    stats: SampleStats
    batches: Callable[[], Iterator[pa.RecordBatch]]


def _samples_per_bucket(
    spill: _Spill,
    mapping: IngestMapping,
    modes: _Modes,
    provisional: list[str],
    plan: _Plan,
    spill_schema: pa.Schema | None,
    request_id_base: int,
) -> _Done:
    """Pass 2: per bucket, parse, order the sessions, cut the histories; one bucket's samples
    stay in memory, several buckets' go to sorted files that are merged on output."""
    schema = _output_schema(mapping)
    event_id = {name: i + 1 for i, name in enumerate(provisional)}
    bad: list[_BadLine] = []
    names: set[str] = set()
    stats = SampleStats()
    kept: BucketSamples | None = None
    sorted_paths: list[Path] = []
    for bucket in range(plan.buckets):
        table = spill.read(bucket, spill_schema)
        events, bucket_bad, bucket_names = _parse_bucket(
            table, mapping, modes, event_id, request_id_base
        )
        del table
        bad.extend(bucket_bad)
        names |= bucket_names
        samples = BucketSamples(events, mapping)
        stats.add(samples.stats(measure_zipf=bucket == 0))
        if plan.buckets == 1:
            kept = samples
        elif len(samples):
            target = spill.root / f"samples-{bucket:04d}.arrow"
            write_sorted(
                target,
                samples.batches(schema, batch_rows=plan.batch_rows),
                schema,
            )
            sorted_paths.append(target)

    def batches() -> Iterator[pa.RecordBatch]:
        if kept is not None:
            yield from kept.batches(schema, batch_rows=plan.batch_rows)
        else:
            yield from merge_files(
                sorted_paths, scratch=spill.root, batch_rows=plan.batch_rows, schema=schema
            )

    return _Done(bad=bad, event_names=names, stats=stats, batches=batches)


def _output_schema(mapping: IngestMapping) -> pa.Schema:
    """The sample schema (no metadata) of this mapping: what the catalogue will describe."""
    stats = SampleStats()
    return build_catalogue(stats, mapping, event_types=0).arrow_schema().remove_metadata()


def _parse_bucket(
    table: pa.Table,
    mapping: IngestMapping,
    modes: _Modes,
    event_id: dict[str, int],
    request_id_base: int,
) -> tuple[BucketEvents, list[_BadLine], set[str]]:
    """Parse the core columns of a bucket with the resolved modes; report each bad line's first
    bad field (core fields first, then the mapped features pass 1 checked, then a request key
    shared by two sessions); build the good rows' events and samples."""
    n = table.num_rows
    if n == 0:
        return empty_events(mapping), [], set()
    col = {name: table.column(name).combine_chunks() for name in table.column_names}
    lines = np.asarray(col["line"].to_numpy(), dtype=np.int64)
    history_only = np.asarray(col["history_only"].to_numpy(zero_copy_only=False), dtype=bool)
    no_item = is_missing(col["item"])
    kept_itemless = history_only & no_item & mapping.keep_itemless
    session, _ = parse_session(col["session"], modes.session_ids)
    if mapping.ts_unit == "auto" and modes.ts_unit in ("ms", "s"):
        ts, _ = parse_ts(col["ts"], "number", number_unit=modes.ts_unit, mix=modes.ts_mix)
    else:
        ts, _ = parse_ts(col["ts"], modes.ts_unit)
    parsed = {"session": session, "ts": ts, "item": parse_item(col["item"])}
    # when a present value is required: items not on request rows of a per-request log (those
    # pass 1 checked), not on kept itemless rows
    required = {
        "session": np.ones(n, dtype=bool),
        "ts": np.ones(n, dtype=bool),
        "item": np.zeros(n, dtype=bool) if mapping.candidates else ~kept_itemless,
        "event": np.ones(n, dtype=bool),
    }
    names = _roles(mapping)
    bad: list[_BadLine] = []
    row_bad = np.asarray(col["flagged"].to_numpy(zero_copy_only=False), dtype=bool).copy()
    for role in [r for r in ("session", "ts", "item", "event") if r in names]:
        # report the first failing field of each line
        missing = is_missing(col[role])
        failed = parsed[role].failed & ~missing if role in parsed else np.zeros(n, dtype=bool)
        for mask, problem in (
            (missing & required[role], None),
            (failed, parsed[role].problem if role in parsed else None),
        ):
            for i in np.flatnonzero(mask & ~row_bad):
                raw = col[role][int(i)].as_py()
                message = "missing value" if problem is None else problem(raw)
                bad.append(_BadLine(int(lines[i]), names[role], message))
            row_bad |= mask
    feature_bad = np.asarray(col["bad_field"].is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    fields, problems = col["bad_field"].to_pylist(), col["bad_problem"].to_pylist()
    for j in np.flatnonzero(feature_bad & ~row_bad).tolist():
        bad.append(_BadLine(int(lines[j]), fields[j], problems[j]))
    row_bad |= feature_bad
    request_key = parse_request_keys(col["request"]) if mapping.request else None
    if request_key is not None and not mapping.candidates:
        keyed = np.flatnonzero(~row_bad & ~history_only)
        conflict = keyed[key_conflicts(session.values[keyed], request_key[keyed], lines[keyed])]
        for i in conflict.tolist():
            message = (
                f"request key {quote(col['request'][i].as_py())} is used by another session "
                "too: a request belongs to one session"
            )
            bad.append(_BadLine(int(lines[i]), names["request"], message))
        row_bad[conflict] = True
    good = np.flatnonzero(~row_bad)
    take = pa.array(good)
    encoded = pc.dictionary_encode(pc.fill_null(col["event"].take(take), ""))
    dictionary = encoded.dictionary.to_pylist()
    ids = np.array([event_id.get(s, 0) for s in dictionary], dtype=np.int64)[_indices(encoded)]
    positive = None
    if not mapping.label_columns:
        flags = np.isin(np.array(dictionary, dtype=object), mapping.positives)
        positive = flags[_indices(encoded)].astype(np.float32)
    item = np.asarray(parsed["item"].values)[good]
    itemless = kept_itemless[good]
    rows = GoodRows(
        lines=lines[good],
        session=np.asarray(session.values)[good],
        ts=np.asarray(ts.values)[good],
        item=np.where(itemless, mapping.itemless_item_id, item),
        has_item=~no_item[good] | itemless,
        event_ids=ids,
        positive=positive,
        history_only=history_only[good],
        request_key=None if request_key is None else request_key[good],
        columns={
            name: column.take(take)
            for name, column in col.items()
            if name.split(":", 1)[0] in _FEATURE_KINDS and ":" in name
        },
    )
    events = build_events(rows, mapping, request_id_base=request_id_base)
    return events, bad, {name for name in dictionary if name}


def _check_input(path: Path) -> None:
    """The event log must be one readable file."""
    if path.is_dir():
        suffixes = ", ".join(sorted(_SUFFIX_FORMATS))
        raise ConfigError(
            f"{path}: is a directory; recd logs ingest reads one event log file ({suffixes}) "
            "per run: give one file, or concatenate the directory's logs into one (CSV: one "
            "header line)"
        )
    if not path.exists():
        raise ConfigError(f"event log {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"event log {path} is not a regular file")


DELIMITER_NAMES = {"\\t": "\t", "tab": "\t"}
"""Spellings of a delimiter that the shell cannot pass as one character: ``\\t`` as typed
(``--delimiter '\\t'``) and the word ``tab`` (any case) are a tab."""


def resolve_delimiter(delimiter: str) -> str:
    """The CSV delimiter ``delimiter`` names: itself (one single-byte character), or a tab
    for ``\\t`` and ``tab``; ``ConfigError`` for anything else."""
    resolved = DELIMITER_NAMES.get(delimiter.lower(), delimiter)
    if len(resolved.encode()) != 1 or resolved in '\r\n"':
        raise ConfigError(
            "delimiter must be one single-byte character other than a quote or line break "
            f"(or \\t / tab for a tab), got {delimiter!r}"
        )
    return resolved


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
    on_bad_rows: str, delimiter: str, max_line_bytes: int, memory_budget_bytes: int
) -> None:
    if on_bad_rows not in BAD_ROW_POLICIES:
        raise ConfigError(
            f"on_bad_rows must be one of {', '.join(BAD_ROW_POLICIES)}, got {on_bad_rows!r}"
        )
    resolve_delimiter(delimiter)
    if max_line_bytes < 1:
        raise ConfigError(f"max_line_bytes must be >= 1, got {max_line_bytes}")
    if memory_budget_bytes < 16 * MIB:
        raise ConfigError(
            f"memory budget must be >= 16 MiB, got {memory_budget_bytes / MIB:.1f} MiB"
        )


def _no_events(path: Path, reason: str) -> NoEventsError:
    return NoEventsError(
        f"{path}: no events ({reason}); --allow-empty writes an empty output instead"
    )


# ----------------------------------------------------------------------------- reading


def _no_text() -> _TextColumns:
    return _TextColumns(
        lines=np.zeros(0, np.int64),
        columns={role: pa.array([], pa.string()) for role in _CORE[:2]},
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
    separator: str = "|",
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
    return _read_jsonl(path, readable, names, separator), rejected


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


def _read_jsonl(
    path: Path, lines: _Lines, names: dict[str, str], separator: str = "|"
) -> _TextColumns:
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
            columns, bad, flagged = _json_columns_as_text(table, names, line_numbers, separator)
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
    table: pa.Table, names: dict[str, str], line_numbers: np.ndarray, separator: str = "|"
) -> tuple[dict[str, pa.Array], list[_BadLine], np.ndarray]:
    """Each wanted field as strings (numbers, booleans, timestamps formatted); a list field of
    a list role (``_LIST_KINDS``: sparse lists, histories, candidates and their parallel
    lists) as its items joined by ``separator``.

    A field holding a JSON object or array (other than such a list) makes its line bad (first
    such field per line); returns the columns, those bad lines and the (N,) mask of rows they
    flag.
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
        if role.split(":", 1)[0] in _LIST_KINDS and _is_flat_list(typ):
            items = pc.cast(column, pa.list_(pa.string()))
            out[role] = pc.binary_join(items, separator)
        elif pa.types.is_nested(typ):
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


def _is_flat_list(typ: pa.DataType) -> bool:
    return (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and not pa.types.is_nested(
        typ.value_type
    )


def _json_problem(text: str, arrow_error: str) -> str:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"invalid JSON: {exc.msg} (column {exc.colno})"
    if not isinstance(value, dict):
        return f"not a JSON object (got {type(value).__name__})"
    return f"cannot read line: {arrow_error.removeprefix('JSON parse error: ')}"


# ----------------------------------------------------------------------------- writing


def _event_vocabulary(names: Iterable[str], given: Mapping[str, int] | None) -> dict[str, int]:
    """Ids of event types: ``given`` ones kept, new names appended in sorted order (ids >= 1)."""
    vocabulary = {str(k).strip().lower(): int(v) for k, v in (given or {}).items()}
    if any(v < 1 for v in vocabulary.values()) or len(set(vocabulary.values())) != len(vocabulary):
        raise ConfigError("event_vocabulary: ids must be distinct integers >= 1")
    next_id = max(vocabulary.values(), default=0) + 1
    for name in sorted(names):
        if name not in vocabulary:
            vocabulary[name] = next_id
            next_id += 1
    return vocabulary


def _indices(encoded: pa.DictionaryArray) -> np.ndarray:
    return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def _bad_line_texts(
    path: Path, fmt: str, bad: list[_BadLine], max_line_bytes: int
) -> dict[int, str]:
    """The text of each bad line (cut at ``max_line_bytes``, ending in "…"), read again from
    the input in chunks; none for Parquet, whose rows are no lines."""
    wanted = np.unique(np.array([b.line for b in bad if b.line >= 1], dtype=np.int64))
    texts: dict[int, str] = {}
    if fmt == "parquet" or wanted.size == 0:
        return texts
    for data, before, _ in _iter_line_chunks(path, MIN_CHUNK_BYTES, max_line_bytes):
        lines = _Lines(data)
        lo, hi = np.searchsorted(wanted, [before + 1, before + len(lines) + 1])
        for number in wanted[lo:hi].tolist():
            texts[number] = lines.text(number - before - 1, max_line_bytes)
        if hi == wanted.size:
            break
    return texts


def _write_quarantine(
    target: Path, source: Path, bad: Iterable[_BadLine], texts: dict[int, str]
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
                "text": texts.get(b.line),
            }
            f.write(json.dumps(record) + "\n")
