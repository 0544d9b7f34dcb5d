"""benchmarks/trainer.py end to end at toy size (real tables, real child processes), plus its
pure helpers (the batch-size search, the held-out partitions)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.trainer import CONFIGS, choose_holdout, main, search_max_batch


def test_search_doubles_then_bisects_to_the_granularity() -> None:
    probed: list[int] = []

    def peak_of(batch: int) -> int:
        probed.append(batch)
        return 100 + batch

    best, probes = search_max_batch(1024, 100 + 5000, peak_of, granularity=512, max_batch=16384)
    assert best == 4608
    assert probed == [2048, 4096, 8192, 6144, 5120, 4608]
    assert [p["fits"] for p in probes] == [True, True, False, False, False, True]


def test_search_stops_at_the_cap_and_keeps_the_base_when_nothing_larger_fits() -> None:
    best, probes = search_max_batch(1024, 10**9, lambda b: b, granularity=512, max_batch=3072)
    assert best == 3072
    assert [p["batch_size"] for p in probes] == [2048, 3072]
    best, probes = search_max_batch(1024, 1024, lambda b: b, granularity=512, max_batch=8192)
    assert best == 1024
    assert [p["batch_size"] for p in probes] == [2048, 1536]


def test_holdout_takes_the_fewest_latest_partitions() -> None:
    parts = [("2026-11-01/00", 50), ("2026-11-01/01", 30), ("2026-11-01/02", 15), ("x/03", 5)]
    assert choose_holdout(parts, 0.1) == ("2026-11-01/02", 20, 80)
    assert choose_holdout(parts, 0.01) == ("x/03", 5, 95)
    # Never everything: at least one partition stays for training.
    assert choose_holdout(parts, 0.99) == ("2026-11-01/01", 50, 50)
    with pytest.raises(ValueError, match="at least 2 partitions"):
        choose_holdout(parts[:1], 0.1)


@pytest.mark.slow
def test_quick_run_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "results"
    argv = [
        "--quick",
        "--rows", "3000",
        "--shards", "2",
        "--batch-size", "64",
        "--embedding-dim", "8",
        "--max-rows", "1000",
        "--seq-len", "16",
        "--ff-dim", "16",
        "--warmup-steps", "1",
        "--steps", "2",
        "--max-batch-factor", "2",
        "--dist-steps", "1",
        "--train-steps", "4",
        "--work-dir", str(tmp_path / "work"),
        "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    r = json.loads((out / "trainer_quick.json").read_text())
    for key in (
        "speedup_ikjt",
        "speedup_ikjt_groups",
        "max_batch_ratio",
        "ne_clustered",
        "ne_unclustered",
        "samples_per_s",
        "peak_rss_bytes",
        "batch_sizes",
        "threads",
        "command",
    ):
        assert key in r, key
    assert r["command"].startswith("python benchmarks/trainer.py --quick")
    assert r["threads"] == 1
    assert set(r["samples_per_s"]) == set(CONFIGS)
    assert all(v > 0 for v in r["samples_per_s"].values())
    assert all(v > 100 * 2**20 for v in r["peak_rss_bytes"].values())  # torch alone is more
    sizes = r["batch_sizes"]
    assert sizes["kjt"] == sizes["ikjt_lookup"] == sizes["ikjt_groups"] == 64
    assert sizes["ikjt_groups_max_batch"] in (64, 96, 128)
    assert r["max_batch_ratio"] == sizes["ikjt_groups_max_batch"] / 64
    assert r["speedup_ikjt_groups"] == pytest.approx(
        r["samples_per_s"]["ikjt_groups"] / r["samples_per_s"]["kjt"]
    )
    # The search kept the largest probe within the baseline's peak (or the base batch).
    search = r["search"]
    assert search["budget_bytes"] == r["configs"]["kjt"]["peak_bytes"]
    fitting = [p["batch_size"] for p in search["probes"] if p["fits"]]
    assert all(p["fits"] == (p["peak_bytes"] <= search["budget_bytes"]) for p in search["probes"])
    assert search["max_batch_size"] == max([64, *fitting])
    # Same batches, same initial weights: the IKJT paths train like the KJT path.
    for name in ("ikjt_lookup", "ikjt_groups"):
        assert r["configs"][name]["max_abs_loss_diff_vs_kjt"] < 1e-4
    # Rows really are deduplicated on the clustered table.
    assert all(f > 1.0 for f in r["dedup_factor_sequence_groups"].values())
    acc = r["accuracy"]
    assert acc["clustered"]["steps"] == acc["unclustered"]["steps"] == acc["steps"] == 4
    assert acc["clustered"]["eval_rows"] == acc["unclustered"]["eval_rows"] == acc["holdout_rows"]
    for ne in (r["ne_clustered"], r["ne_unclustered"]):
        assert math.isfinite(ne) and ne > 0
    dist = r["distributed"]
    if dist["measured"]:
        for c in dist["configs"].values():
            assert c["measured"], c
            assert c["samples_per_s"] > 0
            assert all(math.isfinite(x) for x in c["losses_rank0"])
    else:
        assert dist["reason"]
    assert (out / "trainer_quick.md").read_text().startswith("Command: `python benchmarks/")
    assert (out / "trainer_quick.png").stat().st_size > 1000
