"""Optimizers: Adam for every parameter, embeddings included (RecD trainer, checkpoint format).

- :mod:`recd.optim.lazy_adam`: :class:`LazyAdam`, row-sparse Adam over the rows a batch
  touched, with fbgemm's fused GPU ADAM semantics (fbgemm has no ADAM on CPU);
- :mod:`recd.optim.model_adam`: :class:`ModelAdam`, ``torch.optim.Adam`` for dense parameters
  + LazyAdam for tables, one step counter, state export/import in checkpoint order;
- :mod:`recd.optim.sharded_adam`: :class:`ShardedAdam`, the same Adam for a DMP-sharded DLRM
  (this rank's table shards, replicated tables, dense layers), state in checkpoint order;
- :mod:`recd.optim.config`: :class:`AdamConfig` (what a user sets) and :class:`AdamHyper` (one
  param group's settings, what every update and its inverse read);
- :mod:`recd.optim.measure`: cost per step of LazyAdam vs dense-kernel + torch Adam vs fused
  SGD (``python -m recd.optim.measure``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recd.lazy import lazy_exports

# Names load their submodule on first use (recd.lazy): the light ones (configs) without torch.
_HOME = {
    "config": ("AdamConfig", "AdamHyper"),
    "lazy_adam": (
        "LazyAdam",
        "RowsStep",
        "RowUpdate",
        "lazy_adam_direction",
        "lazy_adam_update_rows",
    ),
    "model_adam": (
        "FlatState",
        "ModelAdam",
        "embedding_parameter_names",
    ),
    "sharded_adam": ("ParamShard", "ShardedAdam"),
}
__all__ = [
    "AdamConfig",
    "AdamHyper",
    "FlatState",
    "LazyAdam",
    "ModelAdam",
    "ParamShard",
    "RowUpdate",
    "RowsStep",
    "ShardedAdam",
    "embedding_parameter_names",
    "lazy_adam_direction",
    "lazy_adam_update_rows",
]

if TYPE_CHECKING:
    from recd.optim.config import AdamConfig, AdamHyper
    from recd.optim.lazy_adam import (
        LazyAdam,
        RowsStep,
        RowUpdate,
        lazy_adam_direction,
        lazy_adam_update_rows,
    )
    from recd.optim.model_adam import FlatState, ModelAdam, embedding_parameter_names
    from recd.optim.sharded_adam import ParamShard, ShardedAdam

__getattr__, __dir__ = lazy_exports(__name__, _HOME, globals())
