"""benchmarks/checkpoint.py end to end at toy size (``--quick``): real table, real trainer,
real checkpoints, a resume. Checks that every reported number is measured and consistent,
not the values (no timing assertions); and the interval arithmetic on hand-computed cases."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from benchmarks.checkpoint import (
    KINDS,
    delta_bytes_figures,
    delta_schedule,
    paired_ratio_interval,
    round_ends,
    segment_orders,
    segment_roles,
    t_central_mass,
    t_quantile,
)
from benchmarks.checkpoint import main as bench_main


@pytest.mark.parametrize(
    ("df", "expected"),  # two-sided 95% critical values from printed t tables
    [(1, 12.7062), (2, 4.3027), (5, 2.5706), (10, 2.2281), (30, 2.0423), (120, 1.9799)],
)
def test_t_quantile_matches_tables(df: int, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)


def test_t_central_mass_closed_forms() -> None:
    # df = 1: Cauchy, P(|T| <= 1) = 1/2; df = 2: P(|T| <= t) = t / sqrt(2 + t^2).
    assert t_central_mass(1.0, 1) == pytest.approx(0.5)
    assert t_central_mass(3.0, 2) == pytest.approx(3.0 / math.sqrt(11.0))


def test_paired_interval_by_hand() -> None:
    off = [1.0, 2.0, 3.0]
    treated = [1.1, 2.0, 3.3]  # d = 0.1, 0, 0.3: R = mean(d) / mean(off) = (0.4 / 3) / 2
    got = paired_ratio_interval(off, treated)
    ratio = 0.4 / 3 / 2
    residuals = [d - ratio * a for d, a in zip([0.1, 0.0, 0.3], off, strict=True)]
    se = statistics.stdev(residuals) / math.sqrt(3) / 2.0
    assert got["point"] == pytest.approx(ratio)
    assert got["point"] == pytest.approx(sum(treated) / sum(off) - 1)
    assert got["se"] == pytest.approx(se)
    assert got["ci95"] == pytest.approx([ratio - 4.302653 * se, ratio + 4.302653 * se])
    lo, hi = got["bootstrap_ci95"]
    assert min(d / 2.0 for d in [0.1, 0.0, 0.3]) <= lo <= hi <= 0.3 / 3.0 + 1e-12


def test_paired_interval_needs_two_segments() -> None:
    with pytest.raises(ValueError, match="2 paired segments"):
        paired_ratio_interval([1.0], [1.0])


def test_segment_orders_are_seeded_permutations() -> None:
    by_segment = segment_orders(100, 4, seed=7)
    assert by_segment == segment_orders(100, 4, seed=7)
    assert by_segment != segment_orders(100, 4, seed=8)
    assert all(len(rounds) == 4 for rounds in by_segment)
    orders = [order for rounds in by_segment for order in rounds]
    assert all(sorted(order) == sorted(KINDS) for order in orders)
    assert len({tuple(order) for order in orders}) == 24  # every order turns up in 400 draws
    for slot in range(len(KINDS)):  # no trainer owns a slot
        assert {order[slot] for order in orders} == set(KINDS)


def test_segment_roles_are_seeded_permutations_that_no_trainer_keeps() -> None:
    roles = segment_roles(60, seed=7)
    assert roles == segment_roles(60, seed=7) != segment_roles(60, seed=8)
    assert roles != [order[0] for order in segment_orders(60, 1, seed=7)]  # a stream of its own
    assert all(sorted(segment) == sorted(KINDS) for segment in roles)
    for trainer in range(len(KINDS)):  # every trainer object plays every role
        assert {segment[trainer] for segment in roles} == set(KINDS)


def test_delta_schedule_cycles_full_then_deltas() -> None:
    # segment 0 is the warm-up; then full, 3 deltas, full, ... (full_every 4, cadence 100)
    assert delta_schedule(8, 100, 4) == [
        None,
        None,
        (100, 100, 0),
        (100, 200, 1),
        (100, 300, 2),
        None,
        (500, 500, 0),
        (500, 600, 1),
    ]
    assert delta_schedule(4, 20, 2) == [None, None, (20, 20, 0), None]
    with pytest.raises(ValueError, match="full_every"):
        delta_schedule(4, 20, 1)


def test_delta_bytes_figures_by_hand() -> None:
    tables = {"a": 100, "b": 300}
    files = [
        {"kind": "full", "bytes": 1000},
        {"kind": "delta", "bytes": 100, "table_rows": {"a": 10, "b": 30}, "dense_elements": 5},
        {"kind": "delta", "bytes": 300, "table_rows": {"a": 50, "b": 0}, "dense_elements": 5},
    ]
    got = delta_bytes_figures(files, 1000, tables)
    assert got["deltas"] == 2 and got["fulls"] == 1
    assert got["delta_bytes_ratio"] == pytest.approx(0.2)
    assert got["delta_bytes_ratio_max"] == pytest.approx(0.3)
    assert got["touched_fraction_per_table"] == pytest.approx({"a": 0.3, "b": 0.05})
    assert got["touched_fraction"] == pytest.approx((40 / 400 + 50 / 400) / 2)
    assert got["touched_fraction_range"] == pytest.approx([0.1, 0.125])


def test_rounds_cover_each_segment_with_the_checkpoint_first() -> None:
    assert round_ends(0, 100, 4) == [24, 49, 74, 99]  # warm-up: steps 1 to 99
    assert round_ends(3, 100, 4) == [324, 349, 374, 399]  # checkpoint after step 300
    assert round_ends(2, 20, 1) == [59]


@pytest.mark.slow
def test_quick_benchmark_writes_consistent_results(tmp_path: Path) -> None:
    out = tmp_path / "results"
    argv = ["--quick", "--blocks", "3", "--raw-reps", "1", "--orders-seed", "3"]
    assert bench_main([*argv, "--out", str(out)]) == 0
    result = json.loads((out / "checkpoint_quick.json").read_text())
    stall, protocol = result["stall"], result["protocol"]
    orders = segment_orders(4, 2, seed=3)
    assert stall["orders"] == orders  # segment 0 is the warm-up
    roles = segment_roles(4, seed=3)
    assert stall["roles"] == roles
    for s in stall["warmup_segments"] + stall["segments"]:
        assert s["trainer"] == roles[s["segment"]].index(s["kind"])
        assert 0 < s["hook_s"] < s["wall_s"]
    assert sorted(stall["checkpoints_per_trainer"]) == sorted(
        [sum(segment[t] == "checkpoint" for segment in roles[1:]) for t in range(len(KINDS))]
    )
    # the resume reads the newest checkpoint: the one of the last segment's checkpointer
    assert stall["run_dir"].endswith(f"-t{roles[-1].index('checkpoint')}")
    assert result["resume"]["from_step"] == 60
    assert [s["kind"] for s in stall["warmup_segments"]] == list(KINDS)
    assert [s["kind"] for s in stall["segments"]] == list(KINDS) * 3
    assert [s["steps"] for s in stall["segments"]][:: len(KINDS)] == [[20, 39], [40, 59], [60, 79]]
    for s in stall["segments"]:  # each trainer's place in each of the 2 rounds
        rounds = orders[s["segment"]]
        assert s["positions"] == [order.index(s["kind"]) for order in rounds]
        assert s["wall_s"] == pytest.approx(sum(s["round_wall_s"])) and len(rounds) == 2
    assert len(stall["raw_in_training_write_s"]) == 3  # at steps 20, 40 and 60
    assert stall["checkpoints"] == 3
    assert stall["bytes_written"] >= stall["checkpoint_bytes"] == 8 + 12 * stall["n_params"]
    for key in ("stall_fraction", "blocked_fraction", "write_bw_vs_raw"):
        assert math.isfinite(result[key]), key
    lo, hi = result["stall_fraction_ci95"]
    assert lo < result["stall_fraction"] < hi == result["stall_fraction_upper95"]
    assert result["stall_target_met"] == (hi <= 0.02)
    assert stall["stall_interval"]["segments"] == 3 == len(stall["stall_fraction_per_segment"])
    raw_lo, raw_hi = result["raw_write_stall_fraction_ci95"]
    assert raw_lo < result["raw_write_stall_fraction"] < raw_hi
    assert result["blocked_fraction"] > 0
    assert 0 < stall["off_hook_fraction"] < 1
    for key in ("stall_fraction_by_round", "raw_write_stall_fraction_by_round"):
        split = stall[key]  # the two parts add up to the headline
        total = split["first_round"]["point"] + split["other_rounds"]["point"]
        headline = "stall_fraction" if key.startswith("stall") else "raw_write_stall_fraction"
        assert total == pytest.approx(result[headline])
    for key, value in [
        ("segments", 3),
        ("steps_per_segment", 20),
        ("rounds_per_segment", 2),
        ("steps_per_round", 10),
        ("batch_size", 256),
    ]:
        assert protocol[key] == value, key
    assert protocol["orders_seed"] == 3 and protocol["threads"] == 1
    assert protocol["command"].startswith("python benchmarks/checkpoint.py " + " ".join(argv))
    assert len(protocol["load_avg_before"]) == len(protocol["load_avg_after"]) == 3
    resume = result["resume"]
    assert resume["from_step"] > 0
    for key in ("startup_s", "read_s", "load_s", "first_step_s"):
        assert resume[key] >= 0, key
    table = (out / "checkpoint_quick.md").read_text()
    assert not table.startswith("# ")
    assert "**stall_fraction_upper95**" in table and "**write_bw_vs_raw**" in table
    assert f"{result['stall_fraction_upper95']:+.4f}" in table
    check_delta_role(result, roles, table)


def check_delta_role(result: dict, roles: list[list[str]], table: str) -> None:
    """The delta role of the quick run (full_every 4, segments 1 to 3: full, delta, delta)."""
    stall, protocol = result["stall"], result["protocol"]
    assert result["full_every"] == protocol["full_every"] == stall["full_every"] == 4
    assert protocol["trainers"] == list(KINDS)
    schedule = delta_schedule(4, 20, 4)
    assert stall["delta_schedule"] == [list(c) if c else None for c in schedule]
    kinds = ["full", "delta", "delta"]
    delta_segments = [s for s in stall["segments"] if s["kind"] == "delta"]
    assert [s["checkpoint_kind"] for s in delta_segments] == kinds
    for s in stall["segments"]:  # the writer-thread copy runs for the delta role's deltas only
        assert (s["fill_s"] > 0) == (s.get("checkpoint_kind") == "delta"), s
        assert (s["merge_s"] > 0) == (s.get("checkpoint_kind") == "delta"), s
        assert s["fill_s"] >= s["merge_s"]
        assert s["row_log_s"] > 0  # every trainer logs rows at every step
    # stall: the same paired interval as the full checkpoint's
    lo, hi = result["delta_stall_fraction_ci95"]
    assert lo < result["delta_stall_fraction"] < hi == result["delta_stall_fraction_upper95"]
    assert result["delta_stall_target_met"] == (hi <= 0.01)
    assert stall["delta_stall_interval"]["segments"] == 3
    assert stall["delta_only_segments"] == 2 and stall["delta_role_full_segments"] == 1
    lo, hi = result["delta_only_stall_fraction_ci95"]
    assert (
        lo < result["delta_only_stall_fraction"] < hi == result["delta_only_stall_fraction_upper95"]
    )
    assert stall["delta_role_full_stall_fraction"] is None  # one segment: no interval
    lo, hi = result["delta_vs_checkpoint_ci95"]
    assert lo < result["delta_vs_checkpoint"] < hi
    split = stall["delta_stall_fraction_by_round"]
    total = split["first_round"]["point"] + split["other_rounds"]["point"]
    assert total == pytest.approx(result["delta_stall_fraction"])
    # files: a full file, then two deltas extending it, written by the role's trainers
    role = stall["delta_role"]
    files = role["files"]
    assert [f["kind"] for f in files] == kinds
    assert [f["step"] for f in files] == [20, 40, 60]
    assert [f["trainer"] for f in files] == [roles[i].index("delta") for i in (1, 2, 3)]
    assert role["deltas_written"] == 2
    assert sum(role["checkpoints_per_trainer"]) == 3
    assert len(role["write_s"]["delta"]) == 2 and len(role["write_s"]["full"]) == 1
    assert role["bytes_written"] == sum(f["bytes"] for f in files)
    assert files[0]["bytes"] == stall["checkpoint_bytes"]
    assert role["chain_check"]["links"] == [
        "step_000020.bin",
        "step_000040.delta",
        "step_000060.delta",
    ]
    assert role["chain_check"]["max_abs_diff"] == 0.0  # same seed, same batches: same state
    # bytes: a delta is 32 + 24 blocks + 4 rows + 12 elements (width 8: the quick model)
    tables = stall["bytes"]["table_rows"]
    assert sum(tables.values()) < stall["n_params"] // 8
    for f in files[1:]:
        rows = sum(f["table_rows"].values())
        elements = 12 * (8 * rows + f["dense_elements"])
        assert elements < f["bytes"] < elements + 32 + 24 * 64 + 4 * (rows + 64)
        assert all(0 < f["table_rows"][t] <= n for t, n in tables.items())
    b = stall["bytes"]
    assert b["delta_bytes"] == [f["bytes"] for f in files[1:]]
    assert b["delta_bytes_ratio"] == pytest.approx(
        statistics.fmean(b["delta_bytes"]) / b["full_bytes"]
    )
    assert result["delta_bytes_ratio"] == b["delta_bytes_ratio"] and 0 < b["delta_bytes_ratio"] < 1
    assert result["delta_bytes_target_met"] == (b["delta_bytes_ratio"] <= 1 / 3)
    assert 0 < result["touched_fraction"] <= 1
    expected = statistics.fmean(
        sum(f["table_rows"].values()) / sum(tables.values()) for f in files[1:]
    )
    assert result["touched_fraction"] == pytest.approx(expected)
    # row logging: timed inside the step, over the off segments' time
    rl = stall["row_log"]
    assert 0 < rl["row_log_fraction"] == result["row_log_fraction"] < 0.5
    lo, hi = rl["row_log_fraction_ci95"]
    assert lo < rl["row_log_fraction"] < hi
    assert 0 < rl["marks_only_fraction"] < rl["row_log_fraction"]
    # each trainer, step and touched table (79 steps each: warm-up and 3 segments)
    assert len(KINDS) * 79 <= rl["log_calls_total"] <= len(KINDS) * 79 * len(tables)
    assert result["row_log_target_met"] == (hi <= 0.005)
    for row in ("**delta_stall_fraction_upper95**", "**delta bytes / full bytes**"):
        assert row in table
    assert "**row logging / step time**" in table
    assert f"{result['delta_stall_fraction_upper95']:+.4f}" in table


@pytest.mark.slow
def test_quick_large_benchmark_writes_consistent_results(tmp_path: Path) -> None:
    out = tmp_path / "results"
    assert bench_main(["--quick", "--large", "--out", str(out)]) == 0
    result = json.loads((out / "checkpoint_large_quick.json").read_text())
    large = result["large"]
    assert large["full_every"] == 4 and large["checkpoints"] == 8
    assert [c["kind"] for c in large["per_checkpoint"]] == ["full"] + ["delta"] * 3 + ["full"] + [
        "delta"
    ] * 3
    assert [f["step"] for f in large["files"]] == list(range(20, 161, 20))
    b = large["bytes"]
    assert b["fulls"] == 2 and b["deltas"] == 6
    assert b["full_file_bytes"] == [b["full_bytes"]] * 2 == [8 + 12 * large["n_params"]] * 2
    assert set(large["tables"].values()) == {20_000} and len(large["tables"]) == 4
    assert 0 < result["delta_bytes_ratio"] == b["delta_bytes_ratio"] < 1
    assert result["delta_bytes_target_met"] == (b["delta_bytes_ratio"] <= 0.1)
    assert 0 < result["touched_fraction"] < 1
    for name, frac in b["touched_fraction_per_table"].items():
        assert 0 < frac < 1, name
    assert large["chain_check"]["max_abs_diff"] == 0.0
    assert large["chain_check"]["links"] == [
        "step_000100.bin",
        "step_000120.delta",
        "step_000140.delta",
        "step_000160.delta",
    ]
    tt, wt = large["train_thread"], large["writer_thread"]
    assert len(wt["delta_fill_s"]) == 6 and all(s > 0 for s in wt["delta_fill_s"])
    assert 0 < wt["delta_merge_s_median"] < wt["delta_fill_s_median"]
    assert tt["delta_checkpoint_s_median"] > 0 and tt["full_checkpoint_s_median"] > 0
    assert 0 < large["row_log"]["row_log_fraction"] < 0.5
    assert isinstance(large["stall"], str)  # not measured at this size, and says why
    table = (out / "checkpoint_large_quick.md").read_text()
    assert "**delta bytes / full bytes**" in table
    assert f"{b['delta_bytes_ratio']:.4f}" in table
