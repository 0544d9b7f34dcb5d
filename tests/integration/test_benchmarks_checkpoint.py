"""benchmarks/checkpoint.py end to end at toy size (``--quick``): real table, real trainer,
real checkpoints, a resume. Checks that every reported number is measured and consistent,
not the values (no timing assertions)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.checkpoint import main


@pytest.mark.slow
def test_quick_benchmark_writes_consistent_results(tmp_path: Path) -> None:
    out = tmp_path / "results"
    assert main(["--quick", "--blocks", "2", "--raw-reps", "1", "--out", str(out)]) == 0
    result = json.loads((out / "checkpoint_quick.json").read_text())
    stall = result["stall"]
    kinds = [s["kind"] for s in stall["segments"]]
    assert kinds == ["raw", "checkpoint", "off", "off", "checkpoint", "raw"]  # alternating order
    assert [s["steps"] for s in stall["segments"]][::3] == [[11, 30], [31, 50]]
    assert len(stall["raw_in_training_write_s"]) == 2  # at steps 20 and 40
    assert stall["checkpoints"] == 2
    assert stall["bytes_written"] >= stall["checkpoint_bytes"] == 8 + 12 * stall["n_params"]
    for key in ("stall_fraction", "blocked_fraction", "write_bw_vs_raw"):
        assert math.isfinite(result[key]), key
    assert result["blocked_fraction"] > 0
    resume = result["resume"]
    assert resume["from_step"] > 0
    for key in ("startup_s", "read_s", "load_s", "first_step_s"):
        assert resume[key] >= 0, key
    table = (out / "checkpoint_quick.md").read_text()
    assert "**stall_fraction**" in table and "**write_bw_vs_raw**" in table
