"""Sequence features pooled by a transformer, once per distinct sequence (RecD O6).

A *sequence group* is a set of synchronised sequence features (e.g. cart item ids and their
seller ids). :class:`SequenceArch` looks their ids up per position in a torchrec
``EmbeddingCollection`` (unpooled), and for each group concatenates the features' embeddings
per position (N x L x K*E), projects them to E, prepends a learned [CLS] token, adds learned
position embeddings and runs a small ``nn.TransformerEncoder`` with a padding mask; the output
is pooled to N x E (mean over valid positions, or the [CLS] token).

When the group arrives as one IKJT, N is the group's number of *distinct* rows D: the lookup,
padding and transformer run once per distinct sequence and the pooled D x E result is expanded
to the batch (B x E) by ``index_select`` on ``inverse_lookup``. In ``dedup_compute=False`` mode
(the paper's "IKJT + jagged index_select" step) the lookups still run on distinct rows, but the
embedded sequences are expanded to B rows with fbgemm's ``jagged_index_select`` before the
transformer.

Exactness: the [CLS] token keeps every row non-empty (an all-masked attention row would be
NaN). With ``exact_attention`` the attention runs on PyTorch's MATH SDPA backend, which is
batch-invariant on CPU (the fused CPU flash kernel is not: a row's output changed in the last
bits with the number of rows). The remaining matmuls are batch-invariant as long as they have
enough rows: CPU GEMM kernels take another code path below about a dozen rows, where a row's
result may differ in the last bits. With D distinct sequences of width L the
transformer's matmuls have D * (L + 1) rows, so in practice (any real batch) a distinct row's
pooled output is bitwise the output the same row gets in the batch of B rows; a batch whose
group collapses to one or two very short sequences may differ by rounding.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torchrec.modules.embedding_modules import EmbeddingCollection

from recd.errors import ConfigError
from recd.models.options import SequenceConfig
from recd.models.packing import pack_features
from recd.tensors.batch import SparseFeatures
from recd.tensors.ikjt import lengths_to_offsets

__all__ = ["SequenceArch", "SequenceConfig", "SequenceEncoder"]


class SequenceEncoder(nn.Module):
    """One group's transformer: K jagged embedded sequences -> N x E pooled.

    Args:
        num_features: K, features of the group (concatenated per position).
        embedding_dim: E, the embedding dimension and the transformer width.
        config: layers, heads, pooling, ...
    """

    def __init__(self, num_features: int, embedding_dim: int, config: SequenceConfig) -> None:
        super().__init__()
        if embedding_dim % config.num_heads:
            raise ConfigError(
                f"sequence.num_heads = {config.num_heads} does not divide embedding_dim = "
                f"{embedding_dim}"
            )
        self.config = config
        self.input_proj = nn.Linear(num_features * embedding_dim, embedding_dim)
        self.cls = nn.Parameter(torch.randn(1, 1, embedding_dim) * 0.02)
        self.positions = nn.Parameter(torch.randn(config.max_seq_len + 1, embedding_dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d_model=embedding_dim,
            nhead=config.num_heads,
            dim_feedforward=config.ff_dim,
            dropout=config.dropout,
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(
            layer, num_layers=config.num_layers, enable_nested_tensor=False
        )

    def forward(self, sequences: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """
        Args:
            sequences: per feature ``(values, lengths)``: values (sum(lengths) x E) float32
                embeddings, lengths (N,) int64 positions per row.

        Returns:
            N x E: the pooled output of each row.
        """
        max_len = self.config.max_seq_len
        clamped = [lengths.clamp(max=max_len) for _, lengths in sequences]
        row_len = clamped[0] if len(clamped) == 1 else torch.stack(clamped).amax(dim=0)  # N
        n = row_len.numel()
        width = int(row_len.max()) if n else 0  # L
        e = self.cls.shape[-1]
        if width > 0:
            padded = [
                torch.ops.fbgemm.jagged_to_padded_dense(
                    values, [lengths_to_offsets(lengths)], [width], 0.0
                )
                for values, lengths in sequences
            ]  # K x (N x L x E)
            x = self.input_proj(torch.cat(padded, dim=-1))  # N x L x E
        else:
            x = self.cls.new_zeros(n, 0, e)
        tokens = torch.cat([self.cls.expand(n, 1, e), x], dim=1) + self.positions[: width + 1]
        position = torch.arange(width + 1, device=row_len.device)
        pad_mask = position.unsqueeze(0) > row_len.unsqueeze(1)  # N x (L + 1), True = padding
        backend = (
            sdpa_kernel(SDPBackend.MATH)
            if self.config.exact_attention
            else contextlib.nullcontext()
        )
        with backend:
            hidden = self.encoder(tokens, src_key_padding_mask=pad_mask)  # N x (L + 1) x E
        if self.config.pooling == "first":
            return hidden[:, 0]
        summed = hidden.masked_fill(pad_mask.unsqueeze(-1), 0.0).sum(dim=1)  # N x E
        return summed / (row_len + 1).unsqueeze(1).to(summed.dtype)


class SequenceArch(nn.Module):
    """Every sequence group: EmbeddingCollection lookup, then one transformer per group.

    Args:
        embedding_collection: torchrec EC holding the tables of every sequence feature.
        groups: the sequence groups (lists of feature names), in output order.
        config: the transformer shape shared by the groups.
    """

    def __init__(
        self,
        embedding_collection: EmbeddingCollection,
        groups: list[list[str]],
        config: SequenceConfig,
    ) -> None:
        super().__init__()
        self.embedding_collection = embedding_collection
        self.groups = [list(g) for g in groups]
        self.feature_names = [k for g in self.groups for k in g]
        e = embedding_collection.embedding_dim()
        self.encoders = nn.ModuleList(SequenceEncoder(len(g), e, config) for g in self.groups)

    def forward(self, features: SparseFeatures, *, dedup_compute: bool = True) -> torch.Tensor:
        """
        Args:
            features: the batch's sparse features (plain KJT + IKJTs), batch size B.
            dedup_compute: run each transformer on a group's distinct rows (True) or on the
                B rows after expanding its embedded sequences (False).

        Returns:
            B x G x E: one pooled vector per group.
        """
        packed = pack_features(
            features, self.feature_names, expand_keys=self._keys_to_expand(features)
        )
        embedded = self.embedding_collection(packed.kjt)  # key -> JaggedTensor, B rows
        pooled = []
        for keys, encoder in zip(self.groups, self.encoders, strict=True):
            n = packed.num_rows(keys[0])
            seqs = [(embedded[k].values(), embedded[k].lengths()[:n]) for k in keys]
            group = packed.group(keys[0])
            if group is not None and not dedup_compute:
                inverse = group.inverse_lookup
                seqs = [
                    torch.ops.fbgemm.jagged_index_select(values, lengths, inverse)
                    for values, lengths in seqs
                ]
                pooled.append(encoder(seqs))  # B x E
            else:
                pooled.append(packed.expand(keys[0], encoder(seqs)))  # N x E -> B x E
        return torch.stack(pooled, dim=1)

    def _keys_to_expand(self, features: SparseFeatures) -> frozenset[str]:
        """Keys of groups that do not sit in one IKJT: they need the batch's B rows."""
        out: set[str] = set()
        for keys in self.groups:
            owners = {id(features.ikjt_of(k)) for k in keys}
            if len(owners) > 1 or features.ikjt_of(keys[0]) is None:
                out.update(keys)
        return frozenset(out)
