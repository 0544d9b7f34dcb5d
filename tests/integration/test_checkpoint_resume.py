"""Checkpoint, signal, resume: the real trainer in real processes, stopped by real signals.

The reference is one never-stopped run of N = 12 steps that checkpoints after *every* step
(``checkpoint_every = 1``), so the reference holds the exact bytes of ``step_k.bin`` for
every k, its sample audit and its ``.state.json`` entry. Every other run uses the cadence
EVERY = 5 and is compared byte for byte against it.

Stop points: k in {1, 99, 100, 101, random} at cadence 100 maps to cadence 5 as
k in {1, 4, 5, 6, random}: the first step, the step before a periodic checkpoint, the
checkpoint step itself (the signal coincides with the periodic write), the step after it
(a background write may still be in flight), and one random step (drawn per session; its
value is in the test id). 12 steps at batch 256 cross an epoch boundary (11 batches per
epoch), so the reader position is tested across epochs too.

Each scenario forks a child process (a real process: its own pid, process group, signal
handlers and background writer thread; forked from the warmed-up test process to skip
re-importing torch) that trains with the real ``run_training``. A hook in the child sends
the signal with ``kill(2)`` at the end of step k, before the checkpointer's hook runs, so the
signal arrives while step k is "in flight" from the checkpointer's point of view:

- SIGTERM: the child writes ``step_k.bin`` and exits 0;
- SIGUSR1: the child writes ``step_k.bin`` and trains on to step N;
- SIGKILL: the child dies on the spot (step k's loss and checkpoint are never recorded).

Then a second child resumes (``resume=True``) to step N. Every scenario must end with
``step_000012.bin`` byte-identical (sha256) to the reference's and a ``.loss.json`` holding
exactly one record per step 1..12, bitwise equal to the reference's (the replayed steps after
a resume are checked bitwise by the LossLog and never written twice).

Also: falling back past a corrupt newest checkpoint (truncated, or a NaN in its Adam state:
refused unless ``--accept-nonfinite``), a diverging run stopped at its first non-finite loss,
``.state.json`` pruned with retention, DataLoader workers surviving a signal sent to the whole
process group, ``recd train`` + ``kill -TERM`` + ``recd train --resume`` as real commands,
``recd pivot`` and ``recd fork``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from recd.checkpoint import (
    LOSS_FILE,
    SAMPLES_FILE,
    STATE_FILE,
    check_checkpoint_finite,
    checkpoint_path,
    checksum_of_file,
    fork_run,
    list_checkpoints,
    newest_valid_checkpoint,
    read_checkpoint,
    read_layout,
    read_loss_history,
    read_samples,
    read_state,
    write_checksum,
)
from recd.checkpoint.format import region_byte_offset
from recd.errors import CheckpointCorruptError, ConfigError, TrainingDivergedError
from recd.train.config import TrainConfig, load_train_config
from recd.train.loop import Trainer
from recd.train.run import run_training
from tests.integration.test_train_job import recd_env, table, write_config

__all__ = ["table"]  # the module-scoped fixture: the tiny table through the real ETL

N = 12
EVERY = 5
RANDOM_K = random.SystemRandom().choice([2, 3, 7, 8, 9, 10, 11])
K_VALUES = [1, EVERY - 1, EVERY, EVERY + 1, RANDOM_K]
CHILD_TIMEOUT_S = 120.0
CHECKPOINT_TOML = """
[checkpoint]
checkpoint_every = {every}
keep_last = 100
keep_every = 0
on_replay_mismatch = "raise"
"""


def make_config(
    path: Path, table: Path, run_dir: Path, *, every: int, steps: int = N, **overrides: Any
) -> Path:
    """The tiny DLRM job of test_train_job (batch 256, eval at the end) + ``[checkpoint]``."""
    values: dict[str, Any] = {"kind": "dlrm", "batch_size": 256, "steps": steps, "eval_every": 0}
    values.update(overrides)
    write_config(path, table, run_dir, eval_batches=1, **values)
    text = path.read_text().replace("[train]\n", "[train]\nplot = false\n")
    path.write_text(text + CHECKPOINT_TOML.format(every=every))
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def step_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every step record in ``.loss.json`` as written (not the resolved history)."""
    lines = (run_dir / LOSS_FILE).read_text().splitlines()
    return [r for r in map(json.loads, lines) if "step" in r]


# ---------------------------------------------------------------------- child processes
class SendSignal:
    """Step hook: at the end of step ``step`` send ``sig`` to this process (or its group)."""

    def __init__(self, step: int, sig: signal.Signals, *, group: bool = False) -> None:
        self.step = step
        self.sig = sig
        self.group = group

    def after_step(self, trainer: Trainer, step: int, loss: float) -> None:
        if step == self.step:
            if self.group:
                os.killpg(os.getpgrp(), self.sig)
            else:
                os.kill(os.getpid(), self.sig)


def run_child(
    config: Path,
    *,
    resume: bool = False,
    signal_at: tuple[int, signal.Signals] | None = None,
    group: bool = False,
    steps: int | None = None,
) -> int:
    """Train ``config`` in a forked child (own process group); its exit code (-N: signal N)."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 1
        try:
            os.setpgid(0, 0)  # a group signal must not reach pytest
            torch.set_num_threads(1)
            cfg = load_train_config(config)
            if steps is not None:
                cfg.train.steps = steps
            hooks = [] if signal_at is None else [SendSignal(*signal_at, group=group)]
            run_training(cfg, hooks=hooks, show_progress=False, resume=resume)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"training child {pid} still running after {CHILD_TIMEOUT_S} s (killed)")


# ---------------------------------------------------------------------- the signal flags
def test_signal_flags_count_real_signals_and_restore_the_old_handlers() -> None:
    from recd.train.signals import SignalFlags, StepSignals

    before = signal.getsignal(signal.SIGUSR1)
    with SignalFlags() as flags:
        assert flags.take() == StepSignals()
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert flags.take() == StepSignals(save=True, stop=False)  # acted on once
        assert flags.take() == StepSignals()
        os.kill(os.getpid(), signal.SIGTERM)
        assert flags.take() == StepSignals(save=True, stop=True)
        assert flags.stop_requested
    assert signal.getsignal(signal.SIGUSR1) == before


def test_processes_forked_while_the_flags_are_installed_ignore_stop_signals() -> None:
    """What a DataLoader worker gets: SIGTERM and SIGUSR1 ignored and blocked (torch's worker
    loop installs its own SIGTERM handler later; a blocked signal never reaches it)."""
    from recd.train.signals import SignalFlags

    with SignalFlags():
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                blocked = signal.pthread_sigmask(signal.SIG_BLOCK, set())
                ok = (
                    signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
                    and signal.SIGTERM in blocked
                    and signal.SIGUSR1 in blocked
                )
                os.kill(os.getpid(), signal.SIGTERM)  # must not kill it
                os.write(write_fd, b"ok" if ok else b"no")
            finally:
                os._exit(0)
        os.close(write_fd)
        _, status = os.waitpid(pid, 0)
        answer = os.read(read_fd, 2)
        os.close(read_fd)
    assert os.waitstatus_to_exitcode(status) == 0 and answer == b"ok"
    pid = os.fork()  # after uninstall: children are ordinary again
    if pid == 0:
        os._exit(0 if signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, set()) else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


# ---------------------------------------------------------------------- the reference
@dataclass
class Reference:
    run_dir: Path
    config: Path
    """The EVERY-cadence config the scenarios copy (run_dir replaced per test)."""
    table: Path
    sha: dict[int, str]
    """sha256 of step_k.bin for k = 1..N."""
    losses: list[float]
    audits: dict[int, dict[str, Any]]
    state: dict[str, Any]


@pytest.fixture(scope="module")
def reference(table: Path, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    root = tmp_path_factory.mktemp("ckpt-reference")
    ref_config = make_config(root / "ref.toml", table, root / "ref", every=1)
    # Warm up this process (TorchScript preprocessing, torchrec): forked children skip it.
    Trainer(load_train_config(ref_config), show_progress=False).close()
    assert run_child(ref_config) == 0
    run_dir = root / "ref"
    history = read_loss_history(run_dir)
    assert history.steps.tolist() == list(range(1, N + 1))
    samples = read_samples(run_dir)
    state = read_state(run_dir)
    assert samples is not None and state is not None
    return Reference(
        run_dir=run_dir,
        config=make_config(root / "every.toml", table, root / "unused", every=EVERY),
        table=table,
        sha={k: sha256(checkpoint_path(run_dir, k)) for k in range(1, N + 1)},
        losses=history.losses.tolist(),
        audits={a["step"]: a for a in samples["audits"]},
        state=state,
    )


def scenario_config(ref: Reference, tmp_path: Path, **overrides: Any) -> tuple[Path, Path]:
    run_dir = tmp_path / "run"
    config = make_config(tmp_path / "job.toml", ref.table, run_dir, every=EVERY, **overrides)
    return config, run_dir


def assert_matches_reference(ref: Reference, run_dir: Path) -> None:
    """Final checkpoint bytes and the loss history: identical, one record per step."""
    final = checkpoint_path(run_dir, N)
    assert sha256(final) == ref.sha[N], "final checkpoint differs from the never-stopped run"
    records = step_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, N + 1)), "one record per step"
    assert [r["loss"] for r in records] == ref.losses  # bitwise (JSON keeps float64 exactly)
    history = read_loss_history(run_dir)
    assert history.duplicate_steps == [] and history.superseded == 0


def assert_same_audit(got: dict[str, Any], want: dict[str, Any]) -> None:
    for key in ("step", "rows", "loss", "auc", "mean_prediction", "predictions"):
        assert got[key] == want[key], key


def test_reference_has_every_checkpoint_audit_and_state(reference: Reference) -> None:
    assert sorted(reference.audits) == list(range(1, N + 1))
    assert sorted(int(s) for s in reference.state["checkpoints"]) == list(range(1, N + 1))
    ckpt = read_checkpoint(checkpoint_path(reference.run_dir, N))
    assert ckpt.step == N
    assert ckpt.size_bytes == 8 + 12 * ckpt.n_params


# ---------------------------------------------------------------------- the matrix
@pytest.mark.parametrize("k", K_VALUES, ids=[f"k{k}" for k in K_VALUES])
def test_sigterm_writes_checkpoint_k_exits_0_and_resume_is_bit_exact(
    k: int, reference: Reference, tmp_path: Path
) -> None:
    config, run_dir = scenario_config(reference, tmp_path)
    assert run_child(config, signal_at=(k, signal.SIGTERM)) == 0
    newest = newest_valid_checkpoint(run_dir)
    assert newest == checkpoint_path(run_dir, k)
    assert sha256(newest) == reference.sha[k]
    assert [r["step"] for r in step_records(run_dir)] == list(range(1, k + 1))
    audits = {a["step"]: a for a in (read_samples(run_dir) or {})["audits"]}
    assert audits[k]["reason"] == "SIGTERM"
    assert_same_audit(audits[k], reference.audits[k])
    state = read_state(run_dir)
    assert state is not None
    want = reference.state["checkpoints"][str(k)]
    assert state["checkpoints"][str(k)]["readers"] == want["readers"]
    assert state["checkpoints"][str(k)]["rng"] == want["rng"]

    assert run_child(config, resume=True) == 0
    assert_matches_reference(reference, run_dir)


@pytest.mark.parametrize("k", K_VALUES, ids=[f"k{k}" for k in K_VALUES])
def test_sigusr1_writes_checkpoint_k_and_training_continues(
    k: int, reference: Reference, tmp_path: Path
) -> None:
    config, run_dir = scenario_config(reference, tmp_path)
    assert run_child(config, signal_at=(k, signal.SIGUSR1)) == 0
    assert sha256(checkpoint_path(run_dir, k)) == reference.sha[k]
    saved = {int(p.name[5:11]) for p in list_checkpoints(run_dir)}
    assert saved == {k, 5, 10, 12}
    assert_matches_reference(reference, run_dir)
    if k != RANDOM_K:
        return
    # Fall back to checkpoint k (later ones deleted): resume replays k+1..N against the
    # recorded history (bitwise, on_replay_mismatch = "raise") and writes nothing twice.
    for path in list_checkpoints(run_dir):
        if int(path.name[5:11]) > k:
            path.unlink()
    assert run_child(config, resume=True) == 0
    assert_matches_reference(reference, run_dir)


@pytest.mark.parametrize("k", K_VALUES, ids=[f"k{k}" for k in K_VALUES])
def test_sigkill_then_resume_from_the_last_periodic_checkpoint_is_bit_exact(
    k: int, reference: Reference, tmp_path: Path
) -> None:
    config, run_dir = scenario_config(reference, tmp_path)
    assert run_child(config, signal_at=(k, signal.SIGKILL)) == -signal.SIGKILL
    newest = newest_valid_checkpoint(run_dir)
    # Step k's hook never ran: at most the periodic checkpoints before k (the last one may
    # still have been in flight when the process died).
    assert newest is None or int(newest.name[5:11]) in {s for s in (5, 10) if s < k}
    for path in list_checkpoints(run_dir):
        assert sha256(path) == reference.sha[int(path.name[5:11])]
    assert [r["step"] for r in step_records(run_dir)] == list(range(1, k))
    assert run_child(config, resume=True) == 0
    assert_matches_reference(reference, run_dir)


# ---------------------------------------------------------------------- fallback, workers
def test_resume_falls_back_past_a_corrupt_newest_checkpoint(
    reference: Reference, tmp_path: Path
) -> None:
    config, run_dir = scenario_config(reference, tmp_path)
    shutil.copytree(reference.run_dir, run_dir)
    for path in list_checkpoints(run_dir):
        if int(path.name[5:11]) > 7:
            path.unlink()
    with open(checkpoint_path(run_dir, 7), "r+b") as f:  # a torn newest file
        f.truncate(1000)
    assert run_child(config, resume=True) == 0
    assert sha256(checkpoint_path(run_dir, N)) == reference.sha[N]
    history = read_loss_history(run_dir)
    assert history.losses.tolist() == reference.losses  # 8..12 replayed, checked, not rewritten
    assert len(step_records(run_dir)) == N
    assert sha256(checkpoint_path(run_dir, 10)) == reference.sha[10]  # rewritten by the resume


BIAS = "over_arch.model.1.bias"
"""The output bias: a NaN in its Adam v turns every prediction NaN after the next update."""


def put_nan(path: Path, region: str, tensor: str, element: int = 0) -> None:
    """Overwrite one float of ``tensor`` in ``region`` with NaN, in place, and record the new
    bytes' checksum, as a diverged run that wrote the NaN would have: size, header and
    checksum stay valid, so only the finite check can catch it."""
    layout = read_layout(path.parent)
    with open(path, "r+b") as f:
        f.seek(region_byte_offset(region, layout.n_params, layout.offset_of(tensor) + element))
        f.write(np.array([np.nan], dtype="<f4").tobytes())
    write_checksum(path, checksum_of_file(path))


def recd_train(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "recd", "train", "--config", str(config), *args]
    return subprocess.run(command, env=recd_env(), capture_output=True, text=True, timeout=240)


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " WARNING " in line]


def test_resume_refuses_a_checkpoint_with_nan_and_falls_back_to_the_previous_one(
    reference: Reference, tmp_path: Path
) -> None:
    config, run_dir = scenario_config(reference, tmp_path)
    shutil.copytree(reference.run_dir, run_dir)  # checkpoints 1..12, every one
    newest = checkpoint_path(run_dir, N)
    put_nan(newest, "adam_v", BIAS)
    done = recd_train(config, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    (warning,) = warning_lines(done.stderr)
    assert f"skipping checkpoint {newest}" in warning
    assert (
        f"non-finite value nan in adam_v of tensor '{BIAS}' (shape (1,)) at index (0,)" in warning
    )
    assert f"resumed from {checkpoint_path(run_dir, N - 1)}" in done.stderr
    # Step 12 replayed from 11 (checked bitwise against .loss.json) and written afresh.
    assert sha256(newest) == reference.sha[N]
    assert_matches_reference(reference, run_dir)


def test_accept_nonfinite_resumes_from_the_nan_checkpoint_and_trains_on(
    reference: Reference, tmp_path: Path
) -> None:
    config, run_dir = scenario_config(reference, tmp_path)
    shutil.copytree(reference.run_dir, run_dir)
    newest = checkpoint_path(run_dir, N)
    put_nan(newest, "adam_v", BIAS)
    done = recd_train(config, "--resume", "--accept-nonfinite", "--steps", str(N + 2))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from {newest} (step {N})" in done.stderr
    records = {r["step"]: r["loss"] for r in step_records(run_dir)}
    # Step 13's update spreads the NaN of v into the bias: step 14's loss is NaN.
    assert isinstance(records[N + 1], float) and records[N + 2] is None
    assert "predictions are NaN or infinite" in done.stderr  # the final evaluation
    audits = {a["step"]: a for a in (read_samples(run_dir) or {})["audits"]}
    assert audits[N + 2]["auc"] is None
    with pytest.raises(CheckpointCorruptError, match="non-finite value nan in weights"):
        check_checkpoint_finite(checkpoint_path(run_dir, N + 2), read_layout(run_dir))


def test_no_finite_checkpoint_left_exits_2_with_one_line(
    reference: Reference, tmp_path: Path
) -> None:
    config, run_dir = scenario_config(reference, tmp_path)
    shutil.copytree(reference.run_dir, run_dir)
    for path in list_checkpoints(run_dir):
        if int(path.name[5:11]) != EVERY:
            path.unlink()
    only = checkpoint_path(run_dir, EVERY)
    put_nan(only, "weights", "dense_arch.model._mlp.0._linear.weight", 3)
    done = recd_train(config, "--resume")
    assert done.returncode == 2
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("recd train:")]
    assert error.startswith(f"recd train: error: {run_dir}: none of 1 checkpoints is valid:")
    assert "'dense_arch.model._mlp.0._linear.weight' (shape (32, 2)) at index (1, 1)" in error
    assert f"pass --accept-nonfinite to resume from {only.name} regardless" in error
    assert "Traceback" not in done.stderr and len(step_records(run_dir)) == N  # untouched


def test_a_nonfinite_loss_stops_training_naming_the_step(
    reference: Reference, tmp_path: Path
) -> None:
    config, run_dir = scenario_config(reference, tmp_path)
    cfg = load_train_config(config)
    cfg.optim.lr = cfg.optim.embedding_lr = 1e30  # step 1's update overflows the weights
    with pytest.raises(TrainingDivergedError) as caught:
        run_training(cfg, show_progress=False)
    message = str(caught.value)
    assert message.startswith("step 2: the training loss is nan (not finite): training diverged")
    assert str(run_dir) in message and "--accept-nonfinite" in message
    assert [r["step"] for r in step_records(run_dir)] == [1]  # the NaN step is not recorded
    assert list_checkpoints(run_dir) == []


def test_evaluating_nan_weights_names_the_run_and_the_cause(
    reference: Reference, tmp_path: Path
) -> None:
    config, run_dir = scenario_config(reference, tmp_path)
    trainer = Trainer(load_train_config(config), show_progress=False)
    try:
        with torch.no_grad():
            dict(trainer.model.named_parameters())[BIAS].fill_(math.nan)
        with pytest.raises(TrainingDivergedError) as caught:
            trainer.evaluate()
        message = str(caught.value)
        assert message.startswith(f"evaluation at step 0 (run {run_dir}, held-out ")
        assert "512 of 512 predictions are NaN or infinite" in message
        assert "training diverged" in message
        trainer.config.train.accept_nonfinite = True
        result = trainer.evaluate()
        assert math.isnan(result.auc) and math.isnan(result.loss)
    finally:
        trainer.close()


def test_state_json_keeps_entries_only_for_checkpoints_on_disk(
    reference: Reference, tmp_path: Path
) -> None:
    config, run_dir = scenario_config(reference, tmp_path)
    text = config.read_text().replace("checkpoint_every = 5", "checkpoint_every = 2")
    config.write_text(text.replace("keep_last = 100", "keep_last = 2"))
    run_training(load_train_config(config), show_progress=False)
    on_disk = [int(p.name[5:11]) for p in list_checkpoints(run_dir)]
    assert on_disk == [10, 12]
    state = read_state(run_dir) or {}
    assert sorted(int(s) for s in state["checkpoints"]) == on_disk


def test_dataloader_workers_survive_signals_sent_to_the_whole_group(
    reference: Reference, tmp_path: Path
) -> None:
    """SIGUSR1 to the process group reaches the reader's worker processes too; they must keep
    serving batches (the trainer goes on to step N), and a SIGTERM to the group must still
    end with the checkpoint written and exit 0. Two workers train exactly as the reference's
    reading in the main process, and the run resumes in the main process, bit-exact."""
    config, run_dir = scenario_config(reference, tmp_path)
    text = config.read_text()
    config.write_text(text.replace("[reader]\n", "[reader]\nnum_workers = 2\n"))
    assert run_child(config, signal_at=(3, signal.SIGUSR1), group=True) == 0
    assert sha256(checkpoint_path(run_dir, 3)) == reference.sha[3]
    assert sha256(checkpoint_path(run_dir, N)) == reference.sha[N]

    shutil.rmtree(run_dir)
    assert run_child(config, signal_at=(8, signal.SIGTERM), group=True) == 0
    assert newest_valid_checkpoint(run_dir) == checkpoint_path(run_dir, 8)
    assert sha256(checkpoint_path(run_dir, 8)) == reference.sha[8]
    config.write_text(text)  # another worker count: the same batches from step 9 on
    assert run_child(config, resume=True) == 0
    assert sha256(checkpoint_path(run_dir, N)) == reference.sha[N]


def test_a_slow_background_snapshot_still_holds_the_state_of_its_step(
    reference: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy into the file image runs on the writer thread while the next step loads its
    batch and runs its forward and backward passes; the next ``optimizer.step()`` must wait
    for it. A copy slowed
    down by 0.3 s must still hold exactly the state at its step, not a later one."""
    from recd.train import checkpointing

    original = checkpointing._FileImage.plan_fill

    def slow_plan(self: Any, optimizer: Any, step: int) -> Any:
        time.sleep(0.3)
        return original(self, optimizer, step)

    monkeypatch.setattr(checkpointing._FileImage, "plan_fill", slow_plan)
    captured: dict[int, Any] = {}

    class Capture:
        def after_step(self, trainer: Trainer, step: int, loss: float) -> None:
            if step == EVERY:
                captured[step] = trainer.optimizer.export_state()

    config, run_dir = scenario_config(reference, tmp_path, steps=EVERY + 2)
    cfg = load_train_config(config)
    result = run_training(cfg, hooks=[Capture()], show_progress=False)
    assert result.steps == EVERY + 2
    ckpt = read_checkpoint(checkpoint_path(run_dir, EVERY))
    state = captured[EVERY]
    assert ckpt.weights.tobytes() == state.weights.tobytes()
    assert ckpt.adam_m.tobytes() == state.adam_m.tobytes()
    assert ckpt.adam_v.tobytes() == state.adam_v.tobytes()
    assert sha256(checkpoint_path(run_dir, EVERY)) == reference.sha[EVERY]


def test_steps_that_run_during_a_slow_table_copy_leave_the_checkpoint_exact(
    reference: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedding tables' copy does not hold training up: steps run while it is in
    flight and hand over the rows they update (copy-on-write by rows). With the tables'
    copy held back by 0.5 s, several steps run meanwhile, and the checkpoint still equals,
    byte for byte, the reference run's."""
    from recd.train import snapshot

    original = snapshot.SnapshotFill.run
    rows_saved: list[int] = []

    def slow_run(self: Any) -> None:
        self.dense.work(from_back=False)
        self.dense.finish()
        time.sleep(0.5)  # the next steps run now, before any table row is copied
        original(self)
        rows_saved.append(self.patches.rows_saved)

    monkeypatch.setattr(snapshot.SnapshotFill, "run", slow_run)
    config, run_dir = scenario_config(reference, tmp_path, steps=EVERY + 3)
    result = run_training(load_train_config(config), show_progress=False)
    assert result.steps == EVERY + 3
    assert rows_saved and rows_saved[0] > 0
    assert sha256(checkpoint_path(run_dir, EVERY)) == reference.sha[EVERY]


# ---------------------------------------------------------------------- the commands
@pytest.mark.slow
def test_recd_train_sigterm_then_resume_as_commands(reference: Reference, tmp_path: Path) -> None:
    """``recd train`` as a real command; ``kill -TERM`` from outside at an arbitrary moment
    (once a few steps are recorded) to its whole process group (reader worker included);
    then ``recd train --resume``."""
    config, run_dir = scenario_config(reference, tmp_path, steps=N)
    text = config.read_text().replace("[reader]\n", "[reader]\nnum_workers = 1\n")
    config.write_text(text)
    command = [sys.executable, "-m", "recd", "train", "--config", str(config)]
    proc = subprocess.Popen(
        command,
        env=recd_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        loss = run_dir / LOSS_FILE
        while time.monotonic() < deadline and proc.poll() is None:
            if loss.exists() and len(loss.read_text().splitlines()) >= 2:
                break
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    stopped = len(step_records(run_dir))
    assert 2 <= stopped < N, "the signal should stop the run before its end"
    assert "SIGTERM" in out
    assert newest_valid_checkpoint(run_dir) == checkpoint_path(run_dir, stopped)
    assert sha256(checkpoint_path(run_dir, stopped)) == reference.sha[stopped]

    again = subprocess.run(
        [*command, "--resume"], env=recd_env(), capture_output=True, text=True, timeout=240
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert_matches_reference(reference, run_dir)


def test_a_fresh_run_refuses_a_directory_with_checkpoints(
    reference: Reference, tmp_path: Path
) -> None:
    config = load_train_config(reference.config)
    config.train.run_dir = reference.run_dir
    with pytest.raises(ConfigError, match="pass --resume to continue"):
        run_training(config, show_progress=False)


def pivot_parser() -> argparse.ArgumentParser:
    from recd.cli.pivot import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser


def test_pivot_keeps_the_loss_history_and_archives_the_policy_sidecars(
    reference: Reference, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, run_dir = scenario_config(reference, tmp_path)
    assert run_child(config) == 0  # steps 1..12, checkpoints 5, 10, 12
    before = (run_dir / LOSS_FILE).read_bytes()
    old_samples = (run_dir / SAMPLES_FILE).read_bytes()
    old_state = (run_dir / STATE_FILE).read_bytes()
    new_config = make_config(
        tmp_path / "new.toml", reference.table, tmp_path / "x", every=EVERY, steps=9
    )
    new_config.write_text(new_config.read_text().replace("lr = 0.01", "lr = 0.05"))

    args = pivot_parser().parse_args(
        ["pivot", str(run_dir), "--config", str(new_config), "--from", "5"]
    )
    assert args.func(args) == 0
    assert "pivot at step 5" in capsys.readouterr().out

    (archive,) = (run_dir / "archive").iterdir()
    assert (archive / SAMPLES_FILE).read_bytes() == old_samples
    assert (archive / STATE_FILE).read_bytes() == old_state
    assert sorted(p.name for p in archive.glob("step_*.bin")) == [
        "step_000010.bin",
        "step_000012.bin",
    ]
    after = (run_dir / LOSS_FILE).read_bytes()
    assert after.startswith(before)  # never rewritten, only appended
    history = read_loss_history(run_dir)
    assert history.steps.tolist() == list(range(1, 10))
    assert history.losses.tolist()[:5] == reference.losses[:5]
    assert history.superseded == N - 5
    (branch,) = [e for e in history.events if e["event"] == "branch"]
    assert branch["at_step"] == 5 and branch["config"] == str(new_config.resolve())
    # The new branch started from checkpoint 5's weights with a fresh data policy.
    audits = (read_samples(run_dir) or {})["audits"]
    assert [a["step"] for a in audits] == [9]
    state = read_state(run_dir) or {}
    assert state["checkpoints"]["5"] == {"step": 5, "fresh_policy": True}
    assert sorted(int(s) for s in state["checkpoints"]) == [5, 9]
    assert read_checkpoint(checkpoint_path(run_dir, 9)).step == 9


def test_fork_runs_two_branches_from_identical_weights(
    reference: Reference, tmp_path: Path
) -> None:
    source = checkpoint_path(reference.run_dir, 5)
    results = {}
    for name, lr in (("a", "0.01"), ("b", "0.05")):
        fork_run(source, tmp_path / name)
        config = make_config(
            tmp_path / f"{name}.toml", reference.table, tmp_path / name, every=EVERY, steps=8
        )
        config.write_text(config.read_text().replace("lr = 0.01", f"lr = {lr}"))
        assert run_child(config, resume=True) == 0
        history = read_loss_history(tmp_path / name)
        assert history.steps.tolist() == [6, 7, 8]
        assert history.events[0]["event"] == "fork" and history.events[0]["at_step"] == 5
        results[name] = history.losses.tolist()
    # Step 6's loss is computed before its update: same weights, same (fresh) first batch.
    assert results["a"][0] == results["b"][0]
    assert results["a"][1:] != results["b"][1:]
    assert sha256(checkpoint_path(tmp_path / "a", 8)) != sha256(checkpoint_path(tmp_path / "b", 8))


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("checkpoint_every = 10\nsample_every = 15", "not a multiple of"),
        ("checkpoint_every = 0", "checkpoint.checkpoint_every: expected an integer >= 1"),
        ("keep_last = 0", "checkpoint.keep_last"),
        (
            'on_replay_mismatch = "ignore"',
            "[checkpoint] on_replay_mismatch = 'ignore': invalid enum value 'ignore'; "
            "expected one of 'warn', 'raise'",
        ),
        ("cadence = 5", "unknown key(s) cadence"),
    ],
)
def test_checkpoint_config_errors_name_the_field(
    tmp_path: Path, table: Path, toml: str, message: str
) -> None:
    path = write_config(tmp_path / "c.toml", table, tmp_path / "run")
    path.write_text(path.read_text() + f"\n[checkpoint]\n{toml}\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_train_config(path)


def test_sample_every_defaults_to_checkpoint_every(tmp_path: Path, table: Path) -> None:
    path = write_config(tmp_path / "c.toml", table, tmp_path / "run")
    path.write_text(path.read_text() + "\n[checkpoint]\ncheckpoint_every = 7\n")
    config: TrainConfig = load_train_config(path)
    assert config.checkpoint.sample_every == 7
    assert config.checkpoint_dir == config.train.run_dir
