"""Feature conversion: an Arrow record batch -> dense/label tensors, a KJT and IKJTs (RecD O3).

Everything is vectorised over the Arrow buffers: a ``list<int64>`` column is read zero-copy as
its offsets (B + 1) and flat values (:mod:`recd.tensors.jagged`), and ids are copied once, into the
output tensors. Features of a ``dedup_sparse_features`` group become one IKJT whose distinct
rows come from :func:`recd.tensors.jagged.find_distinct_rows` (exact, A-B-A included): a row joins an
entry only if every feature of its group matches, which keeps the group's shared
``inverse_lookup`` valid for all of its keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.errors import ConfigError, SchemaError
from recd.schema import Catalogue
from recd.tensors.batch import Batch, SparseFeatures
from recd.tensors.ikjt import InverseKeyedJaggedTensor
from recd.tensors.jagged import (
    JaggedColumn,
    RecordBatchLike,
    _column,
    _first_null_row,
    find_distinct_rows,
    find_distinct_stacked,
    gather_rows,
    group_slots,
    read_list_column,
    read_stacked_columns,
    stack_columns,
    take_rows,
)
from recd.tensors.stacked import Stacked, changed_rows, gather, read_stacked

__all__ = [
    "FeatureSpec",
    "JaggedColumn",
    "build_ikjt",
    "convert_batch",
    "convert_dense",
    "convert_sparse",
    "find_distinct_rows",
    "gather_rows",
    "ikjt_from_stacked",
    "ikjt_from_stacked_layout",
    "read_list_column",
    "read_stacked_columns",
    "take_rows",
]


@dataclass(kw_only=True, slots=True)
class FeatureSpec:
    """Which columns become which tensors."""

    dense: list[str] = field(default_factory=list)
    """Dense feature columns (float), in the column order of the B x D dense tensor."""
    sparse: list[str] = field(default_factory=list)
    """Every sparse feature column (``list<int64>``) to read, plain and deduplicated."""
    labels: list[str] = field(default_factory=lambda: ["label"])
    """Label columns, in the column order of the B x L labels tensor."""
    dedup_sparse_features: list[list[str]] = field(default_factory=list)
    """Dedup groups: each inner list becomes one IKJT sharing one inverse_lookup."""

    def __post_init__(self) -> None:
        seen: dict[str, int] = {}
        sparse = set(self.sparse)
        if len(sparse) != len(self.sparse):
            raise ConfigError(f"sparse: a feature is listed twice in {self.sparse}")
        for g, group in enumerate(self.dedup_sparse_features):
            if not group:
                raise ConfigError(f"dedup_sparse_features[{g}] is empty")
            for name in group:
                if name not in sparse:
                    raise ConfigError(
                        f"dedup_sparse_features[{g}]: {name!r} is not one of the sparse features"
                    )
                if name in seen:
                    raise ConfigError(
                        f"dedup_sparse_features: {name!r} is in groups {seen[name]} and {g}"
                    )
                seen[name] = g

    @property
    def plain_sparse(self) -> list[str]:
        """Sparse features in no dedup group (they form the plain KJT), in ``sparse`` order."""
        grouped = {name for group in self.dedup_sparse_features for name in group}
        return [name for name in self.sparse if name not in grouped]

    @classmethod
    def from_catalogue(
        cls, catalogue: Catalogue, *, dedup_sparse_features: list[list[str]] | None = None
    ) -> FeatureSpec:
        """All of a catalogue's dense, sparse and label columns."""
        return cls(
            dense=catalogue.dense_names,
            sparse=catalogue.sparse_names,
            labels=list(catalogue.labels),
            dedup_sparse_features=[list(g) for g in dedup_sparse_features or []],
        )


def convert_dense(
    batch: RecordBatchLike, names: Sequence[str], *, source: str, row_offset: int = 0
) -> torch.Tensor:
    """Float columns -> B x len(names) float32 tensor; a null is a SchemaError naming the row."""
    out = np.empty((batch.num_rows, len(names)), dtype=np.float32)
    for j, name in enumerate(names):
        col = _column(batch, name, source=source, expected="float32")
        if not (pa.types.is_floating(col.type) or pa.types.is_integer(col.type)):
            raise SchemaError(f"{source}: column {name!r} has type {col.type}, expected float32")
        if col.null_count:
            row = row_offset + _first_null_row(col)
            raise SchemaError(f"{source}: column {name!r}: row {row}: null value")
        out[:, j] = col.to_numpy(zero_copy_only=False)
    return torch.from_numpy(out)


# ---------------------------------------------------------------------- numpy -> tensors
def _plain_kjt(stacked: JaggedColumn, names: list[str], batch_size: int) -> KeyedJaggedTensor:
    """KJT of the plain features from their stacked columns (offsets from 0, key-major)."""
    values = stacked.values[: int(stacked.offsets[-1])]
    if not values.flags.writeable:  # a zero-copy view of Arrow's read-only buffer
        values = values.copy()
    return KeyedJaggedTensor(
        keys=list(names),
        values=torch.from_numpy(values),
        lengths=torch.from_numpy(np.diff(stacked.offsets)),
        stride=batch_size,
    )


def build_ikjt(
    columns: Sequence[JaggedColumn], keys: list[str], *, batch_size: int
) -> InverseKeyedJaggedTensor:
    """Deduplicate one group of columns into an IKJT (distinct rows in first-occurrence order)."""
    return ikjt_from_stacked(stack_columns(columns), keys, batch_size=batch_size)


def ikjt_from_stacked(
    stacked: JaggedColumn, keys: list[str], *, batch_size: int
) -> InverseKeyedJaggedTensor:
    """The IKJT of a group given stacked key-major (``stack_columns``, K * B rows).

    Stacked once, the group's dedup and the gather of its distinct rows each run once over all
    of its keys, however many keys the group has.
    """
    k = len(keys)
    distinct, inverse = find_distinct_stacked(stacked, num_keys=k, batch_size=batch_size)
    out = take_rows(stacked, group_slots(distinct, num_keys=k, batch_size=batch_size))
    return InverseKeyedJaggedTensor(
        keys=list(keys),
        values=torch.from_numpy(out.values),
        lengths=torch.from_numpy(np.diff(out.offsets)),
        inverse_lookup=torch.from_numpy(inverse),
    )


def convert_sparse(
    batch: RecordBatchLike, spec: FeatureSpec, *, source: str, row_offset: int = 0
) -> SparseFeatures:
    """Sparse columns -> a plain KJT (features in no group) + one IKJT per dedup group.

    Features a batch holds stacked (the dedup layout, ``recd.tensors.stacked``) are gathered
    without hashing: all of the plain KJT's at once, and a group's distinct rows from their
    stored positions when every key of the group is stacked.
    """
    b = batch.num_rows
    plain = spec.plain_sparse
    stacked = read_stacked(batch)
    encoded = set(stacked.features) if stacked is not None else set()

    def read(names: list[str]) -> JaggedColumn:
        return read_stacked_columns(
            batch, names, source=source, row_offset=row_offset, stacked=stacked
        )

    ikjts = []
    for group in spec.dedup_sparse_features:
        if stacked is not None and encoded.issuperset(group):
            ikjts.append(ikjt_from_stacked_layout(stacked, group))
        else:
            ikjts.append(ikjt_from_stacked(read(group), group, batch_size=b))
    return SparseFeatures(
        batch_size=b,
        kjt=_plain_kjt(read(plain), plain, b) if plain else None,
        ikjts=ikjts,
    )


def ikjt_from_stacked_layout(stacked: Stacked, keys: list[str]) -> InverseKeyedJaggedTensor:
    """The IKJT of a group held stacked (the dedup layout), without hashing: a row is distinct
    iff some key's stored position or length differs from the row before (or it starts a
    chunk), and the distinct rows' lists are gathered once, key-major.

    Repeats that are not adjacent (A-B-A) or that span sessions stay separate entries, so an
    IKJT may hold more distinct rows than the hashing path's; it expands to the same KJT.
    """
    index = stacked.index(keys)
    new = changed_rows(stacked, index)
    distinct = np.flatnonzero(new)
    inverse = np.cumsum(new, dtype=np.int64) - 1
    lengths, values = gather(stacked, index, distinct)
    return InverseKeyedJaggedTensor(
        keys=list(keys),
        values=torch.from_numpy(values),
        lengths=torch.from_numpy(lengths),
        inverse_lookup=torch.from_numpy(inverse),
    )


def convert_batch(
    batch: RecordBatchLike, spec: FeatureSpec, *, source: str, row_offset: int = 0
) -> Batch:
    """An Arrow record batch (or table) -> :class:`Batch` (dense, sparse, labels).

    ``source`` (a file name) and ``row_offset`` (index of the batch's first row in that file)
    only serve error messages.
    """
    return Batch(
        dense=convert_dense(batch, spec.dense, source=source, row_offset=row_offset),
        sparse=convert_sparse(batch, spec, source=source, row_offset=row_offset),
        labels=convert_dense(batch, spec.labels, source=source, row_offset=row_offset),
    )
