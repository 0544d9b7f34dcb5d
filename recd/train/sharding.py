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

Adam for sharded tables (fbgemm's fused-ADAM semantics: only the rows the global batch looked
up are updated; m and v per element; bias correction with the global step):

* **GPU**: torchrec's FUSED compute kernel with ``fused_params`` ``optimizer=ADAM`` (fbgemm's
  fused ADAM runs inside the backward pass; its state is read/written through fbgemm's
  ``split_optimizer_states`` and its ``iter`` counter). Sequence tables
  (``EmbeddingCollection``) are sharded the same way.
* **CPU**: fbgemm has no fused ADAM on CPU, so tables use torchrec's DENSE compute kernel
  (fbgemm's ``DenseTableBatchedEmbeddingBagsCodegen``: the backward writes a dense gradient of
  each local shard) and :class:`ShardedAdam` applies :func:`recd.optim.lazy_adam_update_rows`
  to the rows of each local shard that the global batch touched. The touched rows are read
  where torchrec hands each local lookup kernel its ids, *after* the input all-to-all: a
  forward pre-hook on every kernel records the ids of each local table (already in the
  shard's local row space under row-wise sharding, as fbgemm's bucketisation leaves them).
  Under ``data_parallel`` each rank sees only its own ids, so the ids are all-gathered.
  Sequence tables (``EmbeddingCollection``) stay unsharded on CPU, replicated under DDP with
  sparse gradients (averaged on the training thread by :mod:`recd.train.data_parallel`'s comm
  hook, not by gloo's asynchronous sparse all-reduce; their indices are the global batch's rows) and
  updated by :class:`recd.optim.LazyAdam`: torchrec's dense kernel sum-pools an
  ``EmbeddingCollection`` on CPU instead of returning per-position embeddings.

Dense parameters use ``torch.optim.Adam`` through :class:`recd.optim.ModelAdam`, with the
same step counter as the tables. Call ``step()`` after every training forward + backward: a
training-mode forward (grad enabled) records its ids until the next ``step()``; evaluation
under ``torch.no_grad()`` or ``model.eval()`` records nothing. ``step(capture=True)`` runs
the same update and also returns the record that takes it back bit-exactly (update-undo,
:mod:`recd.recovery.undo`; survivor-based recovery, :mod:`recd.recovery.survivor`).

What runs on CPU (gloo, 2 processes, tested against the unsharded model): table_wise,
row_wise, column_wise and data_parallel (and table_row_wise, checked by hand) with the DENSE
kernel, KJT and IKJT inputs, the pooled DLRM and the RM1-like model. The GPU route (FUSED
kernel + fbgemm's fused ADAM, sharded ``EmbeddingCollection``) follows torchrec's and fbgemm's
API but has not been run here (no GPU on the development machine).

Cost on CPU (2 ranks row-wise, 8 tables x 100k rows x 64, global batch 2048, a busy 2-core
machine; ``python -m tests.distributed.test_sharded_equals_unsharded --measure``): this
route 0.79 s/step; DENSE kernel + ``torch.optim.Adam`` over every local row 3.1 s/step
(4x slower); FUSED kernel + fbgemm's fused EXACT_SGD 0.15 s/step (the CPU floor, but not
Adam). Most of this route's time is fbgemm's dense backward, which writes a gradient the size
of the local shard every step (~0.33 s); the row-sparse update itself is ~0.06-0.1 s.

State in the logical order (checkpoint, :mod:`recd.checkpoint.format`): the checkpoint holds
the *unsharded* model's parameters in ``DLRM.named_parameters()`` order
(:func:`logical_layout`). :meth:`ShardedAdam.local_shards` lists, in that order, the block of
every parameter this rank holds (rows ``[row_start, row_end)``, columns ``[col_start,
col_end)``) with its weights, m and v, and whether this rank is the block's ``owner`` (the one
that writes it: each block of a sharded table has exactly one holder; replicated parameters
are owned by rank 0). :meth:`ShardedAdam.load_flat` is the inverse: every rank copies its
blocks out of the three logical flat arrays (e.g. a checkpoint's read-only memmaps), so a
file written by R ranks loads on any number of ranks. :meth:`ShardedAdam.gather_flat`
assembles the whole logical state on every rank (tests, small models).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder, ShardedEmbeddingCollection
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import (
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
)
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
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.checkpoint.format import ParamLayout
from recd.errors import ConfigError
from recd.models.dlrm import DLRM, ModelConfig
from recd.optim.lazy_adam import RowsStep, lazy_adam_update_rows
from recd.optim.model_adam import AdamConfig, FlatState, ModelAdam
from recd.train.data_parallel import SyncSparseDataParallel

if TYPE_CHECKING:
    from recd.recovery.undo import StepCapture, UndoMethod, UndoRecord

__all__ = [
    "SHARDING_KINDS",
    "ParamShard",
    "RowHyper",
    "ShardedAdam",
    "build_sharded_training",
    "build_sharding_plan",
    "compute_kernel_for",
    "fused_adam_params",
    "logical_layout",
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


class RowHyper(TypedDict):
    """Keyword arguments of :func:`recd.optim.lazy_adam_update_rows` besides ``step``."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float


# ----------------------------------------------------------------------------- layout and plan


def logical_layout(config: ModelConfig) -> ParamLayout:
    """The checkpoint order: the unsharded :class:`DLRM`'s ``named_parameters()`` (built on
    the meta device: no memory, same names and full shapes whatever the sharding)."""
    return ParamLayout.from_named_arrays(
        DLRM(config, device=torch.device("meta")).named_parameters()
    )


def compute_kernel_for(device: torch.device) -> EmbeddingComputeKernel:
    """FUSED (fbgemm's fused ADAM) on GPU; DENSE on CPU, where fbgemm has no fused ADAM."""
    return EmbeddingComputeKernel.FUSED if device.type == "cuda" else EmbeddingComputeKernel.DENSE


def fused_adam_params(config: AdamConfig) -> dict[str, Any]:
    """torchrec ``fused_params`` for fbgemm's fused ADAM with ``config``'s embedding settings."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return {
        "optimizer": EmbOptimType.ADAM,
        "learning_rate": config.lr if config.embedding_lr is None else config.embedding_lr,
        "beta1": config.beta1,
        "beta2": config.beta2,
        "eps": config.eps,
        "weight_decay": config.embedding_weight_decay,
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


# ----------------------------------------------------------------------------- local tables


@dataclass(kw_only=True, slots=True)
class _LocalTable:
    """One block of a sharded table that this rank holds, inside one lookup kernel."""

    name: str
    """The logical parameter name (``...embedding_bags.<table>.weight``)."""
    kernel: Any
    """torchrec's lookup kernel (``BatchedDenseEmbeddingBag`` / ``BatchedFused...``)."""
    index: int
    """The table's position in the kernel (fbgemm's table index)."""
    rows: tuple[int, int]
    cols: tuple[int, int]
    weight: torch.Tensor
    """Live (rows x cols) view of the kernel's weights."""
    fused: bool
    """Updated by fbgemm's fused ADAM in the backward (GPU)."""
    replicated: bool
    """Data-parallel: every rank holds the whole table."""

    def grad(self) -> torch.Tensor | None:
        """The dense gradient of the block (DENSE kernel), or None before a backward."""
        flat = self.kernel.emb_module.weights.grad
        if flat is None:
            return None
        offset = self.kernel.emb_module.weights_physical_offsets[self.index]
        n_rows, n_cols = self.weight.shape
        return flat[offset : offset + n_rows * n_cols].view(n_rows, n_cols)


def _iter_kernels(dmp: DistributedModelParallel) -> Iterator[tuple[str, str, Any, bool]]:
    """(module path, attribute of its tables, lookup kernel, data-parallel) of sharded EBC/EC.

    Reads torchrec internals: each sharded module's ``_lookups`` (one per sharding type;
    data-parallel lookups are wrapped in DDP) and each lookup's ``_emb_modules``.
    """
    from torch.nn.parallel import DistributedDataParallel

    for path, module in dmp.module.named_modules():
        if isinstance(module, ShardedEmbeddingBagCollection):
            attribute = "embedding_bags"
        elif isinstance(module, ShardedEmbeddingCollection):
            attribute = "embeddings"
        else:
            continue
        for lookup in module._lookups:
            is_dp = isinstance(lookup, DistributedDataParallel)
            inner = lookup.module if is_dp else lookup
            for kernel in inner._emb_modules:
                yield path, attribute, kernel, is_dp


def _local_tables(dmp: DistributedModelParallel) -> list[_LocalTable]:
    out = []
    for path, attribute, kernel, is_dp in _iter_kernels(dmp):
        fused = kernel.config.compute_kernel != EmbeddingComputeKernel.DENSE
        if not fused and not hasattr(kernel.emb_module, "weights_physical_offsets"):
            raise ConfigError(f"sharding: unsupported torchrec lookup kernel {type(kernel)}")
        weights = kernel.split_embedding_weights()
        for index, table in enumerate(kernel.config.embedding_tables):
            meta = table.local_metadata
            r0, c0 = (0, 0) if meta is None else (meta.shard_offsets[0], meta.shard_offsets[1])
            weight = weights[index]
            out.append(
                _LocalTable(
                    name=f"{path}.{attribute}.{table.name}.weight",
                    kernel=kernel,
                    index=index,
                    rows=(r0, r0 + weight.shape[0]),
                    cols=(c0, c0 + weight.shape[1]),
                    weight=weight,
                    fused=fused,
                    replicated=is_dp,
                )
            )
    return out


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
    without copying (load a checkpoint with :meth:`ShardedAdam.load_flat` afterwards).

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
            for table in _local_tables(dmp):
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


# ----------------------------------------------------------------------------- optimizer


@dataclass(kw_only=True, slots=True)
class ParamShard:
    """The block of one logical parameter that this rank holds, with its Adam state.

    A 2-D parameter's block is rows ``[row_start, row_end)`` x columns ``[col_start,
    col_end)``; any other parameter is held whole (row range ``[0, shape[0])``).
    """

    name: str
    """Logical parameter name (checkpoint order: :func:`logical_layout`)."""
    shape: tuple[int, ...]
    """The full, unsharded shape."""
    row_start: int
    row_end: int
    col_start: int
    col_end: int
    """Columns of the block (0 and the row width for everything but column-wise tables)."""
    owner: bool
    """This rank writes the block to a checkpoint: sharded blocks have one holder; replicated
    parameters and data-parallel tables are owned by rank 0."""
    weights: torch.Tensor
    adam_m: torch.Tensor
    adam_v: torch.Tensor
    """Block-shaped float32 tensors: live views (``copy=False``) or CPU copies."""

    def element_ranges(self) -> list[tuple[int, int]]:
        """``[start, end)`` element ranges of the block in the flattened (C-order) parameter.

        One range unless the block is narrower than the rows (column-wise): one per row. Add
        ``layout.offset_of(name)`` to place them in a checkpoint region.
        """
        if len(self.shape) < 2:
            return [(0, math.prod(self.shape))] if self.row_end > self.row_start else []
        width = math.prod(self.shape[1:])
        if self.col_start == 0 and self.col_end == width:
            return [(self.row_start * width, self.row_end * width)]
        return [
            (r * width + self.col_start, r * width + self.col_end)
            for r in range(self.row_start, self.row_end)
        ]

    def pieces(self, region: str) -> list[tuple[int, np.ndarray]]:
        """``(start element in the flattened parameter, float32 data)`` of each range of the
        block in ``region`` (``weights``, ``adam_m`` or ``adam_v``): what a rank pwrites."""
        block = {"weights": self.weights, "adam_m": self.adam_m, "adam_v": self.adam_v}[region]
        flat = block.detach().to("cpu", torch.float32).reshape(-1).numpy()
        out, at = [], 0
        for start, end in self.element_ranges():
            out.append((start, flat[at : at + end - start]))
            at += end - start
        return out


class ShardedAdam:
    """Adam for a DMP-sharded DLRM: sharded tables, replicated tables and dense layers.

    One step counter for all. Call ``zero_grad()``, forward, ``backward()``, ``step()`` as with
    any optimizer; on CPU the touched rows of each local table shard are recorded during the
    forward (training mode, grad enabled) and consumed by the next ``step()``.

    Args:
        dmp: the model from :func:`shard_model`.
        config: Adam settings (on GPU the fused tables were built with them by ``shard_model``).
    """

    def __init__(self, dmp: DistributedModelParallel, config: AdamConfig | None = None) -> None:
        self.config = config or AdamConfig()
        self.dmp = dmp
        inner = dmp.module
        if not isinstance(inner, DLRM):
            raise ConfigError(f"ShardedAdam: expected a sharded DLRM, got {type(inner)}")
        self.layout = logical_layout(inner.config)
        """The logical (checkpoint) order and full shapes."""
        self.pg: dist.ProcessGroup = dmp._env.process_group
        self.rank = dist.get_rank(self.pg)
        self.world_size = dist.get_world_size(self.pg)
        self.tables = _local_tables(dmp)
        sharded_paths = [
            path + "."
            for path, m in inner.named_modules()
            if isinstance(m, ShardedEmbeddingBagCollection | ShardedEmbeddingCollection)
        ]
        self._sharded_names = {n for n in self.layout.names if n.startswith(tuple(sharded_paths))}
        params = dict(dmp.named_parameters())
        unsharded = [n for n in self.layout.names if n not in self._sharded_names]
        missing = [n for n in unsharded if n not in params]
        if missing:
            raise ConfigError(f"ShardedAdam: parameters {missing[:5]} not found in the DMP model")
        replicated_tables = {
            f"{prefix}.weight" if prefix else "weight"
            for prefix, m in inner.named_modules()
            if isinstance(m, nn.Embedding | nn.EmbeddingBag)
        }
        self.dense = ModelAdam(
            [(n, params[n]) for n in unsharded],
            config=self.config,
            is_embedding=replicated_tables.__contains__,
        )
        self._moments: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, table in enumerate(self.tables):
            if not table.fused:
                self._moments[i] = (torch.zeros_like(table.weight), torch.zeros_like(table.weight))
        self._touched: dict[tuple[int, int], list[torch.Tensor]] = {}
        self._hooks = [
            kernel.register_forward_pre_hook(self._record_ids)
            for kernel in {id(t.kernel): t.kernel for t in self.tables if not t.fused}.values()
        ]
        self.step_count = 0
        """Optimizer steps completed."""
        self.keep_rows_after = False
        """Keep :attr:`rows_after` (a peer copy of the shards is on)."""
        self.rows_after: list[tuple[int, torch.Tensor, RowsStep]] = []
        """With :attr:`keep_rows_after`, the last :meth:`step`'s updates of this rank's
        sharded (not replicated) table blocks: ``(index in tables, rows, the update's
        RowsStep)``, what a peer copy of the shards needs (:mod:`recd.recovery.peer_copy`);
        replaced by the next step."""
        self.mid_step_hook: Callable[[], None] | None = None
        """Called inside :meth:`step` between the dense update and the tables' (fault
        injection for recovery tests)."""

    # ------------------------------------------------------------------ training
    def _record_ids(self, kernel: Any, args: tuple[Any, ...]) -> None:
        """Forward pre-hook of a DENSE lookup kernel: remember each local table's ids."""
        if not (kernel.training and torch.is_grad_enabled()):
            return
        features = args[0]
        assert isinstance(features, KeyedJaggedTensor)
        per_key = features.values().split(features.length_per_key())
        tables = kernel.config.embedding_tables
        start = 0
        for index, table in enumerate(tables):
            n = table.num_features()
            ids = per_key[start : start + n]
            start += n
            self._touched.setdefault((id(kernel), index), []).extend(ids)

    def zero_grad(self) -> None:
        self.dense.zero_grad()
        for table in self.tables:
            if not table.fused:
                table.kernel.emb_module.weights.grad = None

    @torch.no_grad()
    def step(self, *, capture: bool = False, undo: UndoMethod = "inverse") -> UndoRecord | None:
        """One Adam step: dense layers, replicated tables, then this rank's table shards.

        ``capture=True`` (update-undo, :mod:`recd.recovery.undo`): also return the
        :class:`~recd.recovery.undo.UndoRecord` that takes the whole step back bit-exactly
        (dense layers, replicated tables, this rank's table shards and both step counters;
        CPU route only: fbgemm's fused ADAM updates inside the backward, out of reach), by
        the ``undo`` method (``inverse``: SwIFT's algebra, less memory; ``copy``: the
        pre-update values kept, no work). A captured step that raises part-way (e.g. a
        collective fails because a peer died) is rolled back before the exception
        propagates. Same updates, same bits, either way.
        """
        capture_ = self._new_capture(undo) if capture else None
        try:
            if capture_ is None:
                self.dense.step()
            else:
                capture_.run(self.dense)
                capture_.counter(self, "step_count")
            self.step_count += 1
            if self.mid_step_hook is not None:
                self.mid_step_hook()
            hyper = self.embedding_hyper()
            self.rows_after = []
            for i, (table, m, v, rows, grad) in self._touched_shards():
                args = (table.weight, m, v, rows, grad.index_select(0, rows))
                if capture_ is None:
                    done = lazy_adam_update_rows(*args, **hyper, step=self.step_count)
                else:
                    name = f"{table.name}[{table.rows[0]}:{table.rows[1]}]"
                    done = capture_.update_rows(*args, **hyper, step=self.step_count, name=name)
                if self.keep_rows_after and not table.replicated:
                    self.rows_after.append((i, rows, done))
        except BaseException:
            if capture_ is not None:
                capture_.rollback()
            raise
        return None if capture_ is None else capture_.finish(self.step_count)

    def embedding_hyper(self) -> RowHyper:
        """The table shards' Adam settings, as :func:`recd.optim.lazy_adam_update_rows`
        takes them (``lr``, ``beta1``, ``beta2``, ``eps``, ``weight_decay``)."""
        cfg = self.config
        return {
            "lr": cfg.lr if cfg.embedding_lr is None else cfg.embedding_lr,
            "beta1": cfg.beta1,
            "beta2": cfg.beta2,
            "eps": cfg.eps,
            "weight_decay": cfg.embedding_weight_decay,
        }

    def _new_capture(self, method: UndoMethod = "inverse") -> StepCapture:
        from recd.errors import UndoError
        from recd.recovery.undo import StepCapture

        fused = [t.name for t in self.tables if t.fused]
        if fused:
            raise UndoError(f"tables {fused}: no update-undo for fbgemm's fused ADAM")
        return StepCapture(method=method)

    def _touched_shards(
        self,
    ) -> Iterator[
        tuple[int, tuple[_LocalTable, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    ]:
        """``(index, (table, m, v, rows, grad))`` of every local DENSE-kernel shard the
        batches since the last step touched (index: in :attr:`tables`; rows: (R,) sorted
        unique local rows; grad: the shard's dense gradient); consumes the recorded ids.
        Replicated tables all-gather their rows (a collective: every rank iterates)."""
        touched, self._touched = self._touched, {}
        for i, table in enumerate(self.tables):
            if table.fused:
                continue
            parts = touched.get((id(table.kernel), table.index), [])
            rows = torch.unique(torch.cat(parts).to(torch.int64)) if parts else None
            if table.replicated:
                rows = self._all_gather_rows(rows, table.weight.device)
            grad = table.grad()
            if rows is None or rows.numel() == 0 or grad is None:
                continue
            m, v = self._moments[i]
            yield i, (table, m, v, rows, grad)

    def _all_gather_rows(self, rows: torch.Tensor | None, device: torch.device) -> torch.Tensor:
        """Union over ranks of the rows a data-parallel table was looked up at."""
        local = rows if rows is not None else torch.empty(0, dtype=torch.int64, device=device)
        size = torch.tensor([local.numel()], dtype=torch.int64, device=device)
        sizes = [torch.empty_like(size) for _ in range(self.world_size)]
        dist.all_gather(sizes, size, group=self.pg)
        longest = int(max(int(s) for s in sizes))
        padded = torch.full((longest,), -1, dtype=torch.int64, device=device)
        padded[: local.numel()] = local
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(gathered, padded, group=self.pg)
        every = torch.cat(gathered)
        return torch.unique(every[every >= 0])

    def close(self) -> None:
        """Remove the forward hooks (the optimizer is unusable afterwards)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # ------------------------------------------------------------------ state
    def _table_moments(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        table = self.tables[i]
        if not table.fused:
            return self._moments[i]
        states = table.kernel.emb_module.split_optimizer_states()[table.index]
        return states[0], states[1]

    def local_shards(self, *, copy: bool = True) -> list[ParamShard]:
        """This rank's block of every logical parameter it holds, in checkpoint order.

        ``copy=True``: detached CPU float32 copies (a snapshot safe to write in the
        background); ``copy=False``: live views (writes change the model / optimizer).
        """

        def out(t: torch.Tensor) -> torch.Tensor:
            return t.detach().to("cpu", torch.float32, copy=True) if copy else t

        by_name: dict[str, list[ParamShard]] = {}
        for i, table in enumerate(self.tables):
            m, v = self._table_moments(i)
            by_name.setdefault(table.name, []).append(
                ParamShard(
                    name=table.name,
                    shape=self.layout.spec(table.name).shape,
                    row_start=table.rows[0],
                    row_end=table.rows[1],
                    col_start=table.cols[0],
                    col_end=table.cols[1],
                    owner=self.rank == 0 or not table.replicated,
                    weights=out(table.weight),
                    adam_m=out(m),
                    adam_v=out(v),
                )
            )
        moments_m = self.dense.moments("adam_m")
        moments_v = self.dense.moments("adam_v")
        for name in self.dense.names:
            p = self.dense.params[name]
            shape = tuple(p.shape)
            by_name[name] = [
                ParamShard(
                    name=name,
                    shape=shape,
                    row_start=0,
                    row_end=shape[0] if shape else 1,
                    col_start=0,
                    col_end=math.prod(shape[1:]) if len(shape) > 1 else 1,
                    owner=self.rank == 0,
                    weights=out(p),
                    adam_m=out(moments_m[name]),
                    adam_v=out(moments_v[name]),
                )
            ]
        ordered = []
        for name in self.layout.names:
            ordered.extend(sorted(by_name.get(name, []), key=lambda s: (s.row_start, s.col_start)))
        return ordered

    def load_flat(
        self, *, step: int, weights: np.ndarray, adam_m: np.ndarray, adam_v: np.ndarray
    ) -> None:
        """Set weights, m, v and the step from the logical model's three flat arrays.

        The arrays are in :attr:`layout` order (a checkpoint's regions; read-only memmaps
        are fine: each rank reads only the elements of its blocks).
        """
        for region, flat in (("weights", weights), ("adam_m", adam_m), ("adam_v", adam_v)):
            if flat.shape != (self.layout.n_params,):
                raise ValueError(
                    f"load_flat: {region} has shape {flat.shape}, the model has "
                    f"{self.layout.n_params} parameters"
                )
        with torch.no_grad():
            for i, table in enumerate(self.tables):
                m, v = self._table_moments(i)
                shard = ParamShard(
                    name=table.name,
                    shape=self.layout.spec(table.name).shape,
                    row_start=table.rows[0],
                    row_end=table.rows[1],
                    col_start=table.cols[0],
                    col_end=table.cols[1],
                    owner=False,
                    weights=table.weight,
                    adam_m=m,
                    adam_v=v,
                )
                _copy_block(shard, self.layout.offset_of(table.name), weights, adam_m, adam_v)
        views = {name: self.layout.slice_of(name) for name in self.dense.names}
        self.load_dense(
            step=step,
            weights={name: weights[view] for name, view in views.items()},
            adam_m={name: adam_m[view] for name, view in views.items()},
            adam_v={name: adam_v[view] for name, view in views.items()},
        )

    def load_local(self, shards: list[ParamShard], *, step: int) -> None:
        """Put back this rank's own blocks (``local_shards(copy=True)`` of an optimizer built
        with the same plan and world size, e.g. before a survivor rebuilt the sharded model)
        and the step."""
        index = {(t.name, t.rows[0], t.cols[0]): i for i, t in enumerate(self.tables)}
        dense: dict[str, ParamShard] = {}
        with torch.no_grad():
            for shard in shards:
                if shard.name in self.dense.params:
                    dense[shard.name] = shard
                    continue
                i = index[(shard.name, shard.row_start, shard.col_start)]
                m, v = self._table_moments(i)
                for target, value in (
                    (self.tables[i].weight, shard.weights),
                    (m, shard.adam_m),
                    (v, shard.adam_v),
                ):
                    target.copy_(value.view(target.shape).to(target.device))
        names = self.dense.names
        self.load_dense(
            step=step,
            weights={n: dense[n].weights.numpy().reshape(-1) for n in names},
            adam_m={n: dense[n].adam_m.numpy().reshape(-1) for n in names},
            adam_v={n: dense[n].adam_v.numpy().reshape(-1) for n in names},
        )

    def load_dense(
        self,
        *,
        step: int,
        weights: dict[str, np.ndarray],
        adam_m: dict[str, np.ndarray],
        adam_v: dict[str, np.ndarray],
    ) -> None:
        """Set every dense parameter, its Adam moments and the step (flat arrays per name,
        e.g. a survivor's dense dump), leaving the tables as they are."""
        named_m, named_v = {}, {}
        with torch.no_grad():
            for name in self.dense.names:
                shape = self.layout.spec(name).shape
                p = self.dense.params[name]
                p.copy_(torch.from_numpy(np.array(weights[name], np.float32)).view(shape))
                named_m[name] = np.asarray(adam_m[name]).reshape(shape)
                named_v[name] = np.asarray(adam_v[name]).reshape(shape)
        self.dense.load_moments(step=step, adam_m=named_m, adam_v=named_v)
        self._set_step(step)

    def _set_step(self, step: int) -> None:
        self.step_count = int(step)
        for table in self.tables:
            if table.fused:
                module = table.kernel.emb_module
                module.iter.fill_(step)
                module.iter_cpu.fill_(step)

    def load_state(self, state: FlatState) -> None:
        """:meth:`load_flat` from a :class:`recd.optim.FlatState` (as ``ModelAdam.load_state``)."""
        self.load_flat(
            step=state.step, weights=state.weights, adam_m=state.adam_m, adam_v=state.adam_v
        )

    def export_local(self) -> tuple[int, list[ParamShard]]:
        """``(step, local_shards(copy=True))``: what a rank writes to a checkpoint."""
        return self.step_count, self.local_shards(copy=True)

    def write_local_ranges(
        self, tmp_path: str | os.PathLike[str], shards: list[ParamShard] | None = None
    ) -> int:
        """pwrite this rank's owned blocks into a preallocated checkpoint temp file.

        The distributed save of ``recd.checkpoint.format``: one rank ``preallocate``s the file
        (header: the step, ``layout.n_params``), barrier, every rank calls this (with the
        ``shards`` of its snapshot, default a fresh one), barrier, one rank ``commit``s.
        Returns the number of elements written per region.
        """
        from recd.checkpoint.format import write_region_range

        written = 0
        for shard in self.local_shards(copy=True) if shards is None else shards:
            if not shard.owner:
                continue
            base = self.layout.offset_of(shard.name)
            for region in ("weights", "adam_m", "adam_v"):
                for start, data in shard.pieces(region):
                    write_region_range(tmp_path, region, base + start, data)
                    written += data.size if region == "weights" else 0
        return written

    def gather_flat(self) -> FlatState:
        """The whole logical state (weights, m, v, step) assembled on every rank.

        All-gathers every owned block (``all_gather_object``): for tests and small models;
        a checkpoint writer writes each rank's :meth:`local_shards` ranges instead.
        """
        blocks = [
            (s.name, s.element_ranges(), s.weights.numpy(), s.adam_m.numpy(), s.adam_v.numpy())
            for s in self.local_shards(copy=True)
            if s.owner
        ]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, blocks, group=self.pg)
        n = self.layout.n_params
        regions = [np.full(n, np.nan, np.float32) for _ in range(3)]
        for rank_blocks in gathered:
            for name, ranges, *arrays in rank_blocks:
                base = self.layout.offset_of(name)
                for region, array in zip(regions, arrays, strict=True):
                    flat = array.reshape(-1)
                    at = 0
                    for a, b in ranges:
                        region[base + a : base + b] = flat[at : at + b - a]
                        at += b - a
        if np.isnan(regions[0]).any():
            raise RuntimeError("gather_flat: some parameters are held by no rank")
        return FlatState(
            step=self.step_count, weights=regions[0], adam_m=regions[1], adam_v=regions[2]
        )


def _copy_block(
    shard: ParamShard, base: int, weights: np.ndarray, adam_m: np.ndarray, adam_v: np.ndarray
) -> None:
    """Copy ``shard``'s block out of the three logical flat arrays into its live tensors."""
    for target, flat in ((shard.weights, weights), (shard.adam_m, adam_m), (shard.adam_v, adam_v)):
        parts = [np.asarray(flat[base + a : base + b]) for a, b in shard.element_ranges()]
        block = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        values = torch.from_numpy(block.astype(np.float32, copy=True)).view(target.shape)
        target.copy_(values.to(target.device))


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
