"""One worker's stream of rows: read its units, check and normalise them, cut batches.

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
from recd.layout_read import stack_unit, take_rows
from recd.reader.config import Shuffle
from recd.reader.plan import ReadPlan, WorkUnit, locate, session_order
from recd.reader.stored_ops import split_preprocessing
from recd.schema import SESSION_ID, strict_type
from recd.tensors.jagged import SPARSE_TYPE

INT64_MAX = np.iinfo(np.int64).max


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


class UnitReader:
    """Reads units of one plan, keeping the last opened file (its footer is parsed once)."""

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

    def read(self, unit: WorkUnit, *, epoch: int) -> pa.Table:
        """The unit's rows: projected, checked, canonical types, sessions permuted if asked;
        the plan's stacked features in their in-memory dedup form (``recd.layout``), its
        other encoded features as plain rows, the sparse preprocessing of both applied to
        the stored ids."""
        table = self._read_raw(unit)
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
        if self.plan.config.shuffle == Shuffle.SESSION:
            ids = table.column(SESSION_ID).to_numpy()
            order = session_order(ids, seed=self.plan.config.seed, epoch=epoch, unit=unit.index)
            table = take_rows(table, pa.array(order))
        return table.select(self.plan.batch_columns)

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
            target = pa.int64() if name == SESSION_ID else pa.float32()
            out = col if col.type.equals(target) else col.cast(target)
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


def _check_no_nulls(col: pa.ChunkedArray, name: str, unit: WorkUnit, *, what: str) -> None:
    if col.null_count:
        row = int(pc.index(pc.is_null(col), True).as_py())
        raise BadRowError(unit.path, unit.first_row + row, name, what)


def iter_worker_batches(
    plan: ReadPlan, *, epoch: int, worker: int, start_batch: int = 0
) -> Iterator[RowBatch]:
    """Batches of local ``worker`` in ``epoch``, from batch ``start_batch`` on.

    Skipped batches are not read: the start row is mapped to (unit, offset) with the footer
    row counts and reading begins there.
    """
    config = plan.config
    size = config.batch_size
    units = plan.worker_units(epoch, worker)
    pos = locate(units, start_batch * size)
    reader = UnitReader(plan)
    parts: list[pa.Table] = []
    pending = 0
    fill_s = process_s = 0.0
    read_bytes = 0
    for i in range(pos.unit, len(units)):
        t0 = time.perf_counter()
        before = reader.process_s
        table = reader.read(units[i], epoch=epoch)
        if i == pos.unit and pos.offset:
            table = table.slice(pos.offset)
        processed = reader.process_s - before
        fill_s += time.perf_counter() - t0 - processed
        process_s += processed
        read_bytes += units[i].read_bytes
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
            )
            parts, pending, fill_s, process_s, read_bytes = [], 0, 0.0, 0.0, 0
        if table.num_rows:
            parts.append(table)
            pending += table.num_rows
    if pending and not config.drop_last:
        t0 = time.perf_counter()
        rows = _concat(parts)
        yield RowBatch(
            rows=rows,
            fill_s=fill_s + time.perf_counter() - t0,
            read_bytes=read_bytes,
            process_s=process_s,
        )


def _concat(parts: list[pa.Table]) -> pa.Table:
    """One table of the given row-group slices, zero-copy (their chunks side by side)."""
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)
