"""Pack a batch's sparse features (plain KJT + IKJTs) into one fixed-stride KJT for one lookup.

The model's embedding modules (torchrec ``EmbeddingBagCollection`` / ``EmbeddingCollection``,
sharded or not) take one fixed-stride ``KeyedJaggedTensor``. To look up each dedup group's
*distinct* rows only (RecD O5) without changing that interface, :func:`pack_features` builds a
KJT of stride B in which

* a plain feature holds its B rows, as in the batch;
* a feature of an IKJT holds the group's D distinct rows in rows ``0 .. D-1`` and empty rows
  ``D .. B-1`` (D <= B always), so only distinct ids are looked up (and, sharded, sent)::

      batch B = 4, group {c}: distinct rows [7, 8], [11]; inverse_lookup [0, 0, 1, 0]
      packed "c": lengths [2, 1, 0, 0], values [7, 8, 11]

After the lookup, a group's pooled output (B x E, rows >= D are zeros) is expanded to the batch
with ``index_select(0, inverse_lookup)``: :meth:`PackedFeatures.expand`. Every row index the
expansion reads is < D, so the empty rows never reach the model.

Why not torchrec's variable-batch KJT (``inverse_indices``)? It is exact unsharded, but fails
with row-wise sharding under gloo and with the dense kernel, and its metadata cost grows with
the number of bags (measured when the trainer was built); the padded packing works with every kernel and plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.errors import TensorFormatError
from recd.tensors.batch import SparseFeatures

__all__ = ["DistinctRows", "PackedFeatures", "as_sparse_features", "pack_features"]


@dataclass(kw_only=True, slots=True)
class DistinctRows:
    """The row space of one dedup group inside a :class:`PackedFeatures`."""

    keys: list[str]
    """The group's features that were packed (a subset of the IKJT's keys, model order)."""
    num_distinct: int
    """D: the group's distinct rows, stored in rows 0 .. D-1 of the packed KJT."""
    inverse_lookup: torch.Tensor
    """(B,) int64: row i of the batch is distinct row ``inverse_lookup[i]``."""


@dataclass(kw_only=True, slots=True)
class PackedFeatures:
    """One fixed-stride KJT (stride B) holding plain rows and each group's distinct rows."""

    kjt: KeyedJaggedTensor
    """Stride B, keys in the order asked for; group features hold D rows, then empty rows."""
    batch_size: int
    """B."""
    groups: list[DistinctRows] = field(default_factory=list)
    """One entry per dedup group that contributed keys."""
    group_of_key: dict[str, int] = field(default_factory=dict)
    """Key -> index in ``groups``; plain keys are absent."""

    def group(self, key: str) -> DistinctRows | None:
        """The distinct-row space of ``key``, or None when ``key`` holds the batch's B rows."""
        index = self.group_of_key.get(key)
        return None if index is None else self.groups[index]

    def num_rows(self, key: str) -> int:
        """Rows of ``key`` that hold data: D for a deduplicated key, B for a plain one."""
        group = self.group(key)
        return self.batch_size if group is None else group.num_distinct

    def expand(self, key: str, rows: torch.Tensor) -> torch.Tensor:
        """A per-row result of ``key`` (N x ..., N >= num_rows) expanded to the batch (B x ...).

        Plain keys: ``rows[:B]`` unchanged. Deduplicated keys: ``rows.index_select(0,
        inverse_lookup)``, an exact copy forward; its backward sums the gradients of the
        batch rows that share a distinct row (``index_add``).
        """
        group = self.group(key)
        if group is None:
            return rows if rows.shape[0] == self.batch_size else rows[: self.batch_size]
        return rows.index_select(0, group.inverse_lookup)


def as_sparse_features(sparse: SparseFeatures | KeyedJaggedTensor) -> SparseFeatures:
    """A plain fixed-stride KJT wrapped as :class:`SparseFeatures` (no IKJTs); else unchanged."""
    if isinstance(sparse, SparseFeatures):
        return sparse
    if sparse.variable_stride_per_key():
        raise TensorFormatError("model input: variable-batch KJTs are not supported")
    return SparseFeatures(batch_size=sparse.stride(), kjt=sparse)


def pack_features(
    features: SparseFeatures,
    keys: list[str],
    *,
    expand_keys: frozenset[str] = frozenset(),
) -> PackedFeatures:
    """Pack ``keys`` of ``features`` into one KJT of stride B (see the module docstring).

    Keys in ``expand_keys`` that belong to an IKJT are expanded to the batch's B rows instead
    (their group's rows are then looked up once per batch row, like a plain feature). Raises
    TensorFormatError naming the keys ``features`` lacks.
    """
    b = features.batch_size
    wanted = set(keys)
    values: dict[str, torch.Tensor] = {}
    lengths: dict[str, torch.Tensor] = {}
    groups: list[DistinctRows] = []
    group_of_key: dict[str, int] = {}

    plain = features.kjt
    if plain is not None and plain.keys():
        _take_rows(plain, wanted, values, lengths, rows=b)
    for ikjt in features.ikjts:
        ikjt_keys = ikjt.keys()
        group_keys = [k for k in ikjt_keys if k in wanted]
        if not group_keys:
            continue
        expanded = [k for k in group_keys if k in expand_keys]
        if expanded:
            _take_rows(ikjt.to_kjt(), set(expanded), values, lengths, rows=b)
        distinct = [k for k in group_keys if k not in expand_keys]
        if distinct:
            _take_rows(ikjt.distinct_kjt(), set(distinct), values, lengths, rows=b)
            order = {k: i for i, k in enumerate(keys)}
            distinct.sort(key=order.__getitem__)
            for k in distinct:
                group_of_key[k] = len(groups)
            groups.append(
                DistinctRows(
                    keys=distinct,
                    num_distinct=ikjt.num_distinct(),
                    inverse_lookup=ikjt.inverse_lookup(),
                )
            )
    missing = [k for k in keys if k not in values]
    if missing:
        raise TensorFormatError(
            f"model input: sparse features {missing} are missing from the batch "
            f"(it has {features.keys()})"
        )
    device = next(iter(values.values())).device if values else torch.device("cpu")
    kjt = KeyedJaggedTensor(
        keys=list(keys),
        values=_cat([values[k] for k in keys], torch.int64, device),
        lengths=_cat([lengths[k] for k in keys], torch.int64, device),
        stride=b,
    )
    return PackedFeatures(kjt=kjt, batch_size=b, groups=groups, group_of_key=group_of_key)


def _take_rows(
    kjt: KeyedJaggedTensor,
    wanted: set[str],
    values: dict[str, torch.Tensor],
    lengths: dict[str, torch.Tensor],
    *,
    rows: int,
) -> None:
    """Split ``kjt``'s wanted keys into per-key values/lengths, lengths padded to ``rows``."""
    kjt_keys = list(kjt.keys())
    if not wanted.intersection(kjt_keys):
        return
    stride = kjt.stride()
    per_key_values = kjt.values().split(kjt.length_per_key())
    per_key_lengths = kjt.lengths().to(torch.int64).view(len(kjt_keys), stride)
    if stride < rows:
        per_key_lengths = F.pad(per_key_lengths, (0, rows - stride))
    for i, key in enumerate(kjt_keys):
        if key in wanted:
            values[key] = per_key_values[i]
            lengths[key] = per_key_lengths[i]


def _cat(parts: list[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if not parts:
        return torch.empty(0, dtype=dtype, device=device)
    return torch.cat([p.to(dtype) for p in parts])
