"""benchmarks/reader_tier.py end to end at toy size (``--quick``): a real table, the inline
reader, DataLoader workers and Ray Data workers on a local Ray cluster. Checks that every
reported number is measured and consistent with the others, not its value (no timing
assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_quick_run_writes_consistent_results(tmp_path: Path) -> None:
    out = tmp_path / "reader_tier.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "reader_tier.py"), "--quick",
         "--work-dir", str(tmp_path / "work"), "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    protocol = result["protocol"]
    assert protocol["reps"] == 1 and len(protocol["orders"]) == 1
    assert (
        sorted(protocol["orders"][0])
        == sorted(result["tiers"])
        == [
            "dataloader_w1",
            "inline",
            "ray_w1",
        ]
    )
    assert protocol["step_calibrated"] and protocol["step_ms"] > 0
    for name, tier in result["tiers"].items():
        assert tier["rows"] == protocol["table_rows"] > 0, name  # the whole table, every tier
        assert tier["passes"] == 1 and tier["failed_passes"] == 0
        for key in ("samples_per_s", "stall_fraction", "wall_s"):
            s = tier[key]
            assert s["min"] <= s["median"] <= s["max"], (name, key)
        assert 0.0 <= tier["stall_fraction"]["median"] <= 1.0
        assert tier["samples_per_s"]["median"] == pytest.approx(
            tier["rows"] / tier["wall_s"]["median"]
        )
    wire = result["wire"]
    assert wire["wire_ratio_kjt_over_ikjt"] == pytest.approx(
        wire["kjt"]["pickled_bytes_per_batch"] / wire["ikjt"]["pickled_bytes_per_batch"]
    )
    assert out.with_suffix(".md").read_text().count("\n| ") == 4  # header + 3 tiers
    assert out.with_suffix(".png").stat().st_size > 0
