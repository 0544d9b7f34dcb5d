"""DDP for the parameters DMP does not shard, with sparse gradients summed on the training thread.

torchrec's DMP wraps everything it does not shard in ``DistributedDataParallel``. On CPU that
includes the sequence tables (``EmbeddingCollection``, sparse gradients, see
:mod:`recd.train.sharding`). DDP hands each sparse gradient to gloo's asynchronous sparse
all-reduce, which coalesces the gradient and writes the sum back into the *same* sparse tensor
on a gloo worker thread while the training thread goes on with the backward pass (torchrec's
pooled all-to-alls, DDP's dense buckets on gloo's other worker thread).

With torch 2.13 on CPU that route corrupts the heap: 2-process runs abort with ``malloc():
unaligned tcache chunk detected`` or crash inside gloo's allreduce, each time with gloo's sparse
all-reduce (a coalesce) on one worker thread and a dense bucket's allreduce on the other
(measured: 5 of 8 runs of 300 steps crashed, and 0 of 8 without sequence tables).

:class:`SyncSparseDataParallel` keeps torchrec's DDP wrapper and registers a comm hook
(:func:`mean_allreduce_hook`):

* dense buckets: unchanged, torch's ``allreduce_hook`` (divide by the world size, asynchronous
  all-reduce that overlaps the rest of the backward);
* sparse buckets: the mean is computed on the training thread, inside the hook, by
  :func:`sparse_mean`: each rank's coalesced rows are all-gathered (blocking, dense tensors
  only) and summed. No sparse tensor is touched by another thread.
"""

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

    Each rank divides its coalesced values by the world size (as DDP does before summing),
    the ranks all-gather the row counts, then the padded indices and values, and the rows are
    summed by one ``coalesce`` in rank order. Returns a coalesced sparse tensor of
    ``grad``'s shape, dtype and device.
    """
    world = dist.get_world_size(group)
    local = grad.coalesce()
    indices = local.indices()  # (sparse_dim, nnz)
    values = local.values() / world  # (nnz, *dense_dims)
    nnz = torch.tensor([indices.shape[1]], dtype=torch.int64, device=grad.device)
    counts = [torch.zeros_like(nnz) for _ in range(world)]
    dist.all_gather(counts, nnz, group=group)
    sizes = [int(c.item()) for c in counts]
    longest = max(sizes)
    pad = longest - indices.shape[1]
    padded_indices = torch.nn.functional.pad(indices, (0, pad))
    padded_values = torch.cat([values, values.new_zeros((pad, *values.shape[1:]))])
    all_indices = [torch.empty_like(padded_indices) for _ in range(world)]
    all_values = [torch.empty_like(padded_values) for _ in range(world)]
    dist.all_gather(all_indices, padded_indices, group=group)
    dist.all_gather(all_values, padded_values, group=group)
    summed = torch.sparse_coo_tensor(
        torch.cat([idx[:, :n] for idx, n in zip(all_indices, sizes, strict=True)], dim=1),
        torch.cat([val[:n] for val, n in zip(all_values, sizes, strict=True)]),
        grad.shape,
        dtype=grad.dtype,
        device=grad.device,
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
