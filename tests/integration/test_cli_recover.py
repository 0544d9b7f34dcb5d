"""``recd recover``: the CLI runs ``recd train --nproc 2`` with a worker SIGKILLed, the trainer
recovers by itself and the report (JSON and text) states the recovery from the trainer's own
records: its event log (the phases, the lost steps) and its audit trail (bit-exactness)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recd.cli import main
from recd.cli.recover import format_report
from tests.integration.test_train_job import table

__all__ = ["table"]

pytestmark = pytest.mark.timeout(300)


def test_recover_runs_a_job_with_a_kill_and_reports_the_recovery(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    # Killed inside its update of step 4, newest checkpoint at step 2: the survivor undoes its
    # update of step 4, the agreed step is 3, and the dead rank's shards lose step 3's updates
    # (not bit-exact, and said so). No --table: the tiny profile's table is generated.
    argv = ["recover", str(run_dir), "--steps", "5", "--checkpoint-every", "2"]
    code = main([*argv, "--kill-step", "4", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failures"] == 1 and report["returncode"] == 0
    timeline = report["timeline"]
    assert timeline["route"] == "survivor" and timeline["failed_step"] == 4
    assert timeline["resumed_at_step"] == 3 and timeline["lost_steps"] == 1
    assert timeline["total"] >= timeline["detection"] > 0
    (record,) = report["recoveries"]
    assert record["failed_ranks"] == [1] and record["agreed_step"] == 3
    assert [(u["rank"], u["step"], u["exact"]) for u in record["undone"]] == [(0, 4, True)]
    assert record["embedding_checkpoint_step"] == 2
    assert sum(record["rows_lost_updates"].values()) > 0 and record["bit_exact"] is False
    assert (run_dir / "train" / ".recovery.json").exists()
    assert (run_dir / "table" / "table").is_dir()
    text = format_report(report)
    assert "killed in step 4 (optimizer), resumed at step 3 (1 step(s) lost" in text
    assert "undone: rank 0 step 4 exact" in text and "bit_exact=False" in text


@pytest.mark.slow
def test_recover_restart_mode_replays_from_the_checkpoint(
    tmp_path: Path, table: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    argv = ["recover", str(run_dir), "--mode", "restart", "--table", str(table)]
    code = main([*argv, "--steps", "5", "--checkpoint-every", "2", "--kill-step", "4", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    timeline = report["timeline"]
    assert timeline["route"] == "restart" and timeline["resumed_at_step"] == 2
    assert timeline["lost_steps"] == 2  # steps 3 and 4 done again
    (record,) = report["recoveries"]
    assert record["route"] == "restart" and record["checkpoint_step"] == 2
    assert record["bit_exact"] is True
    assert "every worker restarted from step_000002.bin" in format_report(report)


def test_recover_refuses_a_used_run_dir_and_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "old.txt").write_text("a previous run")
    assert main(["recover", str(tmp_path)]) == 2
    assert "must be a new or empty directory" in capsys.readouterr().err
    assert main(["recover", str(tmp_path / "new"), "--kill-step", "11"]) == 2
    assert "--kill-step must be in [0, --steps=10]" in capsys.readouterr().err
    assert main(["recover", str(tmp_path / "new"), "--world-size", "3"]) == 2
    assert "--batch-size 128 is not divisible by --world-size 3" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--tables", "4"], "--tables was removed: the tables are the sparse features"),
        (["--kill-point", "after_backward"], "the trainer's nearest point is 'optimizer'"),
        (["--kill-point", "after_step"], "the trainer's nearest point is 'after_update'"),
    ],
)
def test_recover_says_which_options_of_the_standalone_job_are_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["recover", str(tmp_path / "new"), *option])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_recover_help_explains_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["recover", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "SIGKILLs itself" in out and "--kill-step" in out and ".recovery.json" in out
    assert "--recovery survivor" in out and "--tables" not in out
