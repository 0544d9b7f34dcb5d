"""benchmarks/recovery.py: the simulation's bookkeeping, the protocol (seeded interleaved order,
failures counted, reload scaling) and the quick run end to end (``recd train`` drills)."""

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


def test_order_is_seeded_complete_and_interleaved() -> None:
    bench = load_benchmark()
    routes = ["survivor", "restart", "capture"]
    order = bench.plan_order(routes, 3, seed=0)
    assert sorted(order) == sorted((r, i) for r in routes for i in range(3))
    assert order == bench.plan_order(routes, 3, seed=0)
    assert order != bench.plan_order(routes, 3, seed=1)
    grouped = [(r, i) for r in routes for i in range(3)]
    assert order != grouped and order != [(r, i) for i in range(3) for r in routes]


def test_failed_runs_are_counted_and_kept_out_of_the_median_only() -> None:
    bench = load_benchmark()
    totals = {("restart", 0): 2.0, ("restart", 2): 4.0, ("survivor", 0): 1.0}

    def measure(route: str, rep: int) -> dict[str, object]:
        if route == "survivor" and rep == 1:
            raise RuntimeError("rank 0 failed with exit code 1")
        if route == "restart" and rep == 1:
            return {"error": "exit code 0, no recovery observed"}
        total = totals.get((route, rep), 3.0)
        return {"timeline": {"total": total, "lost_steps": 1, "load": total / 10}}

    order = bench.plan_order(["survivor", "restart"], 3, seed=0)
    runs = bench.run_schedule(order, measure)
    assert len(runs) == 6 and [r["position"] for r in runs] == list(range(6))
    assert all(len(r["loadavg_before"]) == 3 and len(r["loadavg_after"]) == 3 for r in runs)
    survivor = bench.summarize_route(runs, "survivor")
    restart = bench.summarize_route(runs, "restart")
    assert (survivor["runs"], survivor["runs_ok"]) == (3, 2)
    assert survivor["failed_runs"][0]["rep"] == 1
    assert "RuntimeError: rank 0 failed" in survivor["failed_runs"][0]["error"]
    assert restart["failed_runs"][0]["error"] == "exit code 0, no recovery observed"
    assert survivor["recovery_s"]["median"] == 2.0  # (1.0, 3.0): the failed run is not a value
    assert restart["recovery_s"]["median"] == 3.0  # (2.0, 4.0)
    ratio = bench.ratio(survivor["recovery_s"], restart["recovery_s"])
    assert ratio["value"] == pytest.approx(2.0 / 3.0)
    assert ratio["range"] == pytest.approx([1.0 / 4.0, 3.0 / 2.0])


def test_a_route_that_always_fails_is_reported_not_hidden() -> None:
    bench = load_benchmark()
    args = bench.parse_args(["--quick", "--reps", "3"])
    phases = {"detection": 0.1, "restart": 0.1, "rendezvous": 1.0, "load": 0.5}
    timeline = {**phases, "first_step": 0.3, "replay": 0.2, "total": 2.2, "lost_steps": 4}

    def measure(route: str, rep: int) -> dict[str, object]:
        if route == "survivor":
            raise RuntimeError(f"rank 1 (generation 1) failed with exit code 1 in rep {rep}")
        if route == "capture":
            return {"capture": dict.fromkeys(bench.CAPTURE_KEYS, 0.1)}
        return {"timeline": timeline, "checkpoint_stalls_s": [0.5]}

    order = bench.plan_order(bench.routes_of(args), args.reps, args.seed)
    runs = bench.run_schedule(order, measure)
    proto = bench.protocol(args, order, [[0.0] * 3, [0.0] * 3])
    result = bench.summarize(args, runs, proto)
    assert result["failed_runs"] == {"survivor": 3, "restart": 0, "capture": 0}
    assert result["recovery_time_ratio"] is None and result["simulated_speedup"] is None
    assert result["recovery_time_s"] == {"survivor": None, "restart": 2.2}
    markdown = "\n".join(bench.markdown_lines(result))
    assert "failed runs: survivor 3" in markdown
    assert markdown.count("- failed: survivor rep") == 3
    assert "Simulation: not run" in markdown


def test_reload_is_scaled_only_below_the_target_size() -> None:
    bench = load_benchmark()
    phases = {"detection": 0.1, "restart": 0.1, "rendezvous": 1.0, "load": 0.5, "first_step": 0.3}
    # the restart route's workers do not log their rendezvous and load: first_step holds them
    restart = {**phases, "rendezvous": None, "load": None, "first_step": 2.0}
    routes = {
        "survivor": {"phases_median_s": phases, "lost_steps": {"median": 1.0}},
        "restart": {"phases_median_s": restart, "lost_steps": {"median": 4.0}},
    }
    capture = {"train_step_s": {"median": 0.2}, "overhead_fraction": {"median": 0.1}}
    stall = {"median": 2.0}
    big = bench.reload_scaling(2_000_000_000, 2.0, 1e9, 1.5e9)
    assert big["factor"] == 1.0 and not big["scaled"] and big["extra_load_s"] == 0.0
    assert big["checkpoint_write_bytes_per_s"] == pytest.approx(1e9)
    inputs = bench.measured_inputs(routes, capture, stall, big)
    assert inputs["restart_fixed_s"] == pytest.approx(2.2)
    assert inputs["survivor_fixed_s"] == pytest.approx(2.0)
    assert inputs["checkpoint_cost_s"] == 2.0 and inputs["undo_overhead"] == 0.1
    small = bench.reload_scaling(250_000_000, 2.0, 1e9, 1.5e9)
    assert small["factor"] == pytest.approx(4.0) and small["scaled"]
    # each of the 2 ranks reads its half of the 750 MB more, at 1.5 GB/s
    assert small["extra_load_s"] == pytest.approx(0.25)
    scaled = bench.measured_inputs(routes, capture, stall, small)
    assert scaled["restart_fixed_s"] == pytest.approx(2.2 + 0.25)
    assert scaled["survivor_fixed_s"] == pytest.approx(2.0 + 0.25)
    assert scaled["checkpoint_cost_s"] == pytest.approx(8.0)


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_benchmark_writes_ratio_spread_protocol_and_simulation(tmp_path: Path) -> None:
    bench = load_benchmark()
    out = tmp_path / "recovery.json"
    argv = ["--quick", "--reps", "1", "--trials", "5", "--work-hours", "48"]
    argv += ["--work-dir", str(tmp_path / "w"), "--out", str(out)]
    assert bench.main(argv) == 0
    result = _strict(out.read_text())
    assert isinstance(result, dict)
    assert result["ratio_baseline"] == "restart"
    assert result["failed_runs"] == {"survivor": 0, "restart": 0, "capture": 0}
    lo, hi = result["recovery_time_ratio_range"]
    assert 0 < lo <= result["recovery_time_ratio"] <= hi
    survivor, restart = result["routes"]["survivor"], result["routes"]["restart"]
    assert survivor["recovery_s"]["n"] == restart["recovery_s"]["n"] == 1
    assert result["recovery_time_ratio"] == pytest.approx(
        survivor["recovery_s"]["median"] / restart["recovery_s"]["median"]
    )
    assert result["lost_steps"]["survivor"] == 1.0  # the step in flight, done again
    assert result["lost_steps"]["restart"] == 4.0  # steps 6..9 after the checkpoint at 5
    assert restart["phases_median_s"]["load"] is None  # not logged apart by its workers
    (run,) = [r for r in result["runs"] if r["route"] == "survivor"]
    audit = run["audit"]
    assert audit["agreed_step"] == 8 and audit["embedding_checkpoint_step"] == 5
    assert [(u["rank"], u["step"], u["exact"]) for u in audit["undone"]] == [(0, 9, True)]
    assert audit["bit_exact"] is False  # rows of rank 1's shards lost steps 6-8's updates
    proto = result["protocol"]
    assert proto["world_size"] == 2 and proto["steps"] == 10 and proto["repetitions"] == 1
    model = proto["model"]
    assert (model["profile"], model["rows"], model["dim"]) == ("rm1-like", 1500, 8)
    n_params, header = divmod(proto["checkpoint_bytes"] - 8, 12)
    assert header == 0 and n_params > model["table_rows"] * model["dim"]  # tables + MLPs
    sizes = {s for r in result["runs"] for s in r.get("checkpoint_file_bytes", [])}
    assert sizes == {proto["checkpoint_bytes"]}  # the files the jobs wrote
    assert sorted(proto["order"]) == sorted(
        f"{route}:0" for route in ("survivor", "restart", "capture")
    )
    assert [f"{r['route']}:{r['rep']}" for r in result["runs"]] == proto["order"]
    assert len(proto["loadavg_before"]) == 3 and len(proto["loadavg_after"]) == 3
    assert proto["threads"]["torch_threads_per_worker"] == 1
    assert proto["command"].startswith("python benchmarks/recovery.py --quick")
    variants = result["simulation"]["variants"]
    measured = variants["measured"]
    assert measured["assumption"] is False and measured["assumed_inputs"] == []
    capture = result["undo_capture"]["overhead_fraction"]
    assert capture["n"] == 1 and measured["inputs"]["undo_overhead"] == capture["median"]
    assert result["simulated_speedup"] == measured["simulated_speedup"]
    assert variants["assumed_capture_0_05"]["assumption"] is True
    assert variants["assumed_capture_0_05"]["inputs"]["undo_overhead"] == 0.05
    assert (
        result["simulated_speedup_assumed_capture_0_05"]
        == (variants["assumed_capture_0_05"]["simulated_speedup"])
    )
    scaling = result["simulation"]["reload_scaling"]
    assert scaling["scaled"] and scaling["extra_load_s"] > 0  # 8 MB, scaled to 1 GB
    markdown = (tmp_path / "recovery.md").read_text()
    assert not markdown.startswith("#")
    assert markdown.startswith("recovery_time_ratio (survivor / restart-and-reload")
    assert "| survivor |" in markdown and "| cadence h |" in markdown


def test_train_recovery_ratio_interval_is_a_seeded_bootstrap_of_the_medians() -> None:
    from benchmarks.train_recovery import median_ratio_ci95

    survivor = [0.5, 0.9, 1.0, 1.1, 1.3, 1.8, 2.1, 2.2, 2.5, 3.3]
    elastic = [4.4, 4.6, 5.3, 8.2, 8.3, 8.3, 8.9, 9.4, 9.7, 10.8]
    lo, hi = median_ratio_ci95(survivor, elastic)
    assert median_ratio_ci95(survivor, elastic) == [lo, hi]  # seeded
    point = float(np.median(survivor) / np.median(elastic))
    assert min(survivor) / max(elastic) < lo < point < hi < max(survivor) / min(elastic)
    assert median_ratio_ci95([2.0] * 5, [4.0] * 5) == [0.5, 0.5]  # no spread, no width
    assert median_ratio_ci95([1.0], elastic) is None  # one run is no interval
