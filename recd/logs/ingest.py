"""``recd logs ingest``: a real event log (CSV, JSON Lines or Parquet) -> a raw-log directory of
the recd sample schema (catalogue ``ingest``).

``ingest_events`` checks the options, reads the input in two passes whose memory is bounded by
``memory_budget_bytes`` rather than by the file, and replaces ``OUT`` atomically with the
samples, ``_ingest.json`` (``IngestReport``) and, when quarantining, ``_quarantine.jsonl``.
docs/own-data.md has the input rules, the output schema, bad-line handling and the memory
bound. The steps live in modules of their own:

    ingest_mapping     which columns are read and what each becomes (``IngestMapping``)
    ingest_spill       the read plan (chunk size, buckets) and the per-bucket spill files
    ingest_read        pass 1: chunks -> checked rows, spilled by a hash of the session id
    ingest_decode      a CSV / JSON Lines chunk: lines no reader may see set aside first
    ingest_csv, ingest_jsonl, ingest_parquet   the readers, each format -> text columns
    ingest_text        what the readers share: roles, lines, text columns, bad lines
    ingest_values      text columns -> typed columns (timestamps, ids, numbers)
    ingest_features    the mapped feature columns of a chunk, parsed and checked
    ingest_bucket      pass 2: per bucket, parse, order the sessions, cut the histories
    ingest_requests    the events and samples of the two impression-log shapes
    ingest_samples     a bucket's samples, the statistics, the catalogue
    ingest_merge       the buckets' sorted samples merged into one arrival-order stream
    ingest_warnings    what the samples written are warned about (or refused for)
    ingest_quarantine  the bad lines written to ``_quarantine.jsonl``
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recd.durable import replace_dir_atomically
from recd.errors import BadLineError, ConfigError, NoEventsError
from recd.logs import rawlog
from recd.logs.ingest_bucket import samples_per_bucket
from recd.logs.ingest_mapping import HISTORY_SPARSE, LABEL, IngestMapping
from recd.logs.ingest_quarantine import bad_line_texts, write_quarantine
from recd.logs.ingest_read import ReadResult, read_into_buckets
from recd.logs.ingest_samples import SampleStats, build_catalogue, remap_values
from recd.logs.ingest_spill import Spill, make_plan
from recd.logs.ingest_text import BadLine
from recd.logs.ingest_warnings import constant_label_warnings, early_dates, partition_hint

__all__ = [
    "BAD_ROW_POLICIES",
    "DEFAULT_MEMORY_BUDGET_BYTES",
    "FORMATS",
    "INGEST_FILE",
    "MAX_LINE_BYTES",
    "QUARANTINE_FILE",
    "IngestReport",
    "ingest_events",
    "memory_bound_bytes",
    "read_ingest_info",
    "resolve_delimiter",
]

log = logging.getLogger(__name__)

FORMATS = ("csv", "jsonl", "parquet")
BAD_ROW_POLICIES = ("fail", "quarantine")
QUARANTINE_FILE = "_quarantine.jsonl"
INGEST_FILE = "_ingest.json"
LABEL_DEFINITION = "label = 1 if the event type is one of positive_events, else 0"
LABEL_COLUMNS_DEFINITION = "labels = the label columns (numbers; true/false = 1/0)"
LABEL_CLICKED_DEFINITION = "label = 1 on the candidate equal to the clicked item, else 0"
MIB = 1 << 20
DEFAULT_MEMORY_BUDGET_BYTES = 512 * MIB
FIXED_OVERHEAD_BYTES = 192 * MIB  # on top of the budget: imports done lazily, Arrow pools, slack
MAX_LINE_BYTES = 1 << 20  # default bound on one input line (and so on any value in it)
_SUFFIX_FORMATS = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}


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

    docs/own-data.md has the input rules, the output schema, the labels, bad-line handling and
    the memory bound. ``mapping`` names the columns and features; the older keyword options
    (``session_col`` ... ``session_ids``) build one when it is not given (giving both is an
    error). ``request_id_base`` is added to every request id that is a line (row) number.
    ``out_dir`` is replaced atomically, and only when there are events to write: an
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
    plan = make_plan(path, memory_budget_bytes, max_line_bytes)
    with tempfile.TemporaryDirectory(
        prefix=f".{Path(out_dir).name}.ingest-", dir=_parent(out_dir)
    ) as scratch:
        spill = Spill(Path(scratch), plan.buckets)
        read = read_into_buckets(
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
        done = samples_per_bucket(
            spill, mapping, modes, provisional, plan, read.schema, request_id_base
        )
        bad = read.bad + done.bad
        if bad and on_bad_rows == "fail":
            first = min(bad, key=lambda b: b.line)
            raise BadLineError(str(path), first.line, first.field, first.problem)
        stats = done.stats
        if stats.samples == 0 and not allow_empty:
            raise _no_events(path, _why_no_events(read, bad, fmt, stats))
        early = early_dates(path, mapping, modes, stats)
        vocabulary = _event_vocabulary(done.event_names, event_vocabulary)
        lookup = np.array([0, *(vocabulary.get(name, 0) for name in provisional)], dtype=np.int64)
        catalogue = build_catalogue(stats, mapping, event_types=max(vocabulary.values(), default=0))
        warnings = constant_label_warnings(stats, mapping) + early
        if partition_by != "day":
            warnings += partition_hint(stats)
        with replace_dir_atomically(out_dir) as tmp:
            with rawlog.RawLogWriter(tmp, catalogue) as writer:
                for batch in done.batches():
                    if HISTORY_SPARSE[1] in mapping.hist_sparse:
                        batch = remap_values(batch, HISTORY_SPARSE[1], lookup)
                    writer.write(batch)
            quarantine_path = None
            if bad:
                texts = bad_line_texts(path, fmt, bad, max_line_bytes)
                write_quarantine(tmp / QUARANTINE_FILE, path, bad, texts)
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


def _why_no_events(read: ReadResult, bad: list[BadLine], fmt: str, stats: SampleStats) -> str:
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
