"""One trainer per run directory, with real ``recd train`` processes.

A second ``recd train --resume`` on a live run directory must exit 2 with one line naming the
directory and the live trainer's pid, having touched nothing in it: in particular not the
temp files a live writer may be filling (the newcomer used to remove them before it found the
``.loss.json`` lock taken, and the live trainer then died with "checkpoint write failed"). The
live trainer then ends normally (SIGTERM: checkpoint, exit 0) with valid checkpoints, and the
next owner of the directory removes the stray temp file, under the lock.

The live trainer is given far more steps than it can train while the test runs, and is stopped
with SIGTERM once the second process has been refused: no assertion depends on timing, only
bounded waits for files to appear.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recd.checkpoint import (
    LOSS_FILE,
    RUN_LOCK_FILE,
    check_checkpoint_finite,
    checkpoint_path,
    list_checkpoints,
    newest_valid_checkpoint,
    read_layout,
    read_loss_history,
    read_state,
)
from tests.integration.test_train_job import recd_env, table, write_config

__all__ = ["table"]

WAIT_S = 300.0
"""Bound of every wait for a file or a process (generous: a loaded 2-core machine)."""
STRAY = ".step_999999.bin.tmp-4242"
"""A temp file planted while the trainer runs: what a newcomer must not remove."""


def long_config(tmp_path: Path, table: Path, *, every: int) -> tuple[Path, Path]:
    """A tiny DLRM job that trains far longer than the test lasts (stopped by SIGTERM)."""
    run_dir = tmp_path / "run"
    values = {"kind": "dlrm", "batch_size": 256, "steps": 1_000_000, "eval_every": 0}
    path = write_config(
        tmp_path / "job.toml", table, run_dir, eval_batches=1, num_epochs=100_000, **values
    )
    text = path.read_text().replace("[train]\n", "[train]\nplot = false\n")
    path.write_text(text + f"\n[checkpoint]\ncheckpoint_every = {every}\nkeep_last = 3\n")
    return path, run_dir


def start_trainer(config: Path, log_dir: Path, *args: str) -> subprocess.Popen[bytes]:
    """``recd train`` in its own session, output to files (a pipe nobody reads would fill)."""
    command = [sys.executable, "-m", "recd", "train", "--config", str(config), *args]
    return subprocess.Popen(
        command,
        env=recd_env(),
        stdout=(log_dir / "live.out").open("wb"),
        stderr=(log_dir / "live.err").open("wb"),
        start_new_session=True,
    )


def wait_for_checkpoints(proc: subprocess.Popen[bytes], run_dir: Path, log_dir: Path) -> None:
    """Until the live trainer has committed a checkpoint and logged a few more steps."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        loss = run_dir / LOSS_FILE
        if list_checkpoints(run_dir) and loss.exists() and len(loss.read_bytes().split()) >= 3:
            return
        time.sleep(0.05)
    stop(proc)
    pytest.fail(
        f"the live trainer wrote no checkpoint: {(log_dir / 'live.err').read_text()[-3000:]}"
    )


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM to the trainer (with ``--nproc``, the launcher: it forwards it to its workers),
    then its exit code."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def second_trainer(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "recd", "train", "--config", str(config), "--resume", *args]
    return subprocess.run(command, env=recd_env(), capture_output=True, text=True, timeout=WAIT_S)


def assert_refused(done: subprocess.CompletedProcess[str], run_dir: Path, pid: int) -> None:
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stdout == "" and "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("recd train:")]
    assert line.startswith(f"recd train: error: {run_dir} is in use by another trainer, pid {pid}")
    assert "one trainer per run directory" in line


def assert_ended_normally(proc: subprocess.Popen[bytes], run_dir: Path, log_dir: Path) -> None:
    """SIGTERM ends the live run the normal way: a last checkpoint, exit 0, and every
    checkpoint on disk complete, finite, and listed in ``.state.json``."""
    code = stop(proc)
    out, err = (log_dir / "live.out").read_text(), (log_dir / "live.err").read_text()
    assert code == 0, err[-3000:]
    assert "checkpoint write failed" not in err and "Traceback" not in err
    assert "stopped early: SIGTERM: stopped after step" in out
    steps = read_loss_history(run_dir).steps.tolist()
    assert steps == list(range(1, len(steps) + 1))
    assert newest_valid_checkpoint(run_dir) == checkpoint_path(run_dir, steps[-1])
    layout = read_layout(run_dir)
    on_disk = list_checkpoints(run_dir)
    for path in on_disk:
        check_checkpoint_finite(path, layout)
    state = read_state(run_dir) or {}
    assert sorted(int(s) for s in state["checkpoints"]) == [int(p.name[5:11]) for p in on_disk]


def test_a_second_trainer_on_a_live_run_exits_2_and_touches_nothing(
    tmp_path: Path, table: Path
) -> None:
    config, run_dir = long_config(tmp_path, table, every=2)
    live = start_trainer(config, tmp_path)
    try:
        wait_for_checkpoints(live, run_dir, tmp_path)
        owner = json.loads((run_dir / RUN_LOCK_FILE).read_text())
        assert owner["pid"] == live.pid
        (run_dir / STRAY).write_bytes(b"a live writer's half-written file")

        refused = second_trainer(config)
        assert_refused(refused, run_dir, live.pid)
        assert live.poll() is None, "the live trainer must survive the second one"
        assert (run_dir / STRAY).exists(), "the second trainer removed a temp file"
    finally:
        assert_ended_normally(live, run_dir, tmp_path)
    assert (run_dir / STRAY).exists()

    # Now the directory is free: the next owner resumes, and cleans up under the lock.
    last = read_loss_history(run_dir).steps[-1]
    again = second_trainer(config, "--steps", str(last + 2))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"removed stray temp file {run_dir / STRAY}" in again.stderr
    assert not (run_dir / STRAY).exists()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_the_launcher_of_a_multi_process_run_owns_its_directory(
    tmp_path: Path, table: Path
) -> None:
    """``recd train --nproc 2``: the launcher takes the lock before its workers exist, and
    its rank 0 works under it; a newcomer is refused naming the launcher's pid."""
    config, run_dir = long_config(tmp_path, table, every=5)
    live = start_trainer(config, tmp_path, "--nproc", "2")
    try:
        wait_for_checkpoints(live, run_dir, tmp_path)
        assert json.loads((run_dir / RUN_LOCK_FILE).read_text())["pid"] == live.pid
        refused = second_trainer(config)
        assert_refused(refused, run_dir, live.pid)
        assert live.poll() is None
    finally:
        assert_ended_normally(live, run_dir, tmp_path)
