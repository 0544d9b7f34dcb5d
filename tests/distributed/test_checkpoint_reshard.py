"""Distributed checkpoints of the real trainer (2 gloo processes, torchrec DMP row-wise).

One group of 2 processes trains the tiny DLRM 4 steps with ``checkpoint_every = 2``; rank 1
alone receives SIGUSR1 at step 3. Checked:

- the ranks agree (all-reduce of the flags): both write ``step_000003.bin``, one file, by
  ranged pwrites of each rank's blocks into one preallocated temp file;
- the file written by 2 ranks is the logical model: its regions equal the state gathered
  from the shards (``ShardedAdam.gather_flat``) byte for byte;
- 2 -> 1: one process loads it (``ModelAdam``), exports the same bytes, and writing them from
  one process gives a byte-identical file (sha256);
- 1 -> 2: a checkpoint written by one process is loaded by 2 ranks and saved again by the
  distributed writer: byte-identical file;
- resume on 2 ranks from step 3 (reader positions of both ranks from ``.state.json``) gives a
  step-4 checkpoint byte-identical to the uninterrupted run's;
- resuming that 2-rank checkpoint on 1 process is refused with a clear error (the reader
  positions are per rank), while its weights load on any world size.

Workers are forked processes with a hard deadline (tests/distributed/spawn.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from recd.checkpoint import checkpoint_path, fork_run, list_checkpoints, read_checkpoint
from recd.checkpoint.atomic import write_checkpoint
from recd.errors import ConfigError
from recd.train.checkpointing import Checkpointer, read_checkpoint_flat
from recd.train.config import load_train_config
from recd.train.launch import DistContext
from recd.train.loop import Trainer
from recd.train.run import run_training
from recd.train.signals import SignalFlags
from tests.distributed.spawn import run_workers
from tests.integration.test_train_job import table, write_config

__all__ = ["table"]

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(300)]

WORLD = 2
STEPS = 4
TIMEOUT_S = 150.0


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_config(tmp: Path, table: Path, name: str) -> Path:
    path = write_config(
        tmp / f"{name}.toml",
        table,
        tmp / name,
        kind="dlrm",
        batch_size=64,
        steps=STEPS,
        eval_every=0,
        eval_batches=1,
        sharding="row_wise",
    )
    text = path.read_text().replace("[train]\n", "[train]\nplot = false\n")
    text += '\n[checkpoint]\ncheckpoint_every = 2\nkeep_last = 10\non_replay_mismatch = "raise"\n'
    path.write_text(text)
    return path


class UsrOneAt:
    def __init__(self, step: int) -> None:
        self.step = step

    def after_step(self, trainer: Trainer, step: int, loss: float) -> None:
        if step == self.step:
            os.kill(os.getpid(), signal.SIGUSR1)


def dist_trainer(rank: int, world: int, config_path: str, hooks: list[Any]) -> Trainer:
    config = load_train_config(config_path)
    config.train.world_size = world
    context = DistContext(
        rank=rank, world_size=world, local_rank=rank, backend="gloo", device=torch.device("cpu")
    )
    return Trainer(config, dist=context, hooks=hooks, show_progress=False)


def train_worker(
    rank: int, world: int, config_path: str, resume: bool, usr1_rank: int | None
) -> dict[str, Any]:
    """``run_training`` by hand on an existing process group: train, checkpoint, gather."""
    hooks: list[Any] = [UsrOneAt(3)] if rank == usr1_rank else []
    with SignalFlags() as flags:
        trainer = dist_trainer(rank, world, config_path, hooks)
        checkpointer = Checkpointer(trainer.config, signals=flags)
        try:
            checkpointer.attach(trainer, resume=resume)
            trainer.hooks.append(checkpointer)
            result = trainer.train()
            checkpointer.close()
            state = trainer.capture_state().params  # gather_flat: a collective
        finally:
            checkpointer.close(raise_errors=False)
            trainer.close()
    return {
        "steps": result.steps,
        "losses": result.losses,
        "saved": list(checkpointer.stats.steps),
        "weights": state.weights.tobytes(),
        "adam_m": state.adam_m.tobytes(),
        "adam_v": state.adam_v.tobytes(),
    }


def load_and_save_worker(rank: int, world: int, config_path: str, source: str) -> None:
    """Load a checkpoint written by one process into 2 ranks' shards, write it again."""
    with SignalFlags() as flags:
        trainer = dist_trainer(rank, world, config_path, [])
        checkpointer = Checkpointer(trainer.config, signals=flags)
        try:
            info = checkpointer.attach(trainer, resume=True)  # a fork: fresh data policy
            assert info.fresh_policy and info.step == read_checkpoint(source).step
            checkpointer.save(trainer, reason="reshard")  # replaces the file, from 2 ranks
            checkpointer.close()
        finally:
            checkpointer.close(raise_errors=False)
            trainer.close()


@pytest.fixture(scope="module")
def two_rank_run(table: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("dist-ckpt")
    config = make_config(tmp, table, "run")
    results = run_workers(
        train_worker, world_size=WORLD, timeout_s=TIMEOUT_S, args=(str(config), False, 1)
    )
    return {"tmp": tmp, "config": config, "run_dir": tmp / "run", "results": results}


def test_ranks_agree_on_the_signal_step_and_write_one_logical_file(
    two_rank_run: dict[str, Any],
) -> None:
    run_dir: Path = two_rank_run["run_dir"]
    rank0, rank1 = two_rank_run["results"]
    assert rank0["steps"] == rank1["steps"] == STEPS
    assert rank0["saved"] == [2, 3, 4]  # rank 1's SIGUSR1 at step 3: both ranks saved at 3
    assert [int(p.name[5:11]) for p in list_checkpoints(run_dir)] == [2, 3, 4]
    final = read_checkpoint(checkpoint_path(run_dir, STEPS))
    assert final.step == STEPS
    for region in ("weights", "adam_m", "adam_v"):
        assert final.region(region).tobytes() == rank0[region] == rank1[region], region


def test_two_rank_checkpoint_loads_on_one_process_and_writes_the_same_bytes(
    two_rank_run: dict[str, Any], tmp_path: Path
) -> None:
    source = checkpoint_path(two_rank_run["run_dir"], STEPS)
    trainer = Trainer(load_train_config(two_rank_run["config"]), show_progress=False)
    try:
        trainer.optimizer.load_state(read_checkpoint_flat(source))
        exported = trainer.optimizer.export_state()
    finally:
        trainer.close()
    assert exported.step == STEPS
    written = write_checkpoint(
        tmp_path / source.name, STEPS, exported.weights, exported.adam_m, exported.adam_v
    )
    assert sha256(written) == sha256(source)


def test_one_process_checkpoint_loads_on_two_ranks_and_writes_the_same_bytes(
    two_rank_run: dict[str, Any], table: Path, tmp_path: Path
) -> None:
    config = make_config(tmp_path, table, "one")
    one = load_train_config(config)
    one.train.steps = 2
    run_training(one, show_progress=False)  # 1 process: checkpoint step 2
    source = checkpoint_path(tmp_path / "one", 2)
    digest = sha256(source)
    fork_run(source, tmp_path / "two")
    config_two = make_config(tmp_path, table, "two")
    run_workers(
        load_and_save_worker,
        world_size=WORLD,
        timeout_s=TIMEOUT_S,
        args=(str(config_two), str(source)),
    )
    rewritten = checkpoint_path(tmp_path / "two", 2)
    assert rewritten.stat().st_ino != source.stat().st_ino
    assert sha256(rewritten) == digest


def test_two_rank_resume_is_bit_exact(two_rank_run: dict[str, Any], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(two_rank_run["run_dir"], run_dir)
    checkpoint_path(run_dir, STEPS).unlink()  # newest is now step 3 (rank 1's SIGUSR1)
    config = Path(two_rank_run["config"])
    moved = tmp_path / "resume.toml"
    moved.write_text(config.read_text().replace(str(two_rank_run["run_dir"]), str(run_dir)))
    results = run_workers(
        train_worker, world_size=WORLD, timeout_s=TIMEOUT_S, args=(str(moved), True, None)
    )
    assert results[0]["saved"] == [4]
    assert results[0]["losses"] == two_rank_run["results"][0]["losses"][3:]
    assert sha256(checkpoint_path(run_dir, STEPS)) == sha256(
        checkpoint_path(two_rank_run["run_dir"], STEPS)
    )


def test_resuming_a_two_rank_run_on_one_process_is_refused(
    two_rank_run: dict[str, Any], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(two_rank_run["run_dir"], run_dir)
    config = load_train_config(two_rank_run["config"])
    config.train.run_dir = run_dir
    with pytest.raises(ConfigError, match=r"written by 2 process\(es\), this job has 1"):
        run_training(config, show_progress=False, resume=True)
    # The weights themselves load anywhere (the file is the logical model's).
    flat = read_checkpoint_flat(checkpoint_path(run_dir, STEPS))
    assert np.isfinite(flat.weights).all()


def test_recd_train_nproc_2_forwards_sigusr1_and_sigterm_to_the_workers(
    table: Path, tmp_path: Path
) -> None:
    """``recd train --nproc 2`` (launcher -> torchrun agent -> 2 workers): SIGUSR1 to the
    launcher makes both workers checkpoint the same step and go on; SIGTERM makes them
    checkpoint and exit 0, and the launcher exits 0."""
    import json
    import subprocess
    import sys
    import time

    from tests.integration.test_train_job import recd_env

    config = make_config(tmp_path, table, "job")
    text = (
        config.read_text()
        .replace("steps = 4", "steps = 400")
        .replace("num_epochs = 5", "num_epochs = 30")
    )
    config.write_text(text.replace("checkpoint_every = 2", "checkpoint_every = 100000"))
    run_dir = tmp_path / "job"
    proc = subprocess.Popen(
        [sys.executable, "-m", "recd", "train", "--config", str(config), "--nproc", "2"],
        env=recd_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    loss = run_dir / ".loss.json"

    def wait_for(predicate: Any, what: str) -> None:
        deadline = time.monotonic() + 200
        while not predicate():
            if proc.poll() is not None or time.monotonic() > deadline:
                out, err = proc.communicate()
                pytest.fail(
                    f"waiting for {what}: rc {proc.returncode}\n{out[-2000:]}\n{err[-4000:]}"
                )
            time.sleep(0.01)

    try:
        wait_for(lambda: loss.exists() and len(loss.read_text().splitlines()) >= 2, "2 steps")
        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: bool(list_checkpoints(run_dir)), "the SIGUSR1 checkpoint")
        (first,) = list_checkpoints(run_dir)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-4000:]
    records = [json.loads(line) for line in loss.read_text().splitlines()]
    stopped = records[-1]["step"]
    assert [r["step"] for r in records] == list(range(1, stopped + 1))
    assert stopped < 400
    steps = [int(p.name[5:11]) for p in list_checkpoints(run_dir)]
    assert steps == [int(first.name[5:11]), stopped]
    assert read_checkpoint(checkpoint_path(run_dir, stopped)).step == stopped
    summary = json.loads((run_dir / "train.json").read_text())["result"]
    assert summary["world_size"] == 2 and "SIGTERM" in summary["stop_reason"]
