"""Survivor recovery inside ``recd train --nproc 2 --recovery survivor``, for real.

Real worker processes under recd's launcher, real SIGKILLs at chosen points of a step
(``RECD_TEST_KILL``: in the forward before the input all-to-all, inside the sharded lookup
between the all-to-alls, in the backward, inside the optimizer step between the dense and the
table updates, after the update before the loss all-reduce), a warm spare replacing the dead
rank, and the files a user reads afterwards: the audit trail, the loss history and the final
checkpoint. The never-failed reference checkpoints every step (which changes nothing in the
training), so its state at any step can be compared with what a recovery did.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recd.checkpoint import checkpoint_path, read_checkpoint, read_layout
from recd.checkpoint.sidecars import read_loss_history
from recd.recovery.audit import read_events, recovery_timeline
from tests.integration.test_train_job import recd_env, table, write_config

__all__ = ["table"]

STEPS = 16
EVERY = 5


def _config(tmp_path: Path, table: Path, name: str, every: int = EVERY) -> Path:
    path = write_config(
        tmp_path / f"{name}.toml",
        table,
        tmp_path / name,
        kind="dlrm",
        steps=STEPS,
        eval_every=0,
        sharding="row_wise",
    )
    # written on the training thread: checkpoint k is committed before step k + 1 starts, so
    # which checkpoint a recovery finds does not depend on the writer's timing; all kept
    text = f"\n[checkpoint]\ncheckpoint_every = {every}\nbackground = false\nkeep_last = {STEPS}\n"
    path.write_text(path.read_text() + text)
    return path


def _train(
    config: Path, *extra: str, kills: str = "", timeout: int = 240
) -> subprocess.CompletedProcess[str]:
    env = recd_env()
    if kills:
        env["RECD_TEST_KILL"] = kills
    command = [sys.executable, "-m", "recd", "train", "--config", str(config), "--nproc", "2"]
    return subprocess.run(
        [*command, *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / ".recovery.json"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _assert_history_complete(run_dir: Path) -> None:
    """Every step 1..STEPS recorded exactly once in ``.loss.json``."""
    lines = [json.loads(x) for x in (run_dir / ".loss.json").read_text().splitlines()]
    steps = [r["step"] for r in lines if "step" in r]
    assert steps == list(range(1, STEPS + 1))
    history = read_loss_history(run_dir)
    assert list(history.steps) == list(range(1, STEPS + 1)) and not history.duplicate_steps


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, table: Path) -> Path:
    """The same job that never failed (the same launcher), with a checkpoint every step."""
    tmp = tmp_path_factory.mktemp("survivor-reference")
    proc = _train(_config(tmp, table, "run", every=1), "--recovery", "survivor")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _records(tmp / "run") == []
    return tmp / "run"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_killed_in_each_phase_is_replaced_and_training_continues(
    tmp_path: Path, table: Path
) -> None:
    # Rank 1, then rank 0 (so the replacement of the rank that writes the files is tested
    # too), then their replacements: GEN:RANK:STEP:PHASE, GEN the generation the process
    # started in.
    kills = "0:1:3:forward,0:0:6:lookup,1:1:9:backward,2:0:12:optimizer,3:1:14:after_update"
    config = _config(tmp_path, table, "run")
    proc = _train(config, "--recovery", "survivor", kills=kills)
    run_dir = tmp_path / "run"
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = _records(run_dir)
    assert [r["route"] for r in records] == ["survivor"] * 5
    assert [r["failed_ranks"] for r in records] == [[1], [0], [1], [0], [1]]
    assert [r["agreed_step"] for r in records] == [2, 5, 8, 11, 13]
    assert [r["generation"] for r in records] == [1, 2, 3, 4, 5]
    # A peer killed inside its update or after it: the survivor had applied that step's
    # update and took it back, bit-exactly; killed before its update: nothing to undo.
    assert [len(r["undone"]) for r in records] == [0, 0, 0, 1, 1]
    assert all(u["exact"] for r in records for u in r["undone"])
    for r in records:
        # The dead shard came from the newest committed checkpoint: the rows updated since
        # are named, per table, inside the dead rank's block.
        lost = r["rows_lost_updates"]
        assert set(lost) == set(r["shard_rows"])
        for name, rows in r["lost_rows"].items():
            lo, hi = r["shard_rows"][name]
            assert len(rows) == lost[name] and all(lo <= x < hi for x in rows)
        if r["embedding_checkpoint_step"] is not None:
            assert r["embedding_checkpoint_step"] <= r["agreed_step"]
        assert r["bit_exact"] == (sum(lost.values()) == 0)
    assert sum(sum(r["rows_lost_updates"].values()) for r in records) > 0
    _assert_history_complete(run_dir)
    events = [json.loads(x) for x in (run_dir / ".loss.json").read_text().splitlines()]
    marks = [e for e in events if e.get("event") == "recovery"]
    assert [m["at_step"] for m in marks] == [2, 5, 8, 11, 13]
    assert all(m["route"] == "survivor" for m in marks)
    # every kill was seen by a survivor and by the launcher, and each recovery ended with a
    # completed step in its new generation
    timeline = read_events(run_dir)
    assert sum(e["event"] == "kill" for e in timeline) == 5
    assert sum(e["event"] == "started" for e in timeline) == 1  # the group's, once
    assert sum(e["event"] == "recovered" for e in timeline) == 5
    spares = [e["how"] for e in timeline if e["event"] == "spawn" and "replaced" in e]
    assert sum(how in ("warm spare", "spare (still importing)") for how in spares) >= 1
    # The job's first spare starts with it; each later one at idle priority, and only once
    # the recovery that used the one before is over (it takes no CPU from the recovery).
    launched = [e for e in timeline if e["event"] in ("spare", "recovered") or "replaced" in e]
    starts = [i for i, e in enumerate(launched) if e["event"] == "spare"]
    assert [launched[i]["idle"] for i in starts] == [False] + [True] * (len(starts) - 1)
    assert all(launched[i - 1]["event"] == "recovered" for i in starts[1:])
    assert (run_dir / f"step_{STEPS:06d}.bin").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_recovery_at_a_checkpoint_step_is_bit_exact(
    tmp_path: Path, table: Path, reference: Path
) -> None:
    # Rank 1 dies inside its update of step 6, right after checkpoint 5: the survivor undoes
    # its own update of step 6, the replacement's shard comes from checkpoint 5 = the agreed
    # step, so nothing is lost: the run ends in the same bytes as the one that never failed.
    config = _config(tmp_path, table, "run")
    proc = _train(config, "--recovery", "survivor", "--no-spare", kills="0:1:6:optimizer")
    run_dir = tmp_path / "run"
    assert proc.returncode == 0, proc.stderr[-4000:]
    (record,) = _records(run_dir)
    assert record["agreed_step"] == 5 and record["embedding_checkpoint_step"] == 5
    assert record["undone"] and record["undone"][0]["exact"]
    assert record["bit_exact"] and sum(record["rows_lost_updates"].values()) == 0
    _assert_history_complete(run_dir)
    assert list(read_loss_history(run_dir).losses) == list(read_loss_history(reference).losses)
    final = f"step_{STEPS:06d}.bin"
    assert (run_dir / final).read_bytes() == (reference / final).read_bytes()
    spawns = [e for e in read_events(run_dir) if e["event"] == "spawn" and "replaced" in e]
    assert [e["how"] for e in spawns] == ["new process"]
    # the event log splits the recovery: the step in flight (6) is the first one done again
    split = recovery_timeline(read_events(run_dir))
    assert split is not None and split["route"] == "survivor"
    assert (split["failed_step"], split["resumed_at_step"], split["lost_steps"]) == (6, 5, 1)
    assert split["replay"] == 0.0 and split["total"] > split["detection"] > 0


def _state(run_dir: Path, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ckpt = read_checkpoint(checkpoint_path(run_dir, step))
    return np.array(ckpt.weights), np.array(ckpt.adam_m), np.array(ckpt.adam_v)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_partial_recovery_names_exactly_the_rows_that_lost_updates(
    tmp_path: Path, table: Path, reference: Path
) -> None:
    # Rank 1 dies inside its update of step 8: the survivor takes its own update of step 8
    # back, the agreed step is 7, and the replacement's shards come from checkpoint 5, so the
    # rows of rank 1's blocks updated in steps 6 and 7 lose those updates. The audit names
    # exactly the rows of those blocks whose weight, m or v moved between steps 5 and 7 of
    # the never-failed run.
    config = _config(tmp_path, table, "run")
    proc = _train(config, "--recovery", "survivor", "--no-spare", kills="0:1:8:optimizer")
    run_dir = tmp_path / "run"
    assert proc.returncode == 0, proc.stderr[-4000:]
    (record,) = _records(run_dir)
    assert record["failed_ranks"] == [1] and record["agreed_step"] == 7
    assert record["embedding_checkpoint_step"] == 5
    assert [(u["rank"], u["step"], u["exact"]) for u in record["undone"]] == [(0, 8, True)]
    assert record["dense_source"].startswith("rank 0 (survivor")
    layout = read_layout(run_dir)
    now, then = _state(reference, 7), _state(reference, 5)
    lost = record["rows_lost_updates"]
    assert sum(lost.values()) > 0 and record["bit_exact"] is False
    for name, (lo, hi) in record["shard_rows"].items():
        view, shape = layout.slice_of(name), layout.spec(name).shape
        moved = np.zeros(shape[0], bool)
        for a, b in zip(now, then, strict=True):
            moved |= (a[view].reshape(shape) != b[view].reshape(shape)).any(axis=1)
        want = (np.flatnonzero(moved[lo:hi]) + lo).tolist()
        assert record["lost_rows"].get(name, []) == want, name
        assert lost[name] == len(want), name
    _assert_history_complete(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_with_peer_copies_every_recovery_is_bit_exact(
    tmp_path: Path, table: Path, reference: Path
) -> None:
    # Kills far from the checkpoints (5, 10, 15), in three phases, on both ranks: the dead
    # rank's shards come back from its keeper's copy at the agreed step, not from the
    # checkpoint, so nothing is lost and the run ends in the reference's bytes.
    kills = "0:1:3:forward,0:0:8:optimizer,1:1:12:after_update"
    config = _config(tmp_path, table, "run")
    proc = _train(config, "--recovery", "survivor", "--peer-copy", kills=kills)
    run_dir = tmp_path / "run"
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = _records(run_dir)
    assert [r["route"] for r in records] == ["survivor"] * 3
    assert [r["failed_ranks"] for r in records] == [[1], [0], [1]]
    assert [r["agreed_step"] for r in records] == [2, 7, 11]
    for r, keeper in zip(records, [0, 1, 0], strict=True):
        assert r["embedding_source"] == f"peer copy on rank {keeper} (step {r['agreed_step']})"
        assert r["embedding_checkpoint_step"] is None
        assert sum(r["rows_lost_updates"].values()) == 0 and r["bit_exact"]
    assert [len(r["undone"]) for r in records] == [0, 1, 1]
    _assert_history_complete(run_dir)
    assert list(read_loss_history(run_dir).losses) == list(read_loss_history(reference).losses)
    final = f"step_{STEPS:06d}.bin"
    assert (run_dir / final).read_bytes() == (reference / final).read_bytes()


def test_survivor_options_need_the_survivor_route(tmp_path: Path, table: Path) -> None:
    for option in (["--peer-copy"], ["--undo", "inverse"], ["--no-spare"]):
        proc = _train(_config(tmp_path, table, "run"), *option)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"{option[0]}: only with --recovery survivor" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_kill_during_recovery_falls_back_to_the_elastic_restart(
    tmp_path: Path, table: Path, reference: Path
) -> None:
    # Rank 1 dies in step 7; the survivor dies as it starts recovering: the launcher stops
    # everything and restarts the group from checkpoint 5, which replays steps 6-7 bit-exactly.
    config = _config(tmp_path, table, "run")
    proc = _train(
        config,
        "--recovery",
        "survivor",
        "--max-restarts",
        "1",
        kills="0:1:7:backward,0:0:7:recovery",
    )
    run_dir = tmp_path / "run"
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = _records(run_dir)
    assert [r["route"] for r in records] == ["restart"]
    (restart,) = records
    assert restart["checkpoint_step"] == 5 and restart["last_completed_step"] == 6
    assert restart["steps_lost"] == 1 and restart["bit_exact"]
    _assert_history_complete(run_dir)
    assert list(read_loss_history(run_dir).losses) == list(read_loss_history(reference).losses)
    final = f"step_{STEPS:06d}.bin"
    assert (run_dir / final).read_bytes() == (reference / final).read_bytes()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_elastic_route_restarts_every_worker_from_the_newest_checkpoint(
    tmp_path: Path, table: Path, reference: Path
) -> None:
    # The baseline the survivor route is measured against, from the same launcher: rank 1
    # dies in step 7, every worker is stopped and the group resumes from checkpoint 5.
    config = _config(tmp_path, table, "run")
    proc = _train(config, "--recovery", "elastic", "--max-restarts", "1", kills="0:1:7:backward")
    run_dir = tmp_path / "run"
    assert proc.returncode == 0, proc.stderr[-4000:]
    (restart,) = _records(run_dir)
    assert restart["route"] == "restart" and restart["checkpoint_step"] == 5
    _assert_history_complete(run_dir)
    final = f"step_{STEPS:06d}.bin"
    assert (run_dir / final).read_bytes() == (reference / final).read_bytes()
    # the launcher saw the group start (every worker's first step) once, before the kill
    timeline = read_events(run_dir)
    names = [e["event"] for e in timeline]
    assert names.count("started") == 1 and names.count("kill") == 1
    assert names.index("started") < names.index("kill")
    assert "spare" not in names  # no spare on this route
    # the restarted workers log the replayed steps up to the one in flight at the failure
    split = recovery_timeline(timeline)
    assert split is not None and split["route"] == "restart"
    assert (split["failed_step"], split["resumed_at_step"], split["lost_steps"]) == (7, 5, 2)
    assert split["load"] is None and split["total"] > split["first_step"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_killed_before_its_group_trained_a_step_restarts_the_group(
    tmp_path: Path, table: Path, reference: Path
) -> None:
    # Rank 1 dies inside the first step: its peer is not training yet (still starting up),
    # so there is no survivor to recover with; the group restarts (before, a survivor
    # recovery waited out its timeouts).
    config = _config(tmp_path, table, "run")
    kills = "0:1:1:forward"
    proc = _train(config, "--recovery", "survivor", "--max-restarts", "2", kills=kills)
    run_dir = tmp_path / "run"
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [r["route"] for r in _records(run_dir)] == ["restart"]
    assert "before its group's first step" in proc.stderr
    _assert_history_complete(run_dir)
    final = f"step_{STEPS:06d}.bin"
    assert (run_dir / final).read_bytes() == (reference / final).read_bytes()


def test_survivor_recovery_needs_several_processes(tmp_path: Path, table: Path) -> None:
    proc = _train(_config(tmp_path, table, "run"), "--recovery", "survivor", "--nproc", "1")
    assert proc.returncode == 2
    assert "--recovery survivor: needs --nproc N > 1" in proc.stderr
