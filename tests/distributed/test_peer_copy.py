"""Peer copies of the table shards (``recd.recovery.peer_copy``) on a ring of 3 gloo ranks.

Each rank trains a small synthetic DLRM (``tests.distributed.synthetic``) sharded row-wise and sends the rows each update
touched to the rank after it. After every committed step, each rank's copy equals its ward's
live shards bit for bit (the ward's own weights, m and v, gathered for the check); rows of a
step that is not committed are dropped; a copy sent to another rank loads there as its own
shards.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.distributed.spawn import run_workers

pytestmark = pytest.mark.timeout(120)
STEPS = 3


def _own(opt: Any, peer: Any) -> list[torch.Tensor]:
    return [t.detach().clone() for t in peer._own_tensors()]


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    import torch.distributed as dist

    from recd.models.dlrm import bce_loss
    from recd.optim import AdamConfig
    from recd.recovery.peer_copy import PeerCopy
    from recd.train.sharding import build_sharded_training
    from tests.distributed.synthetic import SyntheticJob, make_batch, model_config_of

    job = SyntheticJob(world_size=world_size, rows=300, batch_size=48)
    dmp, opt = build_sharded_training(
        model_config_of(job), AdamConfig(lr=job.lr), plan="row_wise", seed=0
    )
    opt.keep_rows_after = True
    peer = PeerCopy(opt)
    peer.seed(0)
    report: dict[str, Any] = {"equal": [], "dropped_kept_old": None, "received": None}

    def ward_equals_copy() -> bool:
        mine = _own(opt, peer)
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, mine)
        ward = gathered[peer.ward]
        copy = [t for parts in peer.copy for t in parts]
        return len(ward) == len(copy) and all(
            torch.equal(a.view(torch.int32), b.view(torch.int32))
            for a, b in zip(ward, copy, strict=True)
        )

    report["equal"].append(ward_equals_copy())
    for step in range(1, STEPS + 1):
        dense, kjt, labels = make_batch(job, step, rank)
        dmp.train()
        opt.zero_grad()
        bce_loss(dmp(dense, kjt), labels).backward()
        opt.step()
        peer.send_step()
        peer.commit()
        report["equal"].append(ward_equals_copy() and peer.step == step)
    # a step whose rows arrive but never commit: the copy stays at the last committed step
    before = [t.clone() for parts in peer.copy for t in parts]
    dense, kjt, labels = make_batch(job, STEPS + 1, rank)
    opt.zero_grad()
    bce_loss(dmp(dense, kjt), labels).backward()
    opt.step()
    peer.send_step()
    peer.drop_pending()
    after = [t for parts in peer.copy for t in parts]
    report["dropped_kept_old"] = peer.step == STEPS and all(
        torch.equal(a, b) for a, b in zip(before, after, strict=True)
    )
    # rank 0's keeper (rank 1) sends rank 0 its copy: rank 0's shards go back to step STEPS
    expected = before if rank == 1 else None
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, expected)
    if peer.ward == 0:  # rank 1 keeps rank 0's copy
        peer.send_ward(0)
    if rank == 0:
        peer.receive_own(peer.keeper)
        now = _own(opt, peer)
        report["received"] = all(torch.equal(a, b) for a, b in zip(gathered[1], now, strict=True))
    dist.barrier()
    opt.close()
    return report


def test_each_rank_keeps_its_wards_shards_exactly() -> None:
    reports = run_workers(_worker, world_size=3, timeout_s=100)
    for report in reports:
        assert report["equal"] == [True] * (STEPS + 1)
        assert report["dropped_kept_old"]
    assert reports[0]["received"]
