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
from recd.etl.commit import SUCCESS_FILE, list_committed_files
from recd.etl.config import EtlConfig, EtlReport
from recd.etl.local import run_etl
from recd.etl.partitions import Partition
from recd.schema import REQUEST_ID, SESSION_ID, TS, Catalogue, catalogue_from_schema

from .etl_shards import (
    MS_PER_HOUR,
    START_MS,
    all_rows,
    is_clustered,
    make_rows,
    read_committed,
    session_runs,
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
        assert is_clustered(table), path
        sessions = pc.count_distinct(table.column(SESSION_ID)).as_py()
        assert session_runs(table) == sessions, f"{path}: a session is split into several runs"
        hours = pc.divide(table.column(TS), MS_PER_HOUR).to_numpy()
        assert {Partition.from_hour_id(int(h)).relpath for h in np.unique(hours)} == {relpath}
        meta = pq.read_metadata(path)
        assert all(meta.row_group(i).num_rows <= 50 for i in range(meta.num_row_groups))
        assert meta.row_group(0).column(0).compression == "ZSTD"
        assert catalogue_from_schema(pq.read_schema(path)).name == "tiny"
    # Multiset of rows out == rows in, full content (request_id is unique).
    assert all_rows(tmp_path / "table").equals(rows.sort_by(REQUEST_ID))
    assert report.rows_in == report.rows_out == rows.num_rows
    assert report.rows_quarantined == 0
    assert sum(report.rows_per_partition.values()) == rows.num_rows
    assert report.files == len(files)


def test_a_session_lives_in_one_file_per_partition(tmp_path: Path, shard_dir: Path) -> None:
    etl(shard_dir, tmp_path / "table")
    seen: dict[tuple[str, int], Path] = {}
    for relpath, path, table in read_committed(tmp_path / "table"):
        for session in pc.unique(table.column(SESSION_ID)).to_pylist():
            assert (relpath, session) not in seen, f"session {session} in two files of {relpath}"
            seen[(relpath, session)] = path


def test_baseline_keeps_arrival_order_per_shard_and_hour(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    report = etl(shard_dir, tmp_path / "table", baseline=True)
    assert not report.clustered
    shard = shard_of_sessions(rows.column(SESSION_ID).to_numpy(), 3)
    hour = rows.column(TS).to_numpy() // MS_PER_HOUR
    files = read_committed(tmp_path / "table")
    for relpath, path, table in files:
        k = int(path.name.removeprefix("part-").removesuffix(".parquet"))
        h = Partition(ds=relpath[3:13], hour=int(relpath[-2:])).hour_id
        expected = rows.filter(pa.array((shard == k) & (hour == h)))  # input order
        assert table.replace_schema_metadata(None).equals(expected), path
    assert all_rows(tmp_path / "table").equals(rows.sort_by(REQUEST_ID))
    assert not all(is_clustered(t) for _, _, t in files)  # the input really was interleaved


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
        return {
            str(p.relative_to(table_dir)): p.read_bytes()
            for p in sorted(table_dir.glob("ds=*/hour=*/*"))
        }

    etl(shard_dir, tmp_path / "table")
    first = snapshot(tmp_path / "table")
    etl(shard_dir, tmp_path / "table")
    assert snapshot(tmp_path / "table") == first
    etl(shard_dir, tmp_path / "other")
    assert snapshot(tmp_path / "other") == first
    assert any(name.endswith(SUCCESS_FILE) for name in first)
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
        assert path.name.count("-") == 2, path.name  # part-SSSS-PP.parquet
        assert is_clustered(table)
        sessions = {(relpath, s) for s in pc.unique(table.column(SESSION_ID)).to_pylist()}
        assert not sessions & seen, "a session was split across passes"
        seen |= sessions


def test_dataset_readers_see_only_committed_rows(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    etl(shard_dir, tmp_path / "table")
    stray = tmp_path / "table" / "_tmp-crashed" / "ds=2026-11-01" / "hour=00"
    stray.mkdir(parents=True)
    pq.write_table(rows.slice(0, 5), stray / "part-0000.parquet")
    dataset = ds.dataset(tmp_path / "table", format="parquet", partitioning="hive")
    assert dataset.count_rows() == rows.num_rows
    assert sorted(dataset.files) == sorted(str(p) for p in list_committed_files(tmp_path / "table"))


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
    with pytest.raises(ConfigError, match=r"recd\[spark\]"):
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
    report = etl(shard_dir, tmp_path / "b", memory_budget_bytes=budget)
    assert set(report.passes_per_shard.values()) == {12}  # ceil(3.0 x 40 MiB / 10 MiB)
    assert all_rows(tmp_path / "b").equals(rows.sort_by(REQUEST_ID))
