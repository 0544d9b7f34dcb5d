"""benchmarks/reader.py end to end at toy size: real logs, shards, ETL'd tables and readers."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.reader import (
    ALL_CONFIGS,
    HEADLINES,
    PARTS,
    check_same_output,
    main,
    measure,
    prepare_tables,
    timed_measurement,
)
from recd.reader.stats import BatchTiming


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
    # Every config read the whole table, all checks of identical output passed.
    assert r["identical_batches_checked"] >= 1
    p = r["protocol"]
    assert p["rows_read_per_pass"] == p["rows_in_table"] == r["rows"] == r["data"]["rows"]
    assert p["window"] == "the whole table" and p["repetitions"] == 1
    assert p["interleave"] == "pass" and "rounds of one pass of every config" in p["order"]
    assert all(sorted(order) == sorted(ALL_CONFIGS) for order in p["orders"][0])
    assert len(p["load_average_before"]) == 3 and p["command"] == r["command"]
    assert p["malloc"].startswith(("fixed thresholds", "glibc defaults"))
    assert {r["configs"][name]["rows"] for name in ALL_CONFIGS} == {r["rows"]}
    for name in ALL_CONFIGS:
        assert r["samples_per_cpu_s"][name] > 0 and r["samples_per_s"][name] > 0
        lo, hi = r["configs"][name]["samples_per_cpu_s_min_max"]
        assert lo <= r["samples_per_cpu_s"][name] <= hi
        split = r["time_split"][name]
        assert math.isclose(sum(split["share"][p] for p in PARTS), 1.0, rel_tol=1e-9)
        assert all(split["cpu_s_per_1k"][p] >= 0 for p in PARTS)
    # Headline: the same job (batch, preprocessing, table rows) on both sides.
    for key, (num, den) in HEADLINES.items():
        h = r["headlines"][key]
        assert (
            r[key]
            == h["value"]
            == pytest.approx(r["samples_per_cpu_s"][num] / r["samples_per_cpu_s"][den])
        )
        assert h["min"] <= h["max"] and len(h["per_repetition"]) == 1
    assert r["recd_batch_size"] == 3 * 128
    # Each job's groups come from recd analyze's cost model for that job.
    jobs = {"with_preprocessing", "large", "no_preprocessing"}
    assert set(r["analysis"]) == {
        *jobs,
        "factor_only",
        "dedup_with_preprocessing",
        "dedup_no_preprocessing",
    }
    for name in jobs:
        job = r["analysis"][name]
        assert job["cost_model"].startswith("the reader timed on this machine")
        for g in job["groups"]:
            assert g["expected_saving_ms_per_1k"] > 0
    # The paper's rule, kept for comparison, proposes every candidate the cost-aware one saw.
    factor_only = r["analysis"]["factor_only"]
    assert factor_only["cost_model"] == "none" and not factor_only["rejected"]
    considered = r["analysis"]["with_preprocessing"]
    assert len(factor_only["groups"]) == len(considered["groups"]) + len(considered["rejected"])
    assert (
        r["dedup_sparse_features"] == r["analysis"]["with_preprocessing"]["dedup_sparse_features"]
    )
    assert r["wire"]["clustered_kjt"]["batches"] >= 1
    assert all(r["bytes_read_per_sample"][t] > 0 for t in ("clustered", "unclustered"))
    # The dedup layout: its own table of the same rows, read by the same jobs.
    tables = r["table_bytes"]
    assert tables["dedup_layout"] > 0 and tables["dedup_encoded_features"]
    assert r["bytes_read_per_sample"]["dedup_layout"] > 0
    assert set(r["speedup_vs_torchrec"]) == {
        "unclustered_kjt_vs_torchrec_unclustered",
        "clustered_ikjt_vs_torchrec_clustered",
        "clustered_ikjt_vs_torchrec_unclustered",
    }
    md = (out / "reader_quick.md").read_text()
    assert "reader_speedup_no_preprocessing" in md and not md.startswith("# ")
    assert "reader_speedup_dedup_layout" in md and "dedup layout" in md
    assert (out / "reader_quick.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Same request, same work dir: the tables are reused, not regenerated.
    parquet = sorted((work / "table").rglob("*.parquet"))
    before = [p.stat().st_mtime_ns for p in parquet]
    again = prepare_tables(work, rows=3000, seed=1, num_shards=2, row_group_rows=8192)
    assert again == r["data"]
    assert [p.stat().st_mtime_ns for p in parquet] == before


class _CountingReader:
    """A stand-in reader: every pass yields the same 3 batches of 10 rows."""

    def __init__(self) -> None:
        self.passes = 0

    def iter_timed(self) -> Any:
        self.passes += 1
        for _ in range(3):
            yield (
                None,
                BatchTiming(
                    rows=10, fill_s=0.001, convert_s=0.002, process_s=0.003, read_bytes=100
                ),
            )


def test_a_measurement_repeats_whole_passes_and_reports_per_pass() -> None:
    reader = _CountingReader()
    one = timed_measurement(reader, 0.0)  # type: ignore[arg-type]
    assert reader.passes == 1 and one.passes == 1
    assert (one.rows, one.batches, one.read_bytes) == (30, 3, 300)
    many = timed_measurement(reader, 0.02)  # type: ignore[arg-type]
    assert many.passes == reader.passes - 1 > 1
    assert (many.rows, many.batches, many.read_bytes) == (30, 3, 300)  # per pass
    assert many.fill_s == pytest.approx(0.003) and many.process_s == pytest.approx(0.009)


class _BusyReader(_CountingReader):
    """A stand-in reader whose pass burns ``cpu_s`` of CPU and logs its name."""

    def __init__(self, name: str, cpu_s: float, log: list[str]) -> None:
        super().__init__()
        self.name, self.cpu_s, self.log = name, cpu_s, log

    def iter_timed(self) -> Any:
        self.log.append(self.name)
        t0 = time.process_time()
        while time.process_time() - t0 < self.cpu_s:
            pass
        yield from super().iter_timed()


@pytest.mark.parametrize("interleave", ["pass", "measurement"])
def test_repetitions_interleave_pass_by_pass_or_measurement_by_measurement(
    interleave: str,
) -> None:
    log: list[str] = []
    readers = {"fast": _BusyReader("fast", 0.002, log), "slow": _BusyReader("slow", 0.006, log)}
    passes, orders = measure(
        readers,  # type: ignore[arg-type]
        reps=2,
        warmup_batches=1,
        seed=3,
        min_measure_s=0.01,
        interleave=interleave,
    )
    log = log[2:]  # the warm-ups
    ran = [name for rep in orders for order in rep for name in order]
    assert len(orders) == 2
    if interleave == "measurement":  # each reader's passes back to back
        assert all(len(rep) == 1 and sorted(rep[0]) == ["fast", "slow"] for rep in orders)

        def runs(names: list[str]) -> list[str]:
            return [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]

        assert len(ran) == 4 and runs(log) == runs(ran) and len(log) > len(ran)
        assert passes["fast"][0].passes > passes["slow"][0].passes
        return
    assert log == ran  # the recorded rounds are what ran
    for rep, order in enumerate(orders):
        assert all(sorted(r) == ["fast", "slow"] for r in order)  # each reader once a round
        k = len(order)
        assert passes["fast"][rep].passes == passes["slow"][rep].passes == k
        assert k >= 2  # the slow reader alone needs two 6 ms passes
        assert all(passes[name][rep].cpu_s * k >= 0.01 for name in readers)


class _FixedReader:
    """A stand-in reader handing out the given batches."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches

    def iter_timed(self) -> Any:
        timing = BatchTiming(rows=2, fill_s=0.0, convert_s=0.0, process_s=0.0, read_bytes=0)
        for batch in self.batches:
            yield batch, timing


def _batch(ids: list[int]) -> Any:
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from recd.tensors.batch import Batch, SparseFeatures

    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f"], values=torch.tensor(ids), lengths=torch.ones(len(ids), dtype=torch.int32)
    )
    return Batch(
        dense=torch.zeros(len(ids), 1),
        sparse=SparseFeatures(batch_size=len(ids), kjt=kjt),
        labels=torch.zeros(len(ids), 1),
    )


def test_configs_that_hand_out_different_batches_are_refused() -> None:
    """The timed configs must be the same job: one differing id in one batch of one config
    stops the benchmark, as does a different batch count."""
    same = {name: _FixedReader([_batch([1, 2]), _batch([3, 4])]) for name in ALL_CONFIGS}
    assert check_same_output(same, batches=5) == 2  # type: ignore[arg-type]
    for name in ("unclustered_ikjt", "torchrec_clustered", "dedup_ikjt_nopre"):
        readers = dict(same)
        readers[name] = _FixedReader([_batch([1, 2]), _batch([3, 5])])
        with pytest.raises(RuntimeError, match=f"batch 1: {name} differs"):
            check_same_output(readers, batches=5)  # type: ignore[arg-type]
    readers = dict(same)
    readers["clustered_ikjt"] = _FixedReader([_batch([1, 2])])
    with pytest.raises(RuntimeError, match="different batch counts"):
        check_same_output(readers, batches=5)  # type: ignore[arg-type]
