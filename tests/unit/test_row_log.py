"""The optimizer's log of updated rows: exactly the union of the steps' rows, sorted, by
either merge (sort or mask) and across early folds."""

from __future__ import annotations

import pytest
import torch

from recd.optim import row_log
from recd.optim.row_log import RowLog


def _steps(seed: int, n: int, rows: int, per_step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.unique(torch.randint(0, rows, (per_step,), generator=gen)) for _ in range(n)]


@pytest.mark.parametrize("rows, per_step", [(100_000, 20), (500, 30)])  # sort / mask merge
def test_take_returns_the_union_of_every_step_since_the_last_take(rows: int, per_step: int) -> None:
    log = RowLog(rows)
    assert log.take() is None
    steps = _steps(0, 150, rows, per_step)
    for step_rows in steps[:100]:
        log.add(step_rows)
    assert torch.equal(log.take(), torch.unique(torch.cat(steps[:100])))
    for step_rows in steps[100:]:
        log.add(step_rows)
    assert torch.equal(log.take(), torch.unique(torch.cat(steps[100:])))  # only the new ones
    log.add(steps[0])
    assert torch.equal(log.take(), steps[0])
    log.add(steps[0])
    log.reset()
    assert log.take() is None


def test_kept_indices_fold_into_the_mask_past_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_log, "MIN_FOLD", 10)
    log = RowLog(50)
    steps = _steps(1, 40, 50, 20)
    for step_rows in steps:
        log.add(step_rows)
        assert log._kept <= max(row_log.FOLD_FACTOR * 50, 10) + 20  # memory stays bounded
    assert log._marked
    assert torch.equal(log.take(), torch.unique(torch.cat(steps)))
    log.add(steps[0])
    log.reset()
    assert log.take() is None
