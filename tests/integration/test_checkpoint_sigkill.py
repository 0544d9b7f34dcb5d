"""SIGKILL at random moments while a real process writes checkpoints (and its loss history).

A child process resumes from the newest valid checkpoint, then loops: append the step's loss,
sync the history, write a ~3 MB checkpoint whose bytes are a function of its step, apply
retention. The parent kills it with SIGKILL, half the trials at a random delay and half the
moment a temp file is seen (i.e. during a write), then checks:

- every file under a final ``step_NNNNNN.bin`` name is complete and holds exactly its step's
  bytes (never a half-written file under a final name);
- ``newest_valid_checkpoint`` loads and is at least the last step the child reported committed
  (the previous checkpoint is never lost, retention included);
- the loss history is exactly steps 1..N, once each, with the right values, across all restarts.

Run as a script (``python test_checkpoint_sigkill.py RUN_DIR N_PARAMS``) it is the child\n(writing until killed), e.g. to kill it by hand.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np

from recd.checkpoint import (
    LossLog,
    RetentionPolicy,
    apply_retention,
    checkpoint_path,
    clean_stray_temp_files,
    list_checkpoints,
    newest_valid_checkpoint,
    read_checkpoint,
    read_loss_history,
    write_checkpoint,
)
from recd.durable import is_temp_name

N_PARAMS = 250_000  # 3 MB per checkpoint
TRIALS = 40
POLICY = RetentionPolicy(keep_last=2, keep_every=5, checkpoint_every=1)


def _loss(step: int) -> float:
    return float(np.float32(1.0) / np.float32(step))


def _regions(step: int, n_params: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    w = np.arange(n_params, dtype=np.float32) + np.float32(step)
    return w, w * np.float32(0.5), np.full(n_params, step, dtype=np.float32)


def child_main(run_dir: Path, n_params: int, emit: Callable[[str], object]) -> None:
    clean_stray_temp_files(run_dir)
    newest = newest_valid_checkpoint(run_dir)
    step = read_checkpoint(newest).step if newest is not None else 0
    losses = LossLog(run_dir)
    emit(f"ready {step}")
    while True:
        step += 1
        losses.append(step, _loss(step))
        losses.sync()  # the history reaches the step before its checkpoint commits
        write_checkpoint(checkpoint_path(run_dir, step), step, *_regions(step, n_params))
        emit(f"committed {step}")
        apply_retention(run_dir, POLICY)


Emit = Callable[[str], object]


def _start_child(
    run_dir: Path, main: Callable[[Path, Emit], None] | None = None
) -> tuple[int, IO[str]]:
    """Fork a real child process running ``child_main``; returns its pid and its output pipe.

    Forking (rather than exec'ing a fresh interpreter) saves ~0.5 s of imports per trial; the
    child is an ordinary process that dies by SIGKILL like any other.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            os.close(read_fd)
            emit = lambda line: os.write(write_fd, (line + "\n").encode())  # noqa: E731
            if main is None:
                child_main(run_dir, N_PARAMS, emit)
            else:
                main(run_dir, emit)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)
    os.close(write_fd)
    return pid, os.fdopen(read_fd, "r")


def _kill_child(
    run_dir: Path,
    rng: random.Random,
    on_temp: bool,
    main: Callable[[Path, Emit], None] | None = None,
    *,
    writing: Callable[[str], bool] = is_temp_name,
    delay_s: float = 0.25,
) -> tuple[int, bool]:
    """Start a child (``child_main`` or ``main``), SIGKILL it the moment a file name that
    ``writing`` accepts appears (``on_temp``) or after a random delay up to ``delay_s``;
    returns (last step it reported committed, killed mid-write)."""
    pid, out = _start_child(run_dir, main)
    try:
        ready = out.readline()
        assert ready.startswith("ready"), f"child failed to start: {ready!r}"
        last = int(ready.split()[1])
        mid_write = False
        if on_temp:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                if any(writing(name) for name in os.listdir(run_dir)):
                    mid_write = True
                    break
        else:
            time.sleep(rng.uniform(0.0, delay_s))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        for line in out.read().splitlines():
            if line.startswith("committed"):
                last = max(last, int(line.split()[1]))
    finally:
        out.close()
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    return last, mid_write


def _check_run_dir(run_dir: Path, committed: int, verified: set[tuple[str, int, int]]) -> int:
    for path in list_checkpoints(run_dir):
        st = path.stat()
        key = (path.name, st.st_ino, st.st_mtime_ns)
        if key in verified:  # committed files never change; check each version once
            continue
        verified.add(key)
        ckpt = read_checkpoint(path)  # raises CheckpointCorruptError on a half file
        assert ckpt.n_params == N_PARAMS
        for name, expected in zip(
            ("weights", "adam_m", "adam_v"), _regions(ckpt.step, N_PARAMS), strict=True
        ):
            assert np.array_equal(ckpt.region(name), expected), f"{path}: {name} bytes wrong"
    newest = newest_valid_checkpoint(run_dir)
    assert newest is not None
    newest_step = read_checkpoint(newest).step
    assert newest_step >= committed, f"checkpoint {committed} lost; newest is {newest_step}"
    history = read_loss_history(run_dir)
    assert history.duplicate_steps == []
    assert history.steps.tolist() == list(range(1, len(history.steps) + 1))
    assert history.steps[-1] >= newest_step
    assert np.array_equal(history.losses, [_loss(int(s)) for s in history.steps])
    return newest_step


def test_sigkill_at_random_moments_never_loses_or_tears_a_checkpoint(tmp_path: Path) -> None:
    rng = random.Random(20250101)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    mid_writes, strays = 0, 0
    newest = 0
    verified: set[tuple[str, int, int]] = set()
    for trial in range(TRIALS):
        committed, mid_write = _kill_child(run_dir, rng, on_temp=trial % 2 == 1)
        mid_writes += mid_write
        strays += any(is_temp_name(p.name) for p in run_dir.iterdir())
        step = _check_run_dir(run_dir, committed, verified)
        assert step >= newest  # progress is never lost across restarts
        newest = step
    # The "kill when a temp file is seen" trials must really have hit writes in flight.
    assert mid_writes >= 1 and strays >= 1
    kept = {int(p.name[5:-4]) for p in list_checkpoints(run_dir)}
    assert kept >= {s for s in range(1, newest + 1) if s % 5 == 0}  # every 5th kept by retention


if __name__ == "__main__":
    child_main(Path(sys.argv[1]), int(sys.argv[2]), lambda line: print(line, flush=True))
