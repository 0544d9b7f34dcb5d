"""``recd analyze``: factors at the reader's own batch boundaries, and the cost-aware proposal."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import recd.analyze.costs as costs
from recd.analyze import (
    PAY_MARGIN,
    ConfigTimer,
    JobTimer,
    analyze_table,
    choose_groups,
    hash_all_preprocessing,
    sample_batches,
)
from recd.cli import analyze as analyze_cli
from recd.errors import ConfigError
from recd.reader import ReaderConfig
from recd.reader.dataset import iter_batches
from recd.schema import Catalogue, SparseFeature
from recd.table.layout import dedup_schema, encode_row_group
from recd.tensors.convert import FeatureSpec

from .test_analyze import CATALOGUE, hand_table, write

FEATURES = CATALOGUE.sparse_names


def write_two_partitions(root: Path, table: pa.Table, *, row_group_rows: int) -> Path:
    """Sessions 0-1 in hour 00, sessions 2-3 in hour 01 (6 rows each)."""
    write(root, table.slice(0, 6), hour="00", row_group_rows=row_group_rows)
    return write(root, table.slice(6), hour="01", row_group_rows=row_group_rows)


def reader_ids(table: Path, groups: list[list[str]], batch_size: int) -> tuple[int, int]:
    """(ids the reader's IKJTs would hold expanded, ids they hold) over every batch."""
    config = ReaderConfig(
        table=str(table), batch_size=batch_size, dedup_sparse_features=groups, streams=1
    )
    expanded = stored = 0
    for batch in iter_batches(config):
        for ikjt in batch.sparse.ikjts:
            stored += int(ikjt.values().numel())
            expanded += int(ikjt.to_kjt().values().numel())
    return expanded, stored


@pytest.mark.parametrize("batch_size", [4, 5])
def test_measured_factor_is_the_readers_own(tmp_path: Path, batch_size: int) -> None:
    # 12 rows in two partitions of 6 and row groups of 4: batches of 4 or 5 span row groups
    # and the partition boundary, and the last batch is partial (12 = 2 * 5 + 2).
    root = write_two_partitions(tmp_path / "t", hand_table(), row_group_rows=4)
    a = analyze_table(root, batch_size=batch_size, threshold=1.0)
    assert a.batches == math.ceil(12 / batch_size)
    for f in a.features:
        expanded, stored = reader_ids(root, [[f.name]], batch_size)
        assert (f.values, f.values_after_dedup) == (expanded, stored), f.name
        assert f.measured_factor == expanded / stored
    cart = next(g for g in a.groups if len(g.features) == 3)
    expanded, stored = reader_ids(root, [cart.features], batch_size)
    assert cart.measured_factor == expanded / stored


def test_factor_no_longer_restarts_at_partitions(tmp_path: Path) -> None:
    # Batch 2 of B = 4 holds rows 4..7: two of session 1 (hour 00) and two of session 2
    # (hour 01); "static2" is [1] then [2]: 2 distinct ids there. Restarting at the partition
    # would cut batches 0-3, 4-5, 6-9, 10-11 instead; the totals differ.
    root = write_two_partitions(tmp_path / "t", hand_table(), row_group_rows=6)
    f = {r.name: r for r in analyze_table(root, batch_size=4).features}
    # batches: rows 0-3 (sessions 0, 1), 4-7 (1, 2), 8-11 (2, 3): 2 distinct each
    assert f["static2"].values == 12 and f["static2"].values_after_dedup == 6


# ---------------------------------------------------------------------- cost-aware proposal
def short_table() -> pa.Table:
    """Sessions of 11 rows, only length-1 features: an item id repeated most of the time
    (d = 0.9) and four context features constant per session (d = 1, synchronised)."""
    rng = np.random.default_rng(0)
    rows, sessions = [], 400
    for s in range(sessions):
        item = int(rng.integers(1 << 30))
        for i in range(11):
            if i and rng.random() > 0.9:
                item = int(rng.integers(1 << 30))
            row = {"session_id": s + 1, "request_id": s * 11 + i, "ts": s * 1000 + i}
            row["label"] = 0.0
            row["item"] = [item]
            for k in range(4):
                row[f"ctx{k}"] = [s * 10 + k]
            rows.append(row)
    return pa.Table.from_pylist(rows, schema=SHORT.arrow_schema())


SHORT = Catalogue(
    name="short",
    sparse=[SparseFeature(name="item"), *(SparseFeature(name=f"ctx{k}") for k in range(4))],
)
CONTEXT = ["ctx0", "ctx1", "ctx2", "ctx3"]


def write_one(root: Path, table: pa.Table) -> Path:
    return write(root, table, row_group_rows=1024)


def additive_timer(
    plain_s: float, savings: dict[str, float], *, together: float = 0.0
) -> ConfigTimer:
    """Seconds per sample of a job: ``plain_s`` minus the saving of each deduplicated group
    (keyed by its first feature), minus ``together`` when every listed group is in."""

    def timer(groups: list[list[str]]) -> float:
        firsts = {g[0] for g in groups}
        bonus = together if firsts >= set(savings) else 0.0
        return plain_s - sum(savings[f] for f in firsts) - bonus

    return timer


def test_length_one_features_are_not_proposed(tmp_path: Path) -> None:
    root = write_one(tmp_path / "t", short_table())
    factor_only = analyze_table(root, batch_size=512)
    # The paper's rule proposes them all: the item factor is ~5, the context's ~11.
    assert factor_only.dedup_sparse_features == [["item"], CONTEXT]
    # Timed on this machine, with per-id hashing (the most dedup can save per id): no group
    # of length-1 features pays (a hash probe per row against one id saved per key).
    prep = hash_all_preprocessing(SHORT.sparse_names)
    a = analyze_table(root, batch_size=512, cost_aware=True, preprocessing=prep)
    assert a.dedup_sparse_features == []
    reasons = {tuple(r.features): r.reason for r in a.rejected}
    assert "at most one id per row" in reasons[("item",)]
    assert "(measured" in reasons[tuple(CONTEXT)]
    assert a.cost_model.startswith("the reader timed on this machine")
    assert set(a.reader_ms_per_1k) == {"plain", "proposed"}
    assert a.reader_ms_per_1k["proposed"] == a.reader_ms_per_1k["plain"]


def test_single_length_one_feature_is_refused_even_when_timing_says_it_pays(
    tmp_path: Path,
) -> None:
    root = write_one(tmp_path / "t", short_table())
    timer = additive_timer(10e-6, {"item": 5e-6, "ctx0": 5e-6})
    a = analyze_table(root, batch_size=512, timer=timer)
    assert a.dedup_sparse_features == [CONTEXT]
    assert [r.features for r in a.rejected] == [["item"]]
    (group,) = a.groups
    assert group.expected_saving_ms_per_1k == pytest.approx(5.0)
    assert a.reader_ms_per_1k == pytest.approx({"plain": 10.0, "proposed": 5.0})


def test_a_one_id_feature_stored_in_the_dedup_layout_is_decided_by_its_timing(
    tmp_path: Path,
) -> None:
    # Read from the dedup layout its IKJT needs no hashing: the one-id rule does not apply.
    rows = short_table()
    schema = dedup_schema(rows.schema, SHORT.sparse_names)
    directory = tmp_path / "t" / "ds=2026-11-01" / "hour=00"
    directory.mkdir(parents=True)
    with pq.ParquetWriter(directory / "part-0000.parquet", schema) as writer:
        writer.write_table(encode_row_group(rows, SHORT.sparse_names, schema=schema))
    (directory / "_SUCCESS").touch()
    timer = additive_timer(10e-6, {"item": 5e-6, "ctx0": 1e-6})
    a = analyze_table(tmp_path / "t", batch_size=512, timer=timer)
    assert a.dedup_sparse_features == [["item"], CONTEXT] and a.rejected == []


def test_backward_elimination_keeps_groups_that_pay_together() -> None:
    # Alone, b and c save nothing worth an IKJT; together with a they save 3.
    timer = additive_timer(10.0, {"a": 2.0, "b": 0.05, "c": 0.05}, together=3.0)
    choice = choose_groups([["a"], ["b"], ["c"]], timer)
    assert choice.groups == [["a"], ["b"], ["c"]] and choice.rounds == 1
    assert choice.saving_s[("b",)] == pytest.approx(3.05)
    # Without the joint saving, b and c go in round 1; a alone is kept in round 2.
    choice = choose_groups([["a"], ["b"], ["c"]], additive_timer(10.0, {"a": 2, "b": 0.1, "c": 0}))
    assert choice.groups == [["a"]] and choice.rounds == 2 and choice.chosen_s == 8.0


@pytest.mark.parametrize(("saving", "proposed"), [(0.21, True), (0.19, False)])
def test_a_group_must_save_more_than_the_margin(saving: float, proposed: bool) -> None:
    # plain job 10: the margin (2%) is 0.2
    choice = choose_groups([["a"]], additive_timer(10.0, {"a": saving}))
    assert (choice.groups == [["a"]]) is proposed
    assert PAY_MARGIN == 0.02


def test_nothing_is_proposed_when_the_groups_lose_together() -> None:
    choice = choose_groups([["a"], ["b"]], additive_timer(10.0, {"a": -1.0, "b": -1.0}))
    assert choice.groups == [] and choice.chosen_s == choice.plain_s == 10.0


def test_job_timer_times_the_readers_own_batches(tmp_path: Path) -> None:
    root = write_one(tmp_path / "t", short_table())  # 4400 rows
    batches = sample_batches(root, SHORT.sparse_names, batch_size=512, start=None, end=None)
    assert [b.num_rows for b in batches] == [512] * 8  # every full batch (8 < 12)
    few = sample_batches(root, SHORT.sparse_names, batch_size=2048, start=None, end=None, count=3)
    assert [b.num_rows for b in few] == [2048, 2048]
    timer = JobTimer(batches, SHORT.sparse_names, preprocessing=[], reps=2)
    plain, grouped = timer([]), timer([CONTEXT])
    assert plain > 0 and grouped > 0
    assert timer([]) == plain  # cached: the same configuration is timed once


def test_paired_differences_alternate_and_outlast_a_slow_stretch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_one(tmp_path / "t", short_table())
    read: list[int] = []

    def load() -> list[pa.Table]:
        read.append(1)
        return sample_batches(root, SHORT.sparse_names, batch_size=512, start=None, end=None)

    order: list[str] = []

    def fake_run(batches: list[pa.Table], spec: FeatureSpec, module: object) -> float:
        grouped = bool(spec.dedup_sparse_features)
        order.append("g" if grouped else "p")
        slow = 5.0 if len(order) in (5, 6, 7) else 0.0  # the machine stalls for three passes
        return (2.0 if grouped else 3.0) + slow

    monkeypatch.setattr(costs, "_run", fake_run)
    timer = JobTimer(load, SHORT.sparse_names, preprocessing=[], reps=5)
    assert read == []  # nothing is read before a configuration is timed
    saving = timer.difference([], [CONTEXT])
    assert read == [1]
    assert order == ["p", "g", *"pggppggppg"]  # warm-ups, then alternating pairs
    assert saving * 4096 == 1.0  # 8 batches of 512 rows; the stall moved no median
    # A subtraction of separately timed medians is what a stall can move.
    order.clear()
    assert timer([]) * 4096 == 3.0 and len(order) == 5


def test_choose_groups_takes_a_job_timers_paired_differences() -> None:
    class Paired(JobTimer):
        def __init__(self) -> None:
            pass

        def __call__(self, groups: list[list[str]]) -> float:
            return 10.0 if not groups else 12.0  # subtracting medians: dedup costs 2

        def difference(self, a: list[list[str]], b: list[list[str]]) -> float:
            return 1.0 if len(a) < len(b) else -1.0  # paired: each group saves 1

    choice = choose_groups([["a"], ["b"]], Paired())
    assert choice.groups == [["a"], ["b"]]
    assert choice.saving_s == {("a",): 1.0, ("b",): 1.0}


def test_cli_reader_only_times_the_reader_of_a_training_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --reader-config is the deprecated spelling of --config; with --reader-only the job's
    # reader is timed alone: its own preprocessing plus the trainer's hash_modulo of features
    # larger than model.max_rows, and the one-id rule refuses the item.
    root = write_one(tmp_path / "t", short_table())
    config = tmp_path / "job.toml"
    config.write_text(
        '[reader]\ntable = "x"\npreprocessing = [{kind = "hash_modulo", '
        'features = ["item", "ctx0"], modulo = 1000}]\n'
    )
    parser = argparse.ArgumentParser(prog="recd")
    analyze_cli.register(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "a.json"
    argv = ["analyze", str(root), "--batch-size", "512", "--reader-config", str(config)]
    args = parser.parse_args([*argv, "--reader-only", "--json", str(out)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert f"priced by: reader only (the reader of the job {config} (model rm1" in text
    assert "cost model: the reader timed on this machine" in text and "hash_modulo" in text
    assert "not proposed: ['item']" in text
    data = json.loads(out.read_text())
    assert data["pricing"] == "reader" and data["trainer_ms_per_1k"] == {}
    assert {tuple(r["features"]) for r in data["rejected"]} >= {("item",)}
    # Priced for the job (the default), a table without dense features cannot be trained.
    args = parser.parse_args(argv)
    with pytest.raises(ConfigError, match=r"cannot train on .*dense_in_features.*--reader-only"):
        args.func(args)
    config.write_text('[reader]\ntable = "x"\npreprocessing = 3\n')
    args = parser.parse_args([*argv, "--reader-only"])
    with pytest.raises(ConfigError, match=r"preprocessing = 3"):
        args.func(args)
