"""The embedded clustering ETL on real shard files and real Parquet output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from recd.cli.etl import register
from recd.errors import ConfigError
from recd.etl.config import EtlConfig, EtlReport
from recd.etl.local import run_etl
from recd.logs.rawlog import read_catalogue
from recd.schema import (
    REQUEST_ID,
    SESSION_ID,
    TS,
    Catalogue,
    catalogue_from_schema,
    load_catalogue,
)
from recd.table.partitions import Partition
from recd.table.snapshot import committed_files
from recd.tensors.stacked import read_plain

from .etl_shards import (
    MS_PER_HOUR,
    START_MS,
    all_rows,
    as_nullable,
    clustered_shard_by_shard,
    committed_bytes,
    make_rows,
    read_committed,
    row_group_rows,
    session_runs,
    sessions_clustered,
    shard_of_sessions,
    write_shards,
)


@pytest.fixture()
def rows(tiny_catalogue: Catalogue) -> pa.Table:
    return make_rows(tiny_catalogue, num_sessions=60, mean_samples=6.0, seed=7)


@pytest.fixture()
def shard_dir(tmp_path: Path, tiny_catalogue: Catalogue, rows: pa.Table) -> Path:
    directory = tmp_path / "shards"
    write_shards(directory, tiny_catalogue, rows, num_shards=3, block_rows=16)
    return directory


def etl(shard_dir: Path, table_dir: Path, **kwargs: Any) -> EtlReport:
    return run_etl(
        EtlConfig(shard_dir=shard_dir, table_dir=table_dir, show_progress=False, **kwargs)
    )


def test_clustered_partitions_hold_every_row_once_sessions_contiguous_and_sorted(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    report = etl(shard_dir, tmp_path / "table", row_group_rows=50)
    files = read_committed(tmp_path / "table")
    assert files, "no partition committed"
    for relpath, path, table in files:
        # One file per partition (all shards appended), shard after shard, each clustered.
        assert path.name.endswith("-00000.parquet"), path
        assert clustered_shard_by_shard(table, 3), path
        assert sessions_clustered(table), path
        sessions = pc.count_distinct(table.column(SESSION_ID)).as_py()
        assert session_runs(table) == sessions, f"{path}: a session is split into several runs"
        hours = pc.divide(table.column(TS), MS_PER_HOUR).to_numpy()
        assert {Partition.from_hour_id(int(h)).relpath for h in np.unique(hours)} == {relpath}
        # Full row groups of exactly row_group_rows, except the file's last one.
        sizes = row_group_rows(path)
        assert all(n == 50 for n in sizes[:-1]) and 0 < sizes[-1] <= 50, (path, sizes)
        meta = pq.read_metadata(path)
        assert meta.row_group(0).column(0).compression == "ZSTD"
        # Session ids are not sorted across shards: the file must not claim a sort order.
        assert all(not meta.row_group(i).sorting_columns for i in range(meta.num_row_groups))
        assert catalogue_from_schema(pq.read_schema(path)).name == "tiny"
    assert any(table.num_rows > 50 for _, _, table in files), "no multi-row-group file"
    shards_per_file = [
        len(np.unique(shard_of_sessions(table.column(SESSION_ID).to_numpy(), 3)))
        for _, _, table in files
    ]
    assert max(shards_per_file) == 3, "files should gather the rows of every shard"
    # Multiset of rows out == rows in, full content (request_id is unique).
    assert all_rows(tmp_path / "table").equals(rows.sort_by(REQUEST_ID))
    assert report.rows_in == report.rows_out == rows.num_rows
    assert report.rows_quarantined == 0
    assert sum(report.rows_per_partition.values()) == rows.num_rows
    assert report.files == len(files) == report.partitions
    assert report.row_groups_flushed_early == 0


def test_a_session_lives_in_one_file_per_partition(
    tmp_path: Path, shard_dir: Path, tiny_catalogue: Catalogue
) -> None:
    etl(shard_dir, tmp_path / "table")
    seen: dict[tuple[str, int], Path] = {}
    strict = tiny_catalogue.table_schema().remove_metadata()
    for relpath, path, table in read_committed(tmp_path / "table"):
        # No nullable field: the ETL lets no null through (recd.etl.validate).
        assert pq.read_schema(path).remove_metadata().equals(strict), path
        for session in pc.unique(table.column(SESSION_ID)).to_pylist():
            assert (relpath, session) not in seen, f"session {session} in two files of {relpath}"
            seen[(relpath, session)] = path


def test_baseline_keeps_arrival_order_per_shard_and_hour(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    report = etl(shard_dir, tmp_path / "table", baseline=True, row_group_rows=50)
    assert not report.clustered
    shard = shard_of_sessions(rows.column(SESSION_ID).to_numpy(), 3)
    hour = rows.column(TS).to_numpy() // MS_PER_HOUR
    files = read_committed(tmp_path / "table")
    for relpath, path, table in files:
        assert path.name.endswith("-00000.parquet"), path  # one file per partition
        h = Partition(ds=relpath[3:13], hour=int(relpath[-2:])).hour_id
        # Shard after shard, each in input (arrival) order.
        expected = pa.concat_tables(
            [rows.filter(pa.array((shard == k) & (hour == h))) for k in range(3)]
        )
        assert table.replace_schema_metadata(None).equals(expected), path
        sizes = row_group_rows(path)
        assert all(n == 50 for n in sizes[:-1]), (path, sizes)
    assert all_rows(tmp_path / "table").equals(rows.sort_by(REQUEST_ID))
    assert not all(sessions_clustered(t) for _, _, t in files)  # the input was interleaved


def partition_files(table_dir: Path) -> dict[str, list[tuple[Path, pa.Table]]]:
    out: dict[str, list[tuple[Path, pa.Table]]] = {}
    for relpath, path, table in read_committed(table_dir):
        out.setdefault(relpath, []).append((path, table))
    return out


def test_files_roll_over_at_the_target_size_between_sessions(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    target = 3_000
    report = etl(shard_dir, tmp_path / "table", row_group_rows=20, target_file_bytes=target)
    assert all_rows(tmp_path / "table").equals(rows.sort_by(REQUEST_ID))
    by_partition = partition_files(tmp_path / "table")
    assert report.files > 2 * report.partitions, "tiny target: several files per partition"
    for relpath, files in by_partition.items():
        names = [path.name[-len("00000.parquet") :] for path, _ in files]
        assert names == [f"{i:05d}.parquet" for i in range(len(files))], names
        seen: set[int] = set()
        for path, table in files:
            sessions = set(pc.unique(table.column(SESSION_ID)).to_pylist())
            assert not sessions & seen, f"{path}: a session spans two files of {relpath}"
            seen |= sessions
            assert sessions_clustered(table), path
            sizes = row_group_rows(path)
            assert all(n == 20 for n in sizes[:-1]), (path, sizes)  # only the last is short
        for path, _ in files[:-1]:  # closed because they reached the target
            assert path.stat().st_size >= target, path
        # In name order the files hold the partition's rows shard after shard, clustered.
        whole = pa.concat_tables(table for _, table in files)
        assert clustered_shard_by_shard(whole, 3), relpath
    # The same rows, partitions and order as with one file per partition.
    etl(shard_dir, tmp_path / "single", row_group_rows=20)
    for relpath, files in partition_files(tmp_path / "single").items():
        assert len(files) == 1
        rolled = pa.concat_tables(table for _, table in by_partition[relpath])
        assert rolled.equals(files[0][1]), relpath


def test_row_groups_are_short_only_at_file_ends_or_when_buffers_hit_their_cap(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    # 16 kB budget: 4 kB of write buffers for 2 partitions of 100-row groups (~200 B a row).
    report = etl(shard_dir, tmp_path / "table", row_group_rows=100, memory_budget_bytes=16_000)
    assert all_rows(tmp_path / "table").equals(rows.sort_by(REQUEST_ID))
    assert report.row_groups_flushed_early > 0
    short = 0
    for _, path, table in read_committed(tmp_path / "table"):
        sizes = row_group_rows(path)
        assert all(0 < n <= 100 for n in sizes)
        short += sum(n < 100 for n in sizes[:-1])
        assert sessions_clustered(table), path
    assert 0 < short <= report.row_groups_flushed_early


def test_partition_writers_bound_open_files_and_buffers(
    tmp_path: Path, shard_dir: Path, rows: pa.Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    import recd.etl.local as local

    writers = local.PartitionWriters(
        tmp_path / "staging",
        schema=read_catalogue(shard_dir).arrow_schema(),
        row_group_rows=40,
        target_file_bytes=1 << 30,
        buffer_bytes=2_500,  # ~12 decoded rows of ~200 B: buffers get compressed, then flushed
        split_at_sessions=False,
        writer_options={"compression": "zstd"},
        max_open_files=2,
    )
    partitions = [Partition(ds="2026-11-01", hour=h) for h in range(3)]
    for round_ in range(3):
        for i, partition in enumerate(partitions):
            writers.append(partition, rows.slice(30 * (3 * round_ + i), 30))
            assert sum(w.is_open for w in writers.writers.values()) <= 2
            pending = sum(w.pending_bytes for w in writers.writers.values())
            assert writers.buffered_bytes == pending <= 2_500
    writers.close()
    assert writers.compressions > 0 and writers.early_flushes > 0
    for i, partition in enumerate(partitions):
        files = sorted(partition.path(tmp_path / "staging").glob("part-*.parquet"))
        assert [f.name for f in files] == [local.part_file_name(k) for k in range(len(files))]
        got = as_nullable(pa.concat_tables(pq.read_table(f) for f in files))
        expected = pa.concat_tables(rows.slice(30 * (3 * r + i), 30) for r in range(3))
        assert got.equals(expected.combine_chunks()), partition
    assert writers.rows_per_partition == {p: 90 for p in partitions}
    # The engine passes the bound through: a run with 1 open file at a time still works.
    monkeypatch.setattr(local, "MAX_OPEN_FILES", 1)
    report = etl(shard_dir, tmp_path / "table", row_group_rows=10)
    assert report.files > report.partitions
    assert all_rows(tmp_path / "table").equals(rows.sort_by(REQUEST_ID))
    for relpath, written in partition_files(tmp_path / "table").items():
        seen: set[int] = set()
        for path, table in written:  # files close between shards: sessions stay whole
            sessions = set(pc.unique(table.column(SESSION_ID)).to_pylist())
            assert not sessions & seen, f"{path}: a session spans two files of {relpath}"
            seen |= sessions
            assert sessions_clustered(table), path


def test_hour_partitioning_at_boundaries(tmp_path: Path, tiny_catalogue: Catalogue) -> None:
    base = make_rows(tiny_catalogue, num_sessions=3, mean_samples=4.0, seed=1).slice(0, 8)
    day_end = START_MS + 24 * MS_PER_HOUR  # 2026-11-02T00:00:00Z
    ts = [START_MS - 1, START_MS, START_MS + MS_PER_HOUR - 1, START_MS + MS_PER_HOUR]
    ts += [day_end - 1, day_end, day_end + 59 * 60_000, START_MS + 5 * MS_PER_HOUR]
    table = base.set_column(2, TS, pa.array(ts, pa.int64()))
    write_shards(tmp_path / "shards", tiny_catalogue, table, num_shards=2, block_rows=3)
    etl(tmp_path / "shards", tmp_path / "table")
    where = {}
    for relpath, _, t in read_committed(tmp_path / "table"):
        for request_id in t.column(REQUEST_ID).to_pylist():
            where[request_id] = relpath
    ids = table.column(REQUEST_ID).to_pylist()
    assert [where[i] for i in ids] == [
        "ds=2026-10-31/hour=23",
        "ds=2026-11-01/hour=00",
        "ds=2026-11-01/hour=00",
        "ds=2026-11-01/hour=01",
        "ds=2026-11-01/hour=23",
        "ds=2026-11-02/hour=00",
        "ds=2026-11-02/hour=00",
        "ds=2026-11-01/hour=05",
    ]


def test_rerun_is_idempotent_byte_identical(tmp_path: Path, shard_dir: Path) -> None:
    def snapshot(table_dir: Path) -> dict[str, bytes]:
        return committed_bytes(table_dir)

    etl(shard_dir, tmp_path / "table")
    first = snapshot(tmp_path / "table")
    etl(shard_dir, tmp_path / "table")
    assert snapshot(tmp_path / "table") == first
    etl(shard_dir, tmp_path / "other")
    assert snapshot(tmp_path / "other") == first
    assert first and (tmp_path / "table" / "_iceberg").is_dir()
    # Rolled files, several passes and early buffer flushes are deterministic too.
    tight = {"memory_budget_bytes": 16_000, "target_file_bytes": 4_000, "row_group_rows": 60}
    report = etl(shard_dir, tmp_path / "tight", **tight)
    assert report.files > report.partitions and report.row_groups_flushed_early > 0
    assert max(report.passes_per_shard.values()) > 1
    etl(shard_dir, tmp_path / "tight2", **tight)
    assert snapshot(tmp_path / "tight2") == snapshot(tmp_path / "tight")
    hidden = [
        p.name for p in (tmp_path / "table").iterdir() if p.name.startswith(("_tmp", "_trash"))
    ]
    assert hidden == []


def test_window_selects_whole_hours_and_counts_the_rest(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    start, end = "2026-11-01T01:00:00", "2026-11-01/02"
    report = etl(shard_dir, tmp_path / "table", start=start, end=end)
    ts = rows.column(TS).to_numpy()
    inside = (ts >= START_MS + MS_PER_HOUR) & (ts < START_MS + 2 * MS_PER_HOUR)
    assert 0 < inside.sum() < len(ts)
    assert all_rows(tmp_path / "table").equals(rows.filter(pa.array(inside)).sort_by(REQUEST_ID))
    assert report.rows_in == inside.sum()
    assert report.rows_outside_window == (~inside).sum()
    assert report.rows_read == len(ts)


def test_memory_budget_splits_shards_into_passes_same_rows(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    report = etl(shard_dir, tmp_path / "table", memory_budget_bytes=20_000)
    assert min(report.passes_per_shard.values()) > 1
    assert all_rows(tmp_path / "table").equals(rows.sort_by(REQUEST_ID))
    seen: set[tuple[str, int]] = set()
    for relpath, path, table in read_committed(tmp_path / "table"):
        assert path.name.endswith("-00000.parquet"), path  # passes append to the same file
        # A session split across passes would show up as two runs of its id.
        assert sessions_clustered(table), f"{path}: a session was split across passes"
        shard = shard_of_sessions(table.column(SESSION_ID).to_numpy(), 3)
        assert (np.diff(shard) >= 0).all(), "shards not appended in order"
        sessions = {(relpath, s) for s in pc.unique(table.column(SESSION_ID)).to_pylist()}
        assert not sessions & seen
        seen |= sessions


def test_dataset_readers_see_only_committed_rows(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    etl(shard_dir, tmp_path / "table", table_format="hive")
    stray = tmp_path / "table" / "_tmp-crashed" / "ds=2026-11-01" / "hour=00"
    stray.mkdir(parents=True)
    pq.write_table(rows.slice(0, 5), stray / "part-0000.parquet")
    dataset = ds.dataset(tmp_path / "table", format="parquet", partitioning="hive")
    assert dataset.count_rows() == rows.num_rows
    assert sorted(dataset.files) == sorted(
        str(p) for p in committed_files(tmp_path / "table").files
    )


def test_dictionary_modes_change_encodings_not_rows(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    for mode in ("all", "none", "auto"):
        report = etl(shard_dir, tmp_path / mode, dictionary=mode)
        assert all_rows(tmp_path / mode).equals(rows.sort_by(REQUEST_ID))
        encodings = report.encodings
        _, path, _ = read_committed(tmp_path / mode)[0]
        meta = pq.read_metadata(path).row_group(0)
        for i in range(meta.num_columns):
            chunk = meta.column(i)
            name = chunk.path_in_schema.split(".")[0]
            used_dictionary = chunk.has_dictionary_page
            assert used_dictionary == (encodings[name] == "RLE_DICTIONARY"), (mode, name)
            if mode == "all":
                assert used_dictionary
            if mode == "none":
                assert not used_dictionary and encodings[name] in chunk.encodings
    assert report.encodings[REQUEST_ID] != "RLE_DICTIONARY"


def test_config_checks_name_the_field(tmp_path: Path) -> None:
    def config(**kwargs: Any) -> EtlConfig:
        return EtlConfig(shard_dir=tmp_path / "s", table_dir=tmp_path / "t", **kwargs)

    cases: list[tuple[dict[str, Any], str]] = [
        ({"row_group_rows": 0}, "row_group_rows"),
        ({"target_file_bytes": 0}, "target_file_bytes"),
        ({"zstd_level": 30}, "zstd_level"),
        ({"memory_budget_bytes": 0}, "memory_budget_bytes"),
        ({"dictionary": "some"}, "dictionary"),
        ({"on_bad_rows": "drop"}, "on_bad_rows"),
        ({"engine": "flink"}, "engine"),
        ({"start": "2026-11-01T00:30:00"}, "start"),
        ({"end": "yesterday"}, "end"),
        ({"start": "2026-11-01/05", "end": "2026-11-01/04"}, "end"),
    ]
    for kwargs, field in cases:
        with pytest.raises(ConfigError, match=field):
            config(**kwargs)
    with pytest.raises(ConfigError, match="table_dir"):
        EtlConfig(shard_dir=tmp_path, table_dir=tmp_path)


def test_spark_engine_missing_is_a_clear_config_error(
    tmp_path: Path, shard_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "recd.etl.spark", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"the .spark. extra: pip install 'pyspark"):
        etl(shard_dir, tmp_path / "table", engine="spark")


def test_cli_runs_and_writes_the_report(
    tmp_path: Path, shard_dir: Path, rows: pa.Table, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="recd")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "etl",
            str(shard_dir),
            "--table",
            str(tmp_path / "table"),
            "--row-group-rows",
            "64",
            "--zstd-level",
            "5",
            "--memory-budget",
            "0.05",
            "--target-file-mb",
            "0.005",
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert f"rows in {rows.num_rows}" in out and "partitions" in out and "rows/s" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["rows_out"] == rows.num_rows
    assert report["peak_rss_bytes"] > 0 and report["bytes_out"] > 0
    assert max(report["passes_per_shard"].values()) > 1
    assert report["files"] > report["partitions"]  # 5 KiB files roll over


def test_passes_come_from_the_manifest_when_it_lists_decoded_sizes(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    budget = 10 * 2**20
    assert (
        max(etl(shard_dir, tmp_path / "a", memory_budget_bytes=budget).passes_per_shard.values())
        == 1
    )
    shards = [{"shard": k, "uncompressed_bytes": 40 * 2**20, "blocks": 5} for k in range(3)]
    (shard_dir / "_manifest.json").write_text(json.dumps({"key": "session", "shards": shards}))
    report = etl(shard_dir, tmp_path / "b", memory_budget_bytes=budget, workers=1)
    # ceil(3.0 x 40 MiB / 7.5 MiB): a quarter of the budget goes to the write buffers.
    assert set(report.passes_per_shard.values()) == {16}
    assert all_rows(tmp_path / "b").equals(rows.sort_by(REQUEST_ID))
    # The passes do not depend on the workers (nor does the output).
    report = etl(shard_dir, tmp_path / "c", memory_budget_bytes=budget, workers=2)
    assert set(report.passes_per_shard.values()) == {16}
    assert all_rows(tmp_path / "c").equals(rows.sort_by(REQUEST_ID))


def test_dedup_layout_decodes_to_the_plain_tables_rows_under_a_memory_budget(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    # Several passes per shard, early flushes and rolled files: row groups of every size.
    kwargs: dict[str, Any] = {
        "row_group_rows": 64,
        "memory_budget_bytes": 50_000,
        "target_file_bytes": 5_000,
    }
    plain = etl(shard_dir, tmp_path / "plain", **kwargs)
    every = load_catalogue("tiny").sparse_names
    kwargs_dedup = {**kwargs, "layout": "dedup", "dedup_features": every}
    report = etl(shard_dir, tmp_path / "dedup", **kwargs_dedup)
    assert report.layout == "dedup" and report.encoded_features == every
    assert set(report.stored_id_fraction) == set(load_catalogue("tiny").sparse_names)
    assert report.rows_out == plain.rows_out == rows.num_rows
    # Partition by partition (files roll by their bytes, and the dedup layout's are smaller)
    ours: dict[str, list[pa.Table]] = {}
    for rel, path, _ in read_committed(tmp_path / "dedup", decode=False):
        ours.setdefault(rel, []).append(as_nullable(read_plain(str(path))))
    theirs: dict[str, list[pa.Table]] = {}
    for rel, _, table in read_committed(tmp_path / "plain"):
        theirs.setdefault(rel, []).append(table)
    assert list(ours) == list(theirs)
    for rel, tables in ours.items():
        assert pa.concat_tables(tables).equals(pa.concat_tables(theirs[rel])), rel
    # A re-run writes the same bytes.
    again = etl(shard_dir, tmp_path / "again", **kwargs_dedup)
    first = read_committed(tmp_path / "dedup", decode=False)
    second = read_committed(tmp_path / "again", decode=False)
    assert again.encoded_features == report.encoded_features
    assert [p.read_bytes() for _, p, _ in first] == [p.read_bytes() for _, p, _ in second]


def test_cli_layout_dedup_and_an_unknown_dedup_feature(
    tmp_path: Path, shard_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from recd.cli import main

    table = str(tmp_path / "table")
    assert main(["etl", str(shard_dir), "--table", table, "--layout", "dedup"]) == 0
    assert "dedup layout" in capsys.readouterr().out
    code = main(
        ["etl", str(shard_dir), "--table", table, "--layout", "dedup", "--dedup-features", "nope"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "'nope' is not a sparse feature" in err[0]
    code = main(["etl", str(shard_dir), "--table", table, "--dedup-features", "user_static"])
    assert code == 2 and "only used with layout 'dedup'" in capsys.readouterr().err
