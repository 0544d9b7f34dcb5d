"""Table formats on real ETL output: Iceberg snapshots, schema enforcement, migration, expiry,
reader pinning, and the `recd table` / `recd etl` / `recd run` messages on bad input."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recd.errors import ConfigError, SchemaError
from recd.etl.config import EtlConfig, EtlReport
from recd.etl.local import run_etl
from recd.pipeline import holdout_split
from recd.reader.config import ReaderConfig
from recd.reader.dataset import ResumableLoader
from recd.reader.plan import build_plan
from recd.schema import REQUEST_ID, Catalogue, load_catalogue
from recd.table.iceberg import load_table, snapshots
from recd.table.migrate import migrate_to_iceberg
from recd.table.snapshot import committed_files, table_format

from .etl_shards import MS_PER_HOUR, START_MS, all_rows, make_rows, write_shards


@pytest.fixture()
def rows(tiny_catalogue: Catalogue) -> pa.Table:
    return make_rows(tiny_catalogue, num_sessions=50, duration_ms=3 * MS_PER_HOUR, seed=3)


@pytest.fixture()
def shard_dir(tmp_path: Path, tiny_catalogue: Catalogue, rows: pa.Table) -> Path:
    write_shards(tmp_path / "shards", tiny_catalogue, rows, num_shards=2, block_rows=32)
    return tmp_path / "shards"


def etl(shard_dir: Path, table_dir: Path, **kwargs: Any) -> EtlReport:
    options: dict[str, Any] = {"row_group_rows": 40, "show_progress": False, **kwargs}
    return run_etl(EtlConfig(shard_dir=shard_dir, table_dir=table_dir, **options))


def recd(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recd", *argv], capture_output=True, text=True, check=False
    )


def test_each_run_is_one_snapshot_and_metadata_records_partitioning_and_sort(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    table = tmp_path / "table"
    first = etl(shard_dir, table)
    assert first.table_format == "iceberg" and first.snapshot_id is not None
    second = etl(shard_dir, table, start="2026-11-01/01", end="2026-11-01/02")  # one hour
    listed = snapshots(table)
    assert [s["snapshot_id"] for s in listed] == [first.snapshot_id, second.snapshot_id]
    assert [s["operation"] for s in listed] == ["append", "overwrite"]
    assert [s["run_id"] for s in listed] == [first.run_id, second.run_id]
    assert listed[-1]["current"] and listed[-1]["total_rows"] == rows.num_rows
    # The current snapshot: hour 01 from the second run, the others from the first.
    tags = {
        str(p): {f.name.split("-")[1] for f in fs} for p, fs in committed_files(table).partitions
    }
    run_tag = {first.run_id.rpartition(".")[2], second.run_id.rpartition(".")[2]}
    assert tags["ds=2026-11-01/hour=01"] == {second.run_id.rpartition(".")[2]}
    assert all(t <= run_tag and len(t) == 1 for t in tags.values())
    assert all_rows(table).equals(rows.sort_by(REQUEST_ID))
    # The first snapshot still reads as it was.
    old = committed_files(table, snapshot_id=first.snapshot_id)
    assert {f.name.split("-")[1] for f in old.files} == {first.run_id.rpartition(".")[2]}
    iceberg = load_table(table)
    assert str(iceberg.spec().fields[0].transform) == f"truncate[{MS_PER_HOUR}]"
    sort_ids = [f.source_id for f in iceberg.sort_order().fields]
    assert [iceberg.schema().find_column_name(i) for i in sort_ids] == ["session_id", "ts"]
    assert json.loads(iceberg.properties["recd.catalogue"])["name"] == "tiny"
    assert iceberg.properties["recd.table.layout"] == "plain"


def test_a_foreign_schema_is_refused_and_replaces_nothing(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    foreign = load_catalogue("clickstream")
    other = make_rows(foreign, num_sessions=20, duration_ms=3 * MS_PER_HOUR, seed=4)
    write_shards(tmp_path / "foreign", foreign, other, num_shards=2, block_rows=32)
    for table_format_ in ("iceberg", "hive"):
        table = tmp_path / table_format_
        etl(shard_dir, table, table_format=table_format_)
        before = {p: p.read_bytes() for p in committed_files(table).files}
        with pytest.raises(SchemaError, match="do not match the table's schema") as info:
            etl(tmp_path / "foreign", table)
        assert "missing columns" in str(info.value) and "nothing was committed" in str(info.value)
        after = committed_files(table)
        assert {p: p.read_bytes() for p in after.files} == before, table_format_
        assert all_rows(table).equals(rows.sort_by(REQUEST_ID))
        assert not list(table.glob("_tmp-*"))
    proc = recd("etl", str(tmp_path / "foreign"), "--table", str(tmp_path / "hive"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("recd etl: error: ")
    assert "do not match the table's schema" in proc.stderr


def test_table_format_is_kept_and_a_conflicting_request_refused(
    tmp_path: Path, shard_dir: Path
) -> None:
    etl(shard_dir, tmp_path / "hive", table_format="hive")
    assert table_format(tmp_path / "hive") == "hive"
    report = etl(shard_dir, tmp_path / "hive")  # no request: the table's own format
    assert report.table_format == "hive" and report.snapshot_id is None
    with pytest.raises(ConfigError, match="recd table migrate"):
        etl(shard_dir, tmp_path / "hive", table_format="iceberg")
    etl(shard_dir, tmp_path / "ice")
    with pytest.raises(ConfigError, match="in the iceberg format, not hive"):
        etl(shard_dir, tmp_path / "ice", table_format="hive")


def test_migrate_registers_the_hive_files_in_place(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    table = tmp_path / "table"
    etl(shard_dir, table, table_format="hive")
    files = committed_files(table).files
    content = {p: p.read_bytes() for p in files}
    result = migrate_to_iceberg(table)
    assert table_format(table) == "iceberg"
    view = committed_files(table)
    assert view.files == files and {p: p.read_bytes() for p in files} == content
    assert (result.files, result.rows, result.snapshot_id) == (
        len(files),
        rows.num_rows,
        view.snapshot_id,
    )
    assert not list(table.glob("ds=*/hour=*/_SUCCESS"))
    with pytest.raises(ConfigError, match="not a Hive-layout table"):
        migrate_to_iceberg(table)
    report = etl(shard_dir, table)  # goes on as an Iceberg table
    assert report.table_format == "iceberg"
    assert all_rows(table).equals(rows.sort_by(REQUEST_ID))


def test_expire_keeps_the_newest_snapshots_and_deletes_only_their_unlisted_files(
    tmp_path: Path, shard_dir: Path
) -> None:
    table = tmp_path / "table"
    first = etl(shard_dir, table)
    etl(shard_dir, table)
    last = etl(shard_dir, table)
    assert len(list(table.glob("ds=*/hour=*/*.parquet"))) == 3 * last.files
    proc = recd("table", "expire", str(table), "--keep", "1")
    assert proc.returncode == 0, proc.stderr
    assert "2 snapshots expired" in proc.stdout
    assert [s["snapshot_id"] for s in snapshots(table)] == [last.snapshot_id]
    assert sorted(table.glob("ds=*/hour=*/*.parquet")) == sorted(committed_files(table).files)
    with pytest.raises(ConfigError, match=f"snapshot {first.snapshot_id} is not in the table"):
        committed_files(table, snapshot_id=first.snapshot_id)


def test_a_reader_pinned_to_a_snapshot_reads_it_after_new_runs_land(
    tmp_path: Path, shard_dir: Path, tiny_catalogue: Catalogue
) -> None:
    table = tmp_path / "table"
    etl(shard_dir, table, end="2026-11-01/02")  # the first two hours
    config = ReaderConfig(table=str(table), batch_size=16)
    loader = ResumableLoader(config)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = loader.state_dict()
    pinned = loader.plan.config.snapshot
    assert state["snapshot"] == pinned is not None
    expected = [b.labels for b in batches]
    # A later run adds the third hour and rewrites the first.
    later = make_rows(tiny_catalogue, num_sessions=30, start_ms=START_MS, seed=9)
    write_shards(tmp_path / "later", tiny_catalogue, later, num_shards=2, block_rows=32)
    etl(tmp_path / "later", table)
    assert committed_files(table).snapshot_id != pinned
    with pytest.raises(ConfigError, match=f"set reader.snapshot = {pinned}"):
        ResumableLoader(config).load_state_dict(state)
    resumed = ResumableLoader(dataclasses.replace(config, snapshot=pinned))
    resumed.load_state_dict(state)
    got = [b.labels for b in resumed]
    assert len(got) == len(expected) and all(a.equal(b) for a, b in zip(got, expected, strict=True))
    assert build_plan(config).num_rows != build_plan(resumed.config).num_rows


def test_table_cli_info_snapshots_and_errors(tmp_path: Path, shard_dir: Path) -> None:
    table = tmp_path / "table"
    report = etl(shard_dir, table)
    info = recd("table", "info", str(table), "--json")
    assert info.returncode == 0, info.stderr
    body = json.loads(info.stdout)
    assert body["format"] == "iceberg" and body["snapshot_id"] == report.snapshot_id
    assert body["rows"] == report.rows_out and body["files"] == report.files
    listed = recd("table", "snapshots", str(table))
    assert listed.returncode == 0 and str(report.snapshot_id) in listed.stdout
    missing = recd("table", "info", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert (
        missing.stderr.strip()
        == f"recd table: error: {tmp_path / 'nope'}: table directory does not exist"
    )


def test_missing_input_directory_says_it_does_not_exist(tmp_path: Path) -> None:
    proc = recd("etl", str(tmp_path / "nope"), "--table", str(tmp_path / "t"), "--no-progress")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"recd etl: error: {tmp_path / 'nope'}: directory does not exist"
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ('[logs]\nprofle = "tiny"\n', "[logs] unknown key(s) profle; expected profile"),
        ('[shard]\nnum_shards = "8"\n', "[shard] num_shards = '8': expected `int`"),
        ("[etl]\nzstd_level = 2.5\n", "[etl] zstd_level = 2.5: expected `int`"),
    ],
)
def test_recd_run_config_errors_name_section_and_key(
    tmp_path: Path, section: str, expected: str
) -> None:
    path = tmp_path / "run.toml"
    path.write_text(f'[run]\nwork_dir = "{tmp_path / "work"}"\n{section}')
    proc = recd("run", "--config", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert not (tmp_path / "work").exists()


def test_parquet_files_are_unchanged_by_the_commit(tmp_path: Path, shard_dir: Path) -> None:
    """The Iceberg commit moves files, it does not rewrite them: the bytes equal a Hive run's."""
    etl(shard_dir, tmp_path / "ice")
    etl(shard_dir, tmp_path / "hive", table_format="hive")
    ice = committed_files(tmp_path / "ice").files
    hive = committed_files(tmp_path / "hive").files
    assert [p.read_bytes() for p in ice] == [p.read_bytes() for p in hive]
    assert pq.read_metadata(ice[0]).num_rows > 0


def test_day_partitions_one_directory_per_day_read_back_whole(
    tmp_path: Path, tiny_catalogue: Catalogue
) -> None:
    """A sparse log spread over three days: one partition per day, ``ds=D`` with no hour
    level, the Iceberg spec truncates ts to days, every row reads back, windows select days."""
    day = 24 * MS_PER_HOUR
    rows = make_rows(tiny_catalogue, num_sessions=60, duration_ms=3 * day - MS_PER_HOUR, seed=5)
    write_shards(tmp_path / "shards", tiny_catalogue, rows, num_shards=2, block_rows=32)
    table = tmp_path / "table"
    report = etl(tmp_path / "shards", table, partition_by="day")
    assert report.partition_by == "day" and report.partitions == 3
    assert sorted(report.rows_per_partition) == [
        "ds=2026-11-01",
        "ds=2026-11-02",
        "ds=2026-11-03",
    ]
    assert not list(table.glob("ds=*/hour=*"))
    assert sorted(p.parent.name for p in committed_files(table).files) == sorted(
        {p.parent.name for p in table.glob("ds=*/part-*.parquet")}
    )
    iceberg = load_table(table)
    assert str(iceberg.spec().fields[0].transform) == f"truncate[{day}]"
    assert iceberg.spec().fields[0].name == "day_start_ms"
    assert all_rows(table).equals(rows.sort_by(REQUEST_ID))
    # Each day's files hold exactly that day's rows, clustered by session.
    for partition, files in committed_files(table).partitions:
        got = pa.concat_tables(pq.read_table(f) for f in files)
        ts = got.column("ts").to_numpy()
        assert ((ts >= partition.start_ms) & (ts < partition.end_ms)).all()
    # A run over one day replaces that day only; the reader's windows select days.
    again = etl(tmp_path / "shards", table, start="2026-11-02", end="2026-11-03")
    assert again.partition_by == "day" and list(again.rows_per_partition) == ["ds=2026-11-02"]
    assert all_rows(table).equals(rows.sort_by(REQUEST_ID))
    window = committed_files(table, start_ms=START_MS + day, end_ms=START_MS + 2 * day)
    assert [str(p) for p, _ in window.partitions] == ["ds=2026-11-02"]
    plan = build_plan(ReaderConfig(table=str(table), batch_size=64, start="2026-11-03"))
    assert sum(u.num_rows for u in plan.units) == report.rows_per_partition["ds=2026-11-03"]
    proc = recd("table", "info", str(table), "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["partition_by"] == "day" and info["partitions"] == 3
    # recd run's [train] holdout_hours holds out whole days of a day-partitioned table.
    assert holdout_split(table, 24) == "2026-11-03T00:00:00Z"
    assert holdout_split(table, 48) == "2026-11-02T00:00:00Z"
    with pytest.raises(ConfigError, match="partitioned by day; give a multiple of 24"):
        holdout_split(table, 5)
    with pytest.raises(ConfigError, match="has 3 day partition"):
        holdout_split(table, 72)


def test_day_partitions_refused_where_they_cannot_hold(tmp_path: Path, shard_dir: Path) -> None:
    etl(shard_dir, tmp_path / "hourly")
    with pytest.raises(ConfigError, match="partitioned by hour, not day"):
        etl(shard_dir, tmp_path / "hourly", partition_by="day")
    with pytest.raises(ConfigError, match="day partitions need the iceberg table format"):
        etl(shard_dir, tmp_path / "hive", partition_by="day", table_format="hive")
    with pytest.raises(ConfigError, match="must be on a whole day"):
        etl(shard_dir, tmp_path / "daily", partition_by="day", start="2026-11-01/03")
    assert not (tmp_path / "daily").exists() or not committed_files(tmp_path / "daily").files
    with pytest.raises(ConfigError, match="partition_by must be one of hour, day"):
        etl(shard_dir, tmp_path / "weekly", partition_by="week")
    proc = recd("etl", str(shard_dir), "--table", str(tmp_path / "hourly"), "--partition-by", "day")
    assert proc.returncode == 2
    assert "partitioned by hour, not day" in proc.stderr.strip().splitlines()[-1]
