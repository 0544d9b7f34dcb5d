"""benchmarks/reader.py end to end at toy size: real logs, shards, ETL'd tables and readers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.reader import (
    LARGE_CONFIGS,
    PARTS,
    READER_CONFIGS,
    REFERENCE_CONFIGS,
    main,
    prepare_tables,
)

ALL_CONFIGS = (*READER_CONFIGS, *LARGE_CONFIGS, *REFERENCE_CONFIGS)


@pytest.mark.slow
def test_quick_run_writes_sane_results_and_reuses_its_tables(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "results"
    argv = ["--quick", "--rows", "3000", "--shards", "2", "--batch-size", "128"]
    argv += ["--reps", "1", "--warmup-batches", "1", "--wire-batches", "3"]
    argv += ["--work-dir", str(work), "--out", str(out)]
    assert main(argv) == 0

    r = json.loads((out / "reader_quick.json").read_text())
    assert r["command"].startswith("python benchmarks/reader.py --quick")
    assert r["quick"] is True and r["batch_size"] == 128 and r["profile"] == "rm1-like"
    # Every config read the same rows, all checks of identical output passed.
    assert r["identical_batches_checked"] >= 1
    assert 0 < r["rows"] <= r["data"]["rows"]
    assert {r["configs"][name]["rows"] for name in ALL_CONFIGS} == {r["rows"]}
    for name in ALL_CONFIGS:
        assert r["samples_per_cpu_s"][name] > 0 and r["samples_per_s"][name] > 0
        split = r["time_split"][name]
        assert math.isclose(sum(split["share"][p] for p in PARTS), 1.0, rel_tol=1e-9)
        assert all(split["cpu_s_per_1k"][p] >= 0 for p in PARTS)
    for key in ("reader_speedup", "reader_speedup_wall", "wire_bytes_ratio"):
        assert math.isfinite(r[key]) and r[key] > 0
    # The headline compares RecD's own job (3x the batch, as the paper's RM1) with the
    # baseline job; the same-batch ratios are reported next to it.
    assert r["recd_batch_size"] == 3 * 128
    assert set(r["reader_speedup_same_batch"]) == {"128", "384"}
    assert r["reader_speedup"] == pytest.approx(
        r["samples_per_cpu_s"]["clustered_ikjt_large"] / r["samples_per_cpu_s"]["unclustered_kjt"]
    )
    assert r["wire_bytes_ratio_large"] > 1.0
    # --window full (default): leading partitions with a full row group each, never none.
    window = r["window"]
    assert window["min_partition_rows"] == 8192 and window["partitions"] >= 1
    assert window["files_clustered"] == window["files_unclustered"] >= 1
    # The clustered table's sessions dedup: an IKJT batch is smaller on the wire.
    assert r["wire_bytes_ratio"] > 1.0 and r["wire_bytes_ratio_tensor"] > 1.0
    assert r["wire"]["clustered_kjt"]["batches"] >= 1
    assert all(r["bytes_read_per_sample"][t] > 0 for t in ("clustered", "unclustered"))
    groups = r["dedup_sparse_features"]
    assert groups and all(isinstance(f, str) for g in groups for f in g)
    assert set(r["speedup_vs_torchrec"]) == {
        "unclustered_kjt_vs_torchrec_unclustered",
        "clustered_ikjt_vs_torchrec_clustered",
        "clustered_ikjt_vs_torchrec_unclustered",
    }
    assert "reader_speedup" in (out / "reader_quick.md").read_text()
    assert (out / "reader_quick.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Same request, same work dir: the tables are reused, not regenerated.
    parquet = sorted((work / "table").rglob("*.parquet"))
    before = [p.stat().st_mtime_ns for p in parquet]
    again = prepare_tables(work, rows=3000, seed=1, num_shards=2, row_group_rows=8192)
    assert again == r["data"]
    assert [p.stat().st_mtime_ns for p in parquet] == before
