"""``recd run``'s training stage as a user runs it: your own log without the example's
``price`` column trains with the shipped ``own_data`` template, in one uninterrupted segment;
a template naming a column the log lacks stops the run right after the ingest; the ``small``
pipeline (``make run``) still stops its trainer after the first checkpoint and resumes it."""

from __future__ import annotations

import csv
import json
import re
import tomllib
from pathlib import Path

from recd.logs import rawlog
from recd.logs.example_events import make_events
from tests.integration.test_own_data import PIPELINES, _own_data_toml, _recd


def log_without_price(tmp_path: Path) -> Path:
    """The example clickstream (3,000 events over 3 hours) with its price column left out."""
    rows = make_events(3000, hours=3.0)
    drop = rows[0].index("price")
    path = tmp_path / "events.csv"
    with path.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([r[:drop] + r[drop + 1 :] for r in rows])
    return path


def own_data_config(tmp_path: Path, *, steps: int, template: Path | None = None) -> Path:
    """The shipped own_data.toml for the log without price: its mapping maps no dense column."""
    config = _own_data_toml(tmp_path, log_without_price(tmp_path), steps=steps)
    text = config.read_text()
    assert 'dense = ["price"]' in text
    text = text.replace('dense = ["price"]', "dense = []", 1)
    if template is not None:
        text = re.sub(r'(?m)^config = ".*?"', f'config = "{template}"', text)
    config.write_text(text)
    return config


def test_own_log_without_price_trains_with_the_shipped_template_in_one_segment(
    tmp_path: Path,
) -> None:
    config = own_data_config(tmp_path, steps=120)  # past the first checkpoint (step 100)
    done = _recd("run", "--config", str(config))
    assert done.returncode == 0, done.stderr[-3000:]
    work = tmp_path / "work"
    dense = rawlog.read_catalogue(work / "raw").dense_names
    assert "price" not in dense and dense == ["hist_len", "secs_since_prev_event"]
    job = tomllib.loads((work / "train.toml").read_text())
    assert job["reader"]["preprocessing"] == [{"kind": "log1p", "features": dense}]
    assert "log1p_dense: the training job takes log1p of hist_len, secs_since_prev_event" in (
        done.stdout
    )
    report = json.loads((work / "report.json").read_text())
    assert report["log1p_dense"] == dense
    train = report["train"]
    assert (train["first_step"], train["steps"]) == (0, 120)  # one segment, from step 0
    assert "checkpoint_demo" not in train
    assert "SIGTERM" not in done.stdout and "--resume" not in done.stdout
    assert f"model:   {work / 'train' / 'step_000120.bin'}" in done.stdout
    summary = json.loads((work / "train" / "train.json").read_text())
    assert summary["result"]["evals"], "the held-out hour was scored"


def test_a_template_naming_a_column_the_log_lacks_stops_after_the_ingest(
    tmp_path: Path,
) -> None:
    mine = tmp_path / "mine.toml"
    text = (PIPELINES / "train_own_data.toml").read_text()
    mine.write_text(text.replace("num_epochs = 20\n", 'num_epochs = 20\ndense = ["price"]\n', 1))
    config = own_data_config(tmp_path, steps=10, template=mine)
    done = _recd("run", "--config", str(config), timeout=120)
    assert done.returncode == 2
    lines = done.stderr.splitlines()  # the ingest's log lines, then one error line
    error = lines[-1]
    assert error.startswith("recd run: error: ") and [x for x in lines if "error" in x] == [error]
    assert f"{mine}: [reader] dense names 'price', which is not a dense feature" in error
    work = tmp_path / "work"
    assert (work / "raw").is_dir() and not (work / "shards").exists()  # before the shard stage
    assert mine.read_text().count('"price"') == 1  # the user's name is kept, not dropped


def test_small_still_stops_its_trainer_after_the_first_checkpoint_and_resumes(
    tmp_path: Path,
) -> None:
    text = (PIPELINES / "small.toml").read_text()
    assert "demo_resume = true" in text
    text = re.sub(r'(?m)^work_dir = ".*?"', f'work_dir = "{tmp_path / "work"}"', text)
    text = re.sub(r'(?m)^config = ".*?"', f'config = "{PIPELINES / "train_small.toml"}"', text)
    text = text.replace("seed = 7\n", "seed = 7\nrows = 4000\n", 1)  # a smaller log
    text = text.replace("threshold = 1.5", 'threshold = 1.5\npricing = "factor"', 1)  # untimed
    text = text.replace("[train]\n", "[train]\nsteps = 150\n", 1)
    config = tmp_path / "small.toml"
    config.write_text(text)
    done = _recd("run", "--config", str(config), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    work = tmp_path / "work"
    report = json.loads((work / "report.json").read_text())
    demo = report["train"]["checkpoint_demo"]
    assert demo["signal"] == "SIGTERM" and demo["after"] == "step_000100.bin"
    assert demo["exit_code"] == 0 and demo["newest_checkpoint"] is not None
    assert demo["loss_entries"] == 150 and demo["one_entry_per_step"]
    assert report["train"]["steps"] == 150
    assert "resuming with --resume" in done.stdout
    assert "150 entries for steps 1..150, one per step across the restart" in done.stdout
