"""Reading the dedup layout: every batch equals the plain layout's batch of the same data,
exactly (KJT and IKJTs, every shuffle, resumed mid-epoch, 2 ranks, mixed partitions), and
IKJTs of encoded groups are built without hashing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import recd.tensors.convert
from recd.analyze import analyze_table
from recd.etl.config import EtlConfig
from recd.etl.local import run_etl
from recd.logs.generate import generate_logs
from recd.logs.shard import shard_logs
from recd.reader import ReaderConfig, build_plan, iter_batches, make_loader
from recd.reader.transform import BatchTransform
from recd.schema import load_catalogue
from recd.tensors.batch import Batch

GROUPS = [["history_items", "history_event_types"], ["item_id"], ["user_context_0"]]


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dedup-layout")
    catalogue = load_catalogue("clickstream")
    generate_logs(catalogue, root / "raw", seed=5, rows=6000, show_progress=False)
    shard_logs(root / "raw", root / "shards", key="session", num_shards=2, show_progress=False)
    out = {}
    every = catalogue.sparse_names  # listed: every feature encoded, whatever its bytes
    for name, layout, listed in (
        ("plain", "plain", None),
        ("dedup", "dedup", every),
        ("default", "dedup", None),
    ):
        out[name] = root / name
        run_etl(
            EtlConfig(
                shard_dir=root / "shards",
                table_dir=out[name],
                row_group_rows=97,  # row groups cut sessions
                layout=layout,
                dedup_features=listed,
                table_format="hive",  # the mixed table below is made of copied partitions
                show_progress=False,
            )
        )
    # Mixed: every other partition from each layout.
    out["mixed"] = root / "mixed"
    parts = sorted(p for p in out["plain"].glob("ds=*/hour=*"))
    for i, part in enumerate(parts):
        source = out["dedup" if i % 2 else "plain"] / part.relative_to(out["plain"])
        shutil.copytree(source, out["mixed"] / part.relative_to(out["plain"]))
    return out


def plain_view(batch: Batch) -> dict[str, Any]:
    """Everything a batch holds, with every sparse feature as its expanded (lengths, ids)."""
    out: dict[str, Any] = {"dense": batch.dense, "labels": batch.labels}
    sparse = batch.sparse
    kjts = [sparse.kjt] if sparse.kjt is not None else []
    kjts += [ikjt.to_kjt() for ikjt in sparse.ikjts]
    for kjt in kjts:
        for key, jt in kjt.to_dict().items():
            out[key] = (jt.lengths(), jt.values())
    return out


def assert_same(ours: list[Batch], plain: list[Batch]) -> None:
    assert len(ours) == len(plain) > 0
    for i, (a, b) in enumerate(zip(ours, plain, strict=True)):
        va, vb = plain_view(a), plain_view(b)
        assert va.keys() == vb.keys()
        for key in va:
            if isinstance(va[key], tuple):
                assert torch.equal(va[key][0], vb[key][0]), (i, key, "lengths")
                assert torch.equal(va[key][1], vb[key][1]), (i, key, "ids")
            else:
                assert torch.equal(va[key], vb[key]), (i, key)


def read(table: Path, **kwargs: Any) -> list[Batch]:
    config = {"batch_size": 50, "dedup_sparse_features": GROUPS, **kwargs}
    return list(iter_batches(ReaderConfig(table=str(table), **config)))


def forbid_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, building an IKJT by hashing fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an encoded group was hashed")

    monkeypatch.setattr(recd.tensors.convert, "find_distinct_stacked", refuse)


def test_the_etl_encodes_what_it_is_told_or_what_pays(tables: dict[str, Path]) -> None:
    plan = build_plan(ReaderConfig(table=str(tables["dedup"])))
    assert plan.encoded == load_catalogue("clickstream").sparse_names
    assert all(u.encoded for u in plan.units)
    # By default: the sliding histories (about an id per row instead of 13), each alone, and
    # the session-constant context features, which change on the same rows, as one group
    # (two columns for the four; alone, each would be larger than plain); the item id, new on
    # most rows, stays plain.
    default = build_plan(ReaderConfig(table=str(tables["default"])))
    context = tuple(f"user_context_{i}" for i in range(4))
    assert set(default.encoded) == {"history_items", "history_event_types", *context}
    assert all(u.groups == (context,) for u in default.units)
    everything = build_plan(ReaderConfig(table=str(tables["dedup"])))
    assert all(u.groups == (context,) for u in everything.units)  # listed: grouped the same
    assert_same(read(tables["default"]), read(tables["plain"]))
    # one plain KJT of encoded and plain features, in the table's key order
    no_groups = {"dedup_sparse_features": [], "shuffle": "row_group"}
    assert_same(read(tables["default"], **no_groups), read(tables["plain"], **no_groups))
    assert plan.num_rows == build_plan(ReaderConfig(table=str(tables["plain"]))).num_rows
    assert build_plan(ReaderConfig(table=str(tables["plain"]))).encoded == []


@pytest.mark.parametrize("shuffle", ["none", "file", "row_group", "session", "rows"])
def test_batches_equal_the_plain_layouts(
    tables: dict[str, Path], shuffle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Windows of 150 rows span row groups: their units' id buffers are combined.
    kwargs = {"shuffle": shuffle, "seed": 4, "num_epochs": 2, "shuffle_window": 150}
    plain = read(tables["plain"], **kwargs)
    forbid_hashing(monkeypatch)
    ours = read(tables["dedup"], **kwargs)
    assert_same(ours, plain)
    if shuffle != "rows":  # rows one by one scatter the repeats
        # Hash-free IKJTs dedup at least adjacent repeats: far fewer rows than the batch.
        distinct = sum(int(b.sparse.ikjts[1].lengths().numel()) for b in ours)
        assert distinct < 0.5 * sum(b.batch_size for b in ours)


def test_preprocessing_and_two_ranks_give_the_plain_layouts_batches(
    tables: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The encoded features' sparse preprocessing runs on their stored ids (chained moduli,
    # truncations on positions); the plain features' in the batch modules.
    pre = [
        {"kind": "hash_modulo", "features": ["history_items", "item_id"], "modulo": 1000},
        {"kind": "truncate_last", "features": ["history_items", "history_event_types"], "n": 4},
        {"kind": "hash_modulo", "features": ["history_event_types", "user_context_1"], "modulo": 3},
        {"kind": "truncate_last", "features": ["history_items"], "n": 3},
    ]
    kwargs: list[dict[str, Any]] = [
        {"world_size": 2, "rank": rank, "preprocessing": pre, "shuffle": "session"}
        for rank in (0, 1)
    ]
    plain = [read(tables["plain"], **k) for k in kwargs]
    assert max(int(b.sparse.ikjts[0].lengths().max()) for b in plain[0]) == 4
    # every feature of "dedup" is encoded: nothing is left for the batch modules
    dedup_plan = build_plan(ReaderConfig(table=str(tables["dedup"]), preprocessing=pre))
    assert BatchTransform(dedup_plan).sparse_module is None
    for name in ("default", "mixed", "dedup"):  # "default": some groups are not encoded
        if name == "dedup":
            forbid_hashing(monkeypatch)
        for k, expected in zip(kwargs, plain, strict=True):
            assert_same(read(tables[name], **k), expected)


@pytest.mark.parametrize("shuffle", ["none", "session"])
def test_encoded_features_read_as_plain_kjt_rows_equal_the_plain_layouts(
    tables: dict[str, Path], shuffle: str
) -> None:
    # No group, or a group not all encoded ("default"): each unit's encoded features are
    # gathered to plain rows once, before the shuffle; their preprocessing runs before that.
    pre = [
        {"kind": "hash_modulo", "features": ["history_items"], "modulo": 7},
        {"kind": "truncate_last", "features": ["history_event_types"], "n": 2},
    ]
    plan = build_plan(ReaderConfig(table=str(tables["dedup"]), dedup_sparse_features=[]))
    assert plan.encoded and plan.stacked == [] and "__recd_ids" not in plan.batch_columns
    for name in ("dedup", "default", "mixed"):
        for groups in ([], [["history_items", "item_id"]]):
            kwargs = {"dedup_sparse_features": groups, "preprocessing": pre, "shuffle": shuffle}
            assert_same(read(tables[name], **kwargs), read(tables["plain"], **kwargs))


def test_mixed_layouts_read_as_one_table(tables: dict[str, Path]) -> None:
    plan = build_plan(ReaderConfig(table=str(tables["mixed"])))
    assert any(u.encoded for u in plan.units) and not all(u.encoded for u in plan.units)
    for groups in (GROUPS, [["history_items", "user_context_1"]]):
        assert_same(
            read(tables["mixed"], dedup_sparse_features=groups, shuffle="row_group"),
            read(tables["plain"], dedup_sparse_features=groups, shuffle="row_group"),
        )


def test_resuming_mid_epoch_continues_with_the_plain_layouts_batches(
    tables: dict[str, Path],
) -> None:
    def config(table: Path) -> ReaderConfig:
        return ReaderConfig(
            table=str(table), batch_size=50, dedup_sparse_features=GROUPS, shuffle="session"
        )

    first = make_loader(config(tables["dedup"]))
    it = iter(first)
    for _ in range(7):
        next(it)
    state = first.state_dict()
    resumed = make_loader(config(tables["dedup"]))
    resumed.load_state_dict(state)
    plain = list(iter_batches(config(tables["plain"])))
    assert_same(list(resumed), plain[7:])


def test_analyze_reads_the_dedup_layout_like_the_plain_one(tables: dict[str, Path]) -> None:
    ours = analyze_table(tables["dedup"], batch_size=256, show_progress=False)
    plain = analyze_table(tables["plain"], batch_size=256, show_progress=False)
    assert ours.rows == plain.rows

    def figures(analysis: Any) -> list[tuple[str, float, float, float]]:
        return [
            (f.name, f.unchanged, f.dedupe_factor, f.measured_factor) for f in analysis.features
        ]

    assert figures(ours) == figures(plain)
