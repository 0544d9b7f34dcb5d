"""benchmarks/storage.py end to end at toy size (``--quick``): real logs, shards, ``recd etl``
and the DuckDB references in child processes, both profiles. Checks the protocol recorded
next to every figure and that the figures are consistent with the runs they summarise, not
their values (no timing assertions); and the summary arithmetic on hand-made runs."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from benchmarks.storage import (
    DEFAULT_PROFILES,
    RECD,
    RECD_DEDUP,
    RECD_SIDES,
    REFERENCE,
    REFERENCE_GLOBAL,
    SIDES,
    WALL,
    interleaved_order,
    markdown,
    profile_block,
    ratio_summary,
    reference_sql,
    sessions_clustered,
    side_summary,
    speed_ratios,
    summarise_speed,
    top_level,
)
from benchmarks.storage import main as bench_main
from recd.schema import SESSION_ID


def test_interleaved_order_is_seeded_rounds() -> None:
    order = interleaved_order(40, SIDES, seed=5)
    assert order == interleaved_order(40, SIDES, seed=5)
    assert order != interleaved_order(40, SIDES, seed=6)
    rounds = [order[i : i + len(SIDES)] for i in range(0, len(order), len(SIDES))]
    for rep, round_ in enumerate(rounds):  # every side once per round, rounds in order
        assert [r for r, _ in round_] == [rep] * len(SIDES)
        assert sorted(side for _, side in round_) == sorted(SIDES)
    for slot in range(len(SIDES)):  # no side keeps a slot
        assert {round_[slot][1] for round_ in rounds} == set(SIDES)


def test_ratio_summary_pairs_only_reps_both_sides_ran() -> None:
    ours = {0: 30.0, 1: 20.0, 2: 40.0}
    theirs = {0: 10.0, 2: 20.0}  # rep 1 of the reference failed
    got = ratio_summary(ours, theirs)
    assert got["ratio_of_medians"] == pytest.approx(30.0 / 15.0)
    assert got["paired"] == pytest.approx([3.0, 2.0])
    assert (got["paired_min"], got["paired_max"]) == pytest.approx((2.0, 3.0))
    empty = ratio_summary(ours, {})
    assert empty["ratio_of_medians"] is None and empty["paired"] == []


def _run(
    rep: int, rate: float | None, *, side: str = REFERENCE, wall: float | None = None
) -> dict[str, Any]:
    """A hand-made run of 10 rows: ``10 / rate`` s in process, ``wall`` s whole (default: 1 s
    of start-up on top)."""
    if rate is None:
        return {"side": side, "rep": rep, "ok": False, "error": "exit 1: boom", WALL: 0.5}
    table = {
        "bytes": 100,
        "rows": 10,
        "partitions": 2,
        "partitions_digest": "abc",
        "files": 2,
        "columns": ["session_id", "ts"],
        "max_row_group_rows": 8,
        "files_not_clustered": 0,
    }
    seconds = 10 / rate
    timing = {"rows_per_s": rate, "seconds": seconds, "peak_rss_bytes": 1 << 20}
    timing[WALL] = seconds + 1.0 if wall is None else wall
    return {"side": side, "rep": rep, "ok": True, "rows": 10, **timing, "table": table}


def test_side_summary_counts_failures_and_keeps_them() -> None:
    got = side_summary([_run(0, 5.0), _run(1, None), _run(2, 1.0), _run(3, 3.0)])
    assert got["repetitions"] == 4 and got["failed_repetitions"] == 1
    assert got["errors"] == ["exit 1: boom"]
    assert got["rows_per_s"]["values"] == [5.0, 1.0, 3.0]
    assert (got["rows_per_s"]["median"], got["rows_per_s"]["min"]) == (3.0, 1.0)
    assert got["rows_per_s"]["max"] == 5.0 and got["sessions_clustered"] is True
    # whole walls and start-up (whole wall - in-process seconds) of the successful runs only
    assert got[WALL]["values"] == pytest.approx([3.0, 11.0, 13 / 3])
    assert got["startup_seconds"]["values"] == pytest.approx([1.0, 1.0, 1.0])
    failed = side_summary([_run(0, None)])
    assert failed["rows_per_s"]["median"] is None and failed["sessions_clustered"] is None
    assert failed[WALL]["median"] is None and failed["startup_seconds"]["median"] is None


# Hand-made runs of every side: (rows/s, whole wall) by rep. recd is faster per row than the
# reference (2x in every round) but starts slowly, so its whole wall is longer.
HAND_RUNS = {
    RECD: [(20.0, 6.0), (10.0, 8.0), (20.0, 5.0)],  # in process 0.5, 1.0, 0.5 s
    RECD_DEDUP: [(10.0, 7.0), (10.0, 9.0), (10.0, 6.0)],
    REFERENCE: [(10.0, 3.0), (5.0, 4.0), (10.0, 2.5)],
    REFERENCE_GLOBAL: [(5.0, 4.0), None, (5.0, 3.0)],  # rep 1 failed
}


def _hand_runs() -> list[dict[str, Any]]:
    return [
        _run(rep, None if run is None else run[0], side=side, wall=None if run is None else run[1])
        for side, runs in HAND_RUNS.items()
        for rep, run in enumerate(runs)
    ]


def test_speed_ratios_put_the_whole_wall_beside_each_per_row_ratio() -> None:
    ratios = speed_ratios(_hand_runs())
    # per row: recd's rows/s / the reference's, as before
    assert ratios["etl_speed_vs_reference"]["ratio_of_medians"] == pytest.approx(2.0)
    assert ratios["etl_speed_vs_reference"]["paired"] == pytest.approx([2.0, 2.0, 2.0])
    # whole wall: the reference's wall / recd's (> 1 would mean recd is faster): 3 s / 6 s
    wall = ratios["etl_speed_vs_reference_whole_wall"]
    assert wall["ratio_of_medians"] == pytest.approx(3.0 / 6.0)
    assert wall["paired"] == pytest.approx([3.0 / 6.0, 4.0 / 8.0, 2.5 / 5.0])
    assert (wall["paired_min"], wall["paired_max"]) == pytest.approx((0.5, 0.5))
    # the same runs as the per-row ratio: the global sort's failed rep 1 is left out of both
    glob = ratios["etl_speed_vs_reference_global_sort_whole_wall"]
    assert glob["ratio_of_medians"] == pytest.approx(3.5 / 6.0)
    assert glob["paired"] == pytest.approx([4.0 / 6.0, 3.0 / 5.0])
    assert ratios["etl_speed_vs_reference_global_sort"]["paired"] == pytest.approx([4.0, 4.0])
    # dedup layout vs plain: plain's wall / the dedup layout's
    dedup = ratios["dedup_layout_etl_speed_vs_plain_whole_wall"]
    assert dedup["ratio_of_medians"] == pytest.approx(6.0 / 7.0)
    assert list(ratios) == [
        "etl_speed_vs_reference",
        "etl_speed_vs_reference_whole_wall",
        "etl_speed_vs_reference_global_sort",
        "etl_speed_vs_reference_global_sort_whole_wall",
        "dedup_layout_etl_speed_vs_plain",
        "dedup_layout_etl_speed_vs_plain_whole_wall",
    ]


def test_whole_wall_in_profile_json_top_level_and_table() -> None:
    """The whole-wall figures reach the profile's JSON, the top level beside the headline
    ``etl_speed_vs_reference`` and the Markdown table, on hand-made runs."""
    runs = _hand_runs()
    speed = {
        "order": [[r["rep"], r["side"]] for r in runs],
        "order_seed": "1/rm1-like",
        "load_avg_before": [0.0, 0.0, 0.0],
        "load_avg_after": [0.0, 0.0, 0.0],
        **summarise_speed(runs),
        "runs": runs,
    }
    shard = SimpleNamespace(compressed_bytes=50, compression_ratio=2.0)
    args = argparse.Namespace(row_group_rows=8, repetitions=3, threads=2, command="python x")
    block = profile_block(
        profile="rm1-like",
        gen=SimpleNamespace(rows=10, sessions=2, raw_bytes=1000),
        shards=SimpleNamespace(session=shard, random=shard, ratio=1.0),
        num_shards=4,
        baseline_bytes=200,
        baseline_rows=10,
        bytes_clustered=100,
        speed=speed,
        encodings={},
        columns={"plain": {}, "dedup_layout": {SESSION_ID: 10, "footers": 5}, "baseline": {}},
        args=args,
    )
    assert block["etl_speed_vs_reference"] == pytest.approx(2.0)  # the old keys stay
    assert block["etl_speed_vs_reference_range"] == pytest.approx([2.0, 2.0])
    assert block["etl_speed_vs_reference_whole_wall"] == pytest.approx(0.5)
    assert block["etl_speed_vs_reference_whole_wall_range"] == pytest.approx([0.5, 0.5])
    assert block["etl_speed_vs_reference_global_sort_whole_wall"] == pytest.approx(3.5 / 6.0)
    assert block["whole_wall_seconds"] == pytest.approx(
        {RECD: 6.0, RECD_DEDUP: 7.0, REFERENCE: 3.0, REFERENCE_GLOBAL: 3.5}
    )
    # start-up: whole wall - in-process seconds (10 rows / rows/s), medians
    assert block["startup_seconds"] == pytest.approx(
        {RECD: 5.5, RECD_DEDUP: 6.0, REFERENCE: 2.0, REFERENCE_GLOBAL: 1.5}
    )
    assert "whole_wall" in block["etl_speed"]["protocol"]
    protocol = {
        "profiles": ["rm1-like"],
        "repetitions": 3,
        "threads": 2,
        "row_group_rows": 8,
        "order_seed": 1,
        "load_avg_before": [0.0, 0.0, 0.0],
        "load_avg_after": [0.0, 0.0, 0.0],
        "command": "python x",
    }
    result = top_level({"rm1-like": block}, protocol)
    for key in ("etl_speed_vs_reference", "etl_speed_vs_reference_whole_wall"):
        assert result[key] == block[key], key
        assert result[f"{key}_range"] == block[f"{key}_range"], key
    assert result["whole_wall_seconds"] == block["whole_wall_seconds"]
    assert result["startup_seconds"] == block["startup_seconds"]
    rows = {
        line.split(" | ")[0].removeprefix("| "): line.split(" | ")[1].removesuffix(" |")
        for line in markdown(result).splitlines()
        if line.startswith("| ")
    }
    [ratio_row] = [k for k in rows if k.startswith("**etl_speed_vs_reference_whole_wall**")]
    assert rows[ratio_row] == "**0.50x** (0.50-0.50x)"
    [glob_row] = [k for k in rows if k.startswith("etl_speed_vs_reference_global_sort_whole")]
    assert rows[glob_row] == "0.58x (0.60-0.67x)"
    [wall_row] = [k for k in rows if k.startswith("whole wall, median")]
    assert rows[wall_row] == "6.00 s (5.50 s) / 7.00 s (6.00 s) / 3.00 s (2.00 s) / 3.50 s (1.50 s)"
    assert rows["**etl_speed_vs_reference** (ratio of medians; paired min-max)"] == (
        "**2.00x** (2.00-2.00x)"
    )


def test_sessions_clustered_by_hand() -> None:
    assert sessions_clustered(np.array([7, 7, 3, 3, 3, 9]), np.array([1, 2, 1, 1, 5, 0]))
    assert not sessions_clustered(np.array([7, 3, 7]), np.array([1, 1, 2]))  # 7 split
    assert not sessions_clustered(np.array([7, 7, 3]), np.array([2, 1, 0]))  # ts goes back
    assert sessions_clustered(np.array([], dtype=np.int64), np.array([], dtype=np.int64))


def test_reference_sql_sorts_per_partition_or_globally() -> None:
    local = reference_sql(sort="partition", out_dir=Path("/o"), row_group_rows=64, zstd_level=5)
    assert "ORDER_BY (session_id, ts, request_id)" in local and " ORDER BY " not in local
    world = reference_sql(sort="global", out_dir=Path("/o"), row_group_rows=64, zstd_level=5)
    assert "FROM logs ORDER BY session_id, ts, request_id)" in world and "ORDER_BY" not in world
    for sql in (local, world):
        assert "PARTITION_BY (ds, hour)" in sql and "COMPRESSION_LEVEL 5" in sql
        assert "ROW_GROUP_SIZE 64" in sql and "'/o'" in sql
    with pytest.raises(ValueError, match="sort must be"):
        reference_sql(sort="shard", out_dir=Path("/o"), row_group_rows=64, zstd_level=5)


@pytest.mark.slow
def test_quick_benchmark_writes_consistent_results(tmp_path: Path) -> None:
    out = tmp_path / "results"
    argv = ["--quick", "--rows", "3000", "--shards", "4", "--repetitions", "2"]
    argv += ["--order-seed", "4", "--threads", "2"]
    assert bench_main([*argv, "--out", str(out)]) == 0
    result = json.loads((out / "storage_quick.json").read_text())
    assert list(result["profiles"]) == list(DEFAULT_PROFILES) == result["protocol"]["profiles"]
    protocol = result["protocol"]
    assert protocol["command"] == "python benchmarks/storage.py " + " ".join(
        [*argv, "--out", str(out)]
    )
    assert protocol["repetitions"] == 2 and protocol["threads"] == 2
    assert len(protocol["load_avg_before"]) == len(protocol["load_avg_after"]) == 3
    head = result["profiles"]["rm1-like"]
    assert result["headline_profile"] == "rm1-like"
    for key in (
        "shard_compression_ratio",
        "table_compression_ratio",
        "etl_speed_vs_reference",
        "etl_speed_vs_reference_whole_wall",
        "etl_speed_vs_reference_whole_wall_range",
        "whole_wall_seconds",
        "startup_seconds",
    ):
        assert result[key] == head[key], key
    for profile, block in result["profiles"].items():
        _check_profile(profile, block, protocol)
    table = (out / "storage_quick.md").read_text()
    assert not table.startswith("# ") and table.startswith("Command: `python benchmarks/storage.py")
    assert "| measure | rm1-like | clickstream |" in table
    assert "**etl_speed_vs_reference**" in table
    assert "**etl_speed_vs_reference_whole_wall**" in table
    for block in result["profiles"].values():
        assert f"**{block['etl_speed_vs_reference']:.2f}x**" in table
        assert f"**{block['etl_speed_vs_reference_whole_wall']:.2f}x**" in table
        assert f"{block['whole_wall_seconds'][RECD]:.2f} s" in table
        assert f"{block['etl_rows_per_s']:,.0f} rows/s" in table


def _check_profile(profile: str, block: dict[str, Any], protocol: dict[str, Any]) -> None:
    assert block["profile"] == profile
    assert block["shard_compression_ratio"] > 1 and block["table_compression_ratio"] > 1
    assert block["table_compression_ratio"] == pytest.approx(
        block["table_bytes_baseline"] / block["table_bytes_clustered"]
    )
    speed = block["etl_speed"]
    p = speed["protocol"]
    assert p["rows_read"] == block["rows"] and p["rows_in_table"] == [block["rows"]]
    assert p["order"] == interleaved_order(2, SIDES, seed=f"4/{profile}") == speed["order"]
    assert p["order_seed"] == f"4/{profile}"
    assert p["repetitions"] == 2 and p["threads"] == 2 and p["command"] == protocol["command"]
    assert p["zstd_level"] == 3 and p["row_group_rows"] == 8192
    runs = speed["runs"]
    assert [[r["rep"], r["side"]] for r in runs] == p["order"]
    rates: dict[str, dict[int, float]] = {s: {} for s in SIDES}
    walls: dict[str, dict[int, float]] = {s: {} for s in SIDES}
    for run in runs:
        assert run["ok"], run.get("error")
        assert run["rows"] == block["rows"] == run["table"]["rows"]
        assert 0 < run["seconds"] < run["wall_seconds_with_startup"]
        assert run["rows_per_s"] == pytest.approx(run["rows"] / run["seconds"])
        rates[run["side"]][run["rep"]] = run["rows_per_s"]
        walls[run["side"]][run["rep"]] = run[WALL]
        threads = run["workers"] if run["side"] in RECD_SIDES else run["duckdb_threads"]
        assert threads == 2, run["side"]
    for side in SIDES:
        summary = speed["sides"][side]
        assert summary["failed_repetitions"] == 0 and summary["repetitions"] == 2
        values = summary["rows_per_s"]["values"]
        assert sorted(values) == sorted(rates[side].values())
        assert summary["rows_per_s"]["median"] == pytest.approx(statistics.median(values))
        assert summary["same_rows_in_table_as_recd"], side
        assert summary["same_partitions_digest_as_recd"], side
        # the dedup layout stores sparse features as __new_ids + __start
        assert summary["same_columns_as_recd"] == (side != RECD_DEDUP), side
        assert summary["max_row_group_rows"] <= 8192
    assert speed["sides"][RECD]["sessions_clustered"] is True
    assert speed["sides"][RECD_DEDUP]["sessions_clustered"] is True
    assert block["table_ratio_dedup_layout"] == pytest.approx(
        block["table_bytes_baseline"] / block["table_bytes_dedup_layout"]
    )
    assert block["table_ratio_bound_without_sparse"] > block["table_ratio_dedup_layout"]
    dedup_columns = block["column_bytes"]["dedup_layout"]
    assert dedup_columns["footers"] > 0 and SESSION_ID in dedup_columns
    ours, theirs = rates[RECD_DEDUP], rates[RECD]
    assert block["dedup_layout_etl_speed_vs_plain"] == pytest.approx(
        statistics.median(ours.values()) / statistics.median(theirs.values())
    )
    assert speed["sides"][REFERENCE]["sessions_clustered"] is True  # the same work
    assert speed["sides"][REFERENCE]["decode_seconds"]["median"] > 0
    for key, side in (
        ("etl_speed_vs_reference", REFERENCE),
        ("etl_speed_vs_reference_global_sort", REFERENCE_GLOBAL),
    ):
        ours, theirs = rates[RECD], rates[side]
        expected = statistics.median(ours.values()) / statistics.median(theirs.values())
        assert block[key] == pytest.approx(expected), key
        paired = [ours[rep] / theirs[rep] for rep in (0, 1)]
        assert block[f"{key}_range"] == pytest.approx([min(paired), max(paired)])
        # beside it, the whole walls of the same runs: the reference's / recd's
        ours, theirs = walls[RECD], walls[side]
        expected = statistics.median(theirs.values()) / statistics.median(ours.values())
        assert block[f"{key}_whole_wall"] == pytest.approx(expected), key
        paired = [theirs[rep] / ours[rep] for rep in (0, 1)]
        assert block[f"{key}_whole_wall_range"] == pytest.approx([min(paired), max(paired)])
    for side in SIDES:
        assert block["whole_wall_seconds"][side] == pytest.approx(
            statistics.median(walls[side].values())
        )
        startups = [r[WALL] - r["seconds"] for r in runs if r["side"] == side]
        assert block["startup_seconds"][side] == pytest.approx(statistics.median(startups))
        assert block["startup_seconds"][side] > 0
    assert block["failed_repetitions"] == dict.fromkeys(SIDES, 0)
    assert block["encodings"], "encodings summary of the kept recd table"
