"""The elastic baseline for real: ``recd train --resume`` under ``torchrun --max-restarts 1``,
one worker SIGKILLed mid-training (``recd.recovery.elastic``).

The group must restart by itself, resume from the newest valid checkpoint and finish every
step; the driver must split the recovery into detection, restart, start-up, first step and
replay. torchrun (torch 2.13) reuses its store across restarts, so gloo's default
``init_process_group`` would meet the dead group's stale addresses and time out:
``recd.train.launch.init_distributed`` keys its store by ``TORCHELASTIC_RESTART_COUNT``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recd.recovery.elastic import elastic_command, run_elastic
from tests.integration.test_train_job import recd_env, table, write_config

__all__ = ["table"]

STEPS = 16


def test_elastic_command_restarts_and_resumes(tmp_path: Path) -> None:
    command = elastic_command(tmp_path / "job.toml", nproc=2, max_restarts=3)
    assert command[command.index("--max-restarts") + 1] == "3"
    assert command[command.index("--nproc_per_node") + 1] == "2"
    assert command[-1] == "--resume" and "torch.distributed.run" in command


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_killed_worker_group_restarts_from_the_newest_checkpoint(
    tmp_path: Path, table: Path
) -> None:
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path / "job.toml", table, run_dir, kind="dlrm", steps=STEPS, eval_every=0
    )
    text = config.read_text().replace("log_every = 5", "log_every = 1")
    config.write_text(text + "\n[checkpoint]\ncheckpoint_every = 5\n")
    report = run_elastic(
        config, run_dir, kill_after_step=7, timeout_s=360, env=recd_env(), after_a_checkpoint=True
    )
    assert report.returncode == 0, [line for _, line in report.lines][-30:]
    assert report.restarts == 1
    timeline = report.timeline
    assert timeline is not None, [line for _, line in report.lines][-30:]
    # the newest valid checkpoint at the kill (cadence 5): the worker may run a few more steps
    # between the observed step 7 and the SIGKILL landing on a loaded machine
    assert timeline.resumed_at_step % 5 == 0 and timeline.resumed_at_step >= 5
    assert timeline.lost_steps == timeline.killed_at_step - timeline.resumed_at_step >= 0
    assert timeline.total >= timeline.detection + timeline.restart + timeline.startup
    result = json.loads((run_dir / "train.json").read_text())["result"]
    assert result["steps"] == STEPS and result["first_step"] == timeline.resumed_at_step
