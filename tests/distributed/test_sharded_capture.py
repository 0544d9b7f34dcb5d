"""``ShardedAdam.step(capture=True)``: the same update as ``step()``, taken back bit-exactly.

Both undo methods (``inverse``, ``copy``). Two real gloo processes train a small synthetic DLRM
(``tests.distributed.synthetic``) sharded row-wise, and one table kept data-parallel (its rows are all-gathered inside the step). Each
step: forward + backward, a captured step, its undo (every local weight, m, v and both step
counters bitwise back), the same forward + backward again and an uncaptured step, whose state
must equal the captured step's bit for bit. A captured step that fails part-way (after the
dense layers and one table shard were updated) is rolled back before the error propagates.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.distributed.spawn import run_workers

pytestmark = pytest.mark.timeout(120)
STEPS = 3


def _state(opt: Any) -> list[torch.Tensor | int]:
    """Every local block's weights, m, v (as bits) and the step counters."""
    out: list[torch.Tensor | int] = [opt.step_count, opt.dense.step_count]
    for shard in opt.local_shards(copy=True):
        out += [t.view(torch.int32) for t in (shard.weights, shard.adam_m, shard.adam_v)]
    return out


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(a, b, strict=True)
    )


def _train(opt: Any, dmp: Any, job: Any, step: int, rank: int) -> None:
    from recd.models.dlrm import bce_loss
    from tests.distributed.synthetic import make_batch

    dense, kjt, labels = make_batch(job, step, rank)
    dmp.train()
    opt.zero_grad()
    bce_loss(dmp(dense, kjt), labels).backward()


def _build(job: Any) -> tuple[Any, Any]:
    from recd.optim import AdamConfig
    from recd.train.sharding import build_sharded_training
    from tests.distributed.synthetic import model_config_of

    plan = {f"t{i}": "row_wise" for i in range(job.tables)} | {"t0": "data_parallel"}
    return build_sharded_training(model_config_of(job), AdamConfig(lr=job.lr), plan=plan, seed=0)


def _worker(rank: int, world_size: int, method: str) -> dict[str, Any]:
    from recd.recovery.undo import StepCapture
    from tests.distributed.synthetic import SyntheticJob

    job = SyntheticJob(world_size=world_size, rows=200, batch_size=64)
    dmp, opt = _build(job)
    report: dict[str, Any] = {"undo_exact": [], "same_as_plain": [], "entries": []}
    for step in range(1, STEPS + 1):
        before = _state(opt)
        _train(opt, dmp, job, step, rank)
        record = opt.step(capture=True, undo=method)
        captured = _state(opt)
        assert not _same(before, captured)
        result = record.undo()
        report["undo_exact"].append(result.exact and _same(_state(opt), before))
        report["entries"].append([type(p).__name__ for p in record.params])
        _train(opt, dmp, job, step, rank)
        assert opt.step() is None
        report["same_as_plain"].append(_same(_state(opt), captured))

    class FailingCapture(StepCapture):
        """Fails after the first table shard's update, as a dying peer's collective would."""

        def update_rows(self, *args: Any, **kwargs: Any) -> Any:
            super().update_rows(*args, **kwargs)
            raise RuntimeError("peer died")

    before = _state(opt)
    _train(opt, dmp, job, STEPS + 1, rank)
    opt._new_capture = lambda method: FailingCapture(method=method)  # the step builds it here
    try:
        opt.step(capture=True, undo=method)
    except RuntimeError as error:
        report["raised"] = str(error)
    report["rolled_back"] = _same(_state(opt), before)
    opt.close()
    return report


@pytest.mark.parametrize("method", ["inverse", "copy"])
def test_captured_sharded_step_equals_plain_and_undoes_exactly(method: str) -> None:
    reports = run_workers(_worker, world_size=2, timeout_s=100, args=(method,))
    entries = {
        "inverse": ["AdamParamUndo", "LazyRowsUndo"],
        "copy": ["CopiedUndo", "CopiedRowsUndo"],
    }
    for report in reports:
        assert report["undo_exact"] == [True] * STEPS
        assert report["same_as_plain"] == [True] * STEPS
        # Dense layers in one entry, every table shard (and replicated table) in one more.
        assert report["entries"][-1] == entries[method]
        assert report["raised"] == "peer died"
        assert report["rolled_back"]
