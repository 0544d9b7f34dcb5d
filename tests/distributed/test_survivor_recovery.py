"""Survivor-based recovery with real processes and a real SIGKILL (``recd.recovery.survivor``).

A 2-rank CPU job (DMP row-wise tables over gloo, ShardedAdam) trains 10 steps with a full
checkpoint every 4; rank 1 SIGKILLs itself in the middle of a step. The reference is the same
job never failing (checkpointing every 2 steps, which changes nothing in the training, so its
full state is on disk at every even step). Checked:

- the job comes back by itself and finishes all 10 steps;
- the survivor undid its step past the agreed one, exactly, and the dense state (weights, m,
  v) of *both* ranks at the agreed step equals the never-failed run's bit for bit (no
  tolerance: the dense state is replicated, the survivor's undo is bit-exact and the
  replacement copies the survivor's bytes);
- the audit trail (``.recovery.json``) records the recovery, and its count of rows whose
  updates were lost equals, per table, the rows of the dead rank's shard where the reference
  state at the agreed step differs from the checkpoint the shard came from;
- killed right after a checkpoint, the recovery is bit-exact end to end (the final state
  equals the reference's) and the audit says so;
- the baseline (everyone restarts from the checkpoint) also ends in the reference's state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recd.checkpoint import checkpoint_path, read_checkpoint
from recd.recovery.survivor import JobReport, SurvivorJob, read_dense_dump, run_job

pytestmark = pytest.mark.timeout(180)

STEPS = 10


def job(run_dir: Path, **overrides: Any) -> SurvivorJob:
    values: dict[str, Any] = {
        "run_dir": run_dir,
        "steps": STEPS,
        "checkpoint_every": 4,
        "dump_dense_at": [4, 6],
        "timeout_s": 150.0,
    }
    values.update(overrides)
    return SurvivorJob(**values)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference")
    report = run_job(job(run_dir, checkpoint_every=2))
    assert report.failures == 0 and report.recoveries == []
    return run_dir


def dense_of(run_dir: Path, step: int, gen: int, rank: int, tag: str) -> dict[str, np.ndarray]:
    got_step, arrays = read_dense_dump(
        run_dir / "dumps" / f"step{step:06d}_gen{gen}_rank{rank}_{tag}.npz"
    )
    assert got_step == step
    return arrays


def assert_same_arrays(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for key in want:
        assert np.array_equal(got[key], want[key]), key


def state(run_dir: Path, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ckpt = read_checkpoint(checkpoint_path(run_dir, step))
    return np.array(ckpt.weights), np.array(ckpt.adam_m), np.array(ckpt.adam_v)


def finished(report: JobReport) -> None:
    done = [e for e in report.events if e["event"] == "done"]
    assert sorted(e["rank"] for e in done) == [0, 1]
    assert read_checkpoint(checkpoint_path(report.job.run_dir, STEPS)).step == STEPS


def test_killed_rank_is_replaced_and_dense_state_is_exact(tmp_path: Path, reference: Path) -> None:
    report = run_job(job(tmp_path, kill_rank=1, kill_step=7, kill_point="after_backward"))
    finished(report)
    assert report.failures == 1
    [audit] = report.recoveries
    assert audit["failed_rank"] == 1 and audit["agreed_step"] == 6
    assert audit["embedding_checkpoint_step"] == 4
    # rank 0 completed step 7 (rank 1 died after the gradient all-reduce): undone, exactly
    assert audit["undone"] == [{"rank": 0, "step": 7, "exact": True}]

    want = dense_of(reference, 6, 0, 0, "step")
    assert_same_arrays(dense_of(tmp_path, 6, 1, 0, "survivor"), want)
    assert_same_arrays(dense_of(tmp_path, 6, 1, 1, "replacement"), want)

    # the audit's lost rows are exactly the dead shard's rows that moved since step 4
    ref6, ref4 = state(reference, 6), state(reference, 4)
    from recd.recovery.survivor import model_config_of
    from recd.train.sharding import logical_layout

    layout = logical_layout(model_config_of(report.job))
    lost = audit["rows_lost_updates"]
    assert lost and sum(lost.values()) > 0 and audit["bit_exact"] is False
    for name, (lo, hi) in audit["shard_rows"].items():
        view = layout.slice_of(name)
        shape = layout.spec(name).shape
        moved = np.zeros(shape[0], bool)
        for now, then in zip(ref6, ref4, strict=True):
            moved |= (now[view].reshape(shape) != then[view].reshape(shape)).any(axis=1)
        assert int(moved[lo:hi].sum()) == lost[name], name


def test_kill_right_after_a_checkpoint_recovers_bit_exactly(
    tmp_path: Path, reference: Path
) -> None:
    report = run_job(job(tmp_path, kill_rank=1, kill_step=5, kill_point="after_step"))
    finished(report)
    [audit] = report.recoveries
    assert audit["agreed_step"] == 4 and audit["embedding_checkpoint_step"] == 4
    assert audit["undone"] == [{"rank": 0, "step": 5, "exact": True}]
    assert audit["bit_exact"] is True and sum(audit["rows_lost_updates"].values()) == 0
    assert_same_arrays(
        dense_of(tmp_path, 4, 1, 1, "replacement"), dense_of(reference, 4, 0, 0, "step")
    )
    for got, want in zip(state(tmp_path, STEPS), state(reference, STEPS), strict=True):
        assert np.array_equal(got, want)


def test_restart_baseline_replays_from_the_checkpoint(tmp_path: Path, reference: Path) -> None:
    report = run_job(job(tmp_path, mode="restart", kill_rank=1, kill_step=7))
    finished(report)
    assert report.failures == 1 and report.recoveries == []
    timeline = report.timeline()
    assert timeline is not None and timeline["lost_steps"] == 3  # steps 5, 6, 7 redone
    for got, want in zip(state(tmp_path, STEPS), state(reference, STEPS), strict=True):
        assert np.array_equal(got, want)
