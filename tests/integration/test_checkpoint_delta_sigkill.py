"""SIGKILL at random moments while a real process writes chains of delta checkpoints.

A child process resumes from the newest valid checkpoint (a full file or a chain), then
loops: write the next step as a delta onto the previous one (every ``FULL_EVERY``-th step a
full file), apply retention. The state of step s is a function of s: row r of the table was
last updated at the latest step <= s congruent to r modulo ``PERIOD`` (so each step touches
one row in ``PERIOD`` and a delta holds just those), the dense tensor changes every step. The
parent kills the child with SIGKILL, half the trials the moment a temp file is seen (during a
write), half at a random delay, and then checks that every checkpoint under a final name,
chains included, loads and holds exactly its step's state (zero unloadable chains), and that
the newest one is at least the last step the child reported committed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from recd.checkpoint import (
    RetentionPolicy,
    apply_retention,
    checkpoint_path,
    clean_stray_temp_files,
    list_checkpoints,
    newest_valid_checkpoint,
    write_checkpoint,
)
from recd.checkpoint.chain import read_any
from recd.checkpoint.delta import blocks_for, delta_filename, read_delta_header, write_delta
from recd.checkpoint.format import ParamLayout
from recd.durable import is_temp_name
from tests.integration.test_checkpoint_sigkill import _kill_child

ROWS, WIDTH, DENSE = 40_000, 16, 1_000  # 7.7 MB full, about 0.8 MB per delta
PERIOD = 10
FULL_EVERY = 4
TRIALS = 60
LAYOUT = ParamLayout.from_named_arrays(
    [("table", np.zeros((ROWS, WIDTH), np.float32)), ("dense", np.zeros(DENSE, np.float32))]
)
POLICY = RetentionPolicy(keep_last=3, keep_every=0, checkpoint_every=1)


def _state(step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = np.arange(ROWS)
    last = step - (step - rows) % PERIOD  # the last step <= step that touched each row
    last = np.where(last >= 1, last, 0).astype(np.float32)
    table = (rows[:, None] * np.float32(1e-3) + last[:, None] + np.arange(WIDTH)).astype(np.float32)
    dense = np.full(DENSE, step, np.float32)
    w = np.concatenate([table.reshape(-1), dense])
    return w, w * np.float32(0.5), w + np.float32(1.0)


def _touched(step: int) -> np.ndarray:
    return np.arange((step % PERIOD), ROWS, PERIOD)


def child_main(run_dir: Path, emit: Callable[[str], object]) -> None:
    clean_stray_temp_files(run_dir)
    newest = newest_valid_checkpoint(run_dir, LAYOUT)
    step = 0 if newest is None else read_any(newest, LAYOUT).step
    base = step
    if newest is not None and newest.suffix == ".delta":
        base = read_delta_header(newest).base
    emit(f"ready {step}")
    if newest is None:  # the chain starts at a full step 0
        write_checkpoint(checkpoint_path(run_dir, 0), 0, *_state(0), layout=LAYOUT)
    while True:
        parent, step = step, step + 1
        regions = _state(step)
        if step % FULL_EVERY == 0:
            write_checkpoint(checkpoint_path(run_dir, step), step, *regions, layout=LAYOUT)
            base = step
        else:
            write_delta(
                run_dir / delta_filename(step),
                step=step,
                parent=parent,
                base=base,
                n_params=LAYOUT.n_params,
                blocks=blocks_for(LAYOUT, {"table": _touched(step)}, ["dense"]),
                regions=dict(zip(("weights", "adam_m", "adam_v"), regions, strict=True)),
            )
        emit(f"committed {step}")
        apply_retention(run_dir, POLICY, layout=LAYOUT)


def _writing_delta(name: str) -> bool:
    return is_temp_name(name) and ".delta" in name


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_during_delta_writes_leaves_no_unloadable_chain(tmp_path: Path) -> None:
    rng = random.Random(20261206)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    mid_writes = unloadable = 0
    newest_step = 0
    for trial in range(TRIALS):
        committed, mid_write = _kill_child(
            run_dir, rng, trial % 2 == 0, child_main, writing=_writing_delta, delay_s=0.3
        )
        mid_writes += mid_write
        for path in list_checkpoints(run_dir):
            try:
                ckpt = read_any(path, LAYOUT)
            except Exception:  # counted: the count must stay 0
                unloadable += 1
                continue
            want = _state(ckpt.step)
            got = (ckpt.weights, ckpt.adam_m, ckpt.adam_v)
            assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), path
        newest = newest_valid_checkpoint(run_dir, LAYOUT)
        assert newest is not None
        step = read_any(newest, LAYOUT).step
        assert step >= max(committed, newest_step), (trial, committed, step)
        newest_step = step
    assert unloadable == 0
    assert mid_writes >= TRIALS // 2 - 5  # the "on temp" trials really hit delta writes
    assert any(p.suffix == ".delta" for p in list_checkpoints(run_dir))
