"""The deduplicated table layout: each session's repeated and sliding sparse values stored once.

In a clustered table a session's rows sit together in time order, so many sparse values repeat
the previous row, and a "last N items" history is the previous row's with the newest events
appended. The ``dedup`` layout stores an encoded feature ``f`` as two columns in place of
``f``: ``f__new_ids`` (``list<int64>``, the ids the row appends to the row group's sequence of
``f``) and ``f__start`` (``int32``, where the row's list starts in that sequence; it runs to the
end of the row's own new ids). Features that change on the same rows and never slide (a
session's static features) are stored as one group ``g``: ``g__group_ids`` (every member's list,
or empty for a repeat) and ``g__group_lengths``, so a reader decodes two columns for the group
instead of two per member. docs/layout.md has the encoding, a worked example (run as a test),
groups and how readers use it.

The writer (:func:`encode_row_group`, the same function in both ETL engines) starts afresh at
every session and row group (their first row is stored whole), so any row group decodes on its
own and whole sessions can be reordered; for each row it stores the fewest new ids among small
shifts of the previous list (``MAX_SHIFT``), anything else whole, which is always exact. A row
equals its predecessor iff it appends nothing and keeps its start, which is how readers build
an IKJT without hashing (``recd.tensors.stacked``). Which features to encode:
:func:`stored_fractions` and :func:`choose_encoded` (``MAX_STORED_FRACTION``,
``MAX_SIZE_RATIO``). Hand-written: Parquet's own encodings (dictionary, delta) work on single
values within a column chunk, not on lists that share a suffix with the previous row's.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recd.errors import SchemaError
from recd.schema import SESSION_ID

LAYOUTS = ("plain", "dedup")
LAYOUT_METADATA_KEY = b"recd.table.layout"
LAYOUT_VERSION = 2
"""1: per-feature columns only; 2: groups too (a file without groups is written as 1, which
older readers read)."""
NEW_IDS_SUFFIX = "__new_ids"
START_SUFFIX = "__start"
GROUP_IDS_SUFFIX = "__group_ids"
GROUP_LENGTHS_SUFFIX = "__group_lengths"
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
_LENGTHS_TYPE = pa.list_(pa.field("item", pa.int32(), nullable=False))


def new_ids_column(feature: str) -> str:
    return feature + NEW_IDS_SUFFIX


def start_column(feature: str) -> str:
    return feature + START_SUFFIX


def group_ids_column(group: Sequence[str]) -> str:
    return group[0] + GROUP_IDS_SUFFIX


def group_lengths_column(group: Sequence[str]) -> str:
    return group[0] + GROUP_LENGTHS_SUFFIX


@dataclass(frozen=True, slots=True)
class Layout:
    """How a file stores its sparse features."""

    name: str
    """``plain`` or ``dedup``."""
    encoded: tuple[str, ...] = ()
    """Sparse features stored encoded (dedup layout): as ``__new_ids`` + ``__start``, or in
    one of ``groups``."""
    groups: tuple[tuple[str, ...], ...] = ()
    """Encoded features stored together as ``__group_ids`` + ``__group_lengths`` (named after
    the group's first feature); disjoint, members in the group's column order."""
    columns: tuple[str, ...] = dataclasses.field(default=(), compare=False)
    """The file's columns in their plain form, in order (files with groups: a group's members
    need not be neighbours there; empty otherwise)."""

    def to_json(self) -> str:
        data: dict[str, object] = {
            "layout": self.name,
            "version": 2 if self.groups else 1,
            "encoded": list(self.encoded),
        }
        if self.groups:
            data["groups"] = [list(g) for g in self.groups]
            data["columns"] = list(self.columns)
        return json.dumps(data)

    def group_of(self, feature: str) -> tuple[str, ...] | None:
        """The group storing ``feature``, or None (stored alone or plain)."""
        for group in self.groups:
            if feature in group:
                return group
        return None

    @property
    def singles(self) -> tuple[str, ...]:
        """Encoded features stored alone (``__new_ids`` + ``__start``)."""
        grouped = {f for g in self.groups for f in g}
        return tuple(f for f in self.encoded if f not in grouped)

    def stored_column(self, feature: str) -> str:
        """The file's column holding ``feature``'s ids (its type is the feature's)."""
        group = self.group_of(feature)
        if group is not None:
            return group_ids_column(group)
        return new_ids_column(feature) if feature in self.encoded else feature

    def physical_columns(self, columns: Sequence[str]) -> list[str]:
        """The file's columns holding logical ``columns`` (an encoded feature is two; a
        group's two columns are listed once, where its first requested member is)."""
        out: list[str] = []
        for name in columns:
            group = self.group_of(name)
            if group is not None:
                pair = [group_ids_column(group), group_lengths_column(group)]
                if pair[0] not in out:
                    out.extend(pair)
            elif name in self.encoded:
                out.extend([new_ids_column(name), start_column(name)])
            else:
                out.append(name)
        return out

    def restricted(self, features: Sequence[str]) -> Layout:
        """This layout for a reader of ``features`` only: the encoded ones among them, and the
        groups holding any of them (whole: their columns hold every member)."""
        wanted = set(features)
        return Layout(
            self.name,
            tuple(f for f in features if f in self.encoded),
            tuple(g for g in self.groups if wanted.intersection(g)),
        )


PLAIN = Layout("plain")


def layout_of(schema: pa.Schema, *, source: str) -> Layout:
    """The layout a file's schema declares (no ``recd.table.layout`` metadata: plain)."""
    raw = (schema.metadata or {}).get(LAYOUT_METADATA_KEY)
    if raw is None:
        return PLAIN
    try:
        data = json.loads(raw)
        name, version, encoded = data["layout"], int(data["version"]), data["encoded"]
        groups = tuple(tuple(str(f) for f in g) for g in data.get("groups", []))
        columns = tuple(str(c) for c in data.get("columns", []))
    except (ValueError, KeyError, TypeError) as exc:
        raise SchemaError(f"{source}: unreadable recd.table.layout metadata: {exc}") from exc
    if name not in LAYOUTS or version > LAYOUT_VERSION:
        raise SchemaError(
            f"{source}: table layout {name!r} version {version} is not readable by this recd "
            f"(reads {', '.join(LAYOUTS)} up to version {LAYOUT_VERSION}): upgrade recd"
        )
    grouped = [f for g in groups for f in g]
    if any(not g for g in groups) or len(set(grouped)) != len(grouped):
        raise SchemaError(f"{source}: recd.table.layout groups are empty or overlap: {groups}")
    if not set(grouped) <= set(encoded):
        raise SchemaError(f"{source}: recd.table.layout groups name features that are not encoded")
    layout = Layout(name, tuple(encoded), groups, columns)
    for column in layout.physical_columns(layout.encoded):
        if schema.get_field_index(column) < 0:
            raise SchemaError(f"{source}: dedup layout without column {column!r}")
    return layout


def dedup_schema(
    schema: pa.Schema, features: Sequence[str], groups: Sequence[Sequence[str]] = ()
) -> pa.Schema:
    """The file schema of the dedup layout: each encoded feature's column replaced, in place,
    by its ``__new_ids`` and ``__start`` columns, a group's members by the group's two columns
    (where its first member was); ``recd.table.layout`` added to the metadata."""
    layout = Layout("dedup", tuple(features), tuple(tuple(g) for g in groups), tuple(schema.names))
    fields: list[pa.Field] = []
    for fld in schema:
        group = layout.group_of(fld.name)
        if group is not None:
            if fld.name == group[0]:
                fields.append(pa.field(group_ids_column(group), _IDS_TYPE, nullable=False))
                fields.append(pa.field(group_lengths_column(group), _LENGTHS_TYPE, nullable=False))
        elif fld.name in features:
            fields.append(pa.field(new_ids_column(fld.name), _IDS_TYPE, nullable=False))
            fields.append(pa.field(start_column(fld.name), pa.int32(), nullable=False))
        else:
            fields.append(fld)
    metadata = dict(schema.metadata or {})
    metadata[LAYOUT_METADATA_KEY] = layout.to_json().encode()
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


def range_index(
    starts: np.ndarray, lengths: np.ndarray, *, ends: np.ndarray | None = None
) -> np.ndarray:
    """Positions ``starts[r] .. starts[r] + lengths[r] - 1`` of every r, concatenated (int64):
    fbgemm's ``expand_into_jagged_permute`` where torchrec loaded it (readers), else numpy (the
    ETL). ``ends``: the lengths' int64 running sum from 0 (n + 1), if the caller has it."""
    if "fbgemm_gpu" in sys.modules and len(lengths):
        return _range_index_fbgemm(starts, lengths, ends)
    return range_index_numpy(starts, lengths)


def _range_index_fbgemm(
    starts: np.ndarray, lengths: np.ndarray, ends: np.ndarray | None
) -> np.ndarray:
    import torch  # loaded already: fbgemm_gpu is

    n = len(lengths)
    if ends is None:
        ends = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=ends[1:])
    first = np.empty(n + 1, dtype=np.int64)  # the kernel reads n + 1 input offsets
    first[:n] = starts
    first[n] = 0
    index = torch.ops.fbgemm.expand_into_jagged_permute(
        _identity(n), torch.from_numpy(first), torch.from_numpy(ends), int(ends[-1])
    )
    return index.numpy()


_IDENTITY: list[Any] = []
"""``torch.arange`` of at least the longest permutation asked for so far (or nothing)."""


def _identity(n: int) -> Any:
    """The identity permutation of ``n``: a view of a kept ``torch.arange``."""
    import torch

    if not _IDENTITY or len(_IDENTITY[0]) < n:
        size = max(n, 2 * len(_IDENTITY[0])) if _IDENTITY else n
        _IDENTITY[:] = [torch.arange(size)]
    return _IDENTITY[0][:n]


def range_index_numpy(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """:func:`range_index` in numpy. Built as a running sum of steps: +1 inside a range, and
    at the first position of each non-empty range the jump from the previous range's last
    position. One scatter of a step per range and one ``cumsum``: faster than a ``repeat`` of
    per-range shifts plus an ``arange`` on the readers' short rows."""
    lengths = np.asarray(lengths)
    keep = lengths > 0
    if not keep.all():
        starts, lengths = np.asarray(starts)[keep], lengths[keep]
    n = lengths.astype(np.int64, copy=False)
    total = int(n.sum())
    index = np.ones(total, dtype=np.int64)
    if total:
        first = np.asarray(starts, dtype=np.int64)
        out_start = np.cumsum(n) - n
        index[0] = first[0]
        index[out_start[1:]] = first[1:] - (first[:-1] + n[:-1] - 1)
        np.cumsum(index, out=index)
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


def encode_group(
    offsets: Sequence[np.ndarray], values: Sequence[np.ndarray], first: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Encode the members of one group (each: offsets (N + 1,) from 0, int64 values) of one
    row group. Returns ``(id_offsets, ids, length_offsets, lengths)``: the ``__group_ids``
    and ``__group_lengths`` lists. A row is stored unless it repeats the row before in every
    member; ``first`` marks rows stored whatever they hold (session and row-group starts)."""
    k, n = len(offsets), first.size
    lengths = np.stack([np.diff(o) for o in offsets]) if k else np.zeros((0, n), np.int64)
    stored = first.copy()
    if n > 1:
        for o, v, row_lengths in zip(offsets, values, lengths, strict=True):
            same = np.zeros(n, dtype=bool)
            same[1:] = row_lengths[1:] == row_lengths[:-1]
            same &= ~stored  # rows already stored need no comparison
            test = np.flatnonzero(same & (row_lengths > 0))
            if test.size:  # row r's list against the one just before it (row r - 1's)
                same[test] = _suffix_matches(v, o[test], row_lengths[test])
            stored |= ~same
    rows = np.flatnonzero(stored)
    kept = lengths[:, rows].T  # (stored rows, K): row-major, member after member
    id_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.where(stored, lengths.sum(axis=0), 0), out=id_offsets[1:])
    bases = np.zeros(k, dtype=np.int64)
    np.cumsum([v.size for v in values[:-1]], out=bases[1:])
    starts = (np.stack([o[:-1] for o in offsets])[:, rows].T + bases).reshape(-1)
    everything = np.concatenate(values) if k else np.zeros(0, dtype=np.int64)
    ids = everything[range_index(starts, kept.reshape(-1))]
    length_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.where(stored, k, 0), out=length_offsets[1:])
    return id_offsets, ids, length_offsets, kept.reshape(-1).astype(np.int32)


def encode_row_group(
    table: pa.Table,
    features: Sequence[str],
    *,
    groups: Sequence[Sequence[str]] = (),
    schema: pa.Schema | None = None,
) -> pa.Table:
    """One row group of the table schema (``session_id`` included, clustered order) in the
    dedup layout: each of ``features`` becomes its ``__new_ids`` and ``__start`` columns, the
    members of each of ``groups`` (all of them in ``features``) their group's two columns
    (typed as ``schema``, the file's :func:`dedup_schema`, when given)."""
    layout = Layout("dedup", tuple(features), tuple(tuple(g) for g in groups))
    first = row_starts(table.column(SESSION_ID).to_numpy())
    names: list[str] = []
    columns: list[pa.Array | pa.ChunkedArray] = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        group = layout.group_of(name)
        if group is not None:
            if name == group[0]:
                lists = [_offsets_values(table.column(member)) for member in group]
                id_offsets, ids, length_offsets, lengths = encode_group(
                    [o for o, _ in lists], [v for _, v in lists], first
                )
                names.extend([group_ids_column(group), group_lengths_column(group)])
                columns.append(_list_array(id_offsets, pa.array(ids, pa.int64()), _IDS_TYPE))
                columns.append(
                    _list_array(length_offsets, pa.array(lengths, pa.int32()), _LENGTHS_TYPE)
                )
            continue
        if name not in layout.encoded:
            names.append(name)
            columns.append(column)
            continue
        raw, values = _offsets_values(column)
        new_offsets, new_values, starts = encode_list(raw, values, first)
        names.extend([new_ids_column(name), start_column(name)])
        columns.append(_list_array(new_offsets, pa.array(new_values, pa.int64()), _IDS_TYPE))
        columns.append(pa.array(starts.astype(np.int32)))
    if schema is not None:
        return pa.Table.from_arrays(columns, schema=schema)
    return pa.table(columns, names=names)


def _offsets_values(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A list column's offsets (int64, from 0) and its rows' int64 values."""
    chunk = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    raw = chunk.offsets.to_numpy().astype(np.int64)
    values = chunk.values.to_numpy(zero_copy_only=False)[int(raw[0]) : int(raw[-1])]
    return raw - raw[0], values


def _list_array(offsets: np.ndarray, values: pa.Array, typ: pa.DataType) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values, type=typ)


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
) -> tuple[Layout, dict[str, float]]:
    """(the dedup layout to write, stored fraction of each candidate) on the ETL's sample
    (clustered rows, ``session_id`` included).

    Encoded: every candidate when the user ``listed`` them; else those storing at most
    ``MAX_STORED_FRACTION`` of their ids whose encoded columns take at most
    ``MAX_SIZE_RATIO`` times their plain column's bytes, as ``sizes`` (compressed bytes per
    column of a table, the ETL's own encoding trial) measures them. Grouped: the encoded
    features that change on exactly the same rows of the sample and never slide there
    (:func:`_groups`), two or more together.
    """
    if not candidates:
        return Layout("dedup"), {}
    fractions = stored_fractions(sample, candidates)
    chosen = (
        list(candidates)
        if listed
        else [f for f in candidates if fractions[f] <= MAX_STORED_FRACTION]
    )
    if not chosen:
        return Layout("dedup"), fractions
    singles = encode_row_group(sample.select([SESSION_ID, *chosen]), chosen)
    blocks = _synchronised(singles, chosen)
    groups = _groups(sample, singles, blocks)
    if not listed and sizes is not None:
        grouped = encode_row_group(sample.select([SESSION_ID, *chosen]), chosen, groups=groups)
        plain = sizes(sample.select(chosen))
        encoded = {**sizes(singles), **sizes(grouped)}
        kept: list[str] = []
        # Features that change on the same rows (a session's static features) are decided
        # together, so a reader's group of them is either all encoded or all plain.
        for block in blocks:
            group = next((g for g in groups if g[0] == block[0]), None)
            if group is not None:
                size = encoded[group_ids_column(group)] + encoded[group_lengths_column(group)]
            else:
                size = sum(encoded[new_ids_column(f)] + encoded[start_column(f)] for f in block)
            if size <= MAX_SIZE_RATIO * sum(plain[f] for f in block):
                kept += block
        chosen = [f for f in chosen if f in kept]
        groups = [g for g in groups if g[0] in kept]
    return Layout("dedup", tuple(chosen), tuple(tuple(g) for g in groups)), fractions


def _synchronised(encoded: pa.Table, features: Sequence[str]) -> list[list[str]]:
    """``features`` in blocks of those whose rows change (append ids or move their start) on
    exactly the same rows of an encoded table."""
    blocks: dict[bytes, list[str]] = {}
    for feature in features:
        blocks.setdefault(np.packbits(_changed(encoded, feature)).tobytes(), []).append(feature)
    return list(blocks.values())


def _changed(encoded: pa.Table, feature: str) -> np.ndarray:
    """(N,) bool: the rows where ``feature``'s encoding appends ids or moves its start."""
    ids = encoded.column(new_ids_column(feature)).combine_chunks()
    start = encoded.column(start_column(feature)).to_numpy()
    return (np.diff(ids.offsets.to_numpy()) > 0) | np.r_[True, start[1:] != start[:-1]]


def _groups(
    sample: pa.Table, encoded: pa.Table, blocks: Sequence[Sequence[str]]
) -> list[list[str]]:
    """The blocks of two or more features none of which slides on the sample: every row that
    changes stores its whole list (a group stores changed rows whole; a sliding history
    stores one id per row alone)."""
    out = []
    for block in blocks:
        if len(block) < 2:
            continue
        if all(
            _ids(encoded.column(new_ids_column(f))) == _changed_ids(sample, encoded, f)
            for f in block
        ):
            out.append(list(block))
    return out


def _changed_ids(sample: pa.Table, encoded: pa.Table, feature: str) -> int:
    """Ids of ``feature`` on the rows where its encoding appends ids or moves its start."""
    lengths = pc.list_value_length(sample.column(feature)).to_numpy(zero_copy_only=False)
    return int(lengths[_changed(encoded, feature)].sum())


def statistics_columns(schema: pa.Schema) -> list[str]:
    """Parquet leaf paths that keep min/max statistics in a dedup-layout file (``schema``, a
    :func:`dedup_schema`): every column but the encoded features' (nobody filters on stored
    ids or positions, and their statistics in every row group's footer cost more than they
    tell)."""
    layout = layout_of(schema, source="the file schema")
    skip = set(layout.physical_columns(layout.encoded))
    return [
        f"{fld.name}.list.element" if pa.types.is_list(fld.type) else fld.name
        for fld in schema
        if fld.name not in skip
    ]


def _ids(column: pa.ChunkedArray) -> int:
    """Ids held by the rows of a list column (slices counted by their own rows only)."""
    return sum(int(c.offsets[-1].as_py()) - int(c.offsets[0].as_py()) for c in column.chunks)
