"""DDP for the parameters DMP does not shard, with sparse gradients summed on the training thread.

torchrec's DMP wraps everything it does not shard in ``DistributedDataParallel``. On CPU that
includes the sequence tables (``EmbeddingCollection``, sparse gradients, see
:mod:`recd.train.sharding`). DDP hands each sparse gradient to gloo's asynchronous sparse
all-reduce, which coalesces the gradient and writes the sum back into the *same* sparse tensor
on a gloo worker thread while the training thread goes on with the backward pass (torchrec's
pooled all-to-alls, DDP's dense buckets on gloo's other worker thread).

With torch 2.13 on CPU that route corrupts the heap: 2-process runs abort with ``malloc():
unaligned tcache chunk detected`` (the core dump examined: gloo's sparse all-reduce, in a
coalesce, on one worker thread and a dense bucket's allreduce on the other, both with a corrupt
malloc cache)
(measured on 2 ranks, ~100 steps of the test job each: 9 of 16 runs crashed, 0 of 7 without
sequence tables, i.e. without sparse gradients; 0 of 30 with this module's hook).

:class:`SyncSparseDataParallel` keeps torchrec's DDP wrapper and registers a comm hook
(:func:`mean_allreduce_hook`):

* dense buckets: unchanged, torch's ``allreduce_hook`` (divide by the world size, asynchronous
  all-reduce that overlaps the rest of the backward);
* sparse buckets: the mean is computed on the training thread, inside the hook, by
  :func:`sparse_mean`: each rank's coalesced rows are all-gathered (blocking, dense tensors
  only) and summed. No sparse tensor is touched by another thread.
"""

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper

if TYPE_CHECKING:
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

__all__ = ["SyncSparseDataParallel", "mean_allreduce_hook", "sparse_mean"]

# No ``from __future__ import annotations`` here: DDP's register_comm_hook compares the hook's
# ``bucket`` annotation with the class dist.GradBucket, not with a string.


def sparse_mean(grad: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The mean over the ranks of ``group`` of one sparse COO gradient (every rank calls it).

    Each rank divides its coalesced values by the world size (as DDP does before summing).
    Two blocking all-gathers follow: the row counts, then one payload per rank holding the
    values and, bit-cast to the values' dtype, the indices (padded to the longest rank). The
    rows are summed by one ``coalesce`` in rank order. Returns a coalesced sparse tensor of
    ``grad``'s shape, dtype and device.
    """
    world = dist.get_world_size(group)
    local = grad.coalesce()
    indices = local.indices()  # (sparse_dim, nnz) int64
    values = local.values() / world  # (nnz, *dense_dims)
    nnz = indices.shape[1]
    count = torch.tensor([nnz], dtype=torch.int64, device=grad.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    sizes = [int(c.item()) for c in counts]
    width = math.prod(values.shape[1:])
    # int64 indices travel as raw bits in the values' dtype (an exact copy, no conversion).
    index_width = indices.shape[0] * indices.element_size() // values.element_size()
    index_bits = indices.t().reshape(-1).view(values.dtype).reshape(nnz, index_width)
    payload = torch.cat([values.reshape(nnz, width), index_bits], dim=1)
    payload = torch.nn.functional.pad(payload, (0, 0, 0, max(sizes) - nnz))
    gathered = [torch.empty_like(payload) for _ in range(world)]
    dist.all_gather(gathered, payload, group=group)
    rows = torch.cat([part[:n] for part, n in zip(gathered, sizes, strict=True)])
    summed = torch.sparse_coo_tensor(
        rows[:, width:].contiguous().view(torch.int64).t(),
        rows[:, :width].reshape(-1, *values.shape[1:]),
        grad.shape,
        dtype=grad.dtype,
        device=grad.device,
        check_invariants=True,  # rows from other ranks: an index out of range raises here
    )
    return summed.coalesce()


def mean_allreduce_hook(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: dense buckets by torch's asynchronous ``allreduce_hook``; a sparse bucket
    (one sparse gradient) by :func:`sparse_mean` on the calling (training) thread."""
    tensor = bucket.buffer()
    if not tensor.is_sparse:
        return allreduce_hook(group, bucket)
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(sparse_mean(tensor, group))
    return done


class SyncSparseDataParallel(DefaultDataParallelWrapper):
    """torchrec's default DDP wrapper plus :func:`mean_allreduce_hook`.

    Pass it to ``DistributedModelParallel(data_parallel_wrapper=...)``.
    """

    def wrap(
        self, dmp: "DistributedModelParallel", env: "ShardingEnv", device: torch.device
    ) -> None:
        super().wrap(dmp, env, device)
        module = dmp._dmp_wrapped_module
        if isinstance(module, DistributedDataParallel):
            module.register_comm_hook(env.process_group, mean_allreduce_hook)
