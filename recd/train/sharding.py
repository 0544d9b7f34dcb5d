"""Hybrid-parallel DLRM: torchrec's DMP shards the embedding tables, DDP runs the dense layers.

:func:`shard_model` wraps a :class:`models.DLRM` in torchrec's ``DistributedModelParallel``
(DMP): the tables of the ``EmbeddingBagCollection`` are sharded over the ranks (model
parallel: ids go to their table's owner by all-to-all, pooled embeddings come back the same
way) and every other parameter is replicated under ``DistributedDataParallel`` (DMP wraps
what it did not shard in DDP; gradients are all-reduced and averaged). Each rank feeds its
own part of the global batch; torchrec divides the embedding gradients by the world size as
DDP does for the dense ones, so one step on R ranks of B/R rows each is the step of one
process on the B rows (up to the order of floating-point sums, see the tests).

Plans (``plan=``): ``table_wise`` (whole tables, balanced greedily by size), ``row_wise``
(every table split into contiguous row blocks, ``ceil(rows / R)`` each, as torchrec does),
``table_row_wise`` (row-wise within a host), ``column_wise`` (column blocks: each rank holds
every row of its columns), ``data_parallel`` (tables replicated, gradients all-reduced),
``auto`` (torchrec's ``EmbeddingShardingPlanner``, restricted to the kinds above and the
compute kernel below), or a dict ``{table: kind}`` (``"table_wise:1"`` pins a table to rank
1). torchrec's CPU planner never proposes row-wise, so the named plans are built by hand with
``construct_module_sharding_plan`` and torchrec's ``table_wise`` / ``row_wise`` / ... helpers.

Adam for the tables (fbgemm's fused-ADAM semantics: only the rows the global batch looked up
are updated): on GPU torchrec's FUSED compute kernel with ``fused_params`` ``optimizer=ADAM``
(:func:`fused_adam_params`; sequence tables, ``EmbeddingCollection``, are sharded the same
way); on CPU, where fbgemm has no fused ADAM, torchrec's DENSE kernel and
:class:`recd.optim.sharded_adam.ShardedAdam` on the touched rows. Sequence tables stay
unsharded on CPU, replicated under DDP with sparse gradients (averaged on the training thread
by :mod:`recd.train.data_parallel`'s comm hook) and updated by :class:`recd.optim.LazyAdam`:
torchrec's dense kernel sum-pools an ``EmbeddingCollection`` on CPU instead of returning
per-position embeddings. :func:`build_sharded_training` builds the sharded model and its
optimizer in one call. The checkpoint order (``logical_layout``) and the blocks a rank holds
(``ParamShard``) live with the optimizer, in :mod:`recd.optim.sharded_adam`.

What runs on CPU (gloo, 2 processes, tested against the unsharded model): table_wise,
row_wise, column_wise and data_parallel (and table_row_wise, checked by hand) with the DENSE
kernel, KJT and IKJT inputs, the pooled DLRM and the RM1-like model. The GPU route (FUSED
kernel + fbgemm's fused ADAM, sharded ``EmbeddingCollection``) follows torchrec's and fbgemm's
API but has not been run here (no GPU on the development machine).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, cast

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_row_wise,
    table_wise,
)
from torchrec.distributed.types import (
    EmbeddingModuleShardingPlan,
    ModuleSharder,
    ShardingEnv,
    ShardingPlan,
    ShardingType,
)
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from recd.errors import ConfigError
from recd.models.dlrm import DLRM, ModelConfig
from recd.optim.config import AdamConfig
from recd.optim.sharded_adam import ShardedAdam, local_tables
from recd.train.data_parallel import SyncSparseDataParallel

__all__ = [
    "SHARDING_KINDS",
    "build_sharded_training",
    "build_sharding_plan",
    "compute_kernel_for",
    "fused_adam_params",
    "shard_model",
]

ShardingKind = Literal[
    "table_wise", "row_wise", "table_row_wise", "column_wise", "data_parallel", "auto"
]
SHARDING_KINDS: tuple[str, ...] = (
    "table_wise",
    "row_wise",
    "table_row_wise",
    "column_wise",
    "data_parallel",
    "auto",
)
"""Accepted values of ``plan`` (a dict maps tables to any of them but ``auto``)."""

_TYPE_OF_KIND: dict[str, ShardingType] = {
    "table_wise": ShardingType.TABLE_WISE,
    "row_wise": ShardingType.ROW_WISE,
    "table_row_wise": ShardingType.TABLE_ROW_WISE,
    "column_wise": ShardingType.COLUMN_WISE,
    "data_parallel": ShardingType.DATA_PARALLEL,
}
_EBC_PATH = "sparse_arch.embedding_bag_collection"
_EC_PATH = "sequence_arch.embedding_collection"


# ----------------------------------------------------------------------------- plan


def compute_kernel_for(device: torch.device) -> EmbeddingComputeKernel:
    """FUSED (fbgemm's fused ADAM) on GPU; DENSE on CPU, where fbgemm has no fused ADAM."""
    return EmbeddingComputeKernel.FUSED if device.type == "cuda" else EmbeddingComputeKernel.DENSE


def fused_adam_params(config: AdamConfig) -> dict[str, Any]:
    """torchrec ``fused_params`` for fbgemm's fused ADAM with ``config``'s embedding settings."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    hyper = config.embedding_hyper()
    return {
        "optimizer": EmbOptimType.ADAM,
        "learning_rate": hyper.lr,
        "beta1": hyper.beta1,
        "beta2": hyper.beta2,
        "eps": hyper.eps,
        "weight_decay": hyper.weight_decay,
    }


def _sharders(device: torch.device, adam: AdamConfig | None) -> list[ModuleSharder[nn.Module]]:
    """EBC (and on GPU EC) sharders; on GPU with fbgemm's fused ADAM."""
    if device.type != "cuda":
        return [cast(ModuleSharder[nn.Module], EmbeddingBagCollectionSharder())]
    fused = fused_adam_params(adam or AdamConfig())
    return [
        cast(ModuleSharder[nn.Module], EmbeddingBagCollectionSharder(fused_params=fused)),
        cast(ModuleSharder[nn.Module], EmbeddingCollectionSharder(fused_params=fused)),
    ]


def _shardable_modules(model: DLRM, device: torch.device) -> dict[str, nn.Module]:
    """Path -> embedding module that DMP shards: the EBC, and on GPU the EC."""
    out: dict[str, nn.Module] = {}
    if model.sparse_arch is not None:
        out[_EBC_PATH] = model.sparse_arch.embedding_bag_collection
    if model.sequence_arch is not None and device.type == "cuda":
        out[_EC_PATH] = model.sequence_arch.embedding_collection
    return out


def _table_sizes(module: nn.Module) -> dict[str, int]:
    """Table name -> rows x columns of an EBC / EC."""
    if isinstance(module, EmbeddingBagCollection):
        configs: list[Any] = list(module.embedding_bag_configs())
    else:
        assert isinstance(module, EmbeddingCollection)
        configs = list(module.embedding_configs())
    return {c.name: c.num_embeddings * c.embedding_dim for c in configs}


def _parse_kind(table: str, kind: str) -> tuple[str, int | None]:
    name, _, rank = kind.partition(":")
    if name not in _TYPE_OF_KIND:
        raise ConfigError(
            f"sharding plan: table {table!r}: {kind!r} is not one of "
            f"{', '.join(_TYPE_OF_KIND)} (table_wise may name a rank: 'table_wise:1')"
        )
    if rank and name != "table_wise":
        raise ConfigError(f"sharding plan: table {table!r}: only table_wise takes a rank")
    try:
        return name, int(rank) if rank else None
    except ValueError:
        raise ConfigError(f"sharding plan: table {table!r}: bad rank in {kind!r}") from None


def build_sharding_plan(
    model: DLRM,
    plan: str | Mapping[str, str],
    *,
    world_size: int,
    device: torch.device,
    local_world_size: int | None = None,
    pg: dist.ProcessGroup | None = None,
    adam: AdamConfig | None = None,
) -> ShardingPlan:
    """torchrec ``ShardingPlan`` for ``model``'s tables (see the module docstring for ``plan``).

    Named plans are built without communication (every rank computes the same plan);
    ``auto`` runs torchrec's planner on rank 0 and broadcasts it over ``pg``.
    """
    modules = _shardable_modules(model, device)
    kernel = compute_kernel_for(device).value
    local = local_world_size or world_size
    by_type = {s.module_type: s for s in _sharders(device, adam)}
    if plan == "auto":
        constraints = {
            table: ParameterConstraints(
                sharding_types=[t.value for t in _TYPE_OF_KIND.values()],
                compute_kernels=[kernel],
            )
            for module in modules.values()
            for table in _table_sizes(module)
        }
        planner = EmbeddingShardingPlanner(
            topology=Topology(
                world_size=world_size, compute_device=device.type, local_world_size=local
            ),
            constraints=constraints,
        )
        return planner.collective_plan(model, list(by_type.values()), pg)
    per_module: dict[str, EmbeddingModuleShardingPlan] = {}
    loads = [0] * world_size
    for path, module in modules.items():
        sizes = _table_sizes(module)
        if isinstance(plan, str):
            if plan not in _TYPE_OF_KIND:
                raise ConfigError(
                    f"sharding plan: {plan!r} is not one of {', '.join(SHARDING_KINDS)}"
                )
            kinds = dict.fromkeys(sizes, plan)
        else:
            unknown = sorted(set(plan) - {t for m in modules.values() for t in _table_sizes(m)})
            if unknown:
                raise ConfigError(
                    f"sharding plan: tables {unknown} are not in the model "
                    f"(tables: {[t for m in modules.values() for t in _table_sizes(m)]})"
                )
            kinds = {t: plan.get(t, "table_wise") for t in sizes}
        generators = {}
        # Largest tables first, each to the least-loaded rank (ties: lowest rank).
        for table in sorted(sizes, key=lambda t: (-sizes[t], list(sizes).index(t))):
            name, rank = _parse_kind(table, kinds[table])
            if name == "table_wise":
                if rank is None:
                    rank = loads.index(min(loads))
                if not 0 <= rank < world_size:
                    raise ConfigError(
                        f"sharding plan: table {table!r} pinned to rank {rank}, world size is "
                        f"{world_size}"
                    )
                loads[rank] += sizes[table]
                generators[table] = table_wise(rank=rank, compute_kernel=kernel)
            elif name == "row_wise":
                generators[table] = row_wise(compute_kernel=kernel)
            elif name == "table_row_wise":
                generators[table] = _with_kernel(table_row_wise(host_index=0), kernel)
            elif name == "column_wise":
                generators[table] = column_wise(
                    ranks=list(range(world_size)), compute_kernel=kernel
                )
            else:
                generators[table] = data_parallel()
        per_module[path] = construct_module_sharding_plan(
            module,
            {t: generators[t] for t in sizes},
            sharder=by_type[type(module)],
            local_size=local,
            world_size=world_size,
            device_type=device.type,
        )
    return ShardingPlan(plan=dict(per_module))


def _with_kernel(generator: Callable[..., Any], kernel: str) -> Callable[..., Any]:
    """A torchrec parameter-sharding generator whose compute kernel is forced to ``kernel``."""

    def wrapped(*args: Any) -> Any:
        sharding = generator(*args)
        sharding.compute_kernel = kernel
        return sharding

    return wrapped


# ----------------------------------------------------------------------------- shard_model


def shard_model(
    model: DLRM,
    *,
    plan: str | Mapping[str, str] = "row_wise",
    pg: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
    adam: AdamConfig | None = None,
) -> DistributedModelParallel:
    """Wrap ``model`` in torchrec's DMP: tables sharded by ``plan``, the rest under DDP.

    Every rank must call it with a model built from the same config and seed. The sharded
    tables start from ``model``'s own weights (DMP would re-initialise them): sharded and
    unsharded training start from the same point. A model on the meta device is sharded
    without copying (load a checkpoint with :meth:`ShardedAdam.load_flat` afterwards, from
    :mod:`recd.optim.sharded_adam`).

    Args:
        model: the unsharded DLRM (its EBC, and on GPU its EC, are replaced in place).
        plan: see the module docstring.
        pg: the process group (default: the world); gloo on CPU, nccl on GPU.
        device: this rank's device (default CPU).
        adam: on GPU, the Adam settings fbgemm's fused ADAM is built with.

    Returns:
        The DMP module: call it as the DLRM, ``dmp(dense, sparse)`` on this rank's rows.
    """
    device = device or torch.device("cpu")
    pg = pg or dist.group.WORLD
    if pg is None:
        raise ConfigError("shard_model: no process group (call init_distributed first)")
    env = ShardingEnv.from_process_group(pg)
    sharding_plan = build_sharding_plan(
        model,
        plan,
        world_size=env.world_size,
        device=device,
        local_world_size=_local_world_size(env.world_size),
        pg=pg,
        adam=adam,
    )
    # The original tables: DMP drops the EBC/EC it shards but these references keep them.
    initial = {
        name: p.detach()
        for name, p in model.named_parameters()
        if not p.is_meta and any(name.startswith(path + ".") for path in sharding_plan.plan)
    }
    with _quiet_torchrec():
        dmp = DistributedModelParallel(
            model,
            env=env,
            device=device,
            plan=sharding_plan,
            sharders=_sharders(device, adam),
            data_parallel_wrapper=SyncSparseDataParallel(),
        )
    if initial:
        with torch.no_grad():
            for table in local_tables(dmp):
                block = initial[table.name][slice(*table.rows), slice(*table.cols)]
                table.weight.copy_(block.to(table.weight.device))
    return dmp


def _local_world_size(world_size: int) -> int:
    """Ranks per host: torchrun's ``LOCAL_WORLD_SIZE``, else everything on one host."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


@contextlib.contextmanager
def _quiet_torchrec() -> Iterator[None]:
    """Silence torchrec's per-table "caching params will be ignored" warnings (DENSE kernel
    and data-parallel tables have no cache: the warning is expected, once per table)."""
    logger = logging.getLogger("torchrec.distributed.utils")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


# ----------------------------------------------------------------------------- one call


def build_sharded_training(
    config: ModelConfig,
    adam: AdamConfig | None = None,
    *,
    plan: str | Mapping[str, str] = "row_wise",
    pg: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
    seed: int | None = None,
) -> tuple[DistributedModelParallel, ShardedAdam]:
    """Build the DLRM (seeded identically on every rank), shard it and make its optimizer.

    ``seed``: ``torch.manual_seed(seed)`` before building, so every rank (and an unsharded
    reference built with the same seed) starts from the same weights.
    """
    if seed is not None:
        torch.manual_seed(seed)
    device = device or torch.device("cpu")
    model = DLRM(config, device=device)
    dmp = shard_model(model, plan=plan, pg=pg, device=device, adam=adam)
    return dmp, ShardedAdam(dmp, adam)
