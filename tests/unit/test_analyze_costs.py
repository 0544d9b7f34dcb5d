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

from recd.analyze import (
    CostModel,
    GroupShape,
    analyze_table,
    calibrate,
    machine_cost_model,
)
from recd.analyze import costs as costs_module
from recd.analyze.costs import TERMS, machine_fingerprint
from recd.cli import analyze as analyze_cli
from recd.reader import ReaderConfig
from recd.reader.dataset import iter_batches
from recd.schema import Catalogue, SparseFeature

from .test_analyze import CATALOGUE, hand_table

FEATURES = CATALOGUE.sparse_names


def write_two_partitions(root: Path, table: pa.Table, *, row_group_rows: int) -> Path:
    """Sessions 0-1 in hour 00, sessions 2-3 in hour 01 (6 rows each)."""
    for hour, part in (("00", table.slice(0, 6)), ("01", table.slice(6))):
        directory = root / "ds=2026-11-01" / f"hour={hour}"
        directory.mkdir(parents=True)
        pq.write_table(part, directory / "part-0000.parquet", row_group_size=row_group_rows)
        (directory / "_SUCCESS").touch()
    return root


def reader_ids(table: Path, groups: list[list[str]], batch_size: int) -> tuple[int, int]:
    """(ids the reader's IKJTs would hold expanded, ids they hold) over every batch."""
    config = ReaderConfig(table=str(table), batch_size=batch_size, dedup_sparse_features=groups)
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


# ---------------------------------------------------------------------- cost model
def hand_model() -> CostModel:
    """Hand-set coefficients of the order a calibration measured on a 2-core x86 VM: the IKJT
    path pays ~100 us per batch and ~30 ns per row and key; per-id copies cost ~1 ns and
    hashing an id ~6 ns."""

    def fit(**terms: float) -> list[float]:
        return [terms.get(t, 0.0) for t in TERMS]

    none = {
        "plain": fit(ids=1e-9),
        "dedup": fit(batch=100e-6, row_keys=30e-9, ids=1e-9, distinct_ids=1e-9),
    }
    hashed = {
        "plain": fit(keys=5e-6, ids=7e-9),
        "dedup": fit(batch=130e-6, keys=5e-6, row_keys=30e-9, ids=1e-9, distinct_ids=7e-9),
    }
    return CostModel(
        coefficients={
            "none": {"short": none, "long": none},
            "hash_modulo": {"short": hashed, "long": hashed},
        },
        machine=machine_fingerprint(),
    )


def short_table() -> pa.Table:
    """Sessions of 11 rows, only length-1 features: an item id repeated most of the time
    (d = 0.9) and four context features constant per session (d = 1, synchronised)."""
    rng = np.random.default_rng(0)
    rows, sessions = [], 200
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


def write_one(root: Path, table: pa.Table) -> Path:
    directory = root / "ds=2026-11-01" / "hour=00"
    directory.mkdir(parents=True)
    pq.write_table(table, directory / "part-0000.parquet", row_group_size=1024)
    (directory / "_SUCCESS").touch()
    return root


@pytest.mark.parametrize("preprocessed", [False, True])
def test_length_one_features_are_not_proposed(tmp_path: Path, preprocessed: bool) -> None:
    root = write_one(tmp_path / "t", short_table())
    factor_only = analyze_table(root, batch_size=512)
    # The paper's rule proposes them all: the item factor is ~5, the context's ~11.
    assert factor_only.dedup_sparse_features == [["item"], ["ctx0", "ctx1", "ctx2", "ctx3"]]
    a = analyze_table(root, batch_size=512, cost_model=hand_model(), preprocessed=preprocessed)
    assert a.dedup_sparse_features == []
    reasons = {tuple(r.features): r.reason for r in a.rejected}
    assert "at most one id per row" in reasons[("item",)]
    assert "expected to cost the reader" in reasons[("ctx0", "ctx1", "ctx2", "ctx3")]


def test_single_length_one_feature_is_refused_even_if_the_model_says_it_pays(
    tmp_path: Path,
) -> None:
    root = write_one(tmp_path / "t", short_table())
    free = hand_model()
    for pre in free.coefficients.values():
        for regime in pre.values():
            regime["dedup"] = [0.0] * len(TERMS)  # a model where dedup costs nothing
    a = analyze_table(root, batch_size=512, cost_model=free)
    assert a.dedup_sparse_features == [["ctx0", "ctx1", "ctx2", "ctx3"]]
    assert [r.features for r in a.rejected] == [["item"]]


def test_long_repeated_rows_pay_only_with_per_id_work() -> None:
    # 2048 rows of a 50-id history repeated 8x (~256 distinct rows per batch).
    shape = GroupShape(
        batches=1, rows=2048, keys=1, ids=50 * 2048, distinct_rows=256, distinct_ids=50 * 256
    )
    model = hand_model()
    assert model.cost(shape, preprocessed=True).pays
    assert not model.cost(shape, preprocessed=False).pays  # a copy per id is cheap


def test_proposal_reports_expected_savings(tmp_path: Path) -> None:
    root = write_one(tmp_path / "t", hand_table())
    a = analyze_table(root, batch_size=3, threshold=1.4, cost_model=hand_model())
    for g in a.groups:
        assert g.expected_saving_ms_per_1k is not None and g.expected_saving_ms_per_1k > 0
    assert "cost model: reader CPU time on this machine" in analyze_cli_text(root, tmp_path)


def analyze_cli_text(root: Path, tmp_path: Path) -> str:
    cache = tmp_path / "costs.json"
    cache.write_text(json.dumps(hand_model().to_dict()))
    parser = argparse.ArgumentParser(prog="recd")
    analyze_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["analyze", str(root), "--batch-size", "3", "--json", str(tmp_path / "a.json")]
    )
    import contextlib
    import io

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv(costs_module.CACHE_ENV, str(cache))
        assert args.func(args) == 0
    data = json.loads((tmp_path / "a.json").read_text())
    assert "rejected" in data and data["cost_model"].startswith("reader CPU time")
    return out.getvalue()


def test_calibration_fits_every_path_and_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = calibrate(quick=True)
    for pre in ("none", "hash_modulo"):
        for regime in ("short", "long"):
            for path in ("plain", "dedup"):
                coef = model.coefficients[pre][regime][path]
                assert len(coef) == len(TERMS) and all(math.isfinite(c) for c in coef)
    cache = tmp_path / "cache" / "costs.json"
    monkeypatch.setattr(costs_module, "calibrate", lambda **_: model)
    first = machine_cost_model(cache=cache, quiet=True)
    assert cache.exists() and first == model

    def must_not_run(**_: object) -> CostModel:
        raise AssertionError("a cached model of this machine must be reused")

    monkeypatch.setattr(costs_module, "calibrate", must_not_run)
    assert machine_cost_model(cache=cache, quiet=True) == model
    # Another machine's (or version's) cache is recalibrated.
    stale = model.to_dict()
    stale["machine"] = {**stale["machine"], "cpu": "another cpu"}
    cache.write_text(json.dumps(stale))
    monkeypatch.setattr(costs_module, "calibrate", lambda **_: model)
    assert machine_cost_model(cache=cache, quiet=True).machine == machine_fingerprint()
