"""The deduplicated table layout: each session's repeated and sliding sparse values stored once.

A clustered table holds a session's rows next to each other, sorted by time. Many of their
sparse values repeat the previous row (a user feature, an item clicked again), and a "last N
items" history is the previous row's history with the newest events appended and the oldest
dropped. The ``dedup`` layout stores, for every encoded feature ``f``, two columns in place
of ``f``::

    f__new_ids  list<int64>   the ids this row appends to the row group's sequence of f
    f__start    int32         where the row's list starts in that sequence

The *sequence* is the ``f__new_ids`` of the row group's rows laid end to end; a row's list
runs from ``f__start`` to the end of its own new ids. A repeat appends nothing and keeps its
start; a history that slid by one event appends it and starts one id later; a fresh value
appends itself whole and starts where it was appended. Worked example (one session, a 3-item
history; ``docs/layout.md`` holds it as a test)::

    row   history (plain)   f__new_ids   f__start   sequence so far (position: id)
    0     [5, 6]            [5, 6]       0          0:5 1:6
    1     [5, 6]            []           0          0:5 1:6
    2     [5, 6, 7]         [7]          0          0:5 1:6 2:7
    3     [6, 7, 8]         [8]          1          0:5 1:6 2:7 3:8
    4     [9]               [9]          4          0:5 1:6 2:7 3:8 4:9

``f__start`` only ever grows inside a row group, by the ids a row drops: Parquet's
DELTA_BINARY_PACKED (chosen by the ETL's encoding trial when it is the smallest) stores it
in about a bit per row, and decoding it is the only arithmetic a reader needs: row i's list
is ``sequence[start_i : end_i]``, ``end_i`` the end offset of its new ids.

Arrow slices keep offsets into the unsliced buffer, so a batch that starts in the middle of a
session still finds its first row's list, and a row equals its predecessor iff it appends
nothing and keeps its start, which is how readers build an IKJT without hashing
(``recd.layout_read``).

The writer (:func:`encode_row_group`, the same function in both ETL engines) encodes one row
group at a time and starts afresh at every session and row group: the first row of each is
stored whole, so any row group decodes on its own and whole sessions can be reordered. For
each row it stores the fewest new ids among small shifts of the previous list
(``MAX_SHIFT``); anything else is stored whole, which is always exact. Which features to
encode: by default those whose stored ids are at most ``MAX_STORED_FRACTION`` of their ids
on the ETL's sample (:func:`stored_fractions`) and whose encoded columns are not more than
5% larger than the plain one there (:func:`choose_encoded`).

Plain Parquet readers are not misled: column ``f`` does not exist in a dedup file (reading it
fails), and the schema metadata carries ``recd.layout``. recd's readers read both layouts,
mixed partitions included.

Hand-written because no library stores pointer-encoded sliding windows in Parquet: Parquet's
own encodings (dictionary, delta) work within a column chunk on single values, not on lists
that share a suffix with the previous row's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recd.errors import SchemaError
from recd.schema import SESSION_ID

LAYOUTS = ("plain", "dedup")
LAYOUT_METADATA_KEY = b"recd.layout"
LAYOUT_VERSION = 1
NEW_IDS_SUFFIX = "__new_ids"
START_SUFFIX = "__start"
MAX_STORED_FRACTION = 0.8
"""Default feature choice: encode a feature whose stored ids are at most this fraction of its
ids on the ETL's sample..."""
MAX_SIZE_RATIO = 1.05
"""...and whose encoded columns take at most this many times the plain column's bytes there:
encoded, its IKJTs need no hashing, which is worth a few percent of its bytes (a session-
constant short list is about as small plain: zstd removes runs of equal lists almost for
free), but not a fifth more."""
MAX_SHIFT = 4
"""Besides the smallest shift the lengths allow, the writer tries this many more dropped ids
(two events appended at once to a full history need a shift of 2): rows that match none are
stored whole."""
_IDS_TYPE = pa.list_(pa.field("item", pa.int64(), nullable=False))


def new_ids_column(feature: str) -> str:
    return feature + NEW_IDS_SUFFIX


def start_column(feature: str) -> str:
    return feature + START_SUFFIX


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
                out.extend([new_ids_column(name), start_column(name)])
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
        for column in (new_ids_column(feature), start_column(feature)):
            if schema.get_field_index(column) < 0:
                raise SchemaError(f"{source}: dedup layout without column {column!r}")
    return Layout(name, tuple(encoded))


def dedup_schema(schema: pa.Schema, features: Sequence[str]) -> pa.Schema:
    """The file schema of the dedup layout: each encoded feature's column replaced, in place,
    by its ``__new_ids`` and ``__start`` columns; ``recd.layout`` added to the metadata."""
    fields: list[pa.Field] = []
    for fld in schema:
        if fld.name in features:
            fields.append(pa.field(new_ids_column(fld.name), _IDS_TYPE, nullable=False))
            fields.append(pa.field(start_column(fld.name), pa.int32(), nullable=False))
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

    Returns ``(new_offsets, new_values, starts)``: the ``__new_ids`` lists and ``__start``.
    ``first`` marks the rows stored whole (session and row-group starts).
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
            # Row i's first ``kept`` ids against the ``kept`` ids just before them (the end of
            # row i - 1). Their first and last ids first: most rows that differ are out
            # before their whole lists are compared.
            starts = offsets[test]
            ends = starts + kept - 1
            likely = (values[starts] == values[starts - kept]) & (
                values[ends] == values[ends - kept]
            )
            match = np.zeros(test.size, dtype=bool)
            if likely.any():
                match[likely] = _suffix_matches(values, starts[likely], kept[likely])
            added[test[match]] = base[test[match]] + shift
            open_rows = test[~match]
        # Rows whose lengths leave nothing to share (kept == 0) stay whole; so do the rest.
    new_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(added, out=new_offsets[1:])
    new_values = values[range_index(offsets[1:] - added, added)]  # each row's last ``added``
    return new_offsets, new_values, new_offsets[1:] - lengths


def range_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Positions ``starts[r] .. starts[r] + lengths[r] - 1`` of every r, concatenated (int64):
    output position p of range r reads ``p + starts[r] - out_start[r]``, one repeat of that
    shift per range plus an arange."""
    out_start = np.cumsum(lengths, dtype=np.int64) - lengths
    index = np.repeat(starts.astype(np.int64) - out_start, lengths)
    index += np.arange(index.size, dtype=np.int64)
    return index


def _suffix_matches(values: np.ndarray, starts: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """(len(starts),) bool: the ``kept`` (> 0) ids from ``starts`` equal the ``kept`` ids just
    before them (the first ids of a row against the last ids of the row before it).

    One ``memcmp`` per row (Arrow's ``equal`` on binary values) over zero-copy views of
    ``values``: the windows of either side are disjoint and increasing (``starts`` increase
    and a window never reaches before the previous tested row's start), so each side is one
    ``large_binary`` array whose odd elements are the windows and whose even ones the gaps.
    """
    data = pa.py_buffer(np.ascontiguousarray(values, dtype=np.int64))

    def windows(lo: np.ndarray) -> pa.Array:
        bounds = np.zeros(2 * lo.size + 1, dtype=np.int64)
        bounds[1::2] = lo * 8
        bounds[2::2] = (lo + kept) * 8
        return pa.Array.from_buffers(
            pa.large_binary(), 2 * lo.size, [None, pa.py_buffer(bounds), data]
        )

    equal = pc.equal(windows(starts), windows(starts - kept))
    return equal.to_numpy(zero_copy_only=False)[1::2]


def encode_row_group(
    table: pa.Table, features: Sequence[str], *, schema: pa.Schema | None = None
) -> pa.Table:
    """One row group of the table schema (``session_id`` included, clustered order) in the
    dedup layout: each of ``features`` becomes its ``__new_ids`` and ``__start`` columns
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
        new_offsets, new_values, starts = encode_list(raw - raw[0], values, first)
        ids = pa.ListArray.from_arrays(
            pa.array(new_offsets.astype(np.int32)),
            pa.array(new_values, pa.int64()),
            type=_IDS_TYPE,
        )
        names.extend([new_ids_column(name), start_column(name)])
        columns.extend([ids, pa.array(starts.astype(np.int32))])
    if schema is not None:
        return pa.Table.from_arrays(columns, schema=schema)
    return pa.table(columns, names=names)


# ------------------------------------------------------------------------------- choosing
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
    sample: pa.Table,
    candidates: Sequence[str],
    *,
    listed: bool,
    sizes: Callable[[pa.Table], dict[str, int]] | None = None,
) -> tuple[list[str], dict[str, float]]:
    """(features to encode, stored fraction of each candidate) on the ETL's sample (clustered
    rows, ``session_id`` included): every candidate when the user ``listed`` them; else those
    storing at most ``MAX_STORED_FRACTION`` of their ids whose encoded columns take at most
    ``MAX_SIZE_RATIO`` times their plain column's bytes, as ``sizes`` (compressed bytes per
    column of a table, the ETL's own encoding trial) measures them."""
    if not candidates:
        return [], {}
    fractions = stored_fractions(sample, candidates)
    if listed:
        return list(candidates), fractions
    chosen = [f for f in candidates if fractions[f] <= MAX_STORED_FRACTION]
    if chosen and sizes is not None:
        encoded_rows = encode_row_group(sample.select([SESSION_ID, *chosen]), chosen)
        plain = sizes(sample.select(chosen))
        encoded = sizes(encoded_rows)
        kept: list[str] = []
        # Features that change on the same rows (a session's static features) are decided
        # together, so a reader's group of them is either all encoded or all plain.
        for block in _synchronised(encoded_rows, chosen):
            size = sum(encoded[new_ids_column(f)] + encoded[start_column(f)] for f in block)
            if size <= MAX_SIZE_RATIO * sum(plain[f] for f in block):
                kept += block
        chosen = [f for f in chosen if f in kept]
    return chosen, fractions


def _synchronised(encoded: pa.Table, features: Sequence[str]) -> list[list[str]]:
    """``features`` in blocks of those whose rows change (append ids or move their start) on
    exactly the same rows of an encoded table."""
    blocks: dict[bytes, list[str]] = {}
    for feature in features:
        ids = encoded.column(new_ids_column(feature)).combine_chunks()
        start = encoded.column(start_column(feature)).to_numpy()
        changed = (np.diff(ids.offsets.to_numpy()) > 0) | np.r_[True, start[1:] != start[:-1]]
        blocks.setdefault(np.packbits(changed).tobytes(), []).append(feature)
    return list(blocks.values())


def statistics_columns(schema: pa.Schema, encoded: Sequence[str]) -> list[str]:
    """Parquet leaf paths that keep min/max statistics in a dedup-layout file: every column
    but the encoded features' (nobody filters on stored ids or positions, and their
    statistics in every row group's footer cost more than they tell)."""
    skip = {c for f in encoded for c in (new_ids_column(f), start_column(f))}
    return [
        f"{fld.name}.list.element" if pa.types.is_list(fld.type) else fld.name
        for fld in schema
        if fld.name not in skip
    ]


def _ids(column: pa.ChunkedArray) -> int:
    """Ids held by the rows of a list column (slices counted by their own rows only)."""
    return sum(int(c.offsets[-1].as_py()) - int(c.offsets[0].as_py()) for c in column.chunks)
