"""Reader-side preprocessing as TorchScript modules, and its deduplicated form (RecD O4).

Sparse modules map a torchrec ``KeyedJaggedTensor`` to a KJT and are *row-wise*: each output
row depends only on the same row and key of the input. That is what makes deduplicated
preprocessing exact: running a module over an IKJT's distinct rows (``distinct_kjt()``) and
keeping its ``inverse_lookup`` gives the same batch as running it over the expanded KJT, while
doing the work once per distinct row.

Sparse: :class:`HashModulo` (ids modulo a table size per key), :class:`TruncateLast` (keep the
last N ids of each row per key), :class:`SparseChain`. Dense (B x D float32): :class:`Log1p`,
:class:`Clamp`, :class:`Normalize`. Every module here compiles with ``torch.jit.script``;
variable-batch KJTs (``stride_per_key_per_rank`` + ``inverse_indices``) pass through intact.
(No ``from __future__ import annotations`` here: TorchScript reads the class-level attribute
annotations at runtime and cannot parse them as strings.)
"""

from collections.abc import Mapping, Sequence

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.errors import ConfigError
from recd.tensors.batch import Batch, SparseFeatures
from recd.tensors.ikjt import InverseKeyedJaggedTensor

__all__ = [
    "Clamp",
    "DedupPreprocess",
    "HashModulo",
    "Log1p",
    "Normalize",
    "SparseChain",
    "TruncateLast",
    "apply_to_ikjt",
    "preprocess_batch",
    "preprocess_sparse",
]


def _with_values(
    kjt: KeyedJaggedTensor, values: torch.Tensor, lengths: torch.Tensor
) -> KeyedJaggedTensor:
    """A KJT with ``kjt``'s keys and batch layout (fixed or variable) and new values/lengths."""
    if kjt.variable_stride_per_key():
        # The private field, not stride_per_key_per_rank(): its tolist() fails under TorchScript.
        return KeyedJaggedTensor(
            keys=kjt.keys(),
            values=values,
            lengths=lengths,
            stride_per_key_per_rank=kjt._stride_per_key_per_rank,
            inverse_indices=kjt.inverse_indices_or_none(),
        )
    return KeyedJaggedTensor(keys=kjt.keys(), values=values, lengths=lengths, stride=kjt.stride())


class HashModulo(nn.Module):
    """Ids of the listed keys -> ``id mod table_size`` (non-negative); other keys unchanged.

    Args:
        table_sizes: key -> number of rows of its embedding table (> 0).
    """

    table_sizes: dict[str, int]

    def __init__(self, table_sizes: Mapping[str, int]) -> None:
        super().__init__()
        for key, size in table_sizes.items():
            if size <= 0:
                raise ConfigError(f"HashModulo: table size of {key!r} must be > 0, got {size}")
        self.table_sizes = dict(table_sizes)

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        sizes: list[int] = []
        touched = False
        keys = kjt.keys()
        for key in keys:
            size = self.table_sizes.get(key, 0)
            touched = touched or size > 0
            sizes.append(size)
        if not touched:
            return kjt
        values = kjt.values()
        counts = kjt.length_per_key()
        # One scalar remainder per run of consecutive keys sharing a table size (usually a
        # single run): a tensor modulus per id cost over twice as much.
        hashed = torch.empty_like(values)
        lo = 0
        i = 0
        while i < len(keys):
            j = i
            hi = lo
            while j < len(keys) and sizes[j] == sizes[i]:
                hi += counts[j]
                j += 1
            if sizes[i] > 0:
                torch.remainder(values[lo:hi], sizes[i], out=hashed[lo:hi])
            else:
                hashed[lo:hi] = values[lo:hi]
            lo = hi
            i = j
        if lo < values.numel():  # ids past the last row (none in a compact KJT): as they are
            hashed[lo:] = values[lo:]
        return _with_values(kjt, hashed, kjt.lengths())


class TruncateLast(nn.Module):
    """Rows of the listed keys keep only their last ``max_lengths[key]`` ids.

    Args:
        max_lengths: key -> maximum ids per row (>= 0); other keys unchanged.
    """

    max_lengths: dict[str, int]

    def __init__(self, max_lengths: Mapping[str, int]) -> None:
        super().__init__()
        for key, n in max_lengths.items():
            if n < 0:
                raise ConfigError(f"TruncateLast: max length of {key!r} must be >= 0, got {n}")
        self.max_lengths = dict(max_lengths)

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        caps: list[int] = []
        touched = False
        keys = kjt.keys()
        for key in keys:
            cap = self.max_lengths.get(key, -1)
            touched = touched or cap >= 0
            caps.append(cap)
        if not touched:
            return kjt
        values, lengths = kjt.values(), kjt.lengths()
        lengths64 = lengths.to(torch.int64)
        device = values.device
        strides = torch.tensor(kjt.stride_per_key(), dtype=torch.int64, device=device)
        cap_per_row = torch.repeat_interleave(
            torch.tensor(caps, dtype=torch.int64, device=device),
            strides,
            output_size=lengths.numel(),
        )
        kept = torch.where(cap_per_row >= 0, torch.minimum(lengths64, cap_per_row), lengths64)
        if torch.equal(kept, lengths64):  # no row over its cap: nothing to gather
            return kjt
        # The kept ids, gathered: kept id p of row r sits at (r's new offset + shift[r]) in
        # the input, shift[r] = r's end in the input - its kept length - its new offset.
        new_offsets = torch.zeros(kept.numel() + 1, dtype=torch.int64, device=device)
        torch.cumsum(kept, 0, out=new_offsets[1:])
        n = int(new_offsets[-1])
        ends = kjt.offsets()[1:].to(torch.int64)
        shift = ends - kept - new_offsets[:-1]
        index = torch.arange(n, dtype=torch.int64, device=device) + torch.repeat_interleave(
            shift, kept, output_size=n
        )
        return _with_values(kjt, values.index_select(0, index), kept.to(lengths.dtype))


class SparseChain(nn.Module):
    """Sparse modules applied in order (``nn.Sequential`` cannot script a KJT signature)."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        super().__init__()
        self.stages = nn.ModuleList(modules)

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        for stage in self.stages:
            kjt = stage(kjt)
        return kjt


class Log1p(nn.Module):
    """B x D -> log(1 + max(x, 0)): counts and durations onto a log scale (negatives -> 0)."""

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        return torch.log1p(torch.clamp_min(dense, 0.0))


class Clamp(nn.Module):
    """B x D -> x clamped into [min_value, max_value]."""

    def __init__(self, min_value: float, max_value: float) -> None:
        super().__init__()
        if not min_value <= max_value:
            raise ConfigError(f"Clamp: min_value {min_value} > max_value {max_value}")
        self.min_value = float(min_value)
        self.max_value = float(max_value)

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        return torch.clamp(dense, self.min_value, self.max_value)


class Normalize(nn.Module):
    """B x D -> (x - mean) / std with per-column mean and std (D,)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        if len(mean) != len(std):
            raise ConfigError(f"Normalize: {len(mean)} means but {len(std)} stds")
        bad = [i for i, s in enumerate(std) if not s > 0]
        if bad:
            raise ConfigError(f"Normalize: std[{bad[0]}] = {std[bad[0]]} must be > 0")
        self.register_buffer("mean", torch.tensor(list(mean), dtype=torch.float32))
        self.register_buffer("std", torch.tensor(list(std), dtype=torch.float32))

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        return (dense - self.mean) / self.std


# ---------------------------------------------------------------------- deduplicated form
def apply_to_ikjt(module: nn.Module, ikjt: InverseKeyedJaggedTensor) -> InverseKeyedJaggedTensor:
    """Run a row-wise KJT module over the distinct rows only; keep the inverse_lookup.

    Rows that became equal (e.g. two histories truncated to the same tail) stay separate
    entries: the result is exact, just not re-deduplicated.
    """
    out = module(ikjt.distinct_kjt())
    if list(out.keys()) != ikjt.keys() or out.stride() != ikjt.num_distinct():
        raise ConfigError(
            f"preprocessing module {type(module).__name__} changed the keys or rows of IKJT "
            f"{ikjt.keys()}: only row-wise modules can run deduplicated"
        )
    return InverseKeyedJaggedTensor(
        keys=ikjt.keys(),
        values=out.values(),
        lengths=out.lengths(),
        inverse_lookup=ikjt.inverse_lookup(),
    )


class DedupPreprocess(nn.Module):
    """Wraps a (scripted or eager) row-wise KJT module so it takes and returns an IKJT."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, ikjt: InverseKeyedJaggedTensor) -> InverseKeyedJaggedTensor:
        return apply_to_ikjt(self.module, ikjt)


def preprocess_sparse(features: SparseFeatures, module: nn.Module) -> SparseFeatures:
    """Apply ``module`` to the plain KJT and, deduplicated, to every IKJT."""
    return SparseFeatures(
        batch_size=features.batch_size,
        kjt=None if features.kjt is None else module(features.kjt),
        ikjts=[apply_to_ikjt(module, ikjt) for ikjt in features.ikjts],
    )


def preprocess_batch(
    batch: Batch, *, sparse: nn.Module | None = None, dense: nn.Module | None = None
) -> Batch:
    """A batch with ``sparse`` applied to its sparse features and ``dense`` to B x D dense."""
    return Batch(
        dense=batch.dense if dense is None else dense(batch.dense),
        sparse=batch.sparse if sparse is None else preprocess_sparse(batch.sparse, sparse),
        labels=batch.labels,
    )
