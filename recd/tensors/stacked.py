"""Reading the dedup layout (``recd.table.layout``): the readers' in-memory form and the gathers that
turn it into plain lists, KJTs and IKJTs without hashing.

When a unit (one row group) is read, every encoded feature's rows are turned into positions
in one id buffer per unit (:func:`stack_unit`)::

    __recd_ids      list<int64>              every row empty; the child array is the unit's
                                             buffer: each feature's stored ids, feature after
                                             feature (a group's stored lists, once)
    __recd_starts   fixed_size_list<int32>[K] where row i's list of feature k starts in the
                                             buffer, for the K features
    __recd_lengths  fixed_size_list<int32>[K] and how long it is

(the K features, in order, are listed by the ``recd.encoded`` metadata of ``__recd_ids``).
Two K-wide columns rather than two per feature: a batch's positions are then one (n, K)
matrix each, zero-copy, and Arrow's take / slice / concat per batch touch 3 columns, not
2K + 1 (on rm1-like, 46 encoded features). Row i's list of f is
``buffer[start_i : start_i + len_i]``: a repeat points at the same ids
as its predecessor, a sliding history at the sequence one id further. Positions are
absolute, so rows can be permuted (the session shuffle) and sliced (batches) freely; an
Arrow slice of ``__recd_ids`` keeps the whole buffer as its child. A batch spanning several
units holds one chunk per unit; they are never combined (that would cut the buffers).

Per batch, building the KJT of the encoded features is one gather over all of them, and an
IKJT of a group is: a row is distinct iff some key's (start, length) differs from the row
before (or it starts a chunk); ``inverse_lookup`` is the running count of distinct rows;
their lists are gathered once, key-major. The per-feature work is zero-copy views: the
numpy passes run over all features at once (numpy work per feature cost more than the
Parquet decoding it saved).

Plain-layout units of a table with dedup ones take the same form (each row's list is its own
ids), so mixed tables read as one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recd.errors import BadRowError, SchemaError
from recd.table.layout import (
    Layout,
    group_ids_column,
    group_lengths_column,
    layout_of,
    new_ids_column,
    range_index,
    start_column,
)

IDS = "__recd_ids"
STARTS = "__recd_starts"
LENGTHS = "__recd_lengths"
STACKED_COLUMNS = (IDS, STARTS, LENGTHS)
"""The in-memory columns holding a batch's stacked features, in order."""
FEATURES_KEY = b"recd.encoded"


# ------------------------------------------------------------------------- one unit
@dataclass(frozen=True, slots=True)
class StoredOps:
    """Sparse preprocessing of one stacked feature, run on its stored ids
    (``recd.reader.stored_ops``): ``id mod m`` for each of ``moduli`` in order, then keep the
    last ``cap`` ids of each row (the two commute)."""

    moduli: tuple[int, ...] = ()
    cap: int | None = None


def stack_unit(
    table: pa.Table,
    features: Sequence[str],
    stored: Sequence[str],
    *,
    groups: Sequence[Sequence[str]] = (),
    path: str,
    first_row: int = 0,
    ops: Mapping[str, StoredOps] | None = None,
    ops_seconds: list[float] | None = None,
    plain: Collection[str] = (),
) -> pa.Table:
    """A unit's rows as read with every one of ``features`` replaced by the stacked in-memory
    form (module docstring), and ``ops`` applied to the features they name: moduli over each
    feature's ids in the buffer, caps on its rows' (start, length). The seconds the ops took
    are appended to ``ops_seconds``.

    The features in ``plain`` (the ones a reader turns into plain KJT rows) are gathered
    instead to their own ``list<int64>`` columns, after the other columns: one gather per
    unit over all of them, straight from the positions. A plain one the file stores plain
    and no op names keeps its column as read. With every feature in ``plain`` the result
    has no stacked columns.

    How the unit's file stores them: ``stored`` as ``__new_ids`` + ``__start``, the members
    of ``groups`` (whole groups, as the file declares them) in their group's two columns, the
    rest of ``features`` as plain ``list<int64>`` columns.

    Must run before rows are reordered (``__start`` counts in the file's order). BadRowError
    names the file, row (``first_row`` + index) and column of a row whose list would reach
    outside its row group's sequence (a corrupt file).
    """
    ops = ops or {}
    member = {f for g in groups for f in g}
    untouched = {f for f in plain if f not in stored and f not in member and f not in ops}
    features = [f for f in features if f not in untouched]
    n = table.num_rows
    unit = _positions(
        table, features, stored, groups=groups, path=path, first_row=first_row, plain=plain
    )
    if ops:
        t0 = time.perf_counter()
        _apply_ops(unit, features, ops)
        if ops_seconds is not None:
            ops_seconds.append(time.perf_counter() - t0)
    kept = [i for i, c in enumerate(table.column_names) if c not in unit.dropped]
    arrays: list[pa.Array | pa.ChunkedArray] = [table.column(i) for i in kept]
    fields = [table.schema.field(i) for i in kept]
    gathered = [j for j, f in enumerate(features) if f in plain]
    if gathered:
        for j, column in zip(gathered, _gather_plain(unit, gathered, features), strict=True):
            fields.append(pa.field(features[j], SPARSE_LIST))
            arrays.append(column)
    rest = [j for j, f in enumerate(features) if f not in plain]
    if rest:
        fields += list(_stacked_schema([features[j] for j in rest]))
        arrays.append(_holder(unit.buffer, n))
        for matrix in (unit.starts, unit.lengths):  # (K, n) -> rows of K
            block = matrix if len(rest) == len(features) else matrix[rest]
            arrays.append(
                pa.FixedSizeListArray.from_arrays(pa.array(block.T.reshape(-1)), len(rest))
            )
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


@dataclass(frozen=True, slots=True)
class _UnitPositions:
    """Where every row's list of each stacked feature lies in the unit's id buffer."""

    buffer: np.ndarray
    """The unit's ids: each feature's stored ids, feature after feature (a group's once)."""
    parts: list[_Part]
    starts: np.ndarray
    """(K, n) int32: where row i's list of feature k starts in ``buffer`` (rows of the
    features in ``members``: unset)."""
    lengths: np.ndarray
    """(K, n) int32: and how long it is."""
    members: dict[int, _MemberRows]
    """Group members gathered to plain rows, by feature index: kept per stored row."""
    dropped: set[str]
    """The file columns these replace."""


@dataclass(slots=True)
class _MemberRows:
    """One group member's lists, per stored row of the group: row i's list is stored row
    ``rank[i]``'s, ``buffer[starts[r] : starts[r] + lengths[r]]``."""

    starts: np.ndarray
    """(stored rows,) int32."""
    lengths: np.ndarray
    """(stored rows,) int32."""
    rank: np.ndarray
    """(n,) each row's stored row (itself, or the last stored row before it)."""


def _positions(
    table: pa.Table,
    features: Sequence[str],
    stored: Sequence[str],
    *,
    groups: Sequence[Sequence[str]],
    path: str,
    first_row: int,
    plain: Collection[str] = (),
) -> _UnitPositions:
    """:func:`stack_unit`'s positions, before any op. Group members in ``plain`` are kept per
    stored row (``_UnitPositions.members``), not expanded to every row."""
    n, k = table.num_rows, len(features)
    member = {f: tuple(g) for g in groups for f in g}  # feature -> its group
    index = {f: j for j, f in enumerate(features)}
    alone = [j for j, f in enumerate(features) if f not in member]
    # (K, n) views of (K, n + 16): with a row stride of a power of two (n = 8192) the
    # transpose into rows of K thrashes the cache
    starts = np.empty((k, n + 16), dtype=np.int32)[:, :n]
    lengths = np.empty((k, n + 16), dtype=np.int32)[:, :n]
    parts: list[_Part] = []
    drop: list[str] = []
    columns = dict(zip(table.column_names, table.columns, strict=True))  # one lookup each
    # Features alone: int32 (K, n) matrices, every pass over all of them at once (per-feature
    # numpy work cost more than the Parquet decoding the layout saves).
    ends = np.empty((len(alone), n + 1), dtype=np.int32)
    local = np.empty((len(alone), n), dtype=np.int32)
    for i, j in enumerate(alone):
        feature = features[j]
        name = new_ids_column(feature) if feature in stored else feature
        array = _one_chunk(columns[name])
        ends[i] = array.offsets.to_numpy()
        lo, hi = int(ends[i, 0]), int(ends[i, -1])
        parts.append(_Part(array.values.slice(lo, hi - lo).to_numpy(zero_copy_only=False), (j,)))
        drop.append(name)
        if feature in stored:
            local[i] = _one_chunk(columns[start_column(feature)]).to_numpy()
            drop.append(start_column(feature))
        else:  # a plain list starts where it was appended
            local[i] = ends[i, :-1] - lo
    ends -= ends[:, :1]  # positions in each feature's sequence
    run = ends[:, 1:] - local
    if n and alone and (int(local.min()) < 0 or int(run.min()) < 0):
        i, row = (int(x[0]) for x in np.nonzero((local < 0) | (run < 0)))
        raise BadRowError(
            path,
            first_row + row,
            start_column(features[alone[i]]),
            "the row's list would start outside its row group's ids (corrupt dedup layout)",
        )
    base = np.zeros(len(alone), dtype=np.int64)
    np.cumsum([part.ids.size for part in parts[:-1]], out=base[1:])
    starts[alone] = local + base[:, None].astype(np.int32)  # positions in the unit's buffer
    lengths[alone] = run
    offset = int(base[-1]) + parts[-1].ids.size if parts else 0
    members: dict[int, _MemberRows] = {}
    for group in dict.fromkeys(member[f] for f in features if f in member):
        ids, stored_lengths, stored_starts, rank = _group_positions(
            _one_chunk(columns[group_ids_column(group)]),
            _one_chunk(columns[group_lengths_column(group)]),
            len(group),
            path=path,
            first_row=first_row,
            column=group_lengths_column(group),
        )
        wanted = [index.get(f, -1) for f in group]
        parts.append(_Part(ids, tuple(wanted), stored_lengths))
        for i, j in enumerate(wanted):
            if j < 0:
                continue
            if features[j] in plain:
                members[j] = _MemberRows(stored_starts[i] + offset, stored_lengths[i].copy(), rank)
            else:
                np.add(stored_starts[i][rank], offset, out=starts[j])
                lengths[j] = stored_lengths[i][rank]
        offset += ids.size
        drop += [group_ids_column(group), group_lengths_column(group)]
    buffer = np.concatenate([part.ids for part in parts]) if parts else np.zeros(0, np.int64)
    if buffer.size > np.iinfo(np.int32).max:
        raise SchemaError(f"{path}: a row group holds more than 2**31 ids of stacked features")
    return _UnitPositions(
        buffer.astype(np.int64, copy=False), parts, starts, lengths, members, set(drop)
    )


def _gather_plain(
    unit: _UnitPositions, keys: Sequence[int], features: Sequence[str]
) -> list[pa.Array]:
    """The plain ``list<int64>`` column of each of ``keys``. The features with (K, n)
    positions: one index and one take over all of them, key after key, then a zero-copy
    slice per key. A group member: its stored rows' lists gathered, then taken by rank (a
    member whose stored lists all have one length, as a user or context feature of length
    1: one 2-d take, no index)."""
    n = unit.starts.shape[1]
    out: dict[int, pa.Array] = {}
    rows = [j for j in keys if j not in unit.members]
    if rows:
        s, m = (unit.starts[rows].reshape(-1), unit.lengths[rows].reshape(-1))
        ends = np.zeros(s.size + 1, dtype=np.int64)
        np.cumsum(m, out=ends[1:])
        values = np.take(unit.buffer, range_index(s, m, ends=ends))
        for i, j in enumerate(rows):
            lo, hi = int(ends[i * n]), int(ends[(i + 1) * n])
            offsets = ends[i * n : (i + 1) * n + 1] - lo
            out[j] = _list_column(offsets, values[lo:hi], features[j])
    out.update(_gather_members(unit, [j for j in keys if j in unit.members], features))
    return [out[j] for j in keys]


def _gather_members(
    unit: _UnitPositions, keys: Sequence[int], features: Sequence[str]
) -> dict[int, pa.Array]:
    """The plain columns of group members kept per stored row (:func:`_gather_plain`).
    Members of one group whose stored lists all have the same length w (a user or context
    feature: w = 1) are taken together: their (members, stored rows, w) ids, one take by
    rank; any other member alone, through an index."""
    buffer, n = unit.buffer, unit.starts.shape[1]
    out: dict[int, pa.Array] = {}
    together: dict[tuple[int, int], list[int]] = {}  # (group's rank, w) -> members
    for j in keys:
        rows = unit.members[j]
        width = int(rows.lengths[0]) if rows.lengths.size else 0
        if rows.lengths.size and not (rows.lengths != width).any():
            together.setdefault((id(rows.rank), width), []).append(j)
            continue
        stored = np.take(buffer, range_index(rows.starts, rows.lengths))
        lengths = rows.lengths[rows.rank]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        within = np.zeros(rows.lengths.size, dtype=np.int64)  # where each stored list starts
        np.cumsum(rows.lengths[:-1], out=within[1:])
        values = np.take(stored, range_index(within[rows.rank], lengths))
        out[j] = _list_column(offsets, values, features[j])
    for (_, width), members in together.items():
        rank = unit.members[members[0]].rank
        starts = np.stack([unit.members[j].starts for j in members])  # (m, stored rows)
        index = starts if width == 1 else starts[:, :, None] + np.arange(width, dtype=np.int32)
        values = np.take(np.take(buffer, index), rank, axis=1).reshape(len(members), -1)
        offsets = _arrow_offsets(np.arange(n + 1, dtype=np.int64) * width, features[members[0]])
        for i, j in enumerate(members):  # values: (m, n * w)
            out[j] = _list_column(offsets, values[i], features[j])
    return out


def _list_column(offsets: np.ndarray | pa.Array, values: np.ndarray, feature: str) -> pa.Array:
    """A ``list<int64>`` array from ``offsets`` (int64 from 0, or an int32 Arrow array made
    by :func:`_arrow_offsets`) and its ids."""
    if isinstance(offsets, np.ndarray):
        offsets = _arrow_offsets(offsets, feature)
    return pa.ListArray.from_arrays(offsets, pa.array(values))


def _arrow_offsets(offsets: np.ndarray, feature: str) -> pa.Array:
    """int64 list offsets (from 0) as Arrow's int32 ones."""
    if int(offsets[-1]) > _INT32_MAX:
        raise SchemaError(f"{feature}: a row group holds more than 2**31 of its ids")
    return pa.array(offsets.astype(np.int32))


_INT32_MAX = 2**31 - 1


@dataclass(slots=True)
class _Part:
    """One stretch of a unit's id buffer: one feature's sequence, or a group's ids (its
    stored rows' lists, member after member)."""

    ids: np.ndarray
    features: tuple[int, ...]
    """Indices (into the stacked features) of the features whose ids these are; for a group,
    one per member, -1 for a member the reader does not read."""
    member_lengths: np.ndarray | None = None
    """A group's (members, stored rows) lengths, in the order of ``ids`` (None: one
    feature)."""


def _group_positions(
    ids: pa.Array, lengths: pa.Array, k: int, *, path: str, first_row: int, column: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, stored lengths, stored starts, rank) of one group's members in one row group:
    the group's ids, the (k, stored rows) int32 lengths and starts in the ids of its stored
    rows' lists, and each row's stored row (itself, or, for a repeat, the last stored row
    before it). BadRowError for a row that is neither a stored row nor a repeat."""
    id_offsets = ids.offsets.to_numpy()
    lo, hi = int(id_offsets[0]), int(id_offsets[-1])
    values = ids.values.slice(lo, hi - lo).to_numpy(zero_copy_only=False)
    length_offsets = lengths.offsets.to_numpy()
    counts = np.diff(length_offsets)
    stored = counts > 0
    flat = lengths.values.slice(
        int(length_offsets[0]), int(length_offsets[-1] - length_offsets[0])
    ).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(stored)
    first = id_offsets[rows]  # where each stored row's ids start (and end: below)
    if not _group_is_sound(counts, stored, flat, id_offsets[rows + 1] - first, hi - lo, k):
        row = _first_bad_group_row(counts, stored, flat, np.diff(id_offsets), k)
        raise BadRowError(
            path,
            first_row + row,
            column,
            f"a row of a group of {k} features must store {k} lengths adding up to its ids, "
            "or repeat the row before it with no ids (corrupt dedup layout)",
        )
    member_lengths = flat.reshape(-1, k).T
    within = np.cumsum(member_lengths, axis=0, dtype=np.int32) - member_lengths  # exclusive
    stored_starts = within + (first - lo).astype(np.int32)
    rank = np.cumsum(stored) - 1
    return values, member_lengths, stored_starts, rank


def _group_is_sound(
    counts: np.ndarray,
    stored: np.ndarray,
    flat: np.ndarray,
    appended: np.ndarray,
    total: int,
    k: int,
) -> bool:
    """Whole-array checks of one group's row group: every row stores k lengths or none, the
    first row stores, no length is negative, a stored row's lengths add up to the ids it
    ``appended`` and the stored rows' ids are all of the ``total`` (a repeat has none:
    offsets never decrease)."""
    if flat.size != int(np.count_nonzero(counts)) * k or int(counts.max(initial=0)) > k:
        return False
    if counts.size and not stored[0]:
        return False
    if flat.size and int(flat.min()) < 0:
        return False
    sums = flat.reshape(-1, k).sum(axis=1, dtype=np.int64)
    return bool(np.array_equal(sums, appended) and int(appended.sum()) == total)


def _first_bad_group_row(
    counts: np.ndarray, stored: np.ndarray, flat: np.ndarray, appended: np.ndarray, k: int
) -> int:
    """The first row :func:`_group_is_sound` rejects."""
    bad = (counts != 0) & (counts != k)
    if counts.size:
        bad[0] |= not stored[0]  # a row group starts with a stored row
    if flat.size % k == 0 and flat.size:
        member_lengths = flat.reshape(-1, k).T
        bad[stored] |= (member_lengths < 0).any(axis=0)
        bad[stored] |= member_lengths.sum(axis=0) != appended[stored]
    bad[~stored] |= appended[~stored] != 0
    return int(np.flatnonzero(bad)[0])


def _apply_ops(unit: _UnitPositions, features: Sequence[str], ops: Mapping[str, StoredOps]) -> None:
    """``stack_unit``'s ops, in place: one ``remainder`` per modulus over each run of
    consecutive parts whose features share their moduli (a group's members with different
    moduli: one per member's ids), and one pass over the (K, n) positions of the capped
    features (a member kept per stored row: over its stored rows)."""
    buffer, parts = unit.buffer, unit.parts
    moduli = [ops[f].moduli if f in ops else () for f in features]
    runs: list[tuple[int, int, tuple[int, ...]]] = []  # (lo, hi, moduli) in buffer order
    lo = 0
    for part in parts:
        hi = lo + part.ids.size
        mine = {moduli[j] for j in part.features if j >= 0}
        if len(mine) <= 1:
            m = mine.pop() if mine else ()
            if runs and runs[-1][2] == m and runs[-1][1] == lo:
                runs[-1] = (runs[-1][0], hi, m)
            else:
                runs.append((lo, hi, m))
        else:  # members of one group with different moduli: by each id's member
            assert part.member_lengths is not None
            stored = part.member_lengths
            owner = np.repeat(
                np.tile(np.arange(len(part.features)), stored.shape[1]), stored.T.reshape(-1)
            )
            segment = buffer[lo:hi]
            for i, j in enumerate(part.features):
                if j >= 0 and moduli[j]:
                    mask = owner == i
                    picked = segment[mask]
                    for modulus in moduli[j]:
                        np.remainder(picked, modulus, out=picked)
                    segment[mask] = picked
        lo = hi
    for lo, hi, m in runs:
        segment = buffer[lo:hi]
        for modulus in m:
            np.remainder(segment, modulus, out=segment)
    caps = [(k, ops[f].cap) for k, f in enumerate(features) if f in ops and ops[f].cap is not None]
    for k, c in caps:
        if k in unit.members:
            rows = unit.members[k]
            drop = np.maximum(rows.lengths - c, 0)
            rows.starts += drop
            rows.lengths -= drop
    caps = [(k, c) for k, c in caps if k not in unit.members]
    if caps:
        rows_ = np.array([k for k, _ in caps])
        cap = np.array([c for _, c in caps], dtype=np.int32)[:, None]
        drop = np.maximum(unit.lengths[rows_] - cap, 0)
        unit.starts[rows_] += drop
        unit.lengths[rows_] -= drop


def take_rows(table: pa.Table, order: pa.Array) -> pa.Table:
    """``table.take(order)`` keeping a stacked unit's id buffer whole."""
    i = table.schema.get_field_index(IDS)
    if i < 0:
        return table.take(order)
    field, buffer = table.schema.field(i), table.column(i)
    taken = table.remove_column(i).take(order)
    return taken.add_column(i, field, buffer)  # its rows are all empty: any order is the same


def combine_stacked(table: pa.Table) -> pa.Table:
    """``table`` (rows of several units) with its stacked columns in one chunk: the units' id
    buffers concatenated and each unit's starts moved past the ids before it, so that rows of
    different units can be permuted together (a shuffle window). Other columns are untouched."""
    stacked = read_stacked(table)
    if stacked is None or len(stacked.chunks) < 2:
        return table
    sizes = np.array([c.buffer.size for c in stacked.chunks], dtype=np.int64)
    if int(sizes.sum()) > _INT32_MAX:
        raise SchemaError(
            f"a shuffle window holds {int(sizes.sum()):,} ids of stacked features, more than "
            "2**31: lower reader.shuffle_window"
        )
    shifts = np.cumsum(sizes) - sizes
    starts = np.concatenate(
        [
            c.starts.astype(np.int64) + int(shift)
            for c, shift in zip(stacked.chunks, shifts, strict=True)
        ]
    ).astype(np.int32)
    lengths = np.concatenate([c.lengths for c in stacked.chunks])
    buffer = np.concatenate([c.buffer for c in stacked.chunks])
    k = len(stacked.features)
    i = table.schema.get_field_index(IDS)
    arrays = [
        _holder(buffer, starts.shape[0]),
        pa.FixedSizeListArray.from_arrays(pa.array(starts.reshape(-1)), k),
        pa.FixedSizeListArray.from_arrays(pa.array(lengths.reshape(-1)), k),
    ]
    for j, array in enumerate(arrays):
        table = table.set_column(i + j, table.schema.field(i + j), pa.chunked_array([array]))
    return table


def _holder(buffer: np.ndarray, rows: int) -> pa.Array:
    """``rows`` empty lists whose child array is ``buffer``."""
    return pa.ListArray.from_arrays(
        pa.array(np.zeros(rows + 1, dtype=np.int32)), pa.array(buffer, pa.int64())
    )


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


# ------------------------------------------------------------------------- one batch
@dataclass(frozen=True, slots=True)
class StackedChunk:
    """One unit's rows of a batch: row i of feature k is
    ``buffer[starts[i, k] : starts[i, k] + lengths[i, k]]``."""

    buffer: np.ndarray
    starts: np.ndarray
    """(n, K) int32 (a zero-copy view of the batch's column)."""
    lengths: np.ndarray

    @property
    def num_rows(self) -> int:
        return self.starts.shape[0]

    def columns(self, keys: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(starts, lengths) of ``keys``, each (n, len(keys)); views for a run of keys."""
        if len(keys) and list(keys) == list(range(keys[0], keys[0] + len(keys))):
            cols = slice(keys[0], keys[0] + len(keys))
            return self.starts[:, cols], self.lengths[:, cols]
        return self.starts[:, keys], self.lengths[:, keys]

    def key_major(self, keys: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(starts, lengths) of ``keys``, each (len(keys), n): key after key."""
        s, n = self.columns(keys)
        return s.T, n.T


@dataclass(frozen=True, slots=True)
class Stacked:
    """The encoded features of a batch: their names (K) and one chunk per unit."""

    features: list[str]
    chunks: list[StackedChunk]

    def index(self, names: Sequence[str]) -> list[int]:
        return [self.features.index(n) for n in names]


def read_stacked(batch: pa.Table | pa.RecordBatch) -> Stacked | None:
    """The stacked features of a batch's rows, or None when it holds none."""
    i = batch.schema.get_field_index(IDS)
    if i < 0:
        return None
    meta = batch.schema.field(i).metadata or {}
    if FEATURES_KEY not in meta:
        raise SchemaError(f"column {IDS!r} without its {FEATURES_KEY.decode()} metadata")
    features = json.loads(meta[FEATURES_KEY])
    # The stacked columns follow the holder (ReadPlan.batch_columns): by position, not name,
    # and a record batch per unit (its columns share the unit's rows) rather than per column.
    k = len(features)
    names = batch.schema.names
    end = i + len(STACKED_COLUMNS)
    width = pa.list_(pa.int32(), k)
    if tuple(names[i:end]) != STACKED_COLUMNS or any(
        not batch.schema.field(j).type.equals(width) for j in range(i + 1, end)
    ):
        raise SchemaError(f"the stacked columns after {IDS!r} are not {features}'s")
    part = batch.select(range(i, end))
    units = part.to_batches() if isinstance(part, pa.Table) else [part]
    chunks = []
    for unit in units:
        if unit.num_rows == 0:
            continue
        starts, lengths = (
            unit.column(j).flatten().to_numpy().reshape(-1, k) for j in (1, 2)
        )  # flatten(): the unit's rows only, even of a sliced column
        chunks.append(
            StackedChunk(buffer=unit.column(0).values.to_numpy(), starts=starts, lengths=lengths)
        )
    return Stacked(features=features, chunks=chunks)


def changed_rows(stacked: Stacked, keys: Sequence[int]) -> np.ndarray:
    """(B,) bool: rows whose list differs from the row before in some of ``keys`` (indices
    into ``stacked.features``); every chunk's first row counts as changed."""
    parts = []
    for chunk in stacked.chunks:
        new = np.ones(chunk.num_rows, dtype=bool)
        if new.size > 1:
            s, n = chunk.columns(keys)
            new[1:] = ((s[1:] != s[:-1]) | (n[1:] != n[:-1])).any(axis=1)
        parts.append(new)
    return np.concatenate(parts) if len(parts) != 1 else parts[0]


def gather(
    stacked: Stacked,
    keys: Sequence[int],
    rows: np.ndarray | None = None,
    *,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, ids) of ``keys`` x batch ``rows`` (increasing; None: all), key-major like a
    KJT: key ``keys[0]``'s rows first. One gather per chunk, whatever the number of keys.
    ``out``: an int64 array of exactly the ids' size to gather into (returned as the ids)."""
    picks, row = [], 0
    for chunk in stacked.chunks:
        size = chunk.num_rows
        s, n = chunk.key_major(keys)  # (K, n)
        if rows is not None:
            lo, hi = np.searchsorted(rows, [row, row + size])
            local = rows[lo:hi] - row
            s, n = s[:, local], n[:, local]
        picks.append((chunk.buffer, s, n))
        row += size
    if len(picks) == 1:
        buffer, s, n = picks[0]
        lengths = n.reshape(-1).astype(np.int64)
        return lengths, np.take(buffer, range_index(s.reshape(-1), lengths), out=out)
    lengths = np.concatenate([n for _, _, n in picks], axis=1).reshape(-1).astype(np.int64)
    values = np.empty(int(lengths.sum()), dtype=np.int64) if out is None else out
    # Key k's ids are key k's rows of chunk 0, then of chunk 1, ...: each (key, chunk) part
    # is one contiguous slice of the output, and of the chunk's own key-major index.
    per_key = lengths.reshape(len(keys), -1)
    key_starts = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(per_key.sum(axis=1), out=key_starts[1:])
    dest = key_starts[:-1].copy()
    for buffer, s, n in picks:
        part = n.astype(np.int64)  # (K, m)
        index = range_index(s.reshape(-1), part.reshape(-1))
        sizes = part.sum(axis=1)
        lo = 0
        for k, size in enumerate(sizes.tolist()):
            np.take(buffer, index[lo : lo + size], out=values[dest[k] : dest[k] + size])
            dest[k] += size
            lo += size
    return lengths, values


def expand_stacked(table: pa.Table, keep: Collection[str]) -> pa.Table:
    """``table`` (rows holding stacked features, one unit or a batch of several) with every
    stacked feature not in ``keep`` gathered back to its own plain ``list<int64>`` column,
    appended after the other columns; the stacked columns then hold ``keep``'s features only
    (none at all when no stacked feature is kept).

    The reader runs this once per unit for the features it reads as plain KJT rows (every
    encoded feature outside a group whose IKJT it builds from the positions): one gather per
    unit over all of them, and each batch's KJT is then Arrow's concatenation of plain
    columns, as from the plain layout (a gather per batch cost several times the conversion
    of the plain layout's batches).
    """
    stacked = read_stacked(table)
    if stacked is None:
        return table
    expand = [f for f in stacked.features if f not in keep]
    if not expand:
        return table
    kept = [f for f in stacked.features if f in keep]
    n = table.num_rows
    lengths, values = gather(stacked, stacked.index(expand))
    ends = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=ends[1:])
    i = table.schema.get_field_index(IDS)
    out = table.select([c for c in range(table.num_columns) if c not in range(i, i + 3)])
    for k, feature in enumerate(expand):
        lo, hi = int(ends[k * n]), int(ends[(k + 1) * n])
        offsets = ends[k * n : (k + 1) * n + 1] - lo  # each feature's ids alone
        out = out.append_column(
            pa.field(feature, SPARSE_LIST), _list_column(offsets, values[lo:hi], feature)
        )
    if not kept:
        return out
    columns = [kept.index(f) if f in keep else -1 for f in stacked.features]
    picked = [j for j, c in enumerate(columns) if c >= 0]
    chunks = [
        pa.record_batch(
            [
                _holder(chunk.buffer, chunk.num_rows),
                *(
                    pa.FixedSizeListArray.from_arrays(
                        pa.array(np.ascontiguousarray(m[:, picked]).reshape(-1)), len(kept)
                    )
                    for m in (chunk.starts, chunk.lengths)
                ),
            ],
            schema=_stacked_schema(kept),
        )
        for chunk in stacked.chunks
    ]
    holder = pa.Table.from_batches(chunks, schema=_stacked_schema(kept))
    for name, field in zip(STACKED_COLUMNS, holder.schema, strict=True):
        out = out.append_column(field, holder.column(name))
    return out


SPARSE_LIST = pa.list_(pa.int64())


def _stacked_schema(features: Sequence[str]) -> pa.Schema:
    """The schema of the stacked columns holding ``features``."""
    meta = {FEATURES_KEY: json.dumps(list(features)).encode()}
    width = pa.list_(pa.int32(), len(features))
    return pa.schema(
        [
            pa.field(IDS, SPARSE_LIST, metadata=meta),
            pa.field(STARTS, width),
            pa.field(LENGTHS, width),
        ]
    )


# ------------------------------------------------------------------------- whole files
def decode_table(
    table: pa.Table,
    encoded: Sequence[str],
    *,
    groups: Sequence[Sequence[str]] = (),
    path: str = "<table>",
) -> pa.Table:
    """``table`` (one row group of a dedup-layout file as read, any of its columns; the
    file's ``encoded`` features and ``groups``) with every encoded feature back in its plain
    ``list<int64>`` column (where its ``__new_ids`` column was; a group's members, in order,
    where the group's columns were)."""
    layout = Layout("dedup", tuple(encoded), tuple(tuple(g) for g in groups))
    present = set(table.column_names)
    encoded = [f for f in layout.encoded if layout.stored_column(f) in present]
    groups = [g for g in layout.groups if group_ids_column(g) in present]
    plain = stack_unit(table, encoded, layout.singles, groups=groups, path=path, plain=set(encoded))
    names: list[str] = []
    for name in table.column_names:
        features = _logical(name, layout)
        names.extend([name] if features is None else features)
    return plain.select(names)


def _logical(name: str, layout: Layout) -> list[str] | None:
    """The features a file column holds in plain form: None for a column that is its own
    (not an encoded feature's), [] for the second column of an encoded feature or group."""
    for group in layout.groups:
        if name == group_ids_column(group):
            return list(group)
        if name == group_lengths_column(group):
            return []
    for feature in layout.singles:
        if name == new_ids_column(feature):
            return [feature]
        if name == start_column(feature):
            return []
    return None


def read_plain(path: str, columns: Sequence[str] | None = None) -> pa.Table:
    """A table file's rows (``columns`` of them, by logical name, in that order) in the plain
    form, whatever its layout: a dedup-layout file is decoded row group by row group."""
    file = pq.ParquetFile(path)
    layout = layout_of(file.schema_arrow, source=path)
    if not layout.encoded:
        return file.read(columns=None if columns is None else list(columns))
    wanted = list(columns) if columns is not None else _logical_names(file.schema_arrow, layout)
    physical = layout.physical_columns(wanted)

    def decode(rows: pa.Table) -> pa.Table:
        return decode_table(rows, layout.encoded, groups=layout.groups, path=path)

    parts = [
        decode(file.read_row_group(i, columns=physical)) for i in range(file.num_row_groups)
    ] or [decode(file.schema_arrow.empty_table().select(physical))]
    return pa.concat_tables(parts).select(wanted)


def _logical_names(schema: pa.Schema, layout: Layout) -> list[str]:
    if layout.columns:
        return list(layout.columns)
    names: list[str] = []
    for name in schema.names:
        features = _logical(name, layout)
        names.extend([name] if features is None else features)
    return names
