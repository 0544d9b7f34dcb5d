"""The catalogue of a table that has none: a plain Parquet table written by another tool.

Tables written by ``recd etl`` carry their catalogue in the Parquet schema metadata; the
trainer builds its model from it (table sizes from each sparse feature's cardinality, the
sequence groups of the RM1-like model from its history features, their length). A table
from pandas, Spark or DuckDB has none, so the reader config lists its features
(``reader.labels``, ``dense``, ``sparse``, and ``history_features`` for the sparse ones that
are histories) and this module measures what the model needs from the files:

* **cardinality** of a sparse feature = its largest id + 1, from the row groups' Parquet
  statistics (footers only) where every row group has them, else from one scan of the column;
* **max_length** of a history feature = its longest list (one scan of the column; histories
  only: other features' lengths are not needed).

Everything else takes the catalogue defaults (the generator statistics ``recd analyze``'s
analytic model uses are not estimated: its measured factors do not need them).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recd.errors import SchemaError
from recd.schema import Catalogue, DenseFeature, SessionModel, SparseFeature, SparseKind

INFERRED_NAME = "inferred"
"""``Catalogue.name`` of an inferred catalogue."""


def infer_catalogue(
    files: Sequence[Path],
    metas: Sequence[pq.FileMetaData],
    *,
    labels: Sequence[str],
    dense: Sequence[str],
    sparse: Sequence[str],
    history: Sequence[Sequence[str]],
) -> Catalogue:
    """A catalogue of the listed columns, measured on ``files`` (see the module docstring).

    ``history``: groups of sparse features that are histories (one group per set that
    changes together); SchemaError for a name that is not in ``sparse``. A trainer builds
    several plans of one table (training, held-out, audit): the measurement is kept per
    process for the same files (path, size, mtime) and columns.
    """
    key = (
        tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files),
        tuple(labels),
        tuple(dense),
        tuple(sparse),
        tuple(tuple(g) for g in history),
    )
    if key not in _MEASURED:
        if len(_MEASURED) >= 8:
            _MEASURED.clear()
        _MEASURED[key] = _measure(files, metas, labels, dense, sparse, history)
    return copy.deepcopy(_MEASURED[key])


_MEASURED: dict[tuple[Any, ...], Catalogue] = {}


def with_history_features(
    catalogue: Catalogue, history: Sequence[Sequence[str]], sparse: Sequence[str]
) -> Catalogue:
    """``catalogue`` with ``[reader] history_features`` applied to a table that has a recd
    catalogue: the listed groups are its histories (kind ``history``, one group each, as
    :func:`infer_catalogue` names them), every other history feature becomes ``static`` (the
    model pools it with the other sparse features). SchemaError for a name not in
    ``sparse``. No groups: the catalogue as it is."""
    if not history:
        return catalogue
    group_of = _history_groups(history, sparse)
    features = []
    for f in catalogue.sparse:
        f = copy.copy(f)
        if f.name in group_of:
            f.kind, f.group = SparseKind.HISTORY, group_of[f.name]
        elif f.kind is SparseKind.HISTORY:
            f.kind, f.group = SparseKind.STATIC, None
        features.append(f)
    out = copy.copy(catalogue)
    out.sparse = features
    return out


def _history_groups(
    history: Sequence[Sequence[str]], sparse: Sequence[str]
) -> dict[str, str | None]:
    """Feature -> its history group name (None for a group of one), checking the names."""
    group_of: dict[str, str | None] = {}
    for i, group in enumerate(history):
        for name in group:
            if name not in sparse:
                raise SchemaError(
                    f"reader.history_features[{i}] names {name!r}, which is not one of "
                    f"reader.sparse ({', '.join(sparse)})"
                )
            group_of[name] = f"history_{i}" if len(group) > 1 else None
    return group_of


def _measure(
    files: Sequence[Path],
    metas: Sequence[pq.FileMetaData],
    labels: Sequence[str],
    dense: Sequence[str],
    sparse: Sequence[str],
    history: Sequence[Sequence[str]],
) -> Catalogue:
    group_of = _history_groups(history, sparse)
    features = []
    for name in sparse:
        max_id = _max_id(files, metas, name)
        if name in group_of:
            longest = max(1, _max_length(files, name))
            features.append(
                SparseFeature(
                    name=name,
                    kind=SparseKind.HISTORY,
                    cardinality=max_id + 1,
                    max_length=longest,
                    group=group_of[name],
                )
            )
        else:
            features.append(
                SparseFeature(name=name, kind=SparseKind.STATIC, cardinality=max_id + 1)
            )
    return Catalogue(
        name=INFERRED_NAME,
        labels=list(labels),
        dense=[DenseFeature(name=n) for n in dense],
        sparse=features,
        sessions=SessionModel(),
    )


def _leaf_index(meta: pq.FileMetaData, name: str) -> int | None:
    """The column chunk index holding ``name``'s ids: the column itself (scalar ids) or its
    list's element column."""
    group = meta.row_group(0) if meta.num_row_groups else None
    if group is None:
        return None
    for j in range(group.num_columns):
        path = group.column(j).path_in_schema
        head, _, rest = path.partition(".")
        if head == name and (not rest or rest.endswith((".element", ".item"))):
            return j
    return None


def _max_id(files: Sequence[Path], metas: Sequence[pq.FileMetaData], name: str) -> int:
    """The largest id of sparse column ``name`` over ``files`` (0 if it has none)."""
    best = -1
    scan: list[Path] = []
    for path, meta in zip(files, metas, strict=True):
        j = _leaf_index(meta, name)
        stats_ok = j is not None
        file_best = -1
        for rg in range(meta.num_row_groups if stats_ok else 0):
            chunk = meta.row_group(rg).column(j)
            stats = chunk.statistics
            if meta.row_group(rg).num_rows == 0:
                continue
            if stats is None or not stats.has_min_max:
                if chunk.num_values and (stats is None or stats.null_count != chunk.num_values):
                    stats_ok = False
                    break
                continue
            file_best = max(file_best, int(stats.max))
        if stats_ok:
            best = max(best, file_best)
        else:
            scan.append(path)
    for path in scan:
        column = pq.read_table(path, columns=[name]).column(0)
        values = _ids(column)
        if len(values):
            top = pc.max(values).as_py()
            if top is not None:
                best = max(best, int(top))
    return max(best, 0)


def _max_length(files: Sequence[Path], name: str) -> int:
    """The longest list of column ``name`` over ``files`` (1 for a scalar column)."""
    longest = 0
    for path in files:
        column = pq.read_table(path, columns=[name]).column(0)
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
            return 1
        for chunk in column.chunks:
            if len(chunk):
                top = pc.max(pc.list_value_length(chunk)).as_py()
                longest = max(longest, int(top or 0))
    return longest


def _ids(column: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return pa.chunked_array([c.flatten() for c in column.chunks], type=column.type.value_type)
    return column
