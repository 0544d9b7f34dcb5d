"""``recd recover``: the CLI runs a real 2-process job, a worker SIGKILLs itself, the job
recovers by itself and the report (JSON and text) states the recovery and the audit trail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recd.cli import main
from recd.cli.recover import format_report

pytestmark = pytest.mark.timeout(180)


def test_recover_runs_a_job_with_a_kill_and_reports_the_recovery(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    # Killed in step 4, newest checkpoint at step 2: survivors undo step 4, the agreed step
    # is 3, and the dead rank's shard loses step 3's updates (not bit-exact, and said so).
    argv = ["recover", str(run_dir), "--steps", "5", "--checkpoint-every", "2"]
    code = main([*argv, "--kill-step", "4", "--rows", "200", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failures"] == 1
    assert report["timeline"]["failed_step"] == 4 and report["timeline"]["lost_steps"] == 1
    assert report["timeline"]["total"] > 0
    (record,) = report["recoveries"]
    assert record["failed_rank"] == 1 and record["agreed_step"] == 3
    assert record["undone"] == [{"rank": 0, "step": 4, "exact": True}]
    assert record["embedding_checkpoint_step"] == 2
    assert sum(record["rows_lost_updates"].values()) > 0 and record["bit_exact"] is False
    assert (run_dir / ".recovery.json").exists()
    text = format_report(report)
    assert "killed in step 4, resumed at step 3 (1 step(s) lost)" in text
    assert "undone: rank 0 step 4 exact" in text and "bit_exact=False" in text


def test_recover_refuses_a_used_run_dir_and_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "old.txt").write_text("a previous run")
    assert main(["recover", str(tmp_path)]) == 2
    assert "must be a new or empty directory" in capsys.readouterr().err
    assert main(["recover", str(tmp_path / "new"), "--kill-step", "11"]) == 2
    assert "--kill-step must be in [0, --steps=10]" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_recover_help_explains_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["recover", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "SIGKILLs itself" in out and "--kill-step" in out and ".recovery.json" in out
