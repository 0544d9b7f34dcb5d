"""The model's options that a config names, apart from the modules that use them: a training
config is validated (``recd train --config``) without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from recd.errors import ConfigError


class DedupMode(StrEnum):
    """How the model uses IKJTs (the paper's ablation steps)."""

    OFF = "off"
    """Expand every IKJT to B rows first: the plain-KJT baseline and reference."""
    LOOKUP = "lookup"
    """Lookups and pooling on distinct rows; sequence embeddings are expanded to B rows
    (``jagged_index_select``) before the transformers."""
    FULL = "full"
    """As LOOKUP, and each transformer runs once per distinct sequence."""


@dataclass(kw_only=True, slots=True)
class SequenceConfig:
    """The transformer that pools each sequence group (one per group, same shape)."""

    num_layers: int = 1
    """Encoder layers."""
    num_heads: int = 2
    """Attention heads; must divide the embedding dimension (the model width)."""
    ff_dim: int = 32
    """Width of each layer's feed-forward block."""
    max_seq_len: int = 32
    """Positions kept per sequence (the first ``max_seq_len`` ids; readers that want the most
    recent ids apply ``recd.tensors.preprocess.TruncateLast`` first)."""
    pooling: Literal["mean", "first"] = "mean"
    """``mean``: mean over [CLS] and the valid positions; ``first``: the [CLS] output."""
    dropout: float = 0.0
    """Dropout inside the encoder. Must be 0 for the IKJT path to equal the KJT path (dropout
    masks are drawn per row, and a distinct row stands for several batch rows)."""
    exact_attention: bool = True
    """Run attention on the batch-invariant MATH SDPA backend (see the module docstring)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "ff_dim", "max_seq_len"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"sequence.{name} must be >= 1, got {value}")
        if self.pooling not in ("mean", "first"):
            raise ConfigError(f"sequence.pooling must be 'mean' or 'first', got {self.pooling!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"sequence.dropout must be in [0, 1), got {self.dropout}")
