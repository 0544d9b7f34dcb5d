"""Float32 bit tools for exact undo: ulp distances, checksums and sparse corrections.

An optimizer update rounds, so its algebraic inverse computed in float32 can land a few ulps
(units in the last place) off the pre-update value, or, where the update lost information,
far off (see :mod:`recd.recovery.undo`). A :class:`Correction` stores just enough to turn such
a candidate into the exact pre-update bits: the elements where they differ, encoded as

* ``sparse``: (index, exact float32 value) per mismatching element, 4 + 4 bytes each; or
* ``dense``: one int8 per element, the signed ulp offset from the candidate to the truth,
  plus sparse (index, value) exceptions where the offset does not fit in an int8: 1 byte per
  element + 8 per exception. Cheaper once more than 1/8 of the elements mismatch.

:meth:`Correction.between` picks the cheaper encoding. Ulp offsets are taken on the
*ordered* integer image of the float32 bits (:func:`ordered_bits`): adjacent floats map to
adjacent integers and the map is a bijection on all 2^32 bit patterns (-0.0 and +0.0 are one
apart, NaN payloads are kept), so ``candidate + offset`` decodes to the exact bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "Correction",
    "Inexactness",
    "bits_checksum",
    "bits_checksums",
    "from_ordered_bits",
    "measure_inexactness",
    "ordered_bits",
    "ulp_distance",
]

_INT8_MAX = 127
_SIGN = 1 << 31
_MAGNITUDE = _SIGN - 1


def ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """The float32 tensor's bits as int64 integers ordered like the floats (flat, (n,)).

    Non-negative floats keep their bit pattern; a negative float with magnitude bits ``k``
    maps to ``-k - 1`` (so -0.0 -> -1, just below +0.0 -> 0).
    """
    return _ordered32(_bits(t)).to(torch.int64)


def from_ordered_bits(o: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`ordered_bits`: (n,) int64 (or int32) -> (n,) float32."""
    return _ordered32(o.to(torch.int32)).view(torch.float32)


def _ordered32(i: torch.Tensor) -> torch.Tensor:
    """The ordered image in int32, an involution: ``i ^ (sign ? 0x7fffffff : 0)``.

    A negative pattern with magnitude ``k`` is ``~k`` as int32 after flipping its magnitude
    bits, i.e. ``-k - 1``: three integer ops instead of a 64-bit select.
    """
    return i ^ ((i >> 31) & _MAGNITUDE)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|ordered(a) - ordered(b)| per element, flat (n,) int64: 0 iff the bits are equal."""
    return (ordered_bits(a) - ordered_bits(b)).abs()


def bits_checksum(t: torch.Tensor) -> int:
    """Sum of the float32 bit patterns as int64: equal tensors give equal sums.

    A cheap check that a restored tensor is the one captured (any single changed element
    changes the sum); not a cryptographic hash.
    """
    return int(_bits(t).sum(dtype=torch.int64))


def bits_checksums(tensors: Sequence[torch.Tensor] | torch.Tensor) -> list[int]:
    """:func:`bits_checksum` of each tensor, or of each row of a 2-D float32 tensor (one
    reduction for all rows)."""
    if isinstance(tensors, torch.Tensor):
        if tensors.dtype != torch.float32 or tensors.dim() != 2:
            raise TypeError(f"expected a 2-D float32 tensor, got {tensors.dtype} {tensors.dim()}-D")
        return tensors.detach().view(torch.int32).sum(1, dtype=torch.int64).tolist()
    if not tensors:
        return []
    return torch.stack([_bits(t).sum(dtype=torch.int64) for t in tensors]).tolist()


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype != torch.float32:
        raise TypeError(f"expected a float32 tensor, got {t.dtype}")
    if t.requires_grad:
        t = t.detach()
    return (t if t.dim() == 1 else t.reshape(-1)).view(torch.int32)


@dataclass(kw_only=True, slots=True)
class Inexactness:
    """How far a candidate is from the truth, bitwise."""

    elements: int
    """Elements compared."""
    mismatched: int
    """Elements whose bits differ."""
    max_ulp: int
    """Largest ulp distance (0 when bit-exact)."""

    @property
    def mismatch_fraction(self) -> float:
        return self.mismatched / self.elements if self.elements else 0.0

    def merge(self, other: Inexactness) -> Inexactness:
        """Both comparisons together."""
        return Inexactness(
            elements=self.elements + other.elements,
            mismatched=self.mismatched + other.mismatched,
            max_ulp=max(self.max_ulp, other.max_ulp),
        )

    def as_dict(self) -> dict[str, float | int]:
        return {
            "elements": self.elements,
            "mismatched": self.mismatched,
            "mismatch_fraction": self.mismatch_fraction,
            "max_ulp": self.max_ulp,
        }


def measure_inexactness(candidate: torch.Tensor, truth: torch.Tensor) -> Inexactness:
    """Bitwise distance of ``candidate`` from ``truth`` (same number of float32 elements)."""
    d = ulp_distance(candidate, truth)
    return Inexactness(
        elements=d.numel(),
        mismatched=int(torch.count_nonzero(d)),
        max_ulp=int(d.max()) if d.numel() else 0,
    )


@dataclass(kw_only=True, slots=True, eq=False)
class Correction:
    """What turns an inverse's candidate into the exact pre-update bits (flat tensors)."""

    numel: int
    """Elements of the corrected tensor."""
    mismatched: int
    """Elements where the candidate was not bit-exact."""
    offsets: torch.Tensor | None
    """Dense encoding: (numel,) int8 ulp offsets from the candidate (0 where exact or where
    an exception below holds the value); None for the sparse encoding."""
    indices: torch.Tensor
    """(K,) int32 (int64 past 2^31 elements) flat indices of the exact values below."""
    values: torch.Tensor
    """(K,) float32 exact values: every mismatch (sparse) or the exceptions (dense)."""

    @classmethod
    def between(cls, candidate: torch.Tensor, truth: torch.Tensor) -> Correction:
        """The cheaper encoding of ``truth`` given ``candidate`` (float32, same numel)."""
        cand = _bits(candidate)
        true = _bits(truth)
        n = true.numel()
        if cand.numel() != n:
            raise ValueError(f"Correction: {cand.numel()} candidate vs {n} elements")
        # One pass finds the mismatches; their count is the index list's length.
        idx = torch.ne(cand, true).nonzero().view(-1)
        k = idx.numel()
        index_dtype, index_size = (torch.int32, 4) if n < _SIGN else (torch.int64, 8)
        sparse_bytes = k * (4 + index_size)
        if sparse_bytes > n:
            offsets = torch.sub(_ordered32(true).to(torch.int64), _ordered32(cand))
            big = offsets.abs() > _INT8_MAX
            far = big.nonzero().view(-1)
            if n + far.numel() * (4 + index_size) < sparse_bytes:
                return cls(
                    numel=n,
                    mismatched=k,
                    offsets=offsets.masked_fill_(big, 0).to(torch.int8),
                    indices=far.to(index_dtype),
                    values=true.index_select(0, far).view(torch.float32),
                )
        return cls(
            numel=n,
            mismatched=k,
            offsets=None,
            indices=idx.to(index_dtype),
            values=true.index_select(0, idx).view(torch.float32),
        )

    @property
    def encoding(self) -> str:
        """``dense`` (int8 offsets + exceptions) or ``sparse`` (index + value per mismatch)."""
        return "sparse" if self.offsets is None else "dense"

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        dense = 0 if self.offsets is None else self.offsets.numel()
        return dense + _nbytes(self.indices) + _nbytes(self.values)

    def apply(self, candidate: torch.Tensor) -> torch.Tensor:
        """The exact flat (numel,) tensor: ``candidate`` (any shape, numel elements) corrected.

        May reuse ``candidate``'s storage (pass a tensor you own).
        """
        cand = candidate.reshape(-1)
        if cand.numel() != self.numel:
            raise ValueError(f"Correction: {cand.numel()} elements, expected {self.numel}")
        if self.offsets is not None:
            cand = from_ordered_bits(ordered_bits(cand) + self.offsets)
        if self.indices.numel():
            cand.index_copy_(0, self.indices.to(torch.int64), self.values)
        return cand


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
