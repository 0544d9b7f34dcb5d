"""One stream's rows: read its units, check and normalise them, permute windows, cut batches.

The order (which units a stream reads, how windows are permuted) is ``recd.reader.order``'s.
This is the Arrow half of a reader (the "fill" of the paper's Figure 10: read + decompress +
decode); ``recd.reader.dataset`` converts each batch to tensors. Every column is checked
vectorised once per row group, so bad data fails with the file, row and column at fault.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recd.errors import BadRowError, SchemaError
from recd.logs.hashing import hash_strings
from recd.reader.config import Shuffle
from recd.reader.order import next_stream, window_order
from recd.reader.plan import ReadPlan, WorkUnit, locate
from recd.reader.stored_ops import split_preprocessing
from recd.schema import strict_type
from recd.tensors.jagged import SPARSE_TYPE
from recd.tensors.stacked import IDS, combine_stacked, stack_unit, take_rows

INT64_MAX = np.iinfo(np.int64).max
SESSION_KEY = "__recd_session"
"""The int64 session ids of a unit read for the ``session`` shuffle: its first column
(:func:`session_keys` of ``reader.session_column``), dropped once a window is permuted."""


@dataclass(slots=True)
class RowBatch:
    """One batch of rows in Arrow form, before conversion to tensors."""

    rows: pa.Table
    """The projected columns with canonical types (float32 labels/dense, list<int64> sparse):
    zero-copy slices of the row groups the batch spans, one chunk per row group (conversion
    to tensors copies every column once anyway, so the chunks are never combined here)."""
    fill_s: float
    """Seconds spent reading, decompressing, decoding and checking the rows of this batch."""
    read_bytes: int
    """Compressed bytes read from disk for this batch (row groups opened while filling it)."""
    process_s: float = 0.0
    """Seconds of sparse preprocessing run on the stored ids of the units opened while filling
    it (the dedup layout's features: ``recd.reader.stored_ops``), not counted in ``fill_s``."""
    buffer_rows: int = 0
    """Rows the stream held in memory while filling it: the shuffle window and the row group
    kept for the next window, or the row groups the batch spans."""


class UnitReader:
    """Reads units of one plan, keeping the last opened file (its footer is parsed once) and
    the last unit read (a shuffle window ending inside it continues there)."""

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan
        self._path: str | None = None
        self._file: pq.ParquetFile | None = None
        self._stored_ops = split_preprocessing(plan.config.preprocessing, plan.encoded)[0]
        stacked = set(plan.stacked)
        self._plain = {f for f in plan.encoded if f not in stacked}
        """Encoded features read as plain KJT rows: gathered once per unit."""
        self.process_s = 0.0
        """Seconds spent so far preprocessing stored ids (``recd.reader.stored_ops``)."""
        self._last: tuple[int, pa.Table] | None = None
        self._session = plan.session_column
        self._key_only = self._session not in {*plan.labels, *plan.dense, *plan.sparse}
        """Whether the session column is read for the shuffle alone (no feature)."""

    def read_cached(self, unit: WorkUnit) -> tuple[pa.Table, bool]:
        """:meth:`read`, or the table of the last unit read if it is ``unit``; and whether it
        was read now."""
        if self._last is not None and self._last[0] == unit.index:
            return self._last[1], False
        table = self.read(unit)
        self._last = (unit.index, table)
        return table, True

    @property
    def cached_rows(self) -> int:
        """Rows of the unit kept by :meth:`read_cached`."""
        return 0 if self._last is None else self._last[1].num_rows

    def read(self, unit: WorkUnit) -> pa.Table:
        """The unit's rows: projected, checked, canonical types; the plan's stacked features
        in their in-memory dedup form (``recd.table.layout``), its other encoded features as plain
        rows, the sparse preprocessing of both applied to the stored ids. The batch columns
        (``plan.batch_columns``), after the session ids (``SESSION_KEY``) for the ``session``
        shuffle."""
        table = self._read_raw(unit)
        keys = None
        if self._session is not None:
            keys = session_keys(table.column(self._session), self._session, unit)
            if self._key_only:
                table = table.drop_columns([self._session])
        table = normalise_table(table, unit, self.plan)
        seconds: list[float] = []
        if self.plan.encoded:  # plain units too: a mixed table's batches have one form
            table = stack_unit(
                table,
                self.plan.encoded,
                unit.layout.singles,
                groups=unit.groups,
                path=unit.path,
                first_row=unit.first_row,
                ops=self._stored_ops,
                ops_seconds=seconds,
                plain=self._plain,
            )
            self.process_s += sum(seconds)
        table = table.select(self.plan.batch_columns)
        return table if keys is None else table.add_column(0, SESSION_KEY, keys)

    def _read_raw(self, unit: WorkUnit) -> pa.Table:
        columns = self.plan.columns
        if unit.encoded:
            columns = unit.layout.physical_columns(columns)
        try:
            if self._path != unit.path or self._file is None:
                self._file = pq.ParquetFile(unit.path)
                self._path = unit.path
            return self._file.read_row_group(unit.row_group, columns=columns)
        except (OSError, pa.ArrowException) as exc:
            raise SchemaError(
                f"{unit.path}: row group {unit.row_group}: cannot read: {exc}"
            ) from exc


def normalise_table(table: pa.Table, unit: WorkUnit, plan: ReadPlan) -> pa.Table:
    """Check every projected column of one row group and cast it to its canonical type.

    Raises BadRowError naming the file, row (inside the file) and column for a null value, a
    null list, a null id inside a list, or an id outside int64. Clean columns of canonical
    type (the common case) pass through untouched: their null counts are read from the Arrow
    metadata, so a row group costs a few attribute reads per column, not a compute kernel.
    """
    sparse = set(plan.sparse)
    stored = set(unit.layout.physical_columns(unit.encoded))
    columns = []
    # Tables written by recd's ETL have no nullable field (Catalogue.table_schema): their
    # columns hold no null and are viewed, zero-copy, as the canonical nullable types, so
    # that row groups of older tables and newer ones concatenate.
    changed = not all(f.nullable for f in table.schema)
    for name, col in zip(table.column_names, table.columns, strict=True):
        if name in stored:  # the dedup layout's columns: checked by layout_read.stack_unit
            out = col
        elif name in sparse:
            if col.type.equals(_STRICT_SPARSE_TYPE):
                out = pa.chunked_array(
                    [chunk.view(SPARSE_TYPE) for chunk in col.chunks], type=SPARSE_TYPE
                )
            elif _is_clean_sparse(col):
                out = col
            else:
                out = _normalise_sparse(col, name, unit)
        else:
            _check_no_nulls(col, name, unit, what="null value")
            out = col if col.type.equals(pa.float32()) else col.cast(pa.float32())
        changed = changed or out is not col
        columns.append(out)
    return pa.table(columns, names=table.column_names) if changed else table


_STRICT_SPARSE_TYPE = strict_type(SPARSE_TYPE)
"""How a sparse column of a table written by recd's ETL reads back (no null list or id)."""


def _is_clean_sparse(col: pa.ChunkedArray) -> bool:
    """list<int64> without a null list or a null id. The ids are checked on each chunk's whole
    child array: a null outside a sliced chunk's range only sends the column to the exact
    (slower) check, which then finds nothing."""
    return (
        col.type.equals(SPARSE_TYPE)
        and col.null_count == 0
        and all(chunk.values.null_count == 0 for chunk in col.chunks)
    )


def _normalise_sparse(col: pa.ChunkedArray, name: str, unit: WorkUnit) -> pa.ChunkedArray:
    scalar = pa.types.is_integer(col.type)  # one id per row (a plain table's item id column)
    what = "null id" if scalar else "null list (expected a list of int64 ids, maybe empty)"
    _check_no_nulls(col, name, unit, what=what)
    if scalar:
        col = pa.chunked_array(
            [
                pa.ListArray.from_arrays(pa.array(np.arange(len(c) + 1, dtype=np.int32)), c)
                for c in col.chunks
            ],
            type=pa.list_(col.type),
        )
    chunks = []
    row0 = 0
    for chunk in col.chunks:
        values = chunk.flatten()
        if values.null_count:
            flat = int(pc.index(pc.is_null(values), True).as_py())
            row = int(pc.list_parent_indices(chunk)[flat].as_py())
            raise BadRowError(
                unit.path, unit.first_row + row0 + row, name, "null id inside the list"
            )
        if pa.types.is_unsigned_integer(values.type) and len(values):
            big = pc.greater(values, pa.scalar(INT64_MAX, values.type))
            if pc.any(big).as_py():
                flat = int(pc.index(big, True).as_py())
                row = int(pc.list_parent_indices(chunk)[flat].as_py())
                raise BadRowError(
                    unit.path,
                    unit.first_row + row0 + row,
                    name,
                    f"id {values[flat].as_py()} does not fit in int64",
                )
        chunks.append(chunk if chunk.type.equals(SPARSE_TYPE) else chunk.cast(SPARSE_TYPE))
        row0 += len(chunk)
    return pa.chunked_array(chunks, type=SPARSE_TYPE)


def session_keys(col: pa.ChunkedArray, name: str, unit: WorkUnit) -> pa.ChunkedArray:
    """The int64 session ids of a unit's session column (``reader.session_column``): integer
    ids as they are (an unsigned id above 2**63 - 1 wraps, which keeps equal ids equal and
    different ones different), string ids hashed to 63 bits as ``recd logs ingest`` hashes
    string session ids (``recd.logs.hashing.hash_strings``). BadRowError naming the file, row
    and column for a null id. A table written by ``recd etl`` (int64, no nulls) passes as it
    is, without a copy."""
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    _check_no_nulls(col, name, unit, what="null session id")
    if pa.types.is_integer(col.type):
        return col if col.type.equals(pa.int64()) else col.cast(pa.int64(), safe=False)
    return pa.chunked_array([pa.array(hash_strings(col), type=pa.int64())])


def _check_no_nulls(col: pa.ChunkedArray, name: str, unit: WorkUnit, *, what: str) -> None:
    if col.null_count:
        row = int(pc.index(pc.is_null(col), True).as_py())
        raise BadRowError(unit.path, unit.first_row + row, name, what)


@dataclass(slots=True)
class _Piece:
    """Consecutive rows of a stream (a unit, or a permuted window) and what reading them cost."""

    rows: pa.Table
    fill_s: float
    process_s: float
    read_bytes: int
    buffer_rows: int


def iter_stream_batches(
    plan: ReadPlan, *, epoch: int, stream: int, start_batch: int = 0
) -> Iterator[RowBatch]:
    """Batches of this rank's stream ``stream`` in ``epoch``, from batch ``start_batch`` on.

    Skipped batches are not read: the start row is mapped to (unit, offset) with the footer
    row counts (to its window, for ``rows`` and ``session``) and reading begins there.
    """
    units = plan.stream_units(epoch, stream)
    first_row = start_batch * plan.config.batch_size
    reader = UnitReader(plan)
    if plan.config.shuffle.windowed:
        pieces = _windows(plan, reader, units, epoch=epoch, stream=stream, first_row=first_row)
    else:
        pieces = _units(plan, reader, units, first_row=first_row)
    yield from _cut(pieces, plan.config.batch_size, drop_last=plan.config.drop_last)


def iter_rank_batches(plan: ReadPlan, *, epoch: int) -> Iterator[RowBatch]:
    """Every batch of this rank in ``epoch``, in the rank's order (one from each stream in
    turn): what the loader hands out, read in this process."""
    n = plan.config.streams
    totals = [plan.stream_num_batches(epoch, s) for s in range(n)]
    streams = [iter_stream_batches(plan, epoch=epoch, stream=s) for s in range(n)]
    counts = [0] * n
    while (s := next_stream(totals, counts)) is not None:
        counts[s] += 1
        yield next(streams[s])


def _units(
    plan: ReadPlan, reader: UnitReader, units: list[WorkUnit], *, first_row: int
) -> Iterator[_Piece]:
    """The stream's units in order, from ``first_row`` on."""
    pos = locate(units, first_row)
    for i in range(pos.unit, len(units)):
        t0 = time.perf_counter()
        before = reader.process_s
        table = reader.read(units[i]).select(plan.batch_columns)
        if i == pos.unit and pos.offset:
            table = table.slice(pos.offset)
        processed = reader.process_s - before
        fill_s = time.perf_counter() - t0 - processed
        yield _Piece(table, fill_s, processed, units[i].read_bytes, units[i].num_rows)


def _windows(
    plan: ReadPlan,
    reader: UnitReader,
    units: list[WorkUnit],
    *,
    epoch: int,
    stream: int,
    first_row: int,
) -> Iterator[_Piece]:
    """The stream's windows, each permuted (``recd.reader.order.window_order``), from
    ``first_row`` on."""
    config = plan.config
    size = config.window_rows
    total = sum(u.num_rows for u in units)
    window, offset = divmod(first_row, size)
    global_stream = config.global_stream_id(stream)
    while window * size < total:
        t0 = time.perf_counter()
        before = reader.process_s
        lo, hi = window * size, min((window + 1) * size, total)
        pos = locate(units, lo)
        parts, read_bytes, i, skip = [], 0, pos.unit, pos.offset
        need = hi - lo
        while need:
            table, fresh = reader.read_cached(units[i])
            read_bytes += units[i].read_bytes if fresh else 0
            part = table.slice(skip, need)
            parts.append(part)
            need -= part.num_rows
            i, skip = i + 1, 0
        buffer_rows = (hi - lo) + reader.cached_rows
        rows = _concat(parts)
        if IDS in rows.column_names:
            rows = combine_stacked(rows)
        ids = rows.column(SESSION_KEY).to_numpy() if config.shuffle == Shuffle.SESSION else None
        order = window_order(
            config.shuffle,
            rows.num_rows,
            ids,
            seed=config.seed,
            epoch=epoch,
            stream=global_stream,
            window=window,
        )
        rows = take_rows(rows, pa.array(order)).select(plan.batch_columns)
        if offset:
            rows, offset = rows.slice(offset), 0
        processed = reader.process_s - before
        fill_s = time.perf_counter() - t0 - processed
        yield _Piece(rows, fill_s, processed, read_bytes, buffer_rows)
        window += 1


def _cut(pieces: Iterator[_Piece], size: int, *, drop_last: bool) -> Iterator[RowBatch]:
    """Batches of ``size`` rows cut from consecutive pieces; the last partial one unless
    ``drop_last``."""
    parts: list[pa.Table] = []
    pending = 0
    fill_s = process_s = 0.0
    read_bytes = buffer_rows = 0
    for piece in pieces:
        table = piece.rows
        fill_s += piece.fill_s
        process_s += piece.process_s
        read_bytes += piece.read_bytes
        buffer_rows = max(buffer_rows, piece.buffer_rows)
        while pending + table.num_rows >= size:
            take = size - pending
            parts.append(table.slice(0, take))
            table = table.slice(take)
            t0 = time.perf_counter()
            rows = _concat(parts)
            yield RowBatch(
                rows=rows,
                fill_s=fill_s + time.perf_counter() - t0,
                read_bytes=read_bytes,
                process_s=process_s,
                buffer_rows=buffer_rows,
            )
            parts, pending, fill_s, process_s, read_bytes = [], 0, 0.0, 0.0, 0
            buffer_rows = piece.buffer_rows
        if table.num_rows:
            parts.append(table)
            pending += table.num_rows
    if pending and not drop_last:
        t0 = time.perf_counter()
        rows = _concat(parts)
        yield RowBatch(
            rows=rows,
            fill_s=fill_s + time.perf_counter() - t0,
            read_bytes=read_bytes,
            process_s=process_s,
            buffer_rows=buffer_rows,
        )


def _concat(parts: list[pa.Table]) -> pa.Table:
    """One table of the given row-group slices, zero-copy (their chunks side by side)."""
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)
