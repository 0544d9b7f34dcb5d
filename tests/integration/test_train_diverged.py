"""A run stopped by a non-finite loss names the checkpoint to continue from: the newest whose
values are all finite, not a newer one written after the update that spoilt the weights.
The tiny DLRM job of test_train_job on its table (the real generate -> shard -> ETL)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from recd.checkpoint import check_checkpoint_finite, checkpoint_path, list_checkpoints, read_layout
from recd.errors import CheckpointNonFiniteError, TrainingDivergedError
from recd.train.config import load_train_config
from recd.train.loop import Trainer
from recd.train.run import run_training
from tests.integration.test_train_job import table, write_config

__all__ = ["table"]  # the module-scoped fixture: the tiny table through the real ETL

BIAS = "over_arch.model.1.bias"
"""The output bias: NaN there makes every prediction, and so the next loss, NaN."""


class SpoilWeights:
    """Step hook: at the end of step ``step`` set the output bias to NaN, before the
    checkpointer (a hook appended after the caller's) saves that step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def after_step(self, trainer: Trainer, step: int, loss: float) -> None:
        if step == self.step:
            with torch.no_grad():
                dict(trainer.model.named_parameters())[BIAS].fill_(math.nan)


def _config(tmp_path: Path, table: Path, run_dir: Path, **values: Any) -> Path:
    path = tmp_path / "job.toml"
    write_config(path, table, run_dir, eval_batches=1, kind="dlrm", batch_size=256, **values)
    text = path.read_text().replace("[train]\n", "[train]\nplot = false\n")
    path.write_text(text + "\n[checkpoint]\ncheckpoint_every = 1\nkeep_last = 100\n")
    return path


def test_the_stop_names_the_newest_finite_checkpoint_and_how_to_continue(
    tmp_path: Path, table: Path
) -> None:
    run_dir = tmp_path / "run"
    cfg = load_train_config(_config(tmp_path, table, run_dir, steps=6, eval_every=0))
    with pytest.raises(TrainingDivergedError) as caught:
        run_training(cfg, hooks=[SpoilWeights(3)], show_progress=False)
    message = str(caught.value)
    assert message.startswith("step 4: the training loss is nan (not finite): training diverged")
    # step 3 was checkpointed after its hook spoilt the weights; step 2 is the last finite one
    assert [p.name for p in list_checkpoints(run_dir)] == [f"step_00000{k}.bin" for k in (1, 2, 3)]
    with pytest.raises(CheckpointNonFiniteError):
        check_checkpoint_finite(checkpoint_path(run_dir, 3), read_layout(run_dir))
    assert (
        f"continue from {checkpoint_path(run_dir, 2)} (step 2: the newest checkpoint whose "
        "weights and Adam state are all finite; a resume skips the newer step_000003.bin "
        "(non-finite values)) with a lower learning rate (optim.lr, optim.embedding_lr): "
        f"recd pivot {run_dir} --config NEW.toml --from 2, or pass --accept-nonfinite"
    ) in message
    assert "newest checkpoint in" not in message  # not the spoilt step 3


def test_a_run_that_diverged_before_its_first_checkpoint_says_so(
    tmp_path: Path, table: Path
) -> None:
    run_dir = tmp_path / "run"
    cfg = load_train_config(_config(tmp_path, table, run_dir, steps=6, eval_every=0))
    cfg.checkpoint.checkpoint_every = 5
    cfg.optim.lr = cfg.optim.embedding_lr = 1e30  # step 1's update overflows the weights
    with pytest.raises(TrainingDivergedError) as caught:
        run_training(cfg, show_progress=False)
    message = str(caught.value)
    assert message.startswith("step 2: the training loss is nan (not finite)")
    assert (
        f"no checkpoint was written in {run_dir}: start again with a lower learning rate "
        "(optim.lr, optim.embedding_lr), or pass --accept-nonfinite"
    ) in message
    assert list_checkpoints(run_dir) == []
