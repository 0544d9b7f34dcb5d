"""The optimizer's log of updated rows: exactly the union of the steps' rows, sorted."""

from __future__ import annotations

import torch

from recd.optim.row_log import FOLD_FACTOR, RowLog


def test_take_returns_the_union_of_every_step_since_the_last_take() -> None:
    log = RowLog(500)
    assert log.take() is None
    gen = torch.Generator().manual_seed(0)
    steps = [torch.unique(torch.randint(0, 500, (30,), generator=gen)) for _ in range(150)]
    for rows in steps[:100]:  # more than FOLD_FACTOR x 500 indices: merged on the way
        log.add(rows)
    assert sum(r.numel() for r in steps[:100]) > FOLD_FACTOR * 500
    assert len(log._parts) < 100
    assert torch.equal(log.take(), torch.unique(torch.cat(steps[:100])))
    for rows in steps[100:]:
        log.add(rows)
    assert torch.equal(log.take(), torch.unique(torch.cat(steps[100:])))  # only the new ones
    log.add(steps[0])
    assert torch.equal(log.take(), steps[0])
    log.add(steps[0])
    log.reset()
    assert log.take() is None
