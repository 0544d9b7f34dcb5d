"""Reader dataset and resumable loader: conversion, preprocessing, exact resume, worker errors."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from recd.errors import BadRowError, ConfigError
from recd.reader import ReaderConfig, ReaderStats, iter_batches, make_loader
from recd.reader.order import canonical_counts, next_stream
from recd.reader.plan import build_plan
from recd.reader.stream import iter_stream_batches
from recd.reader.transform import BatchTransform
from recd.tensors.batch import Batch

from .reader_tables import make_rows, write_table

GROUPS = [["hist"], ["cart_a", "cart_b"]]
LAYOUT = {"2026-11-01/00": [10, 7], "2026-11-01/01": [9], "2026-11-01/02": [5]}  # 31 rows


@pytest.fixture
def table(tmp_path: Path) -> Path:
    root = tmp_path / "table"
    write_table(root, LAYOUT)
    return root


def assert_same_batch(a: Batch, b: Batch) -> None:
    """torch.equal on every tensor of the two batches."""
    assert torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels)
    assert (a.sparse.kjt is None) == (b.sparse.kjt is None)
    if a.sparse.kjt is not None and b.sparse.kjt is not None:
        assert a.sparse.kjt.keys() == b.sparse.kjt.keys()
        assert torch.equal(a.sparse.kjt.values(), b.sparse.kjt.values())
        assert torch.equal(a.sparse.kjt.lengths(), b.sparse.kjt.lengths())
    assert len(a.sparse.ikjts) == len(b.sparse.ikjts)
    for x, y in zip(a.sparse.ikjts, b.sparse.ikjts, strict=True):
        assert x.keys() == y.keys()
        assert torch.equal(x.values(), y.values())
        assert torch.equal(x.lengths(), y.lengths())
        assert torch.equal(x.inverse_lookup(), y.inverse_lookup())


def row_ids(batch: Batch) -> list[int]:
    return batch.sparse.to_kjt()["item_id"].values().tolist()


def test_batches_hold_rows_and_dedup_groups(table: Path) -> None:
    cfg = ReaderConfig(table=str(table), batch_size=6, dedup_sparse_features=GROUPS, streams=1)
    stats = ReaderStats()
    batches = list(iter_batches(cfg, stats=stats))
    assert [b.batch_size for b in batches] == [6, 6, 6, 6, 6, 1]
    assert [r for b in batches for r in row_ids(b)] == list(range(31))
    first = batches[0]
    first.validate()
    assert first.dense[:, 0].tolist() == [0, 1, 2, 3, 4, 5]  # price = row id
    assert first.dense.shape == (6, 2) and first.labels.shape == (6, 1)
    assert first.sparse.kjt is not None and first.sparse.kjt.keys() == ["item_id"]
    hist, cart = first.sparse.ikjts
    assert hist.inverse_lookup().tolist() == [0, 0, 0, 1, 1, 1]  # 3 rows per session
    assert cart.keys() == ["cart_a", "cart_b"] and cart.num_distinct() == 2
    assert stats.batches == 6 and stats.rows == 31 and stats.read_bytes > 0
    assert stats.fill_s > 0 and stats.convert_s > 0
    # Differential: the dedup path expands to exactly the plain path's KJT.
    plain = list(iter_batches(ReaderConfig(table=str(table), batch_size=6, streams=1)))
    keys = ["hist", "cart_a", "cart_b", "item_id"]
    for d, p in zip(batches, plain, strict=True):
        kd, kp = d.sparse.to_kjt(keys), p.sparse.to_kjt(keys)
        assert torch.equal(kd.values(), kp.values()) and torch.equal(kd.lengths(), kp.lengths())


def test_preprocessing_runs_on_listed_features_only(table: Path) -> None:
    prep: list[dict[str, Any]] = [
        {"kind": "hash_modulo", "features": ["hist", "item_id"], "modulo": 4},
        {"kind": "truncate_last", "features": ["cart_a"], "n": 0},
        {"kind": "log1p", "features": ["age"]},
        {"kind": "clamp", "features": ["price"], "max": 5.0},
    ]
    base = ReaderConfig(table=str(table), batch_size=8, dedup_sparse_features=GROUPS)
    raw = list(iter_batches(base))
    cfg = ReaderConfig(
        table=str(table), batch_size=8, dedup_sparse_features=GROUPS, preprocessing=prep
    )
    done = list(iter_batches(cfg))
    keys = ["hist", "cart_a", "cart_b", "item_id"]
    for r, d in zip(raw, done, strict=True):
        kr, kd = r.sparse.to_kjt(keys), d.sparse.to_kjt(keys)
        assert torch.equal(kd["hist"].values(), kr["hist"].values() % 4)
        assert torch.equal(kd["item_id"].values(), kr["item_id"].values() % 4)
        assert kd["cart_a"].values().numel() == 0
        assert torch.equal(kd["cart_b"].values(), kr["cart_b"].values())
        assert torch.equal(d.dense[:, 1], torch.log1p(r.dense[:, 1]))
        assert torch.equal(d.dense[:, 0], r.dense[:, 0].clamp(max=5.0))
        # Deduplicated: the IKJTs keep their distinct rows and inverse lookups.
        assert torch.equal(d.sparse.ikjts[0].inverse_lookup(), r.sparse.ikjts[0].inverse_lookup())


def test_dense_preprocessing_of_every_column_in_any_order(table: Path) -> None:
    """All dense columns in table order run the module on the whole tensor; another order
    gathers the columns: same result."""
    raw = list(iter_batches(ReaderConfig(table=str(table), batch_size=8)))
    for features in (["price", "age"], ["age", "price"]):
        prep: list[dict[str, Any]] = [{"kind": "log1p", "features": features}]
        cfg = ReaderConfig(table=str(table), batch_size=8, preprocessing=prep)
        for r, d in zip(raw, iter_batches(cfg), strict=True):
            assert torch.equal(d.dense, torch.log1p(r.dense.clamp_min(0)))


def test_transform_pickles_its_compiled_modules(table: Path) -> None:
    """Spawned workers get the TorchScript modules as archives; results are identical."""
    prep: list[dict[str, Any]] = [
        {"kind": "hash_modulo", "features": ["hist"], "modulo": 3},
        {"kind": "normalize", "features": ["price", "age"], "mean": [1.0, 2.0], "std": 2.0},
    ]
    cfg = ReaderConfig(
        table=str(table), batch_size=8, dedup_sparse_features=GROUPS, preprocessing=prep
    )
    plan = build_plan(cfg)
    transform = BatchTransform(plan)
    copy = pickle.loads(pickle.dumps(transform))
    rows = next(iter_stream_batches(plan, epoch=0, stream=0)).rows
    a, b = transform.process(transform.convert(rows)), copy.process(copy.convert(rows))
    assert_same_batch(a, b)
    age = torch.tensor(rows.column("age").to_numpy())
    assert torch.equal(a.dense[:, 1], (age - 2.0) / 2.0)
    assert isinstance(transform.dense_module, torch.jit.ScriptModule)
    assert isinstance(transform.sparse_module, torch.jit.ScriptModule)


def test_loader_matches_single_process_order(table: Path) -> None:
    cfg = ReaderConfig(
        table=str(table),
        batch_size=4,
        num_workers=2,
        dedup_sparse_features=GROUPS,
        shuffle="session",
        seed=5,
        num_epochs=2,
    )
    expected = list(iter_batches(cfg))
    loader = make_loader(cfg)
    assert len(loader) == len(expected)
    got = list(loader)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert_same_batch(a, b)
    assert loader.stats.batches == len(expected) and loader.stats.rows == 62
    # Finished: the next `for` reads every epoch again, the same batches.
    assert len(loader) == len(expected)
    again = list(loader)
    assert len(again) == len(expected)
    for a, b in zip(again, expected, strict=True):
        assert_same_batch(a, b)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("where", ["mid_epoch", "before_boundary", "at_boundary", "epoch_1"])
def test_resume_gives_exactly_the_next_batches(table: Path, num_workers: int, where: str) -> None:
    cfg = ReaderConfig(
        table=str(table),
        batch_size=4,
        num_workers=num_workers,
        dedup_sparse_features=GROUPS,
        shuffle="row_group",
        seed=11,
        num_epochs=2,
    )
    full = list(iter_batches(cfg))  # the loader's order (test_loader_matches_...)
    loader = make_loader(cfg)
    epoch0 = sum(loader.epoch_totals(0))
    stop = {"mid_epoch": 3, "before_boundary": epoch0 - 1, "at_boundary": epoch0}.get(
        where, epoch0 + 2
    )
    it = iter(loader)
    for _ in range(stop):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))  # a checkpoint sidecar stores JSON
    assert state["epoch"] == (1 if where == "epoch_1" else 0)
    del it
    resumed = make_loader(cfg)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(full) - stop
    for a, b in zip(rest[:4], full[stop : stop + 4], strict=True):  # K = 4 next batches
        assert_same_batch(a, b)
    for a, b in zip(rest, full[stop:], strict=True):
        assert row_ids(a) == row_ids(b)


@pytest.mark.parametrize("shuffle", ["none", "row_group", "rows", "session"])
def test_batches_do_not_depend_on_worker_count(table: Path, shuffle: str) -> None:
    """The same batches, in the same order, read in the main process or by 1, 2 or 4
    DataLoader workers; and a run stopped with 2 workers resumes exactly with 0 or 4."""
    base = ReaderConfig(
        table=str(table),
        batch_size=3,
        shuffle=shuffle,
        shuffle_window=9,
        dedup_sparse_features=GROUPS,
        seed=2,
        num_epochs=2,
    )
    expected = list(iter_batches(base))
    assert sum(b.batch_size for b in expected) == 62
    for workers in (0, 1, 2, 4):
        got = list(make_loader(dataclasses.replace(base, num_workers=workers)))
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert_same_batch(a, b)
    two = make_loader(dataclasses.replace(base, num_workers=2))
    it = iter(two)
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(two.state_dict()))
    del it
    for workers in (0, 4):
        resumed = make_loader(dataclasses.replace(base, num_workers=workers))
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert len(rest) == len(expected) - 7
        for a, b in zip(rest, expected[7:], strict=True):
            assert_same_batch(a, b)


def test_a_state_from_the_worker_ordered_reader_is_refused(table: Path) -> None:
    old = {"version": 1, "epoch": 0, "batches_per_worker": [1]}
    with pytest.raises(ConfigError, match=r"depended on reader\.num_workers"):
        make_loader(ReaderConfig(table=str(table))).load_state_dict(old)


def test_state_dict_checks_config_and_table(table: Path) -> None:
    cfg = ReaderConfig(table=str(table), batch_size=4)
    loader = make_loader(cfg)
    next(iter(loader))
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["batches_per_stream"] == [1, 0, 0, 0]
    with pytest.raises(ConfigError, match=r"reader.batch_size: saved 4, now 5"):
        make_loader(ReaderConfig(table=str(table), batch_size=5)).load_state_dict(state)
    directory = table / "ds=2026-11-01" / "hour=05"
    directory.mkdir()
    pq.write_table(make_rows(100, 3), directory / "part-0000.parquet")
    (directory / "_SUCCESS").touch()
    with pytest.raises(ConfigError, match=r"units of .* changed"):
        make_loader(cfg).load_state_dict(state)


def test_canonical_order_positions() -> None:
    totals = [3, 1, 2]  # order: (0,0) (0,1) (0,2) (1,0) (1,2) (2,0)
    assert canonical_counts(totals, 0) == [0, 0, 0]
    assert canonical_counts(totals, 2) == [1, 1, 0]
    assert canonical_counts(totals, 4) == [2, 1, 1]
    assert canonical_counts(totals, 5) == [2, 1, 2]
    assert canonical_counts(totals, 6) == [3, 1, 2]
    assert next_stream(totals, [2, 1, 1]) == 2
    assert next_stream(totals, [3, 1, 2]) is None
    assert next_stream(totals, [1, 0, 0], among=[0, 2]) == 2  # a worker's share of the streams
    with pytest.raises(ConfigError, match="past the end"):
        canonical_counts(totals, 7)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bad_row_in_a_worker_keeps_its_error_type(tmp_path: Path, num_workers: int) -> None:
    t = make_rows(0, 12)
    hist = t["hist"].to_pylist()
    hist[10] = None
    t = t.set_column(t.schema.get_field_index("hist"), "hist", pa.array(hist, pa.list_(pa.int64())))
    directory = tmp_path / "ds=2026-11-01" / "hour=00"
    directory.mkdir(parents=True)
    pq.write_table(t, directory / "part-0000.parquet", row_group_size=4)
    (directory / "_SUCCESS").touch()
    loader = make_loader(ReaderConfig(table=str(tmp_path), batch_size=4, num_workers=num_workers))
    with pytest.raises(
        BadRowError, match=r"part-0000\.parquet: row 10: field 'hist': null list"
    ) as err:
        list(loader)
    assert err.value.row == 10 and err.value.field == "hist"


def test_ray_chunks_end_at_chunk_boundaries_round_robin_over_streams() -> None:
    from recd.reader.ray_tier import chunk_list

    # stream 0: 7 batches from 0; stream 1: 5 batches resumed at 4 (mid-chunk); chunks of 3
    assert chunk_list([7, 5], [0, 4], 3) == [
        (0, 0, 3),
        (1, 4, 1),
        (0, 3, 3),
        (0, 6, 1),
    ]
    assert chunk_list([3, 0], [3, 0], 3) == []
