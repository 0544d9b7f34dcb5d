"""benchmarks/storage.py end to end at toy size (``--quick``): real logs, shards, ``recd etl``
and the DuckDB references in child processes, both profiles. Checks the protocol recorded
next to every figure and that the figures are consistent with the runs they summarise, not
their values (no timing assertions); and the summary arithmetic on hand-made runs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
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
    interleaved_order,
    ratio_summary,
    reference_sql,
    sessions_clustered,
    side_summary,
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


def _run(rep: int, rate: float | None) -> dict[str, Any]:
    if rate is None:
        return {"side": REFERENCE, "rep": rep, "ok": False, "error": "exit 1: boom"}
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
    timing = {"rows_per_s": rate, "seconds": 10 / rate, "peak_rss_bytes": 1 << 20}
    return {"side": REFERENCE, "rep": rep, "ok": True, **timing, "table": table}


def test_side_summary_counts_failures_and_keeps_them() -> None:
    got = side_summary([_run(0, 5.0), _run(1, None), _run(2, 1.0), _run(3, 3.0)])
    assert got["repetitions"] == 4 and got["failed_repetitions"] == 1
    assert got["errors"] == ["exit 1: boom"]
    assert got["rows_per_s"]["values"] == [5.0, 1.0, 3.0]
    assert (got["rows_per_s"]["median"], got["rows_per_s"]["min"]) == (3.0, 1.0)
    assert got["rows_per_s"]["max"] == 5.0 and got["sessions_clustered"] is True
    failed = side_summary([_run(0, None)])
    assert failed["rows_per_s"]["median"] is None and failed["sessions_clustered"] is None


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
    for key in ("shard_compression_ratio", "table_compression_ratio", "etl_speed_vs_reference"):
        assert result[key] == head[key], key
    for profile, block in result["profiles"].items():
        _check_profile(profile, block, protocol)
    table = (out / "storage_quick.md").read_text()
    assert not table.startswith("# ") and table.startswith("Command: `python benchmarks/storage.py")
    assert "| measure | rm1-like | clickstream |" in table
    assert "**etl_speed_vs_reference**" in table
    for block in result["profiles"].values():
        assert f"**{block['etl_speed_vs_reference']:.2f}x**" in table
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
    for run in runs:
        assert run["ok"], run.get("error")
        assert run["rows"] == block["rows"] == run["table"]["rows"]
        assert 0 < run["seconds"] < run["wall_seconds_with_startup"]
        assert run["rows_per_s"] == pytest.approx(run["rows"] / run["seconds"])
        rates[run["side"]][run["rep"]] = run["rows_per_s"]
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
    assert block["failed_repetitions"] == dict.fromkeys(SIDES, 0)
    assert block["encodings"], "encodings summary of the kept recd table"
