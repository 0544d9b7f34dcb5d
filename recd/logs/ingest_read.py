"""Pass 1 of ``recd logs ingest``: read the input chunk by chunk, check it, parse the mapped
features, count what the ``auto`` modes need, and spill each row to its session's bucket.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from recd.logs.hashing import hash_strings
from recd.logs.ingest_decode import read_text
from recd.logs.ingest_features import parse_features
from recd.logs.ingest_mapping import IngestMapping
from recd.logs.ingest_parquet import iter_parquet
from recd.logs.ingest_spill import Plan, Spill
from recd.logs.ingest_text import (
    CORE,
    BadLine,
    Lines,
    TextColumns,
    iter_line_chunks,
    no_text,
    roles,
)
from recd.logs.ingest_values import (
    INT_RE,
    ISO_RE,
    MS_THRESHOLD,
    NUMBER_RE,
    UnitMix,
    cast_where,
    is_missing,
    matches,
)
from recd.progress import progress_bar


@dataclass(slots=True)
class Modes:
    """The timestamp unit and session-id mode pass 2 parses with (``auto`` resolved)."""

    ts_unit: str
    session_ids: str
    ts_mix: UnitMix | None = None  # ts_unit auto on numbers: the log's counts of each kind


@dataclass(slots=True)
class ReadResult:
    """What the first pass saw: counts for the auto modes, event names, bad lines."""

    rows_in: int = 0
    bytes_read: int = 0
    content: bool = False  # a line that is not blank
    bad: list[BadLine] = field(default_factory=list)
    event_names: set[str] = field(default_factory=set)
    session_present: int = 0
    session_ints: int = 0
    ts_numeric: int = 0
    ts_iso: int = 0
    ts_ms_like: int = 0  # numeric timestamps of magnitude >= MS_THRESHOLD
    ts_s_like: int = 0  # the others
    schema: pa.Schema | None = None

    def modes(self, mapping: IngestMapping) -> Modes:
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
        return Modes(ts_unit=unit, session_ids=session, ts_mix=mix)


def read_into_buckets(
    path: Path,
    fmt: str,
    mapping: IngestMapping,
    spill: Spill,
    *,
    plan: Plan,
    delimiter: str,
    max_line_bytes: int,
    first_only: bool,
    show_progress: bool,
) -> ReadResult:
    """Pass 1: read the input chunk by chunk; spill each chunk's rows to their buckets."""
    names = roles(mapping)
    result = ReadResult()
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
    plan: Plan,
    result: ReadResult,
    delimiter: str,
    max_line_bytes: int,
    first_only: bool,
    separator: str,
) -> Iterator[tuple[TextColumns, int]]:
    """CSV / JSON Lines: the text columns of each chunk of whole lines (a CSV chunk after the
    first gets the header line in front, numbered as in the file)."""
    header: tuple[bytes, int] | None = None
    for data, before, size in iter_line_chunks(path, plan.chunk_bytes, max_line_bytes):
        result.bytes_read += len(data)
        lines = Lines(data)
        lines.numbers = lines.numbers + before
        if lines.blank().all():
            yield no_text(), size
            continue
        result.content = True
        if fmt == "csv" and header is not None:
            lines = Lines(header[0] + b"\n" + data)
            lines.numbers = np.concatenate(
                [[header[1]], before + np.arange(1, len(lines), dtype=np.int64)]
            )
        elif fmt == "csv":
            index = int(np.flatnonzero(~lines.empty())[0])
            header = (lines.raw(index), int(lines.numbers[index]))
        text, rejected = read_text(
            path, lines, fmt, names, delimiter, max_line_bytes, first_only, separator
        )
        result.rows_in += text.rows_in + len(rejected)
        result.bad.extend(rejected)
        yield text, size
        if first_only and rejected:
            return  # the input fails at its first bad line: nothing after it is read


def _iter_parquet(
    path: Path,
    names: dict[str, str],
    mapping: IngestMapping,
    plan: Plan,
    result: ReadResult,
) -> Iterator[tuple[TextColumns, int]]:
    """Parquet: the text columns of each record batch (``ingest_parquet``), counted."""
    for text, decoded_bytes, size in iter_parquet(
        path, names, mapping.list_separator, plan.chunk_bytes, plan.file_bytes
    ):
        result.rows_in += text.rows_in
        result.bytes_read += decoded_bytes
        result.content = True
        yield text, size


def _spill_chunk(
    text: TextColumns,
    names: dict[str, str],
    mapping: IngestMapping,
    spill: Spill,
    result: ReadResult,
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
        for role in CORE
    }
    trimmed["event"] = pc.utf8_lower(trimmed["event"])
    _count_modes(trimmed, mapping, result)
    parsed = parse_features(text.columns, trimmed, names, mapping)
    result.event_names.update(name for name in pc.unique(trimmed["event"]).to_pylist() if name)
    flagged = text.flagged if text.flagged is not None else np.zeros(n, dtype=bool)
    columns = {
        "line": pa.array(text.lines.astype(np.int64)),
        "flagged": pa.array(flagged),
        "history_only": pa.array(parsed.history_only),
        "bad_field": pa.array(parsed.bad_field, pa.string()),
        "bad_problem": pa.array(parsed.bad_problem, pa.string()),
        **{role: trimmed[role].cast(pa.string()) for role in CORE},
        **parsed.columns,
    }
    batch = pa.RecordBatch.from_pydict(columns)
    if result.schema is None:
        result.schema = batch.schema
    spill.write(batch, _bucket_of(trimmed["session"], spill.buckets))


def _count_modes(trimmed: dict[str, pa.Array], mapping: IngestMapping, result: ReadResult) -> None:
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
