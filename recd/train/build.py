"""What the Trainer trains, built from a :class:`TrainConfig`: reader, model, optimizer.

:func:`prepare_reader` gives the table's catalogue and one rank's reader config (with the
``hash_modulo`` a feature larger than ``model.max_rows`` needs), :func:`build_model_config`
the DLRM / RM1-like model of ``[model]`` for that catalogue, and :func:`parallelize` the model
to train, the model to evaluate and their optimizer, for one process or several. Tools that
need the model without training it (``recd pivot``, inference, cost analysis) use them too.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch import nn

from recd.errors import ConfigError
from recd.models import DLRM, ModelConfig, dlrm_config, rm1_config
from recd.optim import ModelAdam
from recd.reader import ReaderConfig, build_plan
from recd.schema import Catalogue, SparseKind
from recd.train.config import TrainConfig
from recd.train.launch import DistContext

__all__ = [
    "build_model_config",
    "model_config_of",
    "parallelize",
    "prepare_reader",
    "resolve_device",
]

log = logging.getLogger(__name__)


def resolve_device(name: str, dist: DistContext | None) -> torch.device:
    """The device of ``train.device`` (``auto``: CUDA when there is one); a rank of a
    multi-process job uses the one its launcher gave it."""
    if dist is not None:
        return dist.device
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("train.device: cuda, but no CUDA device is available")
        return torch.device("cuda", 0)
    return torch.device("cpu")


def prepare_reader(
    config: TrainConfig, rank: int, world_size: int
) -> tuple[Catalogue, ReaderConfig]:
    """The table's catalogue (restricted to the read columns) and this rank's reader config:
    rank / world_size set, ``hash_modulo`` added for features larger than ``max_rows``."""
    reader = dataclasses.replace(config.reader, rank=rank, world_size=world_size)
    if world_size > 1 and not reader.drop_last:
        # Sharded lookups exchange equal local batches (row-wise all-gathers fail on a short
        # final batch under gloo): every rank trains on full batches only.
        log.info("reader.drop_last: set for %d ranks (equal local batch sizes)", world_size)
        reader = dataclasses.replace(reader, drop_last=True)
    plan = build_plan(reader)
    assert plan.catalogue is not None  # read from the table, or measured (recd.reader.infer)
    catalogue = dataclasses.replace(
        plan.catalogue,
        labels=list(plan.labels),
        dense=[plan.catalogue.dense[plan.catalogue.dense_names.index(n)] for n in plan.dense],
        sparse=[plan.catalogue.sparse_feature(n) for n in plan.sparse],
    )
    max_rows = config.model.max_rows
    hashed: dict[str, int] = {}
    for spec in reader.preprocessing:
        if spec["kind"] == "hash_modulo":
            hashed.update({f: int(spec["modulo"]) for f in spec["features"]})
    for name, modulo in hashed.items():
        cardinality = catalogue.sparse_feature(name).cardinality
        if cardinality > max_rows and modulo > max_rows:
            raise ConfigError(
                f"reader.preprocessing: hash_modulo of {name!r} by {modulo} leaves ids up to "
                f"{modulo - 1}, but its table has model.max_rows = {max_rows} rows"
            )
    too_big = [
        f.name for f in catalogue.sparse if f.cardinality > max_rows and f.name not in hashed
    ]
    if plan.catalogue_inferred:
        # A table from another tool: its cardinalities were measured on the files read, and
        # held-out rows (another window, or [eval] table) may hold larger ids. Every table
        # takes ids modulo its rows, so an id never seen in training shares a row instead of
        # failing the lookup.
        for f in catalogue.sparse:
            if f.name not in hashed and f.name not in too_big:
                spec = {"kind": "hash_modulo", "features": [f.name], "modulo": f.cardinality}
                reader = dataclasses.replace(reader, preprocessing=[*reader.preprocessing, spec])
    if too_big and config.model.hash_ids:
        spec = {"kind": "hash_modulo", "features": too_big, "modulo": max_rows}
        reader = dataclasses.replace(reader, preprocessing=[*reader.preprocessing, spec])
    elif too_big:
        raise ConfigError(
            f"model.max_rows = {max_rows} is below the cardinality of {too_big}: set "
            "model.hash_ids = true or hash them in reader.preprocessing"
        )
    return catalogue, reader


def model_config_of(config: TrainConfig) -> ModelConfig:
    """The model ``config`` builds (reads the table's catalogue; no weights are made)."""
    catalogue, _ = prepare_reader(config, 0, 1)
    return build_model_config(config, catalogue)


def build_model_config(config: TrainConfig, catalogue: Catalogue) -> ModelConfig:
    """The :class:`models.ModelConfig` of ``[model]`` for the table's catalogue."""
    m = config.model
    common: dict[str, Any] = {
        "embedding_dim": m.embedding_dim,
        "max_rows": m.max_rows,
        "bottom_mlp": m.bottom_mlp,
        "top_mlp": m.top_mlp,
        "dedup": m.dedup,
    }
    if m.top_mlp is not None and m.top_mlp[-1] != len(catalogue.labels):
        raise ConfigError(
            f"model.top_mlp: the last size {m.top_mlp[-1]} must equal the number of labels "
            f"({len(catalogue.labels)}: {catalogue.labels})"
        )
    if m.kind == "dlrm":
        return dlrm_config(catalogue, **common)
    longest = max(
        (f.max_length for f in catalogue.sparse if f.kind is SparseKind.HISTORY), default=1
    )
    return rm1_config(
        catalogue, sequence=m.sequence.to_sequence_config(longest_history=longest), **common
    )


def parallelize(
    model: DLRM, config: TrainConfig, dist: DistContext | None
) -> tuple[nn.Module, nn.Module, Any]:
    """(model to train, model to evaluate, optimizer) for one process or several.

    One process: the DLRM and :class:`recd.optim.ModelAdam`. Several: torchrec's DMP shards
    the tables by ``train.sharding`` (DDP for the rest) and :class:`ShardedAdam` updates them
    (:mod:`recd.train.sharding`). Both optimizers have ``zero_grad``, ``step``, ``step_count``
    and ``load_state(FlatState)``.
    """
    adam = config.optim.to_adam()
    if dist is None:
        return model, model, ModelAdam.for_model(model, adam)
    from recd.optim.sharded_adam import ShardedAdam
    from recd.train.sharding import shard_model

    sharded = shard_model(model, plan=config.train.sharding, device=dist.device, adam=adam)
    return sharded, sharded, ShardedAdam(sharded, adam)
