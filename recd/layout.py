"""The deduplicated table layout: each session's repeated and sliding sparse values stored once.

A clustered table holds a session's rows next to each other, sorted by time. Many of their
sparse values repeat the previous row (a user feature, an item clicked again), and a "last N
items" history is the previous row's history with the newest events appended and the oldest
dropped. The ``dedup`` layout stores, for every encoded feature ``f``, two columns in place
of ``f``::

    f__new_ids  list<int64>   the ids this row appends to the row group's sequence
    f__dropped  int32         how many ids of the previous row's list this row drops (front)

A row's list is the last ``len`` ids of the sequence formed by ``f__new_ids`` of the row
group's rows so far, where ``len = previous len + len(new ids) - dropped`` (0 before the
first row). A repeat appends nothing and drops nothing; a history that slid by one event
appends it and drops the oldest; a fresh value appends itself whole and drops the whole
previous list. Worked example (one session, a 3-item history; ``docs/layout.md`` holds it as
a test)::

    row   history (plain)   f__new_ids   f__dropped   len   sequence so far
    0     [5, 6]            [5, 6]       0            2     5 6
    1     [5, 6]            []           0            2     5 6
    2     [5, 6, 7]         [7]          0            3     5 6 7
    3     [6, 7, 8]         [8]          1            3     5 6 7 8
    4     [9]               [9]          3            1     5 6 7 8 9

Mostly-zero ``dropped`` columns cost almost nothing on disk (storing the length itself cost
as much as the ids it saved on short static features). Readers turn ``dropped`` into the
length once per row group (:func:`read_row_group`, a cumulative sum), and keep the rows in
that form (``f__new_ids`` + ``f__len``) until conversion.

Reading needs no search: in a row group, ``f__new_ids`` of all rows are one flat buffer of
ids, the sessions' sequences end to end, so row i's list is ``ids[end_i - len_i : end_i]``
with ``end_i`` its list's end offset. Arrow slices keep offsets into the unsliced buffer,
so a batch that starts in the middle of a session still finds its first row's list, and a
session shuffle (``take`` of whole sessions) keeps each session's rows in order behind their
first, self-contained row. A row equals its predecessor iff it appends and drops nothing,
which is how readers build an IKJT without hashing (:func:`new_rows`).

The writer (:func:`encode_row_group`, the same function in both ETL engines) encodes one row
group at a time and starts afresh at every session and row group: the first row of each is
stored whole, so any row group decodes on its own. For each row it stores the fewest new ids
among small shifts of the previous list (``MAX_SHIFT``); anything else is stored whole, which
is always exact. Which features to encode: by default those whose stored ids are at most
``MAX_STORED_FRACTION`` of their ids on the ETL's sample (:func:`stored_fractions`); a
feature that changes on every row would only pay for its ``dropped`` column.

Plain Parquet readers are not misled: column ``f`` does not exist in a dedup file (reading it
fails), and the schema metadata carries ``recd.layout``. recd's readers read both layouts,
mixed partitions included (:func:`as_encoded` gives plain rows the encoded form).

Hand-written because no library stores pointer-encoded sliding windows in Parquet: Parquet's
own encodings (dictionary, delta) work within a column chunk on single values, not on lists
that share a suffix with the previous row's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recd.errors import BadRowError, SchemaError
from recd.schema import SESSION_ID

LAYOUTS = ("plain", "dedup")
LAYOUT_METADATA_KEY = b"recd.layout"
LAYOUT_VERSION = 1
NEW_IDS_SUFFIX = "__new_ids"
DROPPED_SUFFIX = "__dropped"
LEN_SUFFIX = "__len"
MAX_STORED_FRACTION = 0.8
"""Default feature choice: encode a feature whose stored ids are at most this fraction of its
ids on the ETL's sample."""
MAX_SHIFT = 4
"""Besides the smallest shift the lengths allow, the writer tries this many more dropped ids
(two events appended at once to a full history need a shift of 2): rows that match none are
stored whole."""
_IDS_TYPE = pa.list_(pa.field("item", pa.int64(), nullable=False))
_PLAIN_TYPE = pa.list_(pa.int64())


def new_ids_column(feature: str) -> str:
    return feature + NEW_IDS_SUFFIX


def len_column(feature: str) -> str:
    """The in-memory length column readers derive from the file's ``dropped`` column."""
    return feature + LEN_SUFFIX


def dropped_column(feature: str) -> str:
    return feature + DROPPED_SUFFIX


@dataclass(frozen=True, slots=True)
class Layout:
    """How a file stores its sparse features."""

    name: str
    """``plain`` or ``dedup``."""
    encoded: tuple[str, ...] = ()
    """Sparse features stored as ``__new_ids`` + ``__len`` (dedup layout)."""

    def to_json(self) -> str:
        return json.dumps(
            {"layout": self.name, "version": LAYOUT_VERSION, "encoded": list(self.encoded)}
        )

    def physical_columns(self, columns: Sequence[str]) -> list[str]:
        """The file's columns holding logical ``columns`` (an encoded feature is two)."""
        out: list[str] = []
        for name in columns:
            if name in self.encoded:
                out.extend([new_ids_column(name), dropped_column(name)])
            else:
                out.append(name)
        return out


PLAIN = Layout("plain")


def layout_of(schema: pa.Schema, *, source: str) -> Layout:
    """The layout a file's schema declares (no ``recd.layout`` metadata: plain)."""
    raw = (schema.metadata or {}).get(LAYOUT_METADATA_KEY)
    if raw is None:
        return PLAIN
    try:
        data = json.loads(raw)
        name, version, encoded = data["layout"], int(data["version"]), data["encoded"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SchemaError(f"{source}: unreadable recd.layout metadata: {exc}") from exc
    if name not in LAYOUTS or version > LAYOUT_VERSION:
        raise SchemaError(
            f"{source}: table layout {name!r} version {version} is not readable by this recd "
            f"(reads {', '.join(LAYOUTS)} up to version {LAYOUT_VERSION}): upgrade recd"
        )
    for feature in encoded:
        for column in (new_ids_column(feature), dropped_column(feature)):
            if schema.get_field_index(column) < 0:
                raise SchemaError(f"{source}: dedup layout without column {column!r}")
    return Layout(name, tuple(encoded))


def dedup_schema(schema: pa.Schema, features: Sequence[str]) -> pa.Schema:
    """The file schema of the dedup layout: each encoded feature's column replaced, in place,
    by its ``__new_ids`` and ``__dropped`` columns; ``recd.layout`` added to the metadata."""
    fields: list[pa.Field] = []
    for fld in schema:
        if fld.name in features:
            fields.append(pa.field(new_ids_column(fld.name), _IDS_TYPE, nullable=False))
            fields.append(pa.field(dropped_column(fld.name), pa.int32(), nullable=False))
        else:
            fields.append(fld)
    metadata = dict(schema.metadata or {})
    metadata[LAYOUT_METADATA_KEY] = Layout("dedup", tuple(features)).to_json().encode()
    return pa.schema(fields, metadata=metadata)


# ------------------------------------------------------------------------------- writing
def row_starts(session_ids: np.ndarray) -> np.ndarray:
    """(N,) bool: row i starts a session run (row 0 always): it is stored whole."""
    first = np.ones(session_ids.size, dtype=bool)
    if session_ids.size > 1:
        np.not_equal(session_ids[1:], session_ids[:-1], out=first[1:])
    return first


def encode_list(
    offsets: np.ndarray, values: np.ndarray, first: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Encode one list column (offsets (N + 1,) from 0, int64 values) of one row group.

    Returns ``(new_offsets, new_values, dropped)``: the ``__new_ids`` lists and
    ``__dropped``. ``first`` marks the rows stored whole (session and row-group starts).
    """
    n = first.size
    lengths = np.diff(offsets)
    added = lengths.copy()  # ids each row adds; whole by default
    if n > 1:
        prev_len = np.r_[0, lengths[:-1]]
        base = np.maximum(lengths - prev_len, 0)  # the fewest new ids the lengths allow
        open_rows = np.flatnonzero(~first)
        for shift in range(MAX_SHIFT + 1):
            if open_rows.size == 0:
                break
            kept = lengths[open_rows] - base[open_rows] - shift  # ids shared with the prev row
            test = open_rows[kept > 0]
            kept = kept[kept > 0]
            if test.size == 0:
                break
            match = _suffix_matches(offsets, values, test, kept, prev_len[test])
            added[test[match]] = base[test[match]] + shift
            open_rows = test[~match]
        # Rows whose lengths leave nothing to share (kept == 0) stay whole; so do the rest.
    new_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(added, out=new_offsets[1:])
    starts = offsets[1:] - added
    index = np.repeat(starts - new_offsets[:-1], added)
    index += np.arange(index.size, dtype=np.int64)
    dropped = np.r_[0, lengths[:-1]] + added - lengths if n else lengths
    return new_offsets, values[index], dropped


def _suffix_matches(
    offsets: np.ndarray,
    values: np.ndarray,
    rows: np.ndarray,
    kept: np.ndarray,
    prev_len: np.ndarray,
) -> np.ndarray:
    """(len(rows),) bool: row r's first ``kept`` ids equal the last ``kept`` ids of row r-1."""
    total = int(kept.sum())
    owner = np.repeat(np.arange(rows.size), kept)
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(kept) - kept, kept)
    mine = values[offsets[rows][owner] + within]
    theirs = values[(offsets[rows - 1] + prev_len - kept)[owner] + within]
    differ = np.bincount(owner, weights=mine != theirs, minlength=rows.size)
    return differ == 0


def encode_row_group(
    table: pa.Table, features: Sequence[str], *, schema: pa.Schema | None = None
) -> pa.Table:
    """One row group of the table schema (``session_id`` included, clustered order) in the
    dedup layout: each of ``features`` becomes its ``__new_ids`` and ``__dropped`` columns
    (typed as ``schema``, the file's :func:`dedup_schema`, when given)."""
    first = row_starts(table.column(SESSION_ID).to_numpy())
    names: list[str] = []
    columns: list[pa.Array | pa.ChunkedArray] = []
    wanted = set(features)
    for name, column in zip(table.column_names, table.columns, strict=True):
        if name not in wanted:
            names.append(name)
            columns.append(column)
            continue
        chunk = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        raw = chunk.offsets.to_numpy().astype(np.int64)
        values = chunk.values.to_numpy(zero_copy_only=False)[int(raw[0]) : int(raw[-1])]
        new_offsets, new_values, dropped = encode_list(raw - raw[0], values, first)
        ids = pa.ListArray.from_arrays(
            pa.array(new_offsets.astype(np.int32)),
            pa.array(new_values, pa.int64()),
            type=_IDS_TYPE,
        )
        names.extend([new_ids_column(name), dropped_column(name)])
        columns.extend([ids, pa.array(dropped.astype(np.int32))])
    if schema is not None:
        return pa.Table.from_arrays(columns, schema=schema)
    return pa.table(columns, names=names)


# ------------------------------------------------------------------------------- reading
@dataclass(frozen=True, slots=True)
class EncodedChunk:
    """One chunk of an encoded feature as numpy: row i is ``ids[ends[i] - lengths[i]:ends[i]]``."""

    ids: np.ndarray
    """The chunk's whole id buffer (rows before a slice included)."""
    ends: np.ndarray
    """(N,) int64 end of each row's new ids in ``ids``."""
    lengths: np.ndarray
    """(N,) int64 list length of each row."""
    added: np.ndarray
    """(N,) int64 new ids of each row."""

    @property
    def starts(self) -> np.ndarray:
        return self.ends - self.lengths


def read_encoded(ids: pa.Array, lengths: pa.Array, *, name: str, source: str) -> EncodedChunk:
    """An encoded chunk (``__new_ids``, ``__len``) as numpy, checked: every row's list lies
    inside the chunk's id buffer (a corrupt file fails here, naming the feature)."""
    offsets = ids.offsets.to_numpy().astype(np.int64)
    child = ids.values
    buffer = child.to_numpy(zero_copy_only=child.type == pa.int64())
    length = lengths.to_numpy(zero_copy_only=False).astype(np.int64)
    ends = offsets[1:]
    if length.size and (int(length.min()) < 0 or int((ends - length).min()) < 0):
        row = int(np.flatnonzero((length < 0) | (ends - length < 0))[0])
        raise SchemaError(
            f"{source}: feature {name!r}: row {row}: {len_column(name)} reaches before the "
            "row group's first id (corrupt dedup layout)"
        )
    return EncodedChunk(
        ids=buffer.astype(np.int64, copy=False), ends=ends, lengths=length, added=np.diff(offsets)
    )


def read_row_group(
    table: pa.Table, encoded: Sequence[str], *, path: str, first_row: int = 0
) -> pa.Table:
    """One row group as read from a dedup-layout file -> the readers' in-memory form: each
    encoded feature's ``__dropped`` column becomes its ``__len`` column (lengths from a
    cumulative sum), ``__new_ids`` viewed as ``list<int64>``.

    Checks that the row group decodes on its own: BadRowError naming the file, row
    (``first_row`` + index) and column when a length goes negative or a row's list would
    reach before the row group's first id (a corrupt file).
    """
    names: list[str] = []
    columns: list[pa.Array | pa.ChunkedArray] = []
    drops = {dropped_column(f): f for f in encoded}
    for name, column in zip(table.column_names, table.columns, strict=True):
        feature = drops.get(name)
        if feature is None:
            names.append(name)
            columns.append(column)
            continue
        ids = table.column(new_ids_column(feature)).combine_chunks()
        offsets = ids.offsets.to_numpy().astype(np.int64)
        added = np.diff(offsets)
        dropped = column.to_numpy().astype(np.int64)
        lengths = np.cumsum(added - dropped)
        bad = (lengths < 0) | (offsets[1:] - lengths < int(offsets[0]) if offsets.size else lengths)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise BadRowError(
                path,
                first_row + row,
                name,
                "drops more ids than its session's earlier rows hold (corrupt dedup layout)",
            )
        names.append(len_column(feature))
        columns.append(pa.array(lengths.astype(np.int32)))
    out = pa.table(columns, names=names)
    for feature in encoded:  # ids: the canonical list<int64> type, zero-copy
        i = out.schema.get_field_index(new_ids_column(feature))
        col = out.column(i)
        if not col.type.equals(_PLAIN_TYPE):
            view = pa.chunked_array([c.view(_PLAIN_TYPE) for c in col.chunks], type=_PLAIN_TYPE)
            out = out.set_column(i, new_ids_column(feature), view)
    return out


def stored_fractions(table: pa.Table, features: Sequence[str]) -> dict[str, float]:
    """Stored ids / ids of each feature once ``table`` (clustered rows with ``session_id``)
    is encoded as one row group: 1.0 for a feature that changes on every row."""
    encoded = encode_row_group(table.select([SESSION_ID, *features]), features)
    out = {}
    for feature in features:
        total = _ids(table.column(feature))
        out[feature] = _ids(encoded.column(new_ids_column(feature))) / total if total else 1.0
    return out


def choose_encoded(
    sample: pa.Table, candidates: Sequence[str], *, listed: bool
) -> tuple[list[str], dict[str, float]]:
    """(features to encode, stored fraction of each candidate) on the ETL's sample (clustered
    rows): every candidate when the user ``listed`` them, else those storing at most
    ``MAX_STORED_FRACTION`` of their ids."""
    if not candidates:
        return [], {}
    fractions = stored_fractions(sample, candidates)
    chosen = [f for f in candidates if listed or fractions[f] <= MAX_STORED_FRACTION]
    return chosen, fractions


def _ids(column: pa.ChunkedArray) -> int:
    """Ids held by the rows of a list column (slices counted by their own rows only)."""
    return sum(int(c.offsets[-1].as_py()) - int(c.offsets[0].as_py()) for c in column.chunks)


def read_plain(path: str, columns: Sequence[str] | None = None) -> pa.Table:
    """A table file's rows (``columns`` of them, by logical name) in the plain form, whatever
    its layout: a dedup-layout file is decoded row group by row group."""
    file = pq.ParquetFile(path)
    layout = layout_of(file.schema_arrow, source=path)
    if not layout.encoded:
        return file.read(columns=None if columns is None else list(columns))
    wanted = list(columns) if columns is not None else _logical_names(file.schema_arrow, layout)
    physical = layout.physical_columns(wanted)
    encoded = [f for f in layout.encoded if f in wanted]
    groups = [
        decode_table(file.read_row_group(i, columns=physical), encoded, path=path)
        for i in range(file.num_row_groups)
    ]
    if not groups:
        return decode_table(file.schema_arrow.empty_table().select(physical), encoded, path=path)
    return pa.concat_tables(groups)


def _logical_names(schema: pa.Schema, layout: Layout) -> list[str]:
    names = []
    for name in schema.names:
        if name.endswith(NEW_IDS_SUFFIX) and name[: -len(NEW_IDS_SUFFIX)] in layout.encoded:
            names.append(name[: -len(NEW_IDS_SUFFIX)])
        elif not (name.endswith(DROPPED_SUFFIX) and name[: -len(DROPPED_SUFFIX)] in layout.encoded):
            names.append(name)
    return names


def gather_ranges(ids: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``ids[starts[r]:starts[r] + lengths[r]]`` of every r, concatenated (one copy)."""
    out_start = np.cumsum(lengths) - lengths
    index = np.repeat(starts - out_start, lengths)
    index += np.arange(index.size, dtype=np.int64)
    return ids[index]


def expand(chunk: EncodedChunk, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, ids) of the chunk's rows (all, or ``rows``) in plain form."""
    if rows is None:
        if np.array_equal(chunk.added, chunk.lengths):  # nothing shared: the ids as stored
            lo = int(chunk.ends[0] - chunk.added[0]) if chunk.ends.size else 0
            hi = int(chunk.ends[-1]) if chunk.ends.size else 0
            return chunk.lengths, chunk.ids[lo:hi]
        return chunk.lengths, gather_ranges(chunk.ids, chunk.starts, chunk.lengths)
    lengths = chunk.lengths[rows]
    return lengths, gather_ranges(chunk.ids, chunk.starts[rows], lengths)


def new_rows(chunk: EncodedChunk) -> np.ndarray:
    """(N,) bool: row i differs from row i - 1 of the chunk (row 0 always counts as new).

    Row i equals row i - 1 iff it adds no id and keeps its length (then its list is the same
    last ``len`` ids of the same sequence); anything else may differ and counts as new.
    """
    new = np.ones(chunk.lengths.size, dtype=bool)
    if new.size > 1:
        np.not_equal(chunk.lengths[1:], chunk.lengths[:-1], out=new[1:])
        new[1:] |= chunk.added[1:] > 0
    return new


def encoded_chunks(
    batch: pa.Table | pa.RecordBatch, name: str, *, source: str
) -> list[EncodedChunk] | None:
    """Feature ``name`` of a batch's rows as encoded chunks, or None when the rows hold it
    plain (a column named ``name``)."""
    schema = batch.schema
    if schema.get_field_index(name) >= 0 or schema.get_field_index(len_column(name)) < 0:
        return None
    ids = batch.column(new_ids_column(name))
    lengths = batch.column(len_column(name))
    if isinstance(ids, pa.Array):
        return [read_encoded(ids, lengths, name=name, source=source)]
    return [
        read_encoded(chunk, length, name=name, source=source)
        for chunk, length in zip(ids.chunks, _rechunk(lengths, ids), strict=True)
    ]


def expand_chunks(chunks: Sequence[EncodedChunk]) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, ids) of every row of the chunks, in plain form."""
    parts = [expand(chunk) for chunk in chunks]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def group_rows(per_key: Sequence[Sequence[EncodedChunk]], batch_size: int) -> np.ndarray:
    """(B,) bool: the rows of a group (K features, each as its batch's chunks) that differ
    from the row before them in some key; every chunk's first row counts as different."""
    new = np.zeros(batch_size, dtype=bool)
    for chunks in per_key:
        row = 0
        for chunk in chunks:
            n = chunk.lengths.size
            new[row : row + n] |= new_rows(chunk)
            row += n
    return new


def take_chunk_rows(
    chunks: Sequence[EncodedChunk], rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, ids) of batch ``rows`` (increasing) of one feature's chunks, plain form."""
    lengths, ids = [], []
    start = 0
    for chunk in chunks:
        n = chunk.lengths.size
        lo, hi = np.searchsorted(rows, [start, start + n])
        part_lengths, part_ids = expand(chunk, rows[lo:hi] - start)
        lengths.append(part_lengths)
        ids.append(part_ids)
        start += n
    if len(lengths) == 1:
        return lengths[0], ids[0]
    return np.concatenate(lengths), np.concatenate(ids)


def as_encoded(column: pa.ChunkedArray) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """A plain ``list<int64>`` column in the in-memory encoded form (``__new_ids``, ``__len``:
    every row appends its whole list): how a plain-layout row group reads beside dedup ones."""
    lengths = [pa.array(np.diff(c.offsets.to_numpy()).astype(np.int32)) for c in column.chunks]
    return column, pa.chunked_array(lengths, type=pa.int32())


def decode_table(table: pa.Table, encoded: Sequence[str], *, path: str = "<table>") -> pa.Table:
    """``table`` (one row group of a dedup-layout file, as read) with every
    encoded feature back in its plain ``list<int64>`` column (placed where its ``__new_ids``
    column was)."""
    table = read_row_group(table, encoded, path=path)
    names: list[str] = []
    columns: list[pa.Array | pa.ChunkedArray] = []
    wanted = {new_ids_column(f): f for f in encoded}
    lens = {len_column(f) for f in encoded}
    for name, column in zip(table.column_names, table.columns, strict=True):
        if name in lens:
            continue
        feature = wanted.get(name)
        if feature is None:
            names.append(name)
            columns.append(column)
            continue
        chunks = []
        len_col = table.column(len_column(feature))
        for ids, length in zip(column.chunks, _rechunk(len_col, column), strict=True):
            chunk = read_encoded(ids, length, name=feature, source="<table>")
            out_lengths, values = expand(chunk)
            offsets = np.zeros(out_lengths.size + 1, dtype=np.int64)
            np.cumsum(out_lengths, out=offsets[1:])
            chunks.append(
                pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
            )
        names.append(feature)
        columns.append(pa.chunked_array(chunks, type=pa.list_(pa.int64())))
    return pa.table(columns, names=names)


def _rechunk(column: pa.ChunkedArray, like: pa.ChunkedArray) -> list[pa.Array]:
    """``column``'s chunks cut like ``like``'s (columns of one table may chunk differently)."""
    out = []
    row = 0
    for chunk in like.chunks:
        out.append(column.slice(row, len(chunk)).combine_chunks())
        row += len(chunk)
    return out
