"""The shipped ``impressions`` pipeline end to end, as a user runs it (a smaller log): the
analysis priced for the rm1 job proposes the history group, the trainer pools it with its
transformer on distinct histories, and the held-out metrics are written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "recd" / "pipelines"


@pytest.mark.slow
def test_recd_run_impressions_trains_rm1_with_the_history_group(tmp_path: Path) -> None:
    text = (PIPELINES / "impressions.toml").read_text()
    text = re.sub(r'(?m)^work_dir = ".*?"', f'work_dir = "{tmp_path / "work"}"', text)
    text = text.replace("seed = 0\n", "seed = 0\nrows = 40000\n", 1)
    text = re.sub(
        r'(?m)^config = ".*?"', f'config = "{PIPELINES / "train_impressions.toml"}"', text
    )
    text = text.replace("holdout_hours = 6", "holdout_hours = 6\nsteps = 40")
    config = tmp_path / "impressions.toml"
    config.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "recd", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "RECD_PROGRESS": "0"},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    work = tmp_path / "work"
    report = json.loads((work / "report.json").read_text())
    analysis = report["analyze"]
    assert analysis["pricing"] == "job"
    history = ["hist_item_ids", "hist_event_types"]
    assert history in analysis["dedup_sparse_features"]
    (group,) = [g for g in analysis["groups"] if g["features"] == history]
    assert group["trainer_saving_ms_per_1k"] > 0  # the transformer runs once per request
    job = tomllib.loads((work / "train.toml").read_text())
    assert job["reader"]["dedup_sparse_features"] == analysis["dedup_sparse_features"]
    summary = json.loads((work / "train" / "train.json").read_text())
    assert summary["result"]["steps"] == 40
    final = summary["result"]["evals"][-1]
    assert 0 < final["ne"] < 1.2 and 0.5 < final["auc"] <= 1.0
    assert "recd analyze" in analysis["command"] and str(work / "train.toml") in analysis["command"]
