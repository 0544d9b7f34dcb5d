"""Model configs from a feature catalogue: plain DLRM and the RM1-like sequence variant.

RM1 in the RecD paper pools users' sequence features (histories) with transformers, grouped
by feature groups that change synchronously; its trainer speedup comes from running those
transformers once per distinct sequence (O6). :func:`rm1_config` maps a catalogue onto that
shape: every ``history`` feature is a sequence feature, features of one catalogue ``group``
form one sequence group (one transformer), an ungrouped history feature is a group of its own,
and every other sparse feature is pooled by the EmbeddingBagCollection. :func:`dlrm_config`
pools every sparse feature. :func:`dedup_groups` gives the reader's matching
``dedup_sparse_features`` (sequence groups, plus each static feature on its own).

Table rows are ``min(cardinality, max_rows)``: readers must map ids into ``[0, rows)``
(``recd.tensors.preprocess.HashModulo`` with :func:`table_sizes`).
"""

from __future__ import annotations

from recd.models.dlrm import DLRM, DedupMode, ModelConfig
from recd.models.sequence import SequenceConfig
from recd.schema import Catalogue, SparseKind

__all__ = [
    "build_rm1",
    "dedup_groups",
    "dlrm_config",
    "rm1_config",
    "sequence_groups",
    "table_sizes",
]


def table_sizes(catalogue: Catalogue, *, max_rows: int) -> dict[str, int]:
    """Rows of each sparse feature's table: ``min(cardinality, max_rows)``, catalogue order."""
    return {f.name: min(f.cardinality, max_rows) for f in catalogue.sparse}


def sequence_groups(catalogue: Catalogue) -> list[list[str]]:
    """History features grouped by catalogue group (an ungrouped one is its own group)."""
    groups: dict[str, list[str]] = {}
    for f in catalogue.sparse:
        if f.kind is SparseKind.HISTORY:
            groups.setdefault(f.group if f.group is not None else f"_{f.name}", []).append(f.name)
    return list(groups.values())


def dedup_groups(catalogue: Catalogue) -> list[list[str]]:
    """Reader ``dedup_sparse_features`` for the RM1-like model: one IKJT per sequence group,
    one per static feature (each feature of a group must match for rows to share an entry)."""
    static = [[f.name] for f in catalogue.sparse if f.kind is SparseKind.STATIC]
    return sequence_groups(catalogue) + static


def dlrm_config(
    catalogue: Catalogue,
    *,
    embedding_dim: int = 16,
    max_rows: int = 100_000,
    bottom_mlp: list[int] | None = None,
    top_mlp: list[int] | None = None,
    dedup: DedupMode = DedupMode.FULL,
) -> ModelConfig:
    """A DLRM that pools every sparse feature of ``catalogue`` (one table per feature)."""
    return ModelConfig(
        dense_in_features=len(catalogue.dense),
        num_embeddings=table_sizes(catalogue, max_rows=max_rows),
        embedding_dim=embedding_dim,
        bottom_mlp=bottom_mlp or [4 * embedding_dim, embedding_dim],
        top_mlp=top_mlp or [4 * embedding_dim, len(catalogue.labels)],
        dedup=dedup,
    )


def rm1_config(
    catalogue: Catalogue,
    *,
    embedding_dim: int = 16,
    max_rows: int = 100_000,
    sequence: SequenceConfig | None = None,
    bottom_mlp: list[int] | None = None,
    top_mlp: list[int] | None = None,
    dedup: DedupMode = DedupMode.FULL,
) -> ModelConfig:
    """The RM1-like model of ``catalogue``: history features pooled by per-group transformers.

    The default transformer keeps ``max_seq_len`` = the longest history's ``max_length``.
    """
    if sequence is None:
        longest = max(
            (f.max_length for f in catalogue.sparse if f.kind is SparseKind.HISTORY), default=1
        )
        sequence = SequenceConfig(max_seq_len=longest)
    return ModelConfig(
        dense_in_features=len(catalogue.dense),
        num_embeddings=table_sizes(catalogue, max_rows=max_rows),
        embedding_dim=embedding_dim,
        sequence_groups=sequence_groups(catalogue),
        sequence=sequence,
        bottom_mlp=bottom_mlp or [4 * embedding_dim, embedding_dim],
        top_mlp=top_mlp or [4 * embedding_dim, len(catalogue.labels)],
        dedup=dedup,
    )


def build_rm1(catalogue: Catalogue, **kwargs: object) -> DLRM:
    """``DLRM(rm1_config(catalogue, **kwargs))``."""
    return DLRM(rm1_config(catalogue, **kwargs))  # type: ignore[arg-type]
