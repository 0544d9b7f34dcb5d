"""A small synthetic DLRM and its batches for sharded-optimizer tests: no table, no reader.

Batches are a deterministic function of (seed, step, rank), with Zipf-skewed ids, so every
process of a job builds its own part of a global batch and a rerun sees the same data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["SyntheticJob", "make_batch", "model_config_of"]


@dataclass(kw_only=True, slots=True)
class SyntheticJob:
    """The model's size and the batches' shape."""

    world_size: int = 2
    tables: int = 4
    """Embedding tables ``t0 .. t<tables - 1>``."""
    rows: int = 1000
    """Rows per table."""
    dim: int = 8
    dense_features: int = 4
    hidden: int = 32
    batch_size: int = 128
    """Global batch, split evenly over the ranks."""
    ids_per_row: int = 3
    """Ids per row and table (pooled)."""
    seed: int = 0
    lr: float = 0.01


def model_config_of(job: SyntheticJob) -> Any:
    """The job's :class:`recd.models.dlrm.ModelConfig`."""
    from recd.models.dlrm import ModelConfig

    return ModelConfig(
        dense_in_features=job.dense_features,
        num_embeddings={f"t{i}": job.rows for i in range(job.tables)},
        embedding_dim=job.dim,
        bottom_mlp=[job.hidden, job.dim],
        top_mlp=[job.hidden, 1],
    )


def make_batch(job: SyntheticJob, step: int, rank: int) -> tuple[torch.Tensor, Any, torch.Tensor]:
    """(dense B x N, KJT, labels B x 1) of ``rank``'s part of step ``step``'s global batch."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    assert job.batch_size % job.world_size == 0
    n = job.batch_size // job.world_size
    rng = np.random.default_rng([job.seed, step, rank])
    ids = (rng.zipf(1.2, (job.tables, n, job.ids_per_row)) - 1) % job.rows
    dense = torch.from_numpy(rng.standard_normal((n, job.dense_features)).astype(np.float32))
    labels = torch.from_numpy((rng.random((n, 1)) < 0.3).astype(np.float32))
    kjt = KeyedJaggedTensor(
        keys=[f"t{i}" for i in range(job.tables)],
        values=torch.from_numpy(ids.astype(np.int64).reshape(-1)),
        lengths=torch.full((job.tables * n,), job.ids_per_row, dtype=torch.int64),
    )
    return dense, kjt, labels
