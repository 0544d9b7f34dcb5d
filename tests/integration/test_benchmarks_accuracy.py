"""benchmarks/accuracy.py: its summary arithmetic on hand-made runs, and the whole benchmark
at toy size (real tables, real ``recd analyze`` and ``recd train`` child processes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.accuracy import (
    AUTOCORRELATION_TARGET,
    CONFIGS,
    NE_TARGET,
    REFERENCE,
    ROWS,
    SESSION,
    lag1_autocorrelation,
    main,
    one_pass,
    order_stats,
    paired_difference,
    profile_jobs,
    run_problem,
    sign_of,
    summarise,
)


def test_lag1_autocorrelation_of_known_sequences() -> None:
    assert lag1_autocorrelation([0.1, 0.3] * 10) == pytest.approx(-1.0)
    assert lag1_autocorrelation([0.01 * i for i in range(20)]) == pytest.approx(1.0)
    assert lag1_autocorrelation([0.2] * 10) is None  # constant: undefined, not 0
    assert lag1_autocorrelation([0.1, 0.2]) is None  # too short


def test_order_stats_weights_the_label_mean_by_rows() -> None:
    s = order_stats([0.0, 1.0, 0.5], [100, 100, 50], batch_size=100)
    assert s["label_mean"] == pytest.approx(125 / 250)
    assert s["iid_batch_label_mean_std"] == pytest.approx((0.5 * 0.5 / 100) ** 0.5)
    assert s["batch_label_mean_std"] == pytest.approx((1 / 6) ** 0.5)  # population std
    assert (s["batches"], s["rows"]) == (3, 250)


def test_one_pass_trains_only_full_batches_of_the_training_rows() -> None:
    job = profile_jobs(quick=False)["impressions"]
    assert one_pass(job, 5_000).steps == 5_000 // job.batch_size
    assert one_pass(job, 10).steps == 1


def test_a_run_counts_only_if_it_trained_and_read_every_step() -> None:
    good = {"steps": 20, "order": {"ok": True, "batches": 20}}
    assert run_problem(good, 20) is None
    assert run_problem({**good, "steps": 12}, 20) == "trained 12 of 20 steps"
    assert "19 of 20 batches" in str(
        run_problem({**good, "order": {"ok": True, "batches": 19}}, 20)
    )
    unread = {**good, "order": {"ok": False, "error": "OSError: gone"}}
    assert run_problem(unread, 20) == "reading the batch order: OSError: gone"


def _run(rnd: int, ne: float, lag1: float | None, *, ok: bool = True) -> dict[str, Any]:
    if not ok:
        return {"round": rnd, "seed": rnd, "ok": False, "error": "boom", "whole_wall_s": 1.0}
    return {
        "round": rnd,
        "seed": rnd,
        "ok": True,
        "ne": ne,
        "auc": 0.7,
        "heldout_loss": 0.3,
        "whole_wall_s": 10.0,
        "whole_cpu_s": 9.0,
        "order": {
            "lag1_autocorrelation": lag1,
            "batch_label_mean_std": 0.01,
            "iid_batch_label_mean_std": 0.012,
        },
    }


def _runs() -> dict[str, list[dict[str, Any]]]:
    return {
        REFERENCE: [_run(0, 0.90, 0.0), _run(1, 0.92, 0.05), _run(2, 0.91, -0.05)],
        SESSION: [_run(0, 0.902, 0.1), _run(1, 0.924, 0.25), _run(2, 0.5, 0.9, ok=False)],
        ROWS: [_run(0, 0.89, 0.01), _run(1, 0.93, 0.02), _run(2, 0.92, None)],
    }


def test_differences_are_per_seed_and_a_failed_run_is_counted_and_left_out() -> None:
    runs = _runs()
    diff = paired_difference(runs, "ne", SESSION, REFERENCE)
    assert diff["n"] == 2  # round 2 of (b) failed: its seed has no difference
    assert diff["values"] == pytest.approx([0.002, 0.004])
    assert diff["mean"] == pytest.approx(0.003)
    s = summarise(runs)
    b = s["configs"][SESSION]
    assert (b["runs"], b["failed"]) == (3, 1)
    assert b["ne"]["mean"] == pytest.approx(0.913)  # the failed run's 0.5 left out
    assert b["lag1_autocorrelation"]["max"] == pytest.approx(0.25)
    assert s["configs"][ROWS]["lag1_undefined"] == 1
    assert s["configs"][ROWS]["lag1_autocorrelation"]["n"] == 2
    assert s["differences"][f"{ROWS}-{REFERENCE}"]["ne"]["values"] == pytest.approx(
        [-0.01, 0.01, 0.01]
    )


def test_a_difference_is_indistinguishable_unless_every_seed_agrees() -> None:
    assert sign_of([0.001, 0.003, 0.002]) == "higher"
    assert sign_of([-0.001, -0.003]) == "lower"
    assert sign_of([-0.001, 0.003, 0.002]) == "indistinguishable"
    assert sign_of([0.01]) == "indistinguishable"  # one seed says nothing about the noise
    assert paired_difference(_runs(), "ne", SESSION, REFERENCE)["sign"] == "higher"


def test_targets_are_met_or_missed_at_their_stated_ends() -> None:
    t = summarise(_runs())["targets"]
    ne = t["ne_abs_difference_b_a"]
    assert ne["target"] == NE_TARGET and ne["value"] == pytest.approx(0.003) and ne["met"]
    # (b): a seed at 0.25 > 0.2 misses, though the mean (0.175) would pass
    assert t["lag1_autocorrelation_b"]["value"] == pytest.approx(0.25)
    assert t["lag1_autocorrelation_b"]["target"] == AUTOCORRELATION_TARGET
    assert t["lag1_autocorrelation_b"]["met"] is False
    assert t["lag1_autocorrelation_c"]["met"] is True
    runs = _runs()
    runs[SESSION] = [_run(r, 0.95, 0.0) for r in range(3)]  # NE 0.03-0.04 worse than (a)
    assert summarise(runs)["targets"]["ne_abs_difference_b_a"]["met"] is False
    runs[SESSION] = [_run(r, 0.5, 0.0, ok=False) for r in range(3)]  # nothing to compare
    missed = summarise(runs)["targets"]
    assert missed["ne_abs_difference_b_a"]["met"] is False
    assert missed["lag1_autocorrelation_b"]["met"] is False


@pytest.mark.slow
def test_the_benchmark_runs_end_to_end_at_toy_size(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["--quick", "--profiles", "impressions", "--work-dir", str(tmp_path / "work")]
    assert main([*argv, "--out-dir", str(out)]) == 0
    result = json.loads((out / "accuracy_quick.json").read_text())
    assert result["protocol"]["seeds"] == [0, 1]
    block = result["profiles"]["impressions"]
    assert ["hist_item_ids", "hist_event_types"] in block["proposal"]["dedup_sparse_features"]
    assert len(block["orders"]) == 2 and all(sorted(o) == sorted(CONFIGS) for o in block["orders"])
    for c in CONFIGS:
        assert len(block["runs"][c]) == 2
        for run in block["runs"][c]:
            assert run["ok"], run.get("error")
            assert 0 < run["ne"] < 2 and 0 <= run["auc"] <= 1
            assert run["order"]["batches"] == block["job"]["steps"]
            assert run["reader"]["shuffle"] == ("session" if c == SESSION else "rows")
            assert run["reader"]["seed"] == run["seed"]
        assert block["configs"][c]["failed"] == 0
    b_groups = block["runs"][SESSION][0]["reader"]["dedup_sparse_features"]
    assert b_groups == block["proposal"]["dedup_sparse_features"]
    assert block["runs"][REFERENCE][0]["reader"]["dedup_sparse_features"] == []
    assert set(block["targets"]) == {
        "ne_abs_difference_b_a",
        "lag1_autocorrelation_b",
        "lag1_autocorrelation_c",
    }
    md = (out / "accuracy_quick.md").read_text()
    assert "python benchmarks/accuracy.py --quick" in md and SESSION in md
    assert (out / "accuracy_quick.png").stat().st_size > 0
