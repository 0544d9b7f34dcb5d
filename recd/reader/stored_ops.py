"""Sparse preprocessing on the dedup layout's stored ids, once per row group (RecD O4 at rest).

A feature the table stores in the dedup layout (``recd.layout``) reaches the reader as one id
buffer per unit (row group) plus each row's (start, length) into it
(``recd.layout_read.stack_unit``): a repeated list or a sliding history is stored, and so
held in memory, once. The sparse preprocessing kinds commute with the gather that later builds
a batch's lists from those positions:

- ``hash_modulo`` maps each id on its own, so it can map the buffer's ids instead of the
  gathered ones;
- ``truncate_last`` keeps a suffix of each row, which is a change of the row's (start, length)
  alone: ``start += max(length - n, 0)``, ``length = min(length, n)``.

So for these features the reader runs the preprocessing when it reads a unit, over its stored
ids (on a real clickstream slice about one id per row instead of a 13-id history), and the
batch's TorchScript modules (``recd.reader.transform``) leave them out. The batches are the
same, bit for bit, as preprocessing the gathered KJT (tested against the modules). Chained
specs on one feature compose: the moduli apply in spec order, and truncations keep the
shortest suffix.

Written by hand because the operation is this layout's own: no library knows its positions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from recd.layout_read import FEATURES_KEY, IDS, length_column, one_chunk, position_column

__all__ = ["StoredOps", "preprocess_stacked", "split_preprocessing"]


@dataclass(frozen=True, slots=True)
class StoredOps:
    """The sparse preprocessing of one stored feature: ``id mod m`` for each of ``moduli`` in
    order, then (in any order: the two commute) keep the last ``cap`` ids of each row."""

    moduli: tuple[int, ...] = ()
    cap: int | None = None


def split_preprocessing(
    specs: Sequence[Mapping[str, Any]], stacked: Sequence[str]
) -> tuple[dict[str, StoredOps], list[dict[str, Any]]]:
    """(ops per ``stacked`` feature, the specs left for the batch modules).

    ``specs`` are ReaderConfig's checked preprocessing specs. Sparse kinds on a stacked
    feature move to the ops; a spec left with no feature is dropped; dense kinds and every
    other feature keep their specs and their order.
    """
    on_units = set(stacked)
    ops: dict[str, StoredOps] = {}
    rest: list[dict[str, Any]] = []
    for spec in specs:
        kind = spec["kind"]
        if kind not in ("hash_modulo", "truncate_last"):
            rest.append(dict(spec))
            continue
        features = list(spec["features"])
        for feature in (f for f in features if f in on_units):
            op = ops.get(feature, StoredOps())
            if kind == "hash_modulo":
                op = StoredOps(moduli=(*op.moduli, int(spec["modulo"])), cap=op.cap)
            else:
                n = int(spec["n"])
                op = StoredOps(moduli=op.moduli, cap=n if op.cap is None else min(op.cap, n))
            ops[feature] = op
        kept = [f for f in features if f not in on_units]
        if kept:
            rest.append({**spec, "features": kept})
    return ops, rest


def preprocess_stacked(table: pa.Table, ops: Mapping[str, StoredOps]) -> pa.Table:
    """One stacked unit (``stack_unit``'s output, before any reordering) with ``ops`` applied
    to its stored features: the moduli over each feature's ids in the buffer, the caps on its
    rows' positions."""
    i = table.schema.get_field_index(IDS)
    if i < 0 or not ops:
        return table
    field = table.schema.field(i)
    features = json.loads((field.metadata or {})[FEATURES_KEY])
    holder = one_chunk(table.column(i))
    buffer: np.ndarray | None = None
    for feature in features:
        op = ops.get(feature)
        if op is None:
            continue
        p, q = position_column(feature), length_column(feature)
        starts = one_chunk(table.column(p)).to_numpy()
        lengths = one_chunk(table.column(q)).to_numpy()
        if op.moduli:
            used = np.flatnonzero(lengths)
            if used.size:  # the feature's ids lie in [lo, hi) of the buffer
                lo = int(starts[used].min())
                hi = int((starts[used] + lengths[used]).max())
                if buffer is None:
                    buffer = holder.values.to_numpy().copy()
                segment = buffer[lo:hi]
                for modulus in op.moduli:
                    np.remainder(segment, modulus, out=segment)
        if op.cap is not None:
            drop = np.maximum(lengths - np.int32(op.cap), 0, dtype=np.int32)
            table = table.set_column(
                table.schema.get_field_index(p), table.schema.field(p), pa.array(starts + drop)
            )
            table = table.set_column(
                table.schema.get_field_index(q), table.schema.field(q), pa.array(lengths - drop)
            )
    if buffer is not None:
        table = table.set_column(
            i, field, pa.ListArray.from_arrays(holder.offsets, pa.array(buffer, pa.int64()))
        )
    return table
