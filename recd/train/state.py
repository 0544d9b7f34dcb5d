"""What a bit-exact resume restores into a trainer (shared by the loop and the checkpointer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from recd.optim import FlatState


@dataclass(kw_only=True, slots=True)
class TrainState:
    """Everything a bit-exact resume needs, captured at a step boundary (copies)."""

    step: int
    """Optimizer steps completed."""
    params: FlatState
    """Weights, Adam m and v of every parameter in the logical (checkpoint) order, and the
    optimizer's step counter: the content of a ``step_NNNNNN.bin`` checkpoint."""
    reader: dict[str, Any]
    """``ResumableLoader.state_dict()`` of this rank: where its next batch starts."""
    rng: torch.Tensor
    """``torch.get_rng_state()``."""
