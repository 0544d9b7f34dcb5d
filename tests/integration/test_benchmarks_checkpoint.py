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
    by_segment = segment_orders(15, 4, seed=7)
    assert by_segment == segment_orders(15, 4, seed=7)
    assert by_segment != segment_orders(15, 4, seed=8)
    assert all(len(rounds) == 4 for rounds in by_segment)
    orders = [order for rounds in by_segment for order in rounds]
    assert all(sorted(order) == sorted(KINDS) for order in orders)
    assert len({tuple(order) for order in orders}) == 6  # every order turns up in 60 draws
    for slot in range(3):  # no trainer owns a slot
        assert {order[slot] for order in orders} == set(KINDS)


def test_segment_roles_are_seeded_permutations_that_no_trainer_keeps() -> None:
    roles = segment_roles(60, seed=7)
    assert roles == segment_roles(60, seed=7) != segment_roles(60, seed=8)
    assert roles != [order[0] for order in segment_orders(60, 1, seed=7)]  # a stream of its own
    assert all(sorted(segment) == sorted(KINDS) for segment in roles)
    for trainer in range(3):  # every trainer object plays every role
        assert {segment[trainer] for segment in roles} == set(KINDS)


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
        [sum(segment[t] == "checkpoint" for segment in roles[1:]) for t in range(3)]
    )
    # the resume reads the newest checkpoint: the one of the last segment's checkpointer
    assert stall["run_dir"].endswith(f"-t{roles[-1].index('checkpoint')}")
    assert result["resume"]["from_step"] == 60
    assert [s["kind"] for s in stall["warmup_segments"]] == list(KINDS)
    assert [s["kind"] for s in stall["segments"]] == list(KINDS) * 3
    assert [s["steps"] for s in stall["segments"]][::3] == [[20, 39], [40, 59], [60, 79]]
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
