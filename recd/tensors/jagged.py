"""Jagged columns and exact duplicate-row detection (numpy + Arrow's C++ kernels, no torch).

A ``list<int64>`` Arrow column is read zero-copy as its offsets (B + 1) and flat values
(:class:`JaggedColumn`). :func:`find_distinct_rows` finds exact duplicate rows anywhere in a
batch (A-B-A too, not only adjacent rows) over one column or a group of columns. The group's
K columns are stacked key-major (one copy of the ids; none for one column) and the stacked
rows are viewed zero-copy as Arrow ``binary`` values: a row's bytes are its ids, so two rows
hold equal bytes iff they hold the same ids (lengths included). Then:

1. short rows (``RUN_CHECK_MAX_IDS_PER_ROW``): compare each row with the previous one (Arrow
   ``equal`` on binary values: a ``memcmp`` per row); rows equal to their predecessor in
   every key of the group join its run (in a session-clustered batch most rows do); long
   rows skip this step (each row is its own run);
2. dictionary-encode the first row of each run (the *heads*) in every key: Arrow's hash
   table confirms every hash hit by comparing the bytes, so equal codes mean equal rows and
   a collision can never merge different rows; codes are numbered in order of first
   occurrence;
3. for K > 1 keys, a head's K codes form one fixed-width binary value, encoded once more;
4. every row takes its run head's code: ``inverse_lookup``. The distinct rows are the heads
   whose code first occurs there (the first occurrence of any content is always a run head),
   in increasing order.

A row joins an entry only if every feature of its group matches, which keeps the group's
shared ``inverse_lookup`` valid for all of its keys. Every step is one C++ kernel or numpy
pass over the group, whatever its number of keys; on sequence features Arrow hashes bytes
instead of running several numpy passes per id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recd.errors import SchemaError
from recd.table.layout import range_index
from recd.tensors.stacked import Stacked, gather, read_stacked

_INT64_MAX = np.iinfo(np.int64).max

RecordBatchLike: TypeAlias = pa.RecordBatch | pa.Table

_INT32_MAX = np.iinfo(np.int32).max
SPARSE_TYPE = pa.list_(pa.int64())
"""The canonical Arrow type of a sparse feature column."""
RUN_CHECK_MAX_IDS_PER_ROW = 8
"""Step 1 (runs of equal adjacent rows) runs for groups averaging fewer ids per row and key:
there a hash-table probe per row costs more than a compare; longer rows (sequences) hash as
fast as they compare, so all their rows go to step 2."""


class JaggedColumn(NamedTuple):
    """One sparse feature of a batch: row i holds ``values[offsets[i]:offsets[i + 1]]``."""

    offsets: np.ndarray
    """(B + 1,) int64, non-decreasing, indexing into ``values``."""
    values: np.ndarray
    """int64 ids (may extend beyond the rows' range)."""

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


# ---------------------------------------------------------------------- Arrow -> numpy
def _lookup(
    batch: RecordBatchLike, name: str, *, source: str, expected: str
) -> pa.Array | pa.ChunkedArray:
    idx = batch.schema.get_field_index(name)
    if idx < 0:
        raise SchemaError(f"{source}: missing column {name!r} (expected {expected})")
    return batch.column(idx)


def _chunks(batch: RecordBatchLike, name: str, *, source: str, expected: str) -> list[pa.Array]:
    """The chunks of a column of a table (a record batch's column is one chunk)."""
    col = _lookup(batch, name, source=source, expected=expected)
    return col.chunks if isinstance(col, pa.ChunkedArray) else [col]


def _column(batch: RecordBatchLike, name: str, *, source: str, expected: str) -> pa.Array:
    """A column as one array (a table's chunks combined)."""
    col = _lookup(batch, name, source=source, expected=expected)
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            return col.chunk(0)
        if col.num_chunks == 0:
            return pa.array([], type=col.type)
        return col.combine_chunks()
    return col


def _first_null_row(arr: pa.Array) -> int:
    return int(np.flatnonzero(pc.is_null(arr).to_numpy(zero_copy_only=False))[0])


def read_list_column(
    batch: RecordBatchLike, name: str, *, source: str, row_offset: int = 0
) -> JaggedColumn:
    """A ``list<int64>`` column as zero-copy numpy offsets (rebased to 0) and values.

    Raises SchemaError naming ``source``, the column and the row (``row_offset`` + index in
    the batch) for a missing column, a wrong type, a null list, a null id or an id outside
    int64. Narrower integer id types are widened to int64.
    """
    col = _column(batch, name, source=source, expected="list<int64>")
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
        raise SchemaError(f"{source}: column {name!r} has type {col.type}, expected list<int64>")
    if col.null_count:
        row = row_offset + _first_null_row(col)
        raise SchemaError(
            f"{source}: column {name!r}: row {row}: null list (expected a list of ids, maybe empty)"
        )
    offsets = col.offsets.to_numpy().astype(np.int64, copy=False)
    start = int(offsets[0])
    if start:
        offsets = offsets - start
    child = col.values.slice(start, int(offsets[-1]))
    value_type = child.type
    if not pa.types.is_integer(value_type):
        raise SchemaError(
            f"{source}: column {name!r} has type {col.type}, expected list<int64> "
            f"(ids must be integers)"
        )

    def row_of(position: int) -> int:
        return row_offset + int(np.searchsorted(offsets, position, side="right")) - 1

    if child.null_count:
        row = row_of(_first_null_row(child))
        raise SchemaError(f"{source}: column {name!r}: row {row}: null id inside the list")
    if value_type == pa.int64():
        values = child.to_numpy(zero_copy_only=True)
    else:
        raw = child.to_numpy(zero_copy_only=False)
        if value_type == pa.uint64() and raw.size and int(raw.max()) > _INT64_MAX:
            position = int(np.flatnonzero(raw > np.uint64(_INT64_MAX))[0])
            raise SchemaError(
                f"{source}: column {name!r}: row {row_of(position)}: id {int(raw[position])} "
                f"is outside the int64 range"
            )
        values = raw.astype(np.int64)
    return JaggedColumn(offsets=offsets, values=values)


def read_stacked_columns(
    batch: RecordBatchLike,
    names: Sequence[str],
    *,
    source: str,
    row_offset: int = 0,
    stacked: Stacked | None = None,
) -> JaggedColumn:
    """Several ``list<int64>`` columns of a batch stacked key-major (like ``stack_columns`` of
    their ``read_list_column``), in one Arrow ``concat_arrays`` call.

    The common case (every column ``list<int64>``, no null, ids fitting int32 offsets) is
    checked once on the concatenated array: a single C++ call instead of a dozen numpy
    operations per column. Anything else (another type, a null, an overflow) takes the
    per-column path, which converts what can be converted and raises what
    ``read_list_column`` raises, naming the column and row. Features a batch holds stacked
    (the dedup layout, ``recd.tensors.stacked``; ``stacked``: already read) are gathered to their
    plain rows, all in one gather; the others' ids are then copied once beside them.
    """
    if stacked is None and any(batch.schema.get_field_index(n) < 0 for n in names):
        stacked = read_stacked(batch)  # a stacked feature has no column of its own
    mine = [n for n in names if n in stacked.features] if stacked is not None else []
    if stacked is not None and mine:
        if len(mine) == len(names):
            return jagged_from_lengths(*gather(stacked, stacked.index(mine)))
        return _stack_mixed(batch, names, stacked, source=source, row_offset=row_offset)
    arrays = [_chunks(batch, name, source=source, expected="list<int64>") for name in names]
    chunks = [chunk for column in arrays for chunk in column]
    if len(chunks) > 1 and all(c.type.equals(SPARSE_TYPE) for c in chunks):
        try:
            joined = pa.concat_arrays(chunks)
        except pa.ArrowInvalid:  # more ids than int32 list offsets can address
            joined = None
        if joined is not None and joined.null_count == 0 and joined.values.null_count == 0:
            offsets = joined.offsets.to_numpy().astype(np.int64)
            values = joined.values.to_numpy(zero_copy_only=True)
            return JaggedColumn(offsets=offsets, values=values)
    return stack_columns(
        [read_list_column(batch, n, source=source, row_offset=row_offset) for n in names]
    )


def _stack_mixed(
    batch: RecordBatchLike, names: Sequence[str], stacked: Stacked, *, source: str, row_offset: int
) -> JaggedColumn:
    """``read_stacked_columns`` of stacked and plain features together: every id is written
    once, straight to its place (each run of consecutive stacked features is one gather into
    its block; each plain feature's ids, one copy)."""
    b = batch.num_rows
    plain = {
        n: read_list_column(batch, n, source=source, row_offset=row_offset)
        for n in names
        if n not in stacked.features
    }
    lengths = np.empty((len(names), b), dtype=np.int64)
    for k, n in enumerate(names):
        if n in plain:
            lengths[k] = np.diff(plain[n].offsets)
        else:
            j = stacked.features.index(n)
            lengths[k] = np.concatenate([c.lengths[:, j] for c in stacked.chunks]) if b else 0
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths.reshape(-1), out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=np.int64)
    k = 0
    while k < len(names):
        lo = int(offsets[k * b])
        if names[k] in plain:
            column = plain[names[k]]
            values[lo : int(offsets[(k + 1) * b])] = column.values[: int(column.offsets[-1])]
            k += 1
            continue
        end = k
        while end < len(names) and names[end] not in plain:
            end += 1
        gather(stacked, stacked.index(names[k:end]), out=values[lo : int(offsets[end * b])])
        k = end
    return JaggedColumn(offsets=offsets, values=values)


def jagged_from_lengths(lengths: np.ndarray, values: np.ndarray) -> JaggedColumn:
    """The column of rows of ``lengths`` holding ``values`` in order."""
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return JaggedColumn(offsets=offsets, values=values)


# ---------------------------------------------------------------------- dedup kernel
def stack_columns(columns: Sequence[JaggedColumn]) -> JaggedColumn:
    """The rows of K columns of B rows laid end to end, key-major like a KJT: K * B rows.

    Row ``k * B + i`` is row i of column k; offsets start at 0. One copy of the ids (none for
    a single column whose offsets already start at 0).
    """
    if len(columns) == 1 and int(columns[0].offsets[0]) == 0:
        return columns[0]
    lengths = np.concatenate([np.diff(c.offsets) for c in columns])
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate([c.values[int(c.offsets[0]) : int(c.offsets[-1])] for c in columns])
    return JaggedColumn(offsets=offsets, values=values.astype(np.int64, copy=False))


def group_slots(rows: np.ndarray, *, num_keys: int, batch_size: int) -> np.ndarray:
    """(K * len(rows),) rows of a stacked column holding ``rows`` of every key, key-major."""
    base = np.arange(num_keys, dtype=np.int64)[:, None] * batch_size
    return (base + np.asarray(rows, dtype=np.int64)[None, :]).reshape(-1)


def take_rows(column: JaggedColumn, rows: np.ndarray) -> JaggedColumn:
    """A compact column of just ``rows`` (offsets from 0, ids copied)."""
    offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(column.offsets[rows + 1] - column.offsets[rows], out=offsets[1:])
    return JaggedColumn(offsets=offsets, values=gather_rows(column, rows))


def as_binary(column: JaggedColumn) -> pa.Array:
    """The rows of a column as Arrow ``binary`` values, row i holding the bytes of its ids
    (zero-copy over the ids); ``large_binary`` once the bytes outgrow int32 offsets."""
    offsets, values = column
    start, end = int(offsets[0]), int(offsets[-1])
    ids = np.ascontiguousarray(values[start:end], dtype=np.int64)
    large = (end - start) * ids.itemsize > _INT32_MAX
    byte_offsets = ((offsets - start) * ids.itemsize).astype(np.int64 if large else np.int32)
    return pa.Array.from_buffers(
        pa.large_binary() if large else pa.binary(),
        offsets.size - 1,
        [None, pa.py_buffer(byte_offsets), pa.py_buffer(ids)],
    )


def _codes(rows: pa.Array, *, num_keys: int) -> np.ndarray:
    """(len(rows) / K,) int64 codes of stacked rows (K keys, key-major): equal iff the rows
    match in every key; numbered in order of first occurrence."""
    codes = _first_occurrence_codes(rows)
    if num_keys == 1:
        return codes
    n = codes.size // num_keys
    return _pair_codes(codes.reshape(num_keys, n).T)


def _first_occurrence_codes(values: pa.Array) -> np.ndarray:
    """int64 code of each value: equal iff the values are equal (bytes compared), numbered in
    order of first occurrence (Arrow's ``dictionary_encode``)."""
    indices = pc.dictionary_encode(values).indices
    return indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _pair_codes(columns: np.ndarray) -> np.ndarray:
    """Codes of the rows of an (N, C) matrix of codes: equal iff every column matches."""
    n, c = columns.shape
    tuples = np.ascontiguousarray(columns, dtype=np.int32)
    return _first_occurrence_codes(
        pa.Array.from_buffers(pa.binary(4 * c), n, [None, pa.py_buffer(tuples)])
    )


def _record_codes(
    stacked: JaggedColumn, heads: np.ndarray, *, num_keys: int, batch_size: int
) -> np.ndarray:
    """Codes of the given batch rows over all K keys of a stacked group, from one record per
    row: its K lengths, and its ids of every key laid end to end.

    Two rows match in every key iff both their length vectors and their id records are equal.
    Two hash passes over N records replace K passes over N short values (and the pairing of
    K codes): for short rows (a few ids per key) hashing costs per value, not per byte.
    """
    m = heads.size
    slots = (heads[:, None] + np.arange(num_keys, dtype=np.int64)[None, :] * batch_size).reshape(-1)
    lengths = stacked.offsets[slots + 1] - stacked.offsets[slots]
    ids = gather_rows(stacked, slots)
    per_row = lengths.reshape(m, num_keys).sum(axis=1)
    ends = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(per_row, out=ends[1:])
    records = as_binary(JaggedColumn(offsets=ends, values=ids))
    shapes = pa.Array.from_buffers(
        pa.binary(8 * num_keys), m, [None, pa.py_buffer(np.ascontiguousarray(lengths))]
    )
    both = np.stack([_first_occurrence_codes(records), _first_occurrence_codes(shapes)], axis=1)
    return _pair_codes(both)


def find_distinct_rows(
    columns: Sequence[JaggedColumn], *, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exact dedup of a group's rows (algorithm: module docstring): ``(distinct, inverse)``,
    the first row of each distinct content in increasing order (D,) and each row's position in
    it (B,), both int64. Rows share an entry iff every column holds the same ids."""
    return find_distinct_stacked(
        stack_columns(columns), num_keys=len(columns), batch_size=batch_size
    )


def find_distinct_stacked(
    stacked: JaggedColumn, *, num_keys: int, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`find_distinct_rows` of a group given as one stacked column (``stack_columns``:
    K * B rows, key-major), so every step runs once over all keys of the group."""
    if batch_size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    rows = as_binary(stacked)
    repeats = np.zeros(batch_size, dtype=bool)
    ids = int(stacked.offsets[-1]) - int(stacked.offsets[0])
    short_rows = ids < RUN_CHECK_MAX_IDS_PER_ROW * num_keys * batch_size
    if short_rows:
        # Row (k, i) is compared with the row before it, (k, i - 1); for i = 0 that is another
        # key's last row, and row 0 is never a repeat anyway.
        same = np.zeros(num_keys * batch_size, dtype=bool)
        if same.size > 1:
            equal = pc.equal(rows.slice(1), rows.slice(0, same.size - 1))
            same[1:] = equal.to_numpy(zero_copy_only=False)
        repeats = np.logical_and.reduce(same.reshape(num_keys, batch_size), axis=0)
        repeats[0] = False
    heads = np.flatnonzero(~repeats)
    if short_rows and num_keys > 1:
        head_codes = _record_codes(stacked, heads, num_keys=num_keys, batch_size=batch_size)
    else:
        if heads.size < batch_size:
            slots = group_slots(heads, num_keys=num_keys, batch_size=batch_size)
            rows = rows.take(pa.array(slots))
        head_codes = _codes(rows, num_keys=num_keys)
    # Codes are numbered in order of first occurrence: a head holds a new content iff its
    # code exceeds every earlier head's.
    seen = np.maximum.accumulate(head_codes)
    is_first = np.empty(heads.size, dtype=bool)
    is_first[:1] = True
    np.greater(head_codes[1:], seen[:-1], out=is_first[1:])
    inverse = head_codes[np.cumsum(~repeats) - 1]
    return heads[is_first], inverse


def gather_rows(
    column: JaggedColumn, rows: np.ndarray, *, out: np.ndarray | None = None
) -> np.ndarray:
    """Ids of ``rows`` of a column, concatenated: (sum of their lengths,) int64 (into ``out``)."""
    offsets, values = column
    starts = offsets[rows]
    return np.take(values, range_index(starts, offsets[rows + 1] - starts), out=out)
