"""InverseKeyedJaggedTensor (IKJT): the features of one dedup group, each distinct row once (RecD O3).

A torchrec ``KeyedJaggedTensor`` (KJT) of K keys and batch size B stores ``lengths`` key-major
(K x B entries) and the ids of every row. When rows of a batch repeat (the samples of one user
session carry the same history), an IKJT stores only the D distinct rows of the group plus one
``inverse_lookup`` of B entries shared by all K keys::

    batch (B = 3)      key "c"    key "d"          IKJT (D = 2)
    row 0              [7, 8]     [9]              values         = [7, 8, 11, 9, 12]
    row 1              [7, 8]     [9]              lengths        = [2, 1, 1, 1]  (K x D, key-major)
    row 2              [11]       [12]             inverse_lookup = [0, 0, 1]

Row i of the batch is distinct row ``inverse_lookup[i]`` for every key of the group: that is
why a group's features must match on *every* key before two rows share an entry.

Three views of an IKJT feed the rest of the pipeline:

* :meth:`InverseKeyedJaggedTensor.to_kjt` expands to the exact KJT of the batch (B rows);
* :meth:`InverseKeyedJaggedTensor.distinct_kjt` is the KJT of the D distinct rows, the input of
  deduplicated preprocessing and of "look up distinct rows, then index_select by
  inverse_lookup" in the trainer;
* :meth:`InverseKeyedJaggedTensor.to_variable_batch_kjt` is torchrec's own variable-batch KJT
  (``stride_per_key_per_rank`` + ``inverse_indices``) that ``EmbeddingBagCollection`` consumes
  natively, expanding its pooled output to B rows.

The batch containers (:class:`SparseFeatures`, :class:`Batch`) live in :mod:`recd.tensors.batch`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.errors import TensorFormatError

__all__ = [
    "IKJT",
    "InverseKeyedJaggedTensor",
    "compact_tensor",
    "fbgemm_jagged_index_select",
    "jagged_index_select",
    "jagged_index_select_reference",
    "kjt_equal",
    "kjt_from_state",
    "kjt_state",
    "kjt_wire_bytes",
    "lengths_to_offsets",
    "validate_kjt",
]

_ID_DTYPES = (torch.int32, torch.int64)


def _load_fbgemm() -> bool:
    try:
        import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
    except ImportError:  # pragma: no cover - fbgemm is a declared dependency
        return False
    return hasattr(torch.ops.fbgemm, "jagged_index_select")


_HAS_FBGEMM = _load_fbgemm()


def lengths_to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """Offsets (N + 1, starting at 0) of jagged rows of the given lengths (N,)."""
    if _HAS_FBGEMM:
        return torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)
    out = torch.zeros(lengths.numel() + 1, dtype=lengths.dtype, device=lengths.device)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


def jagged_index_select(
    values: torch.Tensor, lengths: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row j of the output is row ``indices[j]`` (M,) of the jagged input (values, lengths
    (N,)), exact for every integer dtype. fbgemm's kernel on accelerators; on CPU a numpy
    gather on zero-copy views, which beats fbgemm's CPU kernel and the torch reference."""
    if values.device.type == "cpu" and not values.requires_grad:
        return _jagged_index_select_numpy(values, lengths, indices)
    if not _HAS_FBGEMM:
        return jagged_index_select_reference(values, lengths, indices)
    return fbgemm_jagged_index_select(values, lengths, indices)


def fbgemm_jagged_index_select(
    values: torch.Tensor, lengths: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`jagged_index_select` through ``torch.ops.fbgemm.jagged_index_select`` (any device)."""
    if indices.numel() == 0:  # the kernel rejects an empty selection from an empty input
        return values[:0], lengths[:0]
    out_values, out_lengths = torch.ops.fbgemm.jagged_index_select(
        values.unsqueeze(1), lengths.to(torch.int64), indices.to(torch.int64)
    )
    return out_values.squeeze(1), out_lengths.to(lengths.dtype)


def _jagged_index_select_numpy(
    values: torch.Tensor, lengths: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    lengths_np = lengths.numpy()
    offsets = np.zeros(lengths_np.size + 1, dtype=np.int64)
    np.cumsum(lengths_np, out=offsets[1:])
    index = indices.numpy()
    out_lengths = lengths_np[index]
    out_starts = np.cumsum(out_lengths, dtype=np.int64) - out_lengths
    total = int(out_starts[-1] + out_lengths[-1]) if out_lengths.size else 0
    gather = np.repeat(offsets[index] - out_starts, out_lengths)
    gather += np.arange(total, dtype=np.int64)
    return torch.from_numpy(values.numpy()[gather]), torch.from_numpy(out_lengths)


def jagged_index_select_reference(
    values: torch.Tensor, lengths: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-PyTorch :func:`jagged_index_select` (the reference the fbgemm path is tested against)."""
    offsets = lengths_to_offsets(lengths.to(torch.int64))
    out_lengths = lengths[indices]
    out_lengths64 = out_lengths.to(torch.int64)
    total = int(out_lengths64.sum())
    out_offsets = lengths_to_offsets(out_lengths64)
    shift = torch.repeat_interleave(
        offsets[indices] - out_offsets[:-1], out_lengths64, output_size=total
    )
    gather = torch.arange(total, dtype=torch.int64, device=values.device) + shift
    return values[gather], out_lengths


def compact_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself if it owns exactly its storage, else a compact contiguous copy.

    Pickling a tensor writes its whole storage: a view into a larger buffer (a slice of a
    batch, a zero-copy Arrow column) would otherwise ship the whole buffer to the worker.
    """
    if (
        t.is_contiguous()
        and t.storage_offset() == 0
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    ):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class InverseKeyedJaggedTensor:
    """The features of one dedup group, each distinct row stored once.

    Args:
        keys: the group's features (K >= 1 keys, unique).
        values: ids of the distinct rows, key-major like a KJT: (sum(lengths),) int64/int32.
        lengths: ids per key per distinct row, key-major: (K * D,) int64/int32.
        inverse_lookup: (B,) int64; row i of the batch is distinct row ``inverse_lookup[i]``
            of every key.
        offsets: optional (K * D + 1,) cumulative ``lengths``; computed lazily when absent.

    The constructor only checks shapes that every accessor relies on; call :meth:`validate`
    at trust boundaries (after unpickling, before handing to a model) for the full checks.
    """

    __slots__ = ("_inverse_lookup", "_keys", "_lengths", "_offsets", "_values")

    def __init__(
        self,
        *,
        keys: list[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        inverse_lookup: torch.Tensor,
        offsets: torch.Tensor | None = None,
    ) -> None:
        if len(keys) == 0:
            raise TensorFormatError("IKJT: a dedup group needs at least one key, got none")
        if lengths.dim() != 1 or lengths.numel() % len(keys) != 0:
            raise TensorFormatError(
                f"IKJT {keys}: lengths must be 1-D with len(keys) * num_distinct entries, got "
                f"shape {tuple(lengths.shape)} for {len(keys)} keys"
            )
        self._keys: list[str] = list(keys)
        self._values = values
        self._lengths = lengths
        self._inverse_lookup = inverse_lookup
        self._offsets = offsets

    # ------------------------------------------------------------------ accessors
    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        """(sum(lengths),) ids of the distinct rows, key-major."""
        return self._values

    def lengths(self) -> torch.Tensor:
        """(K * D,) ids per key per distinct row, key-major."""
        return self._lengths

    def offsets(self) -> torch.Tensor:
        """(K * D + 1,) cumulative lengths (computed once, then cached)."""
        if self._offsets is None:
            self._offsets = lengths_to_offsets(self._lengths)
        return self._offsets

    def offsets_or_none(self) -> torch.Tensor | None:
        return self._offsets

    def inverse_lookup(self) -> torch.Tensor:
        """(B,) int64: the distinct row used by each row of the batch."""
        return self._inverse_lookup

    def batch_size(self) -> int:
        """B: rows of the batch this IKJT stands for."""
        return int(self._inverse_lookup.numel())

    def num_distinct(self) -> int:
        """D: distinct rows stored."""
        return self._lengths.numel() // len(self._keys)

    def length_per_key(self) -> list[int]:
        """Ids stored per key (distinct rows only)."""
        k, d = len(self._keys), self.num_distinct()
        if d == 0:
            return [0] * k
        return [int(x) for x in self._lengths.view(k, d).sum(dim=1).tolist()]

    @property
    def device(self) -> torch.device:
        return self._values.device

    def wire_bytes(self) -> int:
        """Bytes of the tensors sent to a trainer: values, lengths and inverse_lookup."""
        return _nbytes(self._values) + _nbytes(self._lengths) + _nbytes(self._inverse_lookup)

    # ------------------------------------------------------------------ views
    def distinct_kjt(self) -> KeyedJaggedTensor:
        """KJT of the D distinct rows (stride D): what lookups and preprocessing run on."""
        return KeyedJaggedTensor(
            keys=self._keys,
            values=self._values,
            lengths=self._lengths,
            offsets=self._offsets,
            stride=self.num_distinct(),
        )

    def _expansion_indices(self) -> torch.Tensor:
        """(K * B,) index of the distinct (key, row) slot behind each (key, batch row) slot."""
        k, d = len(self._keys), self.num_distinct()
        key_base = torch.arange(k, dtype=torch.int64, device=self._lengths.device) * d
        return (key_base.unsqueeze(1) + self._inverse_lookup.to(torch.int64).unsqueeze(0)).reshape(
            -1
        )

    def to_kjt(self) -> KeyedJaggedTensor:
        """The exact KJT of the batch (stride B): every row's ids, key-major.

        One fbgemm ``jagged_index_select`` over all keys at once: slot (k, i) of the output is
        slot (k, inverse_lookup[i]) of the distinct rows.
        """
        values, lengths = jagged_index_select(
            self._values, self._lengths, self._expansion_indices()
        )
        return KeyedJaggedTensor(
            keys=self._keys, values=values, lengths=lengths, stride=self.batch_size()
        )

    expand = to_kjt

    def to_variable_batch_kjt(self) -> KeyedJaggedTensor:
        """torchrec's variable-batch KJT: the distinct rows + ``inverse_indices`` (K x B).

        ``stride_per_key_per_rank`` is D for every key (one rank) and ``inverse_indices``
        repeats ``inverse_lookup`` for each key, so torchrec's ``EmbeddingBagCollection`` looks
        up and pools D rows and expands its output to B rows itself.
        """
        k, d, b = len(self._keys), self.num_distinct(), self.batch_size()
        inverse = self._inverse_lookup.to(torch.int64).unsqueeze(0).expand(k, b)
        return KeyedJaggedTensor(
            keys=self._keys,
            values=self._values,
            lengths=self._lengths,
            offsets=self._offsets,
            stride=b,
            stride_per_key_per_rank=[[d]] * k,
            inverse_indices=(list(self._keys), inverse),
        )

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_kjt(
        cls, kjt: KeyedJaggedTensor, *, keys: list[str] | None = None
    ) -> InverseKeyedJaggedTensor:
        """Deduplicate ``keys`` (default: all keys) of a fixed-stride KJT as one group.

        Rows share an entry only if every key of the group holds exactly the same ids;
        distinct rows keep the order of their first occurrence.
        """
        # convert.py builds IKJTs from Arrow and imports this module: import lazily.
        from recd.tensors.jagged import JaggedColumn, find_distinct_rows

        if kjt.variable_stride_per_key():
            raise TensorFormatError("IKJT.from_kjt: variable-batch KJTs are not supported")
        validate_kjt(kjt, name="IKJT.from_kjt input")
        group = list(kjt.keys()) if keys is None else list(keys)
        index = {key: i for i, key in enumerate(kjt.keys())}
        missing = [key for key in group if key not in index]
        if missing:
            raise TensorFormatError(
                f"IKJT.from_kjt: keys {missing} are not in the KJT {kjt.keys()}"
            )
        b = kjt.stride()
        values_np = kjt.values().detach().cpu().numpy()
        offsets_np = kjt.offsets().detach().cpu().to(torch.int64).numpy()
        columns = [
            JaggedColumn(
                offsets=offsets_np[index[key] * b : (index[key] + 1) * b + 1], values=values_np
            )
            for key in group
        ]
        distinct, inverse = find_distinct_rows(columns, batch_size=b)
        key_rows = torch.tensor([index[key] for key in group], dtype=torch.int64) * b
        slots = (key_rows.unsqueeze(1) + torch.from_numpy(distinct).unsqueeze(0)).reshape(-1)
        device = kjt.values().device
        values, lengths = jagged_index_select(kjt.values(), kjt.lengths(), slots.to(device))
        return cls(
            keys=group,
            values=values,
            lengths=lengths,
            inverse_lookup=torch.from_numpy(inverse).to(device),
        )

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise :class:`TensorFormatError` naming the first inconsistency found.

        Checks: unique string keys; 1-D integer tensors of allowed dtypes on one device;
        lengths non-negative and summing to len(values); offsets (if cached) equal to the
        cumulative lengths; inverse_lookup int64 with every entry in [0, D).
        """
        name = f"IKJT {self._keys}"
        if len(set(self._keys)) != len(self._keys) or not all(
            isinstance(k, str) for k in self._keys
        ):
            raise TensorFormatError(f"{name}: keys must be unique strings")
        for part, t, dtypes in (
            ("values", self._values, _ID_DTYPES),
            ("lengths", self._lengths, _ID_DTYPES),
            ("inverse_lookup", self._inverse_lookup, (torch.int64,)),
        ):
            if t.dim() != 1:
                raise TensorFormatError(f"{name}: {part} must be 1-D, got shape {tuple(t.shape)}")
            if t.dtype not in dtypes:
                raise TensorFormatError(
                    f"{name}: {part} has dtype {t.dtype}, expected one of {dtypes}"
                )
            if t.device != self._values.device:
                raise TensorFormatError(f"{name}: {part} is on {t.device}, values on {self.device}")
        _check_lengths(name, self._values, self._lengths)
        if self._offsets is not None and not torch.equal(
            self._offsets.to(torch.int64), lengths_to_offsets(self._lengths.to(torch.int64))
        ):
            raise TensorFormatError(f"{name}: cached offsets do not match the lengths")
        d = self.num_distinct()
        inv = self._inverse_lookup
        if inv.numel() > 0:
            lo, hi = int(inv.min()), int(inv.max())
            if lo < 0 or hi >= d:
                bad = int(torch.nonzero((inv < 0) | (inv >= d))[0, 0])
                raise TensorFormatError(
                    f"{name}: inverse_lookup[{bad}] = {int(inv[bad])} is outside [0, {d}) "
                    f"(num_distinct = {d})"
                )

    def equals(self, other: object) -> bool:
        """Exactly the same representation: keys, values, lengths and inverse_lookup."""
        if not isinstance(other, InverseKeyedJaggedTensor):
            return False
        return (
            self._keys == other._keys
            and _tensor_equal(self._values, other._values)
            and _tensor_equal(self._lengths, other._lengths)
            and _tensor_equal(self._inverse_lookup, other._inverse_lookup)
        )

    # ------------------------------------------------------------------ devices, pickling
    def to(
        self, device: torch.device | str, non_blocking: bool = False
    ) -> InverseKeyedJaggedTensor:
        offsets = self._offsets
        return InverseKeyedJaggedTensor(
            keys=self._keys,
            values=self._values.to(device, non_blocking=non_blocking),
            lengths=self._lengths.to(device, non_blocking=non_blocking),
            inverse_lookup=self._inverse_lookup.to(device, non_blocking=non_blocking),
            offsets=None if offsets is None else offsets.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> InverseKeyedJaggedTensor:
        offsets = self._offsets
        return InverseKeyedJaggedTensor(
            keys=self._keys,
            values=self._values.pin_memory(),
            lengths=self._lengths.pin_memory(),
            inverse_lookup=self._inverse_lookup.pin_memory(),
            offsets=None if offsets is None else offsets.pin_memory(),
        )

    def __getstate__(self) -> dict[str, Any]:
        """Only the base tensors, compacted (offsets are recomputed on demand)."""
        return {
            "keys": self._keys,
            "values": compact_tensor(self._values),
            "lengths": compact_tensor(self._lengths),
            "inverse_lookup": compact_tensor(self._inverse_lookup),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._keys = list(state["keys"])
        self._values = state["values"]
        self._lengths = state["lengths"]
        self._inverse_lookup = state["inverse_lookup"]
        self._offsets = None

    def __repr__(self) -> str:
        return (
            f"InverseKeyedJaggedTensor(keys={self._keys}, batch_size={self.batch_size()}, "
            f"num_distinct={self.num_distinct()}, values={self._values.numel()} ids)"
        )


IKJT = InverseKeyedJaggedTensor


# ---------------------------------------------------------------------- KJT helpers
def _tensor_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.device != b.device:
        return False
    if a.dtype != b.dtype:
        if a.is_floating_point() or b.is_floating_point():
            return False
        a, b = a.to(torch.int64), b.to(torch.int64)
    return bool(torch.equal(a, b))


def _check_lengths(name: str, values: torch.Tensor, lengths: torch.Tensor) -> None:
    if lengths.numel() > 0 and int(lengths.min()) < 0:
        bad = int(torch.nonzero(lengths < 0)[0, 0])
        raise TensorFormatError(f"{name}: lengths[{bad}] = {int(lengths[bad])} is negative")
    total = int(lengths.to(torch.int64).sum())
    if total != values.numel():
        raise TensorFormatError(
            f"{name}: lengths sum to {total} but there are {values.numel()} values"
        )


def kjt_equal(a: KeyedJaggedTensor, b: KeyedJaggedTensor) -> bool:
    """Exact equality of two KJTs: keys, stride per key, lengths and values (ids compared exactly).

    (torchrec's ``kjt_is_equal`` uses ``allclose``, which is not exact for large int64 ids.)
    """
    if list(a.keys()) != list(b.keys()) or a.stride_per_key() != b.stride_per_key():
        return False
    wa, wb = a.weights_or_none(), b.weights_or_none()
    if (wa is None) != (wb is None) or (
        wa is not None and wb is not None and not _tensor_equal(wa, wb)
    ):
        return False
    return _tensor_equal(a.lengths(), b.lengths()) and _tensor_equal(a.values(), b.values())


def validate_kjt(kjt: KeyedJaggedTensor, *, name: str = "KJT") -> None:
    """Raise :class:`TensorFormatError` if a fixed-stride KJT's lengths and values disagree."""
    keys = kjt.keys()
    if len(set(keys)) != len(keys):
        raise TensorFormatError(f"{name}: keys must be unique, got {keys}")
    values, lengths = kjt.values(), kjt.lengths()
    if values.dim() != 1 or values.dtype not in _ID_DTYPES:
        raise TensorFormatError(
            f"{name}: values must be 1-D int32/int64, got {values.dtype} {tuple(values.shape)}"
        )
    if lengths.dim() != 1 or lengths.dtype not in _ID_DTYPES:
        raise TensorFormatError(f"{name}: lengths must be 1-D int32/int64, got {lengths.dtype}")
    expected = sum(kjt.stride_per_key())
    if lengths.numel() != expected:
        raise TensorFormatError(
            f"{name}: {lengths.numel()} lengths for {len(keys)} keys with strides "
            f"{kjt.stride_per_key()} (expected {expected})"
        )
    _check_lengths(name, values, lengths)


def kjt_wire_bytes(kjt: KeyedJaggedTensor) -> int:
    """Bytes of the tensors a fixed-stride KJT sends: values, lengths (and weights)."""
    weights = kjt.weights_or_none()
    return (
        _nbytes(kjt.values())
        + _nbytes(kjt.lengths())
        + (0 if weights is None else _nbytes(weights))
    )


def kjt_state(kjt: KeyedJaggedTensor) -> dict[str, Any]:
    """Picklable base state of a fixed-stride KJT: keys, compact values, lengths and stride."""
    if kjt.variable_stride_per_key():
        raise TensorFormatError("kjt_state: variable-batch KJTs are not supported")
    weights = kjt.weights_or_none()
    return {
        "keys": list(kjt.keys()),
        "values": compact_tensor(kjt.values()),
        "lengths": compact_tensor(kjt.lengths()),
        "weights": None if weights is None else compact_tensor(weights),
        "stride": kjt.stride(),
    }


def kjt_from_state(state: dict[str, Any]) -> KeyedJaggedTensor:
    """Inverse of :func:`kjt_state`."""
    return KeyedJaggedTensor(
        keys=state["keys"],
        values=state["values"],
        lengths=state["lengths"],
        weights=state["weights"],
        stride=state["stride"],
    )
