"""benchmarks/train_e2e.py: its summary arithmetic on hand-made runs, and the whole benchmark
at toy size (real tables, real ``recd analyze`` and ``recd train`` child processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.train_e2e import (
    BASELINE,
    CONFIGS,
    RECD,
    ProfileJob,
    main,
    paired_difference,
    ratio,
    steady_state,
    targets_met,
)


def _runs(**by_config: list[float]) -> dict[str, list[dict]]:
    return {
        c: [{"round": i, "ok": True, "x": v} for i, v in enumerate(values)]
        for c, values in by_config.items()
    }


def test_ratios_are_of_the_medians_with_per_round_spread() -> None:
    runs = _runs(kjt_arrival=[10.0, 20.0, 30.0], ikjt_clustered=[40.0, 50.0, 90.0])
    r = ratio(runs, "x")
    assert r["median"] == pytest.approx(50 / 20)
    assert r["per_round"] == pytest.approx([4.0, 2.5, 3.0])
    assert (r["min"], r["max"], r["n"]) == (pytest.approx(2.5), pytest.approx(4.0), 3)
    times = ratio(runs, "x", inverse=True)  # times: KJT over IKJT
    assert times["median"] == pytest.approx(20 / 50)
    runs[RECD][1]["ok"] = False  # a failed run leaves its round out of the spread
    assert ratio(runs, "x")["per_round"] == pytest.approx([4.0, 3.0])


def test_paired_difference_and_targets_at_the_bad_end() -> None:
    runs = _runs(kjt_arrival=[0.50, 0.52], ikjt_clustered=[0.501, 0.518])
    diff = paired_difference(runs, "x")
    assert diff["mean"] == pytest.approx((0.001 - 0.002) / 2)
    headlines = {
        "train_cpu_speedup": {"median": 5.0, "min": 3.9, "max": 6.0},
        "table_bytes_ratio": {"median": 2.0, "min": None, "max": None},
        "ne_difference": diff,
    }
    met = targets_met(
        headlines,
        {"train_cpu_speedup": 4.0, "table_bytes_ratio": 1.9, "ne_abs_difference": 0.005},
    )
    assert met["train_cpu_speedup"]["met"] is False  # the median passes, the bad end does not
    assert met["table_bytes_ratio"]["met"] is True
    assert met["ne_abs_difference"]["met"] is True


def test_steady_state_leaves_out_the_warm_up_windows() -> None:
    job = ProfileJob(
        profile="p",
        rows=1,
        batch_size=100,
        steps=50,
        log_every=10,
        model={},
        sequence={},
        optim={},
    )
    lines = [
        {"kind": "train", "step": s, "samples_per_cpu_s": cpu, "samples_per_s": wall}
        for s, cpu, wall in ((10, 1.0, 1.0), (20, 100.0, 50.0), (30, 200.0, 100.0))
    ] + [{"kind": "eval", "step": 30}]
    s = steady_state(lines, job)
    assert s["steady_steps_from"] == 10
    # windows of steps 11-20 and 21-30: 1000 rows each, 10 + 5 CPU seconds, 20 + 10 wall
    assert s["samples_per_cpu_s"] == pytest.approx(2000 / 15)
    assert s["samples_per_s"] == pytest.approx(2000 / 30)


@pytest.mark.slow
def test_the_benchmark_runs_end_to_end_at_toy_size(tmp_path: Path) -> None:
    assert (
        main(
            [
                "--quick",
                "--profiles",
                "impressions",
                "--reps",
                "1",
                "--work-dir",
                str(tmp_path / "work"),
                "--out-dir",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    result = json.loads((tmp_path / "out" / "train_e2e_quick.json").read_text())
    block = result["profiles"]["impressions"]
    assert ["hist_item_ids", "hist_event_types"] in block["proposal"]["dedup_sparse_features"]
    for c in CONFIGS:
        (run,) = block["runs"][c]
        assert run["ok"] and run["samples_per_cpu_s"] > 0
        assert 0 < run["ne"] < 2  # a held-out NE, written by the run
        assert block["readers"][c][0]["ok"]
    assert block["headlines"]["train_cpu_speedup"]["n"] == 1
    assert block["headlines"]["table_bytes_ratio"]["median"] > 0
    assert set(block["targets"]) == {
        "train_cpu_speedup",
        "reader_speedup",
        "table_bytes_ratio",
        "ne_abs_difference",
    }
    md = (tmp_path / "out" / "train_e2e_quick.md").read_text()
    assert "KJT, arrival-order table" in md and BASELINE in md
    assert (tmp_path / "out" / "train_e2e_quick.png").stat().st_size > 0
