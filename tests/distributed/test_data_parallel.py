"""The DDP comm hook for what DMP does not shard (``recd.train.data_parallel``), on 2 real gloo
processes: a sparse gradient's mean equals the dense mean (empty ranks, repeated and
uncoalesced rows included), and DDP with the hook gives the same gradients as without it."""

from __future__ import annotations

import signal
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from recd.train.data_parallel import mean_allreduce_hook, sparse_mean
from recd.train.signals import SignalFlags
from tests.distributed.spawn import WorkerFailed, run_workers

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

ROWS, DIM = 10, 3


def _local_grad(rank: int, case: str) -> torch.Tensor:
    """An uncoalesced sparse (ROWS x DIM) gradient per rank; ``empty``: rank 1 has no rows."""
    gen = torch.Generator().manual_seed(10 + rank)
    if case == "empty" and rank == 1:
        ids = torch.zeros(0, dtype=torch.int64)
    else:
        ids = torch.randint(0, ROWS, (7 + 3 * rank,), generator=gen)  # repeats likely
    values = torch.randn(ids.numel(), DIM, generator=gen)
    return torch.sparse_coo_tensor(ids.unsqueeze(0), values, (ROWS, DIM))


def _sparse_mean_worker(rank: int, world: int, case: str) -> dict[str, Any]:
    grad = _local_grad(rank, case)
    out = sparse_mean(grad)
    dense = grad.to_dense() / world
    dist.all_reduce(dense)
    return {
        "mean": out.to_dense(),
        "dense_mean": dense,
        "coalesced": out.is_coalesced(),
        "shape": tuple(out.shape),
    }


@pytest.mark.parametrize("case", ["both", "empty"])
def test_sparse_mean_equals_the_dense_mean(case: str) -> None:
    results = run_workers(_sparse_mean_worker, world_size=2, timeout_s=90, args=(case,))
    for r in results:
        assert r["coalesced"] and r["shape"] == (ROWS, DIM)
        torch.testing.assert_close(r["mean"], r["dense_mean"], rtol=0, atol=1e-6)
    assert torch.equal(results[0]["mean"], results[1]["mean"])  # every rank holds one answer


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(ROWS, DIM, sparse=True)
        self.linear = nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.linear(self.table(ids)).sum()


def _ddp_worker(rank: int, world: int) -> dict[str, torch.Tensor]:
    grads: dict[str, torch.Tensor] = {}
    for hooked in (False, True):
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(_Tiny())
        if hooked:
            model.register_comm_hook(None, mean_allreduce_hook)
        ids = torch.arange(rank, ROWS, 3)  # the ranks touch different, overlapping rows
        for _ in range(2):  # DDP rebuilds its buckets after the first step
            model.zero_grad(set_to_none=True)
            model(ids).backward()
        for name, p in model.module.named_parameters():
            assert p.grad is not None
            grad = p.grad.to_dense() if p.grad.is_sparse else p.grad
            grads[f"{'hook' if hooked else 'ddp'}:{name}"] = grad.clone()
    return grads


def test_ddp_with_the_hook_matches_plain_ddp() -> None:
    for grads in run_workers(_ddp_worker, world_size=2, timeout_s=90):
        for name in ("table.weight", "linear.weight", "linear.bias"):
            torch.testing.assert_close(grads[f"hook:{name}"], grads[f"ddp:{name}"])
        assert grads["hook:table.weight"].abs().sum() > 0


def _mismatched_worker(rank: int, world: int) -> bool:
    rows = ROWS + 5 * rank  # rank 1's table is larger: its last rows do not exist on rank 0
    ids = torch.tensor([rows - 1])
    grad = torch.sparse_coo_tensor(ids.unsqueeze(0), torch.ones(1, DIM), (rows, DIM))
    sparse_mean(grad)
    return True


def test_a_peer_row_outside_the_table_raises_instead_of_corrupting_memory() -> None:
    with pytest.raises(WorkerFailed, match=rf"size is {ROWS} but found index {ROWS + 4}"):
        run_workers(_mismatched_worker, world_size=2, timeout_s=90)


def _signal_skew(rank: int, world_size: int) -> list[bool]:
    """One SIGUSR1 forwarded to both ranks reaches rank 0 before boundary 1 and rank 1 only
    before boundary 2; a second one reaches both before boundary 4."""
    flags = SignalFlags()  # counted by hand: no handler needed
    saves = []
    for boundary in range(1, 6):
        if (rank == 0 and boundary == 1) or (rank == 1 and boundary == 2) or boundary == 4:
            flags.raise_signal(signal.SIGUSR1)
        saves.append(flags.take_agreed(device=torch.device("cpu")).save)
    return saves


def test_one_forwarded_signal_is_one_checkpoint_whenever_each_rank_sees_it() -> None:
    results = run_workers(_signal_skew, world_size=2, timeout_s=120)
    assert results == [[True, False, False, True, False]] * 2
