"""Entry points that run a training job in this process: :func:`run_training` (a
:class:`recd.train.loop.Trainer` with the :class:`recd.train.checkpointing.Checkpointer` as its
step hook, in a run directory this process owns), :func:`owning_run_directory` and
:func:`train_from_pipeline` (``recd run``'s training stage).

Kept apart from the loop so that the loop and the checkpointer do not import each other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from recd.checkpoint.lock import lock_run_directory
from recd.errors import ConfigError
from recd.recovery.env import KILL_ENV, ROLE_ENV
from recd.recovery.rejoin import FirstStepNotice, SurvivorRecovery, recovery_mode
from recd.train.checkpointing import Checkpointer
from recd.train.config import TrainConfig, load_train_config
from recd.train.hooks import StepHook
from recd.train.launch import (
    DistContext,
    destroy_distributed,
    in_torchrun,
    init_distributed,
)
from recd.train.loop import Trainer
from recd.train.results import TrainResult
from recd.train.signals import SignalFlags

__all__ = ["owning_run_directory", "run_training", "train_from_pipeline"]


def run_training(
    config: TrainConfig,
    *,
    hooks: Sequence[StepHook[Trainer]] = (),
    show_progress: bool = True,
    resume: bool = False,
) -> TrainResult:
    """Train ``config`` in this process; inside a torchrun worker, as its rank of the job.

    ``train.world_size > 1`` must run under torchrun (``recd train --nproc N`` launches it).
    With ``[checkpoint] enabled`` (the default) a :class:`recd.train.checkpointing.Checkpointer`
    runs after ``hooks``: checkpoints every ``checkpoint_every`` steps, on SIGTERM (then stops)
    and SIGUSR1, and at the end, with the run directory's sidecars. ``resume``: continue from
    the newest valid checkpoint of the run directory (a fresh start when there is none);
    without it a run directory that already holds checkpoints is refused. The run directory is
    owned (locked) for the whole call, before anything in it is touched
    (:func:`owning_run_directory`).
    """
    use_checkpoints = config.checkpoint.enabled
    signals: SignalFlags | None = None
    if use_checkpoints and threading.current_thread() is threading.main_thread():
        signals = SignalFlags().install()  # early: a SIGTERM during start-up is not fatal
    dist: DistContext | None = None
    owner = contextlib.ExitStack()
    try:
        owner = owning_run_directory(config)  # RunDirectoryBusyError: nothing touched
        if in_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
            dist = init_distributed(config.train.device)
            config.train.world_size = dist.world_size
        elif config.train.world_size > 1:
            raise ConfigError(
                f"train.world_size = {config.train.world_size} needs torchrun: run "
                "`recd train --nproc N` (or set train.world_size = 1)"
            )
        trainer = Trainer(config, dist=dist, hooks=hooks, show_progress=show_progress)
        checkpointer = None
        recovery = injected = None
        joining = os.environ.get(ROLE_ENV) == "replacement"
        try:
            if dist is not None and recovery_mode() == "survivor":
                recovery = SurvivorRecovery(
                    trainer, store=dist.store, generation=dist.generation, attempt=dist.attempt
                )
                trainer.recovery = recovery
            elif dist is not None and recovery_mode() == "elastic":
                trainer.hooks.append(
                    FirstStepNotice(dist.store, attempt=dist.attempt, generation=dist.generation)
                )
                if os.environ.get(KILL_ENV):
                    # the baseline's faults: the same injected kills, no survivor recovery
                    injected = SurvivorRecovery(
                        trainer, store=dist.store, generation=dist.generation, attempt=dist.attempt
                    )
            if use_checkpoints:
                checkpointer = Checkpointer(config, signals=signals)
                trainer.checkpointer = checkpointer
                checkpointer.attach(trainer, resume=resume, joining=joining)
                trainer.hooks.append(checkpointer)
            if joining and recovery is not None:
                recovery.join()  # the survivors' state, at their step
            elif recovery is not None:
                recovery.start()  # every worker at once (peer copies seeded)
            result = trainer.train()
            for part in (recovery, injected):
                if part is not None:
                    part.close()  # the last recovery's audit is written
            if checkpointer is not None:
                checkpointer.close()  # waits for the write in flight; raises if it failed
            return result
        finally:
            if checkpointer is not None:
                checkpointer.close(raise_errors=False)
            trainer.close()
    finally:
        if dist is not None:
            destroy_distributed()
        owner.close()
        if signals is not None:
            signals.uninstall()


def owning_run_directory(config: TrainConfig) -> contextlib.ExitStack:
    """Own the run directory of ``config`` (and its checkpoint directory when that is another
    one) until the returned stack is closed: their locks (:mod:`recd.checkpoint.lock`).

    Taken by the process that writes there: the only one, or rank 0 of a torchrun job (whose
    other ranks touch the directory only after rank 0's set-up barrier); a rank 0 under
    ``recd train --nproc`` finds the lock held by its launcher and proceeds.
    ``RunDirectoryBusyError`` (naming the live owner's pid) when another process owns it.
    """
    stack = contextlib.ExitStack()
    if in_torchrun() and os.environ["RANK"] != "0":
        return stack
    directories = [config.train.run_dir]
    if config.checkpoint.enabled:
        directories.append(config.checkpoint_dir)
    try:
        for directory in dict.fromkeys(Path(d).resolve() for d in directories):
            stack.enter_context(lock_run_directory(directory))
    except BaseException:
        stack.close()
        raise
    return stack


def train_from_pipeline(
    work_dir: Path,
    config_path: Path,
    *,
    dedup_sparse_features: list[list[str]] | None = None,
    steps: int | None = None,
    show_progress: bool = True,
) -> TrainResult:
    """The ``make run`` training stage: train ``config_path`` on ``work_dir/table``.

    The config's ``[reader] table`` and ``[train] run_dir`` are replaced by ``work_dir/table``
    and ``work_dir/train``; ``dedup_sparse_features`` (the analysis' proposal,
    ``TableAnalysis.dedup_sparse_features``) replaces the reader's groups when given.
    """
    config = load_train_config(config_path)
    reader = dataclasses.replace(config.reader, table=str(Path(work_dir) / "table"))
    if dedup_sparse_features is not None:
        reader = dataclasses.replace(
            reader, dedup_sparse_features=[list(g) for g in dedup_sparse_features]
        )
    config.reader = reader
    config.train.run_dir = Path(work_dir) / "train"
    if steps is not None:
        config.train.steps = steps
    return run_training(config, show_progress=show_progress)
