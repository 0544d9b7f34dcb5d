"""Your own data, end to end, as real processes: the example clickstream through `recd run`
(ingest -> shard -> ETL -> analyze -> train -> predict), a bad pipeline mapping, and the
streaming ingest's peak memory following the budget, not the file.

The memory test follows tests/integration/test_etl_memory.py: a child process reports its peak
RSS (``VmHWM``) after imports and at the end; a run with a 16 MiB budget on a file whose
whole-file read grows by several times that must stay within ``memory_bound_bytes`` (budget +
fixed overhead) and write the same rows as a control run with a budget above the file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from recd.logs import rawlog
from recd.logs.ingest import memory_bound_bytes

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "recd" / "pipelines"
MIB = 1 << 20
BUDGET_MB = 16
ENV = {**os.environ, "RECD_PROGRESS": "0"}


def _recd(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=ROOT,
    )


def _own_data_toml(tmp_path: Path, events: Path, *, steps: int) -> Path:
    """The shipped own_data.toml with this test's input, work_dir, step count."""
    text = (PIPELINES / "own_data.toml").read_text()
    text = re.sub(r'(?m)^input = ".*?"', f'input = "{events}"', text)
    text = re.sub(r'(?m)^work_dir = ".*?"', f'work_dir = "{tmp_path / "work"}"', text)
    text = re.sub(r'(?m)^config = ".*?"', f'config = "{PIPELINES / "train_own_data.toml"}"', text)
    text = re.sub(r"(?m)^steps = \d+", f"steps = {steps}", text)
    path = tmp_path / "own_data.toml"
    path.write_text(text)
    return path


def test_recd_run_own_data_end_to_end_then_predict(tmp_path: Path) -> None:
    events = tmp_path / "events.csv"
    made = subprocess.run(
        [sys.executable, "-m", "recd.logs.example_events", "--out", str(events),
         "--events", "3000", "--hours", "3"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    assert "wrote 3,000 events" in made.stdout
    config = _own_data_toml(tmp_path, events, steps=60)
    done = _recd("run", "--config", str(config))
    assert done.returncode == 0, done.stderr[-3000:]
    work = tmp_path / "work"
    report = json.loads((work / "report.json").read_text())
    ingest = report["ingest"]
    assert ingest["rows_in"] == 3000 and ingest["history_only"] > 0
    assert ingest["rows_out"] + ingest["history_only"] + ingest["quarantined"] == 3000
    assert report["etl"]["clustered"]["rows_out"] == ingest["rows_out"]
    assert report["train"]["steps"] == 60
    catalogue = rawlog.read_catalogue(work / "raw")
    assert {"price", "hist_len"} <= set(catalogue.dense_names)
    assert {"category_id", "brand_id", "hist_item_ids"} <= set(catalogue.sparse_names)
    train_toml = tomllib.loads((work / "train.toml").read_text())
    assert train_toml["reader"]["end"] == "2026-11-01T10:00:00Z"  # holdout_hours = 1 of 08-10
    assert train_toml["eval"]["start"] == "2026-11-01T10:00:00Z"
    assert f"model:   {work / 'train' / 'step_000060.bin'}" in done.stdout
    command = next(line for line in done.stdout.splitlines() if line.startswith("score:"))
    args = command.removeprefix("score:").split()[2:]  # after "recd predict"
    scored = _recd("predict", *args)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert (work / "predictions.parquet").is_file()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ('sparse = ["category_id", "brand_id"]', 'sparse = ["category_id"]\nsesion = "x"'),
        ("history = 10", 'history = "ten"'),
    ],
)
def test_recd_run_bad_mapping_key_exits_2_with_one_line(
    tmp_path: Path, edit: str, message: str
) -> None:
    config = _own_data_toml(tmp_path, tmp_path / "missing.csv", steps=10)
    text = config.read_text()
    assert edit in text
    config.write_text(text.replace(edit, message, 1))
    done = _recd("run", "--config", str(config), timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    expected = "unknown key(s) sesion" if "sesion" in message else "history = 'ten'"
    assert "[ingest.mapping]" in done.stderr and expected in done.stderr, done.stderr


CHILD = """
import json, sys
from pathlib import Path
from recd.etl.local import peak_rss_bytes
from recd.logs.ingest import ingest_events
from recd.logs.ingest_mapping import IngestMapping
baseline = peak_rss_bytes()
report = ingest_events(Path(sys.argv[1]), Path(sys.argv[2]), memory_budget_bytes=int(sys.argv[3]),
                       mapping=IngestMapping(keep_itemless=True, history=10), show_progress=False)
print(json.dumps({"baseline": baseline, "peak": peak_rss_bytes(), "buckets": report.buckets,
                  "rows_out": report.rows_out}))
"""


def _child(src: Path, out: Path, budget: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(src), str(out), str(budget)],
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
        timeout=300,
    )
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    result["growth"] = result["peak"] - result["baseline"]
    return result


def _write_events(path: Path, rows: int) -> None:
    """An interleaved clickstream CSV, ~40 bytes a line, written in slices."""
    rng = np.random.default_rng(3)
    ts = 1_793_520_000_000 + np.sort(rng.integers(0, 4 * 3_600_000, size=rows))
    with path.open("w") as f:
        f.write("session_id,ts,item_id,event_type\n")
        for lo in range(0, rows, 200_000):
            n = min(200_000, rows - lo)
            session = rng.integers(0, rows // 20, size=n)
            item = rng.integers(1, 1_000_000, size=n).astype(str).astype(object)
            item[rng.random(n) < 0.1] = ""
            kind = np.array(["view", "cart", "search"])[rng.integers(0, 3, size=n)]
            f.writelines(
                f"user-{s:08d},{t},{i},{k}\n"
                for s, t, i, k in zip(session, ts[lo : lo + n], item, kind, strict=True)
            )


@pytest.mark.slow
def test_streaming_ingest_peak_rss_follows_the_budget_not_the_file(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    _write_events(src, 1_000_000)
    size = src.stat().st_size
    budget = BUDGET_MB * MIB
    assert size >= 2 * budget, "the file must be bigger than the budget"

    bounded = _child(src, tmp_path / "bounded", budget)
    control = _child(src, tmp_path / "control", 4096 * MIB)  # one bucket: all in memory
    assert bounded["buckets"] > 1 and control["buckets"] == 1
    assert bounded["rows_out"] == control["rows_out"] > 0

    def rows(out: Path) -> pa.Table:
        return pa.Table.from_batches([b for _, _, b in rawlog.iter_raw_log(out)])

    assert rows(tmp_path / "bounded").equals(rows(tmp_path / "control"))
    limit = memory_bound_bytes(budget)
    print(
        f"file {size / MIB:.0f} MiB: bounded +{bounded['growth'] / MIB:.0f} MiB "
        f"({bounded['buckets']} buckets, limit {limit / MIB:.0f}), "
        f"control +{control['growth'] / MIB:.0f} MiB"
    )
    assert bounded["growth"] <= limit, f"grew {bounded['growth'] / MIB:.0f} MiB"
    assert control["growth"] > 1.5 * bounded["growth"], "the control must hold the whole file"
