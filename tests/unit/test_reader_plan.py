"""Read plan and row stream: partitions, units, split over streams, shuffles, resume, bad data."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recd.errors import BadRowError, ConfigError, SchemaError
from recd.reader.config import ReaderConfig, Shuffle
from recd.reader.infer import with_history_features
from recd.reader.order import order_units, session_order, window_order
from recd.reader.plan import build_plan, locate
from recd.reader.stream import iter_rank_batches, iter_stream_batches
from recd.schema import SparseKind
from recd.table.hive import committed_partition_dirs

from .reader_tables import make_rows, write_table


def item_ids(batch: pa.RecordBatch) -> list[int]:
    return [v[0] for v in batch.column("item_id").to_pylist()]


@pytest.fixture
def table(tmp_path: Path) -> Path:
    root = tmp_path / "table"
    write_table(root, {"2026-11-01/00": [10, 7], "2026-11-01/01": [9], "2026-11-01/02": [5]})
    return root


def test_only_committed_visible_partitions_in_window(table: Path) -> None:
    (table / "ds=2026-11-01" / "hour=03").mkdir()  # no _SUCCESS: being written
    (table / "_tmp" / "hour=00").mkdir(parents=True)
    (table / ".staging").mkdir()
    parts = committed_partition_dirs(table)
    assert [str(p) for p, _ in parts] == [
        "ds=2026-11-01/hour=00",
        "ds=2026-11-01/hour=01",
        "ds=2026-11-01/hour=02",
    ]
    plan = build_plan(ReaderConfig(table=str(table), start="2026-11-01/01", end="2026-11-01T02"))
    assert {Path(u.path).parent.name for u in plan.units} == {"hour=01"}
    assert plan.num_rows == 9


def test_units_in_table_order_with_row_counts(table: Path) -> None:
    plan = build_plan(ReaderConfig(table=str(table)))
    assert [(Path(u.path).name, u.row_group, u.num_rows, u.first_row) for u in plan.units][:5] == [
        ("part-0000.parquet", 0, 4, 0),
        ("part-0000.parquet", 1, 4, 4),
        ("part-0000.parquet", 2, 2, 8),
        ("part-0001.parquet", 0, 4, 0),
        ("part-0001.parquet", 1, 3, 4),
    ]
    assert plan.num_rows == 31
    assert [u.index for u in plan.units] == list(range(len(plan.units)))
    assert all(u.read_bytes > 0 for u in plan.units)
    assert plan.sparse == ["hist", "cart_a", "cart_b", "item_id"]
    assert plan.dense == ["price", "age"] and plan.labels == ["label"]


@pytest.mark.parametrize("shuffle", list(Shuffle))
def test_units_split_over_ranks_and_streams_exactly_once(table: Path, shuffle: Shuffle) -> None:
    for epoch in range(3):
        seen: list[int] = []
        for rank in range(2):
            cfg = ReaderConfig(
                table=str(table), shuffle=shuffle, rank=rank, world_size=2, streams=2, seed=7
            )
            plan = build_plan(cfg)
            for stream in range(2):
                seen += [u.index for u in plan.stream_units(epoch, stream)]
        assert sorted(seen) == list(range(len(plan.units)))


@pytest.mark.parametrize("shuffle", list(Shuffle))
@pytest.mark.parametrize("window", [4, 7, 1000])
def test_every_shuffle_reads_each_row_once_per_epoch(
    table: Path, shuffle: Shuffle, window: int
) -> None:
    """Over ranks and streams, with windows smaller than, across and larger than row groups."""
    for epoch in range(2):
        rows: list[int] = []
        for rank in range(2):
            cfg = ReaderConfig(
                table=str(table),
                shuffle=shuffle,
                shuffle_window=window,
                batch_size=2,
                rank=rank,
                world_size=2,
                streams=3,
                seed=5,
            )
            plan = build_plan(cfg)
            for stream in range(3):
                batches = list(iter_stream_batches(plan, epoch=epoch, stream=stream))
                assert len(batches) == plan.stream_num_batches(epoch, stream)
                rows += [r for b in batches for r in item_ids(b.rows)]
        assert sorted(rows) == list(range(31))


def test_rows_shuffle_mixes_row_groups_inside_a_batch(table: Path) -> None:
    """A window spans several row groups drawn from the whole table: a batch holds rows of
    several row groups and partitions, in an order that changes with the seed and epoch."""
    cfg = ReaderConfig(table=str(table), shuffle="rows", shuffle_window=16, batch_size=8, streams=1)
    plan = build_plan(cfg)
    unit_of = {r: u.index for u in plan.units for r in _unit_rows(u)}
    batches = [item_ids(b.rows) for b in iter_stream_batches(plan, epoch=0, stream=0)]
    assert max(len({unit_of[r] for r in b}) for b in batches) >= 3
    again = [item_ids(b.rows) for b in iter_stream_batches(plan, epoch=0, stream=0)]
    assert again == batches
    other = [item_ids(b.rows) for b in iter_stream_batches(plan, epoch=1, stream=0)]
    assert other != batches


def test_window_orders_are_permutations_seeded_per_window() -> None:
    kw = {"seed": 3, "epoch": 0, "stream": 1}
    order = window_order(Shuffle.ROWS, 50, None, window=0, **kw)
    assert sorted(order.tolist()) == list(range(50))
    assert np.array_equal(order, window_order(Shuffle.ROWS, 50, None, window=0, **kw))
    assert not np.array_equal(order, window_order(Shuffle.ROWS, 50, None, window=1, **kw))
    ids = np.repeat(np.arange(10), 5)
    by_session = window_order(Shuffle.SESSION, 50, ids, window=0, **kw)
    assert sorted(by_session.tolist()) == list(range(50))
    runs = ids[by_session].reshape(10, 5)
    assert (runs == runs[:, :1]).all()  # each session stays one run of 5
    with pytest.raises(ValueError, match="does not permute"):
        window_order(Shuffle.ROW_GROUP, 50, None, window=0, **kw)


@pytest.mark.parametrize("shuffle", [Shuffle.ROWS, Shuffle.SESSION])
def test_a_stream_holds_at_most_a_window_and_one_row_group(table: Path, shuffle: Shuffle) -> None:
    cfg = ReaderConfig(table=str(table), shuffle=shuffle, shuffle_window=6, batch_size=3)
    plan = build_plan(cfg)
    largest = max(u.num_rows for u in plan.units)
    held = [b.buffer_rows for b in iter_rank_batches(plan, epoch=0)]
    assert max(held) <= cfg.window_rows + largest
    assert max(held) > cfg.window_rows  # the row group kept for the next window is counted


def test_shuffle_orders_depend_on_seed_and_epoch_only(table: Path) -> None:
    units = build_plan(ReaderConfig(table=str(table))).units
    same = order_units(units, Shuffle.ROW_GROUP, seed=1, epoch=0)
    assert same == order_units(units, Shuffle.ROW_GROUP, seed=1, epoch=0)
    assert same != order_units(units, Shuffle.ROW_GROUP, seed=1, epoch=1)
    assert same != order_units(units, Shuffle.ROW_GROUP, seed=2, epoch=0)
    assert order_units(units, Shuffle.NONE, seed=1, epoch=3) == units
    by_file = order_units(units, Shuffle.FILE, seed=3, epoch=0)
    # A file's row groups stay together and in order.
    for path in {u.path for u in units}:
        idx = [i for i, u in enumerate(by_file) if u.path == path]
        assert idx == list(range(idx[0], idx[0] + len(idx)))
        assert [by_file[i].row_group for i in idx] == sorted(by_file[i].row_group for i in idx)


def test_session_order_permutes_whole_sessions() -> None:
    ids = np.array([5, 5, 5, 9, 2, 2, 7, 7, 7, 7, 1])
    order = session_order(ids, np.random.default_rng(0))
    assert sorted(order.tolist()) == list(range(len(ids)))
    permuted = ids[order]
    runs = [permuted[0]] + [b for a, b in itertools.pairwise(permuted) if a != b]
    assert sorted(runs) == [1, 2, 5, 7, 9]  # each session is one contiguous run
    assert np.all(np.diff(order)[permuted[1:] == permuted[:-1]] == 1)  # rows keep their order
    orders = {tuple(session_order(ids, np.random.default_rng(e))) for e in range(6)}
    assert len(orders) > 1


def test_locate_maps_rows_to_units(table: Path) -> None:
    units = build_plan(ReaderConfig(table=str(table))).units[:3]  # 4, 4, 2 rows
    assert locate(units, 0) == (0, 0) or locate(units, 0).unit == 0
    assert (locate(units, 5).unit, locate(units, 5).offset) == (1, 1)
    assert (locate(units, 8).unit, locate(units, 8).offset) == (2, 0)
    assert locate(units, 10).unit == 3


@pytest.mark.parametrize("drop_last", [False, True])
def test_stream_batches_cover_rows_once_and_span_row_groups(table: Path, drop_last: bool) -> None:
    cfg = ReaderConfig(table=str(table), batch_size=3, streams=2, drop_last=drop_last)
    plan = build_plan(cfg)
    seen: list[int] = []
    for worker in range(2):
        batches = list(iter_stream_batches(plan, epoch=0, stream=worker))
        assert len(batches) == plan.stream_num_batches(0, worker)
        sizes = [b.rows.num_rows for b in batches]
        assert all(s == 3 for s in sizes[:-1])
        assert sizes[-1] == 3 or not drop_last
        expected = [r for u in plan.stream_units(0, worker) for r in _unit_rows(u)]
        got = [r for b in batches for r in item_ids(b.rows)]
        assert got == expected[: len(got)]
        seen += got
        assert batches[0].rows.schema.field("price").type == pa.float32()
    if drop_last:
        assert len(seen) < plan.num_rows and len(set(seen)) == len(seen)
    else:
        assert sorted(seen) == list(range(plan.num_rows))


def _unit_rows(unit) -> list[int]:  # type: ignore[no-untyped-def]
    t = pq.ParquetFile(unit.path).read_row_group(unit.row_group, columns=["item_id"])
    return [v[0] for v in t.column("item_id").to_pylist()]


@pytest.mark.parametrize("shuffle", [Shuffle.NONE, Shuffle.SESSION, Shuffle.ROWS])
def test_start_batch_skips_to_the_same_rows(table: Path, shuffle: Shuffle) -> None:
    cfg = ReaderConfig(
        table=str(table), batch_size=3, shuffle=shuffle, seed=4, streams=1, shuffle_window=7
    )
    plan = build_plan(cfg)
    full = [item_ids(b.rows) for b in iter_stream_batches(plan, epoch=1, stream=0)]
    for k in (1, 3, 4, len(full)):
        tail = [
            item_ids(b.rows) for b in iter_stream_batches(plan, epoch=1, stream=0, start_batch=k)
        ]
        assert tail == full[k:]


def test_session_shuffle_keeps_sessions_in_one_run(table: Path) -> None:
    cfg = ReaderConfig(table=str(table), batch_size=100, shuffle="session", seed=1, streams=1)
    plan = build_plan(cfg)
    rows = [r for b in iter_stream_batches(plan, epoch=0, stream=0) for r in item_ids(b.rows)]
    assert sorted(rows) == list(range(plan.num_rows))
    assert rows != sorted(rows)
    sessions = np.array(rows) // 3
    changes = np.flatnonzero(np.diff(sessions)) + 1
    runs = np.split(sessions, changes)
    # A session is contiguous inside its window (it may straddle row groups: two runs then).
    assert len(runs) <= len(set(sessions.tolist())) + len(plan.units)


def test_missing_column_names_file_and_column(table: Path) -> None:
    with pytest.raises(SchemaError, match=r"part-0000\.parquet: missing column 'nope'"):
        build_plan(ReaderConfig(table=str(table), dense=["nope"]))
    with pytest.raises(SchemaError, match=r"dedup_sparse_features.*'zzz'"):
        build_plan(ReaderConfig(table=str(table), dedup_sparse_features=[["zzz"]]))


def test_schema_change_between_partitions_names_both_files(tmp_path: Path) -> None:
    root = tmp_path / "t"
    write_table(root, {"2026-11-01/00": [4]})
    bad = make_rows(4, 4)
    bad = bad.set_column(
        bad.schema.get_field_index("price"), "price", bad["price"].cast(pa.float64())
    )
    directory = root / "ds=2026-11-01" / "hour=01"
    directory.mkdir(parents=True)
    pq.write_table(bad, directory / "part-0000.parquet")
    (directory / "_SUCCESS").touch()
    with pytest.raises(SchemaError) as err:
        build_plan(ReaderConfig(table=str(root)))
    msg = str(err.value)
    assert "'price'" in msg and "hour=00/part-0000.parquet" in msg and "hour=01/part-0000" in msg
    # A column dropped in a later partition: names that file and where the column was seen.
    (directory / "part-0000.parquet").unlink()
    pq.write_table(make_rows(4, 4).drop_columns(["hist"]), directory / "part-0000.parquet")
    with pytest.raises(
        SchemaError,
        match=r"hour=01/part-0000.parquet: missing column 'hist' \(present in .*hour=00",
    ):
        build_plan(ReaderConfig(table=str(root)))


def test_partitions_with_and_without_nullable_fields_read_as_one_table(tmp_path: Path) -> None:
    """Tables written by recd's ETL have no nullable field (Catalogue.table_schema); a table
    whose older partitions do reads through, and one batch can span both kinds."""
    from recd.schema import as_table_schema, strict_schema

    root = tmp_path / "t"
    write_table(root, {"2026-11-01/00": [6], "2026-11-01/01": [6]})
    newer = root / "ds=2026-11-01" / "hour=01" / "part-0000.parquet"
    rows = pq.read_table(newer)
    pq.write_table(as_table_schema(rows, strict_schema(rows.schema)), newer)
    assert not pq.read_schema(newer).field("item_id").nullable
    plan = build_plan(ReaderConfig(table=str(root), batch_size=12, streams=1))
    batches = list(iter_stream_batches(plan, epoch=0, stream=0))
    assert [b.rows.num_rows for b in batches] == [12]
    assert batches[0].rows.schema.field("item_id").type.equals(pa.list_(pa.int64()))
    assert item_ids(batches[0].rows) == [r for u in plan.stream_units(0, 0) for r in _unit_rows(u)]


def _write_single(root: Path, table: pa.Table) -> None:
    directory = root / "ds=2026-11-01" / "hour=00"
    directory.mkdir(parents=True)
    pq.write_table(table, directory / "part-0000.parquet", row_group_size=4)
    (directory / "_SUCCESS").touch()


def _read_all(root: Path, **kw: object) -> None:
    plan = build_plan(ReaderConfig(table=str(root), streams=1, **kw))  # type: ignore[arg-type]
    for _ in iter_stream_batches(plan, epoch=0, stream=0):
        pass


def test_null_list_names_file_row_and_column(tmp_path: Path) -> None:
    t = make_rows(0, 10)
    hist = t["hist"].to_pylist()
    hist[6] = None
    t = t.set_column(t.schema.get_field_index("hist"), "hist", pa.array(hist, pa.list_(pa.int64())))
    _write_single(tmp_path, t)
    with pytest.raises(BadRowError, match=r"part-0000\.parquet: row 6: field 'hist': null list"):
        _read_all(tmp_path)


def test_null_id_inside_list_is_reported(tmp_path: Path) -> None:
    t = make_rows(0, 10)
    t = t.set_column(
        t.schema.get_field_index("item_id"),
        "item_id",
        pa.array(
            [[1], [2], [3], [4], [5], [None, 6], [7], [8], [9], [1, 2, None]], pa.list_(pa.int64())
        ),
    )
    _write_single(tmp_path, t)
    with pytest.raises(BadRowError, match=r"row 5: field 'item_id': null id"):
        _read_all(tmp_path)


def test_id_out_of_int64_is_reported(tmp_path: Path) -> None:
    t = make_rows(0, 10)
    ids = [[i] for i in range(10)]
    ids[9] = [3, 2**64 - 5]
    t = t.set_column(
        t.schema.get_field_index("item_id"), "item_id", pa.array(ids, pa.list_(pa.uint64()))
    )
    _write_single(tmp_path / "bad", t)
    with pytest.raises(BadRowError, match=r"row 9: field 'item_id': id 18446744073709551611"):
        _read_all(tmp_path / "bad")
    # Small unsigned ids are fine: cast to int64.
    ids[9] = [3, 2**63 - 1]
    t = t.set_column(
        t.schema.get_field_index("item_id"), "item_id", pa.array(ids, pa.list_(pa.uint64()))
    )
    _write_single(tmp_path / "ok", t)
    plan = build_plan(ReaderConfig(table=str(tmp_path / "ok"), sparse=["item_id"], streams=1))
    batches = list(iter_stream_batches(plan, epoch=0, stream=0))
    assert batches[0].rows.schema.field("item_id").type == pa.list_(pa.int64())
    assert batches[-1].rows.column("item_id").to_pylist()[-1] == [3, 2**63 - 1]


def test_float_ids_are_a_schema_error(tmp_path: Path) -> None:
    t = make_rows(0, 4)
    t = t.set_column(
        t.schema.get_field_index("hist"), "hist", pa.array([[1.5]] * 4, pa.list_(pa.float64()))
    )
    _write_single(tmp_path, t)
    with pytest.raises(
        SchemaError, match=r"part-0000\.parquet: column 'hist' has type list<\w+: double>"
    ):
        build_plan(ReaderConfig(table=str(tmp_path)))


def test_empty_window_is_a_config_error(table: Path) -> None:
    with pytest.raises(ConfigError, match="no committed partition"):
        build_plan(ReaderConfig(table=str(table), start="2027-01-01"))


def test_history_features_replace_the_catalogues_histories(table: Path) -> None:
    """``[reader] history_features`` means one thing for every table: on a table with a recd
    catalogue the listed groups are its histories, the catalogue's other histories are not."""
    plain = build_plan(ReaderConfig(table=str(table)))
    assert {f.kind for f in plain.catalogue.sparse} == {SparseKind.ITEM}
    listed = build_plan(ReaderConfig(table=str(table), history_features=[["hist"], ["cart_a"]]))
    kinds = {f.name: (f.kind, f.group) for f in listed.catalogue.sparse}
    assert kinds == {
        "hist": (SparseKind.HISTORY, None),
        "cart_a": (SparseKind.HISTORY, None),
        "cart_b": (SparseKind.ITEM, "cart"),
        "item_id": (SparseKind.ITEM, None),
    }
    grouped = build_plan(
        ReaderConfig(table=str(table), history_features=[["cart_a", "cart_b"]])
    ).catalogue
    again = with_history_features(grouped, [["hist"]], grouped.sparse_names)
    kinds = {f.name: (f.kind, f.group) for f in again.sparse}
    assert kinds["hist"] == (SparseKind.HISTORY, None)
    assert kinds["cart_a"] == kinds["cart_b"] == (SparseKind.STATIC, None)  # no longer listed
    with pytest.raises(SchemaError, match=r"history_features\[0\] names 'nope'"):
        build_plan(ReaderConfig(table=str(table), history_features=[["nope"]]))
