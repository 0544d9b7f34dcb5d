"""What a reader sends to a trainer: dense features, labels and sparse features (KJT + IKJTs).

``SparseFeatures`` holds the plain features of a batch as one torchrec ``KeyedJaggedTensor``
and each dedup group as one :class:`~recd.tensors.ikjt.InverseKeyedJaggedTensor`. ``Batch`` adds the
dense features (B x D float32) and labels (B x L float32). Both move between devices, pin
memory (so ``DataLoader(pin_memory=True)`` works) and pickle compactly for worker processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.errors import TensorFormatError
from recd.tensors.ikjt import (
    InverseKeyedJaggedTensor,
    compact_tensor,
    kjt_equal,
    kjt_from_state,
    kjt_state,
    kjt_wire_bytes,
    validate_kjt,
)

__all__ = ["Batch", "SparseFeatures"]


@dataclass(kw_only=True, slots=True)
class SparseFeatures:
    """The sparse features of one batch: plain features in a KJT, dedup groups as IKJTs."""

    batch_size: int
    """B: rows in the batch."""
    kjt: KeyedJaggedTensor | None = None
    """Features in no dedup group (stride B), or None when every feature is deduplicated."""
    ikjts: list[InverseKeyedJaggedTensor] = field(default_factory=list)
    """One IKJT per dedup group, in the order of ``dedup_sparse_features``."""

    def keys(self) -> list[str]:
        """Plain keys, then each group's keys: the default key order of :meth:`to_kjt`."""
        out = [] if self.kjt is None else list(self.kjt.keys())
        for ikjt in self.ikjts:
            out.extend(ikjt.keys())
        return out

    def ikjt_of(self, key: str) -> InverseKeyedJaggedTensor | None:
        """The IKJT holding ``key``, or None if ``key`` is a plain feature (or absent)."""
        for ikjt in self.ikjts:
            group = ikjt.keys()
            if key in group:
                return ikjt
        return None

    def validate(self) -> None:
        """Raise :class:`TensorFormatError` if a part is inconsistent or has another batch size."""
        keys = self.keys()
        if len(set(keys)) != len(keys):
            raise TensorFormatError(f"sparse features: a key appears twice in {keys}")
        if self.kjt is not None:
            validate_kjt(self.kjt, name="plain KJT")
            if self.kjt.keys() and self.kjt.stride() != self.batch_size:
                raise TensorFormatError(
                    f"plain KJT has stride {self.kjt.stride()}, batch size is {self.batch_size}"
                )
        for ikjt in self.ikjts:
            ikjt.validate()
            if ikjt.batch_size() != self.batch_size:
                raise TensorFormatError(
                    f"IKJT {ikjt.keys()} has batch size {ikjt.batch_size()}, "
                    f"the batch has {self.batch_size}"
                )

    def to_kjt(self, keys: list[str] | None = None) -> KeyedJaggedTensor:
        """Everything expanded into one KJT of stride B.

        Keys in ``keys`` order if given (any subset of :meth:`keys`, e.g. the catalogue's
        column order), else plain keys then each group's keys.
        """
        parts = [] if self.kjt is None else [self.kjt]
        parts.extend(ikjt.to_kjt() for ikjt in self.ikjts)
        all_keys = [key for part in parts for key in list(part.keys())]
        if not parts:
            merged = KeyedJaggedTensor(
                keys=[],
                values=torch.empty(0, dtype=torch.int64),
                lengths=torch.empty(0, dtype=torch.int64),
                stride=self.batch_size,
            )
        else:
            merged = KeyedJaggedTensor(
                keys=all_keys,
                values=torch.cat([p.values() for p in parts]),
                lengths=torch.cat([p.lengths().to(torch.int64) for p in parts]),
                stride=self.batch_size,
            )
        if keys is None or keys == all_keys:
            return merged
        index = {k: i for i, k in enumerate(all_keys)}
        missing = [k for k in keys if k not in index]
        if missing:
            raise TensorFormatError(f"sparse features have no keys {missing} (have {all_keys})")
        return merged.permute([index[k] for k in keys])

    def to_variable_batch_kjt(self) -> KeyedJaggedTensor:
        """One torchrec variable-batch KJT over every key (plain keys: stride B, identity inverse).

        Consumed natively by torchrec's ``EmbeddingBagCollection``; its output has B rows.
        """
        b = self.batch_size
        keys: list[str] = []
        values: list[torch.Tensor] = []
        lengths: list[torch.Tensor] = []
        strides: list[list[int]] = []
        inverses: list[torch.Tensor] = []
        if self.kjt is not None and self.kjt.keys():
            k = len(self.kjt.keys())
            keys.extend(self.kjt.keys())
            values.append(self.kjt.values())
            lengths.append(self.kjt.lengths().to(torch.int64))
            strides.extend([[b]] * k)
            identity = torch.arange(b, dtype=torch.int64, device=self.kjt.values().device)
            inverses.append(identity.unsqueeze(0).expand(k, b))
        for ikjt in self.ikjts:
            k = len(ikjt.keys())
            keys.extend(ikjt.keys())
            values.append(ikjt.values())
            lengths.append(ikjt.lengths().to(torch.int64))
            strides.extend([[ikjt.num_distinct()]] * k)
            inverses.append(ikjt.inverse_lookup().unsqueeze(0).expand(k, b))
        if not keys:
            raise TensorFormatError("sparse features: no keys to build a variable-batch KJT from")
        return KeyedJaggedTensor(
            keys=keys,
            values=torch.cat(values),
            lengths=torch.cat(lengths),
            stride=b,
            stride_per_key_per_rank=strides,
            inverse_indices=(list(keys), torch.cat(inverses)),
        )

    def wire_bytes(self) -> int:
        """Bytes of the sparse tensors sent to a trainer (plain values + lengths, IKJT parts)."""
        plain = 0 if self.kjt is None else kjt_wire_bytes(self.kjt)
        return plain + sum(ikjt.wire_bytes() for ikjt in self.ikjts)

    def equals(self, other: object) -> bool:
        """Same representation: batch size, plain KJT and IKJTs (in order) exactly equal."""
        if not isinstance(other, SparseFeatures) or self.batch_size != other.batch_size:
            return False
        if (self.kjt is None) != (other.kjt is None):
            return False
        if self.kjt is not None and other.kjt is not None and not kjt_equal(self.kjt, other.kjt):
            return False
        return len(self.ikjts) == len(other.ikjts) and all(
            a.equals(b) for a, b in zip(self.ikjts, other.ikjts, strict=True)
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SparseFeatures:
        return SparseFeatures(
            batch_size=self.batch_size,
            kjt=None if self.kjt is None else self.kjt.to(torch.device(device), non_blocking),
            ikjts=[ikjt.to(device, non_blocking) for ikjt in self.ikjts],
        )

    def pin_memory(self) -> SparseFeatures:
        return SparseFeatures(
            batch_size=self.batch_size,
            kjt=None if self.kjt is None else self.kjt.pin_memory(),
            ikjts=[ikjt.pin_memory() for ikjt in self.ikjts],
        )

    def __getstate__(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "kjt": None if self.kjt is None else kjt_state(self.kjt),
            "ikjts": self.ikjts,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.batch_size = state["batch_size"]
        self.kjt = None if state["kjt"] is None else kjt_from_state(state["kjt"])
        self.ikjts = state["ikjts"]


@dataclass(kw_only=True, slots=True)
class Batch:
    """One training batch as a reader hands it to a trainer."""

    dense: torch.Tensor
    """B x D float32 dense features (catalogue order)."""
    sparse: SparseFeatures
    """Sparse features: plain KJT + one IKJT per dedup group."""
    labels: torch.Tensor
    """B x L float32 labels."""

    @property
    def batch_size(self) -> int:
        return self.sparse.batch_size

    def validate(self) -> None:
        """Raise :class:`TensorFormatError` if shapes, dtypes or batch sizes disagree."""
        b = self.sparse.batch_size
        for part, t in (("dense", self.dense), ("labels", self.labels)):
            if t.dim() != 2 or t.shape[0] != b:
                raise TensorFormatError(f"batch: {part} must be {b} x N, got {tuple(t.shape)}")
            if t.dtype != torch.float32:
                raise TensorFormatError(f"batch: {part} has dtype {t.dtype}, expected float32")
        self.sparse.validate()

    def wire_bytes(self) -> int:
        """Bytes of every tensor sent to a trainer."""
        return (
            self.dense.numel() * self.dense.element_size()
            + self.labels.numel() * self.labels.element_size()
            + self.sparse.wire_bytes()
        )

    def equals(self, other: object) -> bool:
        return (
            isinstance(other, Batch)
            and torch.equal(self.dense, other.dense)
            and torch.equal(self.labels, other.labels)
            and self.sparse.equals(other.sparse)
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            dense=self.dense.to(device, non_blocking=non_blocking),
            sparse=self.sparse.to(device, non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> Batch:
        return Batch(
            dense=self.dense.pin_memory(),
            sparse=self.sparse.pin_memory(),
            labels=self.labels.pin_memory(),
        )

    def __getstate__(self) -> dict[str, Any]:
        return {
            "dense": compact_tensor(self.dense),
            "sparse": self.sparse,
            "labels": compact_tensor(self.labels),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.dense = state["dense"]
        self.sparse = state["sparse"]
        self.labels = state["labels"]
