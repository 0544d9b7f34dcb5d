"""Adam for a DMP-sharded DLRM (:mod:`recd.train.sharding`): dense layers, replicated tables
and this rank's table shards, one step counter.

On GPU the tables update inside the backward (fbgemm's fused ADAM, torchrec's FUSED kernel).
fbgemm has no fused ADAM on CPU, so there the tables use torchrec's DENSE kernel and
:class:`ShardedAdam` applies :func:`recd.optim.lazy_adam_update_rows` to the rows of each local
shard that the global batch touched: a forward pre-hook on each lookup kernel records its ids
after the input all-to-all (data-parallel tables all-gather them). Dense parameters and
replicated tables go through :class:`recd.optim.ModelAdam`.

State moves in the checkpoint's logical order (:func:`logical_layout`): each rank lists its
blocks (:class:`ParamShard`) and loads them back from flat arrays, so a checkpoint written by
R ranks loads on any number of ranks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding import ShardedEmbeddingCollection
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.checkpoint.delta import Block
from recd.checkpoint.format import ParamLayout
from recd.errors import ConfigError
from recd.models.dlrm import DLRM, ModelConfig
from recd.optim.config import AdamConfig
from recd.optim.lazy_adam import RowsStep, lazy_adam_update_rows
from recd.optim.model_adam import DeltaPart, FlatState, ModelAdam
from recd.optim.row_log import RowLog

if TYPE_CHECKING:
    from recd.recovery.undo import StepCapture, UndoMethod, UndoRecord

__all__ = ["LocalTable", "ParamShard", "ShardedAdam", "local_tables", "logical_layout"]


def logical_layout(config: ModelConfig) -> ParamLayout:
    """The checkpoint order: the unsharded :class:`DLRM`'s ``named_parameters()`` (built on
    the meta device: no memory, same names and full shapes whatever the sharding)."""
    return ParamLayout.from_named_arrays(
        DLRM(config, device=torch.device("meta")).named_parameters()
    )


@dataclass(kw_only=True, slots=True)
class LocalTable:
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


def local_tables(dmp: DistributedModelParallel) -> list[LocalTable]:
    """Every table block this rank holds, kernel by kernel (torchrec's lookup order)."""
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
                LocalTable(
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
        dmp: the model from :func:`recd.train.sharding.shard_model`.
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
        self.tables = local_tables(dmp)
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
        self.row_log: dict[int, RowLog] | None = None
        """With :meth:`log_rows` on: local table index -> the (local) rows updated since the
        log was last taken (what a delta checkpoint writes)."""
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
            hyper = self.config.embedding_hyper()
            self.rows_after = []
            for i, (table, m, v, rows, grad) in self._touched_shards():
                args = (table.weight, m, v, rows, grad.index_select(0, rows))
                if capture_ is None:
                    done = lazy_adam_update_rows(*args, hyper=hyper, step=self.step_count)
                else:
                    name = f"{table.name}[{table.rows[0]}:{table.rows[1]}]"
                    done = capture_.update_rows(*args, hyper=hyper, step=self.step_count, name=name)
                if self.row_log is not None:
                    log = self.row_log.get(i)
                    if log is None:
                        log = self.row_log[i] = RowLog(table.weight.shape[0])
                    log.add(rows)
                if self.keep_rows_after and not table.replicated:
                    self.rows_after.append((i, rows, done))
        except BaseException:
            if capture_ is not None:
                capture_.rollback()
            raise
        return None if capture_ is None else capture_.finish(self.step_count)

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
        tuple[int, tuple[LocalTable, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
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

    def log_rows(self) -> bool:
        """Remember the rows each step updates (for delta checkpoints); False (and nothing
        logged) when a table is updated by fbgemm's fused ADAM inside the backward, where
        its rows cannot be seen."""
        if any(t.fused for t in self.tables):
            return False
        if self.row_log is None:
            self.row_log = {}
        self.dense.log_rows()
        return True

    def reset_logged_rows(self) -> None:
        """Forget the rows logged so far (a full checkpoint was taken)."""
        for table_log in (self.row_log or {}).values():
            table_log.reset()
        self.dense.reset_logged_rows()

    @torch.no_grad()
    def delta_blocks(self, layout: ParamLayout) -> list[DeltaPart]:
        """This rank's share of a delta checkpoint (and fresh row logs): the rows of its table
        blocks updated since the last call (global rows; a column block is narrower than the
        row), and, on rank 0, the unsharded parameters (:meth:`ModelAdam.delta_blocks`).
        Every rank calls it."""
        if self.row_log is None:
            raise RuntimeError("ShardedAdam.delta_blocks: call log_rows() first")
        parts: list[DeltaPart] = []
        for i, table in enumerate(self.tables):
            logged = self.row_log.get(i)
            rows = None if logged is None else logged.take()
            if rows is None or (table.replicated and self.rank != 0):
                continue
            m, v = self._table_moments(i)
            width_full = self.layout.spec(table.name).shape[1]
            start = layout.offset_of(table.name) + table.cols[0]
            global_rows = (rows + table.rows[0]).cpu().numpy().astype(np.int32)
            block = Block(start, width_full, table.cols[1] - table.cols[0], global_rows)
            values = tuple(
                s.index_select(0, rows).reshape(-1).to("cpu", torch.float32).numpy()
                for s in (table.weight, m, v)
            )
            parts.append((block, values))
        if self.rank != 0:  # rank 0 writes the unsharded parameters
            self.dense.reset_logged_rows()
            return parts
        return parts + self.dense.delta_blocks(layout)

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
