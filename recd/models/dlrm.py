"""DLRM from torchrec parts that consumes IKJTs natively (RecD O5/O6).

Notation: B batch size, E embedding dimension, N dense features, F pooled sparse features,
G sequence groups, T tasks (labels).

    dense (B x N) ----------------------------> DenseArch (bottom MLP) -> B x E ---------+
    sparse (KJT + IKJTs) -> PooledSparseArch (EmbeddingBagCollection) -> B x F x E -+     |
                         -> SequenceArch (EmbeddingCollection + transformers) -> B x G x E
                                                 InteractionArch (pairwise dots) <-+-----+
                                                 OverArch (top MLP) -> B x T logits

``DenseArch``, ``InteractionArch`` and ``OverArch`` are torchrec's (``torchrec.models.dlrm``).
The sparse side is ours because torchrec's ``SparseArch`` takes one plain KJT: ours takes the
batch container (:class:`recd.tensors.batch.SparseFeatures`) and looks each dedup group up on its
distinct rows only, then expands the pooled D x E output to B x E with ``index_select`` on
``inverse_lookup`` (see :mod:`models.packing`). A plain KJT input (every feature expanded to B
rows) is still accepted and is the reference the IKJT path is tested against.

The model returns logits; train with ``bce_loss`` (BCE with logits, mean over the batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch, choose
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.errors import ConfigError
from recd.models.options import DedupMode, SequenceConfig
from recd.models.packing import as_sparse_features, pack_features
from recd.models.sequence import SequenceArch
from recd.tensors.batch import Batch, SparseFeatures

__all__ = ["DLRM", "DedupMode", "ModelConfig", "PooledSparseArch", "bce_loss"]


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Shape of a DLRM / RM1-like model."""

    dense_in_features: int
    """N: dense features per row (columns of the B x N dense tensor)."""
    num_embeddings: dict[str, int]
    """Rows of the table of each sparse feature the model reads (ids must lie in
    [0, rows): hash them in preprocessing). Key order is the model's feature order."""
    embedding_dim: int = 16
    """E: width of every embedding, of the bottom MLP output and of the transformers."""
    shared_tables: list[list[str]] = field(default_factory=list)
    """Features that share one table (named after the first; equal row counts required)."""
    sequence_groups: list[list[str]] = field(default_factory=list)
    """Sequence features, grouped: each group is embedded per position, concatenated per
    position and pooled by its own transformer. Features in no group are pooled (sum)."""
    bottom_mlp: list[int] = field(default_factory=lambda: [32, 16])
    """Bottom (dense) MLP layer sizes; the last must equal ``embedding_dim``."""
    top_mlp: list[int] = field(default_factory=lambda: [32, 1])
    """Top MLP layer sizes (at least two); the last is T, the number of labels."""
    sequence: SequenceConfig = field(default_factory=SequenceConfig)
    """The transformers of the sequence groups."""
    dedup: DedupMode = DedupMode.FULL
    """How IKJT inputs are used (plain KJT inputs are unaffected)."""
    sparse_grads: bool = True
    """Embedding tables get sparse (COO) gradients: only looked-up rows, which is what the
    row-sparse Adam (``recd.optim``) reads as the touched rows."""

    def __post_init__(self) -> None:
        self.dedup = DedupMode(self.dedup)
        for name in ("dense_in_features", "embedding_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if not self.num_embeddings:
            raise ConfigError("model.num_embeddings: at least one sparse feature is required")
        for feature, rows in self.num_embeddings.items():
            if rows < 1:
                raise ConfigError(f"model.num_embeddings[{feature!r}] must be >= 1, got {rows}")
        if not self.bottom_mlp or self.bottom_mlp[-1] != self.embedding_dim:
            raise ConfigError(
                f"model.bottom_mlp = {self.bottom_mlp}: the last size must equal "
                f"embedding_dim = {self.embedding_dim}"
            )
        if len(self.top_mlp) < 2:
            raise ConfigError(f"model.top_mlp = {self.top_mlp}: needs at least two layers")
        self._check_groups("sequence_groups", self.sequence_groups)
        self._check_groups("shared_tables", self.shared_tables)
        sequence = set(self.sequence_features)
        for table in self.shared_tables:
            kinds = {f in sequence for f in table}
            sizes = {self.num_embeddings[f] for f in table}
            if len(kinds) > 1:
                raise ConfigError(
                    f"model.shared_tables: {table} mixes sequence and pooled features"
                )
            if len(sizes) > 1:
                raise ConfigError(
                    f"model.shared_tables: {table} have different num_embeddings {sorted(sizes)}"
                )

    def _check_groups(self, name: str, groups: list[list[str]]) -> None:
        seen: set[str] = set()
        for i, group in enumerate(groups):
            if not group:
                raise ConfigError(f"model.{name}[{i}] is empty")
            for feature in group:
                if feature not in self.num_embeddings:
                    raise ConfigError(
                        f"model.{name}[{i}]: {feature!r} is not in model.num_embeddings"
                    )
                if feature in seen:
                    raise ConfigError(f"model.{name}: {feature!r} appears twice")
                seen.add(feature)

    @property
    def sequence_features(self) -> list[str]:
        """Features of the sequence groups, group by group."""
        return [f for g in self.sequence_groups for f in g]

    @property
    def pooled_features(self) -> list[str]:
        """Features pooled by the EmbeddingBagCollection, in ``num_embeddings`` order."""
        sequence = set(self.sequence_features)
        return [f for f in self.num_embeddings if f not in sequence]

    def tables(self, features: list[str]) -> list[tuple[str, int, list[str]]]:
        """``(table name, rows, features)`` for ``features``: one table each unless shared."""
        shared = {t[0]: t for t in self.shared_tables}
        owner = {f: t[0] for t in self.shared_tables for f in t}
        out, done = [], set()
        for feature in features:
            name = owner.get(feature, feature)
            if name in done:
                continue
            done.add(name)
            members = [f for f in shared[name] if f in features] if name in shared else [feature]
            out.append((name, self.num_embeddings[feature], members))
        return out


class PooledSparseArch(nn.Module):
    """Pooled sparse features through one torchrec EmbeddingBagCollection.

    Each dedup group is looked up and pooled on its D distinct rows (B x E output whose first
    D rows hold them), then expanded to the batch by ``index_select(inverse_lookup)``.

    Args:
        embedding_bag_collection: the EBC holding every pooled feature's table.
        feature_names: the pooled features, in output order.
    """

    def __init__(
        self, embedding_bag_collection: EmbeddingBagCollection, feature_names: list[str]
    ) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        self.feature_names = list(feature_names)

    def forward(self, features: SparseFeatures) -> torch.Tensor:
        """
        Args:
            features: plain KJT + IKJTs of a batch of B rows.

        Returns:
            B x F x E pooled embeddings, in ``feature_names`` order.
        """
        packed = pack_features(features, self.feature_names)
        pooled = self.embedding_bag_collection(packed.kjt).to_dict()  # key -> B x E
        for group in packed.groups:
            stacked = torch.stack([pooled[k] for k in group.keys], dim=1)  # B x K x E
            expanded = stacked.index_select(0, group.inverse_lookup)  # B x K x E
            pooled.update(zip(group.keys, expanded.unbind(dim=1), strict=True))
        return torch.stack([pooled[k] for k in self.feature_names], dim=1)


class DLRM(nn.Module):
    """DLRM (optionally with transformer-pooled sequence groups: the RM1-like variant).

    Parameter order (``named_parameters()``; the checkpoint's order, see
    ``recd.checkpoint.format.ParamLayout``): ``sparse_arch`` tables (pooled features, config
    order), ``sequence_arch`` tables then one encoder per group, ``dense_arch`` (bottom MLP),
    ``over_arch`` (top MLP). ``InteractionArch`` has no parameters.

    Args:
        config: the model shape.
        device: where to build the parameters (default CPU).
    """

    def __init__(self, config: ModelConfig, *, device: torch.device | None = None) -> None:
        super().__init__()
        self.config = config
        self.dedup = config.dedup
        e = config.embedding_dim
        pooled = config.pooled_features
        self.sparse_arch: PooledSparseArch | None = None
        if pooled:
            ebc = EmbeddingBagCollection(
                tables=[
                    EmbeddingBagConfig(
                        name=name, embedding_dim=e, num_embeddings=rows, feature_names=members
                    )
                    for name, rows, members in config.tables(pooled)
                ],
                device=device,
            )
            if config.sparse_grads:
                for bag in ebc.embedding_bags.values():
                    bag.sparse = True
            self.sparse_arch = PooledSparseArch(ebc, pooled)
        self.sequence_arch: SequenceArch | None = None
        if config.sequence_groups:
            ec = EmbeddingCollection(
                tables=[
                    EmbeddingConfig(
                        name=name, embedding_dim=e, num_embeddings=rows, feature_names=members
                    )
                    for name, rows, members in config.tables(config.sequence_features)
                ],
                device=device,
            )
            if config.sparse_grads:
                for emb in ec.embeddings.values():
                    emb.sparse = True
            self.sequence_arch = SequenceArch(ec, config.sequence_groups, config.sequence)
            if device is not None:
                self.sequence_arch.encoders.to(device)
        num_sparse = len(pooled) + len(config.sequence_groups)
        self.dense_arch = DenseArch(config.dense_in_features, config.bottom_mlp, device=device)
        self.inter_arch = InteractionArch(num_sparse_features=num_sparse)
        self.over_arch = OverArch(e + choose(num_sparse, 2) + num_sparse, config.top_mlp, device)

    def forward(
        self, dense: torch.Tensor, sparse: SparseFeatures | KeyedJaggedTensor
    ) -> torch.Tensor:
        """
        Args:
            dense: B x N float32 dense features.
            sparse: the batch's sparse features: plain KJT + IKJTs, or one plain KJT.

        Returns:
            B x T logits.
        """
        features = as_sparse_features(sparse)
        if self.dedup is DedupMode.OFF and features.ikjts:
            features = SparseFeatures(batch_size=features.batch_size, kjt=features.to_kjt())
        embedded = []
        if self.sparse_arch is not None:
            embedded.append(self.sparse_arch(features))  # B x F x E
        if self.sequence_arch is not None:
            dedup_compute = self.dedup is DedupMode.FULL
            embedded.append(self.sequence_arch(features, dedup_compute=dedup_compute))
        sparse_embedded = torch.cat(embedded, dim=1)  # B x (F + G) x E
        dense_embedded = self.dense_arch(dense)  # B x E
        return self.over_arch(self.inter_arch(dense_embedded, sparse_embedded))  # B x T

    def forward_batch(self, batch: Batch) -> torch.Tensor:
        """B x T logits of a :class:`recd.tensors.batch.Batch`."""
        return self(batch.dense, batch.sparse)

    def embedding_feature_names(self) -> list[str]:
        """Every sparse feature the model reads (pooled, then sequence groups)."""
        return self.config.pooled_features + self.config.sequence_features

    def touched_rows(self, sparse: SparseFeatures | KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        """Embedding parameter name -> sorted unique rows the batch looks up.

        What the row-sparse Adam needs when the tables have dense gradients
        (``sparse_grads=False``); with sparse gradients it reads the rows from them.
        """
        features = as_sparse_features(sparse)
        out: dict[str, torch.Tensor] = {}
        for prefix, features_of, tables in self._embedding_tables():
            packed = pack_features(features, features_of)
            jagged = packed.kjt.to_dict()
            for name, members in tables:
                ids = torch.cat([jagged[f].values() for f in members])
                out[f"{prefix}.{name}.weight"] = torch.unique(ids)
        return out

    def _embedding_tables(self) -> list[tuple[str, list[str], list[tuple[str, list[str]]]]]:
        out = []
        if self.sparse_arch is not None:
            feats = self.config.pooled_features
            out.append(
                (
                    "sparse_arch.embedding_bag_collection.embedding_bags",
                    feats,
                    [(n, m) for n, _, m in self.config.tables(feats)],
                )
            )
        if self.sequence_arch is not None:
            feats = self.config.sequence_features
            out.append(
                (
                    "sequence_arch.embedding_collection.embeddings",
                    feats,
                    [(n, m) for n, _, m in self.config.tables(feats)],
                )
            )
        return out


def bce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of B x T logits against B x T labels in [0, 1]."""
    return F.binary_cross_entropy_with_logits(logits, labels)
