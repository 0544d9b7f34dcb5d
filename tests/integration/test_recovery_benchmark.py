"""benchmarks/recovery.py: the simulation's bookkeeping, and the quick run end to end."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def load_benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_recovery", REPO / "benchmarks/recovery.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_recovery"] = module
    spec.loader.exec_module(module)
    return module


def test_simulation_accounts_for_checkpoints_failures_and_rollback() -> None:
    bench = load_benchmark()
    common = {"work_s": 100.0, "cadence_s": 30.0, "checkpoint_cost_s": 2.0}
    # no failure before the end: 100 s of work + checkpoints at 30, 60, 90
    never = np.array([1e9])
    assert bench.simulate(
        **common,
        gaps_s=never,
        restart_fixed_s=5,
        rollback_to_checkpoint=True,
        lost_s=0,
        overhead=0.0,
    ) == pytest.approx(106.0)
    # one failure 50 s in (progress 48, last checkpoint 30): back to 30, +5 s restart
    once = np.array([50.0, 1e9])
    rollback = bench.simulate(
        **common,
        gaps_s=once,
        restart_fixed_s=5,
        rollback_to_checkpoint=True,
        lost_s=0,
        overhead=0.0,
    )
    assert rollback == pytest.approx(50 + 5 + (100 - 30) + 2 * 2)  # checkpoints at 60 and 90
    survivor = bench.simulate(
        **common,
        gaps_s=once,
        restart_fixed_s=1,
        rollback_to_checkpoint=False,
        lost_s=1,
        overhead=0.0,
    )
    assert survivor == pytest.approx(50 + 1 + (100 - 47) + 2 * 2)
    # a 10 % overhead stretches the training time, not the checkpoints
    slow = bench.simulate(
        **common,
        gaps_s=never,
        restart_fixed_s=5,
        rollback_to_checkpoint=True,
        lost_s=0,
        overhead=0.1,
    )
    assert slow == pytest.approx(110.0 + 6.0)


@pytest.mark.timeout(240)
def test_quick_benchmark_writes_ratio_and_speedup(tmp_path: Path) -> None:
    bench = load_benchmark()
    out = tmp_path / "recovery.json"
    argv = ["--quick", "--trials", "5", "--work-hours", "48", "--work-dir", str(tmp_path / "w")]
    assert bench.main([*argv, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["ratio_baseline"] == "restart"
    assert result["recovery_time_ratio"] > 0 and result["simulated_speedup"] > 0
    assert result["lost_steps"]["survivor"] == 1.0  # the undone step
    assert result["lost_steps"]["restart"] == 4.0  # steps 6..9 after the checkpoint at 5
    assert (tmp_path / "recovery.md").exists()
