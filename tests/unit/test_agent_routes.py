"""The launcher's choice of route after a death: survivor recovery only while the group is
training (after its first step, before its last)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from recd.checkpoint.sidecars import LossLog
from recd.recovery.agent import AgentConfig, _Agent


def _agent(run_dir: Path, steps: int | None) -> _Agent:
    config = AgentConfig(nproc=2, recd_args=[], checkpoint_dir=run_dir, steps=steps)
    return _Agent(config, SimpleNamespace(port=0))


def test_a_death_after_the_last_step_is_not_a_survivor_recovery(tmp_path: Path) -> None:
    with LossLog(tmp_path) as losses:
        losses.append(1, 0.5)
        losses.append(2, 0.4)
    assert not _agent(tmp_path, steps=3)._all_steps_done()
    with LossLog(tmp_path) as losses:
        losses.append(3, 0.3)
    assert _agent(tmp_path, steps=3)._all_steps_done()
    assert not _agent(tmp_path, steps=None)._all_steps_done()
    assert not _agent(tmp_path / "empty", steps=3)._all_steps_done()
