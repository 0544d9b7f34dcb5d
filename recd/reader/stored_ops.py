"""Sparse preprocessing on the dedup layout's stored ids, once per row group (RecD O4 at rest).

A feature the table stores in the dedup layout (``recd.table.layout``) reaches the reader as one id
buffer per unit (row group) plus each row's (start, length) into it
(``recd.tensors.stacked.stack_unit``): a repeated list or a sliding history is stored, and so
held in memory, once. The sparse preprocessing kinds commute with the gather that later builds
a batch's lists from those positions:

- ``hash_modulo`` maps each id on its own, so it can map the buffer's ids instead of the
  gathered ones;
- ``truncate_last`` keeps a suffix of each row, which is a change of the row's (start, length)
  alone: ``start += max(length - n, 0)``, ``length = min(length, n)``.

So for these features the reader runs the preprocessing when it reads a unit, over its stored
ids (on a real clickstream slice about one id per row instead of a 13-id history):
``stack_unit(..., ops=...)`` makes one ``remainder`` pass over the buffer's ids of the
features that share moduli and one pass over the capped features' positions. The batch's
TorchScript modules (``recd.reader.transform``) leave these features out. The batches are the
same, bit for bit, as preprocessing the gathered KJT (tested against the modules). Chained
specs on one feature compose: the moduli apply in spec order, and truncations keep the
shortest suffix.

Written by hand because the operation is this layout's own: no library knows its positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from recd.tensors.stacked import StoredOps

__all__ = ["STORED_KINDS", "StoredOps", "split_preprocessing"]

STORED_KINDS = ("hash_modulo", "truncate_last")
"""The sparse kinds that run on stored ids; any other kind runs on the batch's lists."""


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
        if kind not in STORED_KINDS:
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
