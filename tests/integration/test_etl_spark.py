"""The Spark engine (local mode) against the embedded engine on the same real shards.

Shards come from the real generator and sharder (tiny profile, session key). One SparkSession
(local[2]) serves the whole module; every test runs a real Spark job that writes a real table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import zstandard

pyspark = pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("the Spark engine needs Java (not on PATH)", allow_module_level=True)

from pyspark.sql import SparkSession  # noqa: E402

from recd.cli.etl import register  # noqa: E402
from recd.errors import BadRowError  # noqa: E402
from recd.etl.config import EtlConfig, EtlReport  # noqa: E402
from recd.etl.local import run_etl  # noqa: E402
from recd.etl.spark import (  # noqa: E402
    FAIL_ONCE_ENV,
    default_output_partitions,
    iter_unit_frames,
    plan_units,
    run_spark_etl,
    spark_schema,
)
from recd.etl.validate import iter_frames  # noqa: E402
from recd.logs.generate import generate_logs  # noqa: E402
from recd.logs.rawlog import (  # noqa: E402
    encode_block,
    iter_shard,
    read_catalogue,
    shard_path,
    write_frame,
)
from recd.logs.shard import shard_logs  # noqa: E402
from recd.schema import (  # noqa: E402
    REQUEST_ID,
    SESSION_ID,
    TS,
    Catalogue,
    catalogue_from_schema,
    check_schema,
    load_catalogue,
)
from recd.table.hive import COMMIT_DELAY_ENV, QUARANTINE_DIR  # noqa: E402
from recd.table.layout import layout_of  # noqa: E402
from recd.table.partitions import MS_PER_HOUR, Partition  # noqa: E402
from recd.table.snapshot import committed_files  # noqa: E402
from recd.tensors.stacked import read_plain  # noqa: E402
from tests.spark_session import light_local_spark, restore_pyspark_python  # noqa: E402

try:  # tests/ is a package (tests/__init__.py) or pytest put tests/ itself on sys.path
    from tests.unit.etl_shards import (
        all_rows,
        as_nullable,
        is_clustered,
        read_committed,
        session_runs,
    )
except ModuleNotFoundError:
    from unit.etl_shards import (  # type: ignore[no-redef]
        all_rows,
        as_nullable,
        is_clustered,
        read_committed,
        session_runs,
    )

pytestmark = [pytest.mark.spark, pytest.mark.slow]

NUM_SHARDS = 3
UNIT_BYTES = 10_000  # two or three read units per shard on the tiny profile


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One light local Spark for the test session: 2 cores, no UI, no Hive, small shuffles.

    ``local[2,2]``: a failed task is retried once, as a cluster would (the retry test needs it).

    PySpark starts its Python workers with $PYSPARK_PYTHON (read when the context starts), so
    it must name this interpreter (the one with recd installed), not python3 from PATH.
    """
    session, saved = light_local_spark("local[2,2]", "recd-tests")
    yield session
    session.stop()
    restore_pyspark_python(saved)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, tiny_catalogue: Catalogue) -> Path:
    root = tmp_path_factory.mktemp("spark-shards")
    generate_logs(tiny_catalogue, root / "raw", seed=11, show_progress=False)
    shard_logs(
        root / "raw",
        root / "shards",
        key="session",
        num_shards=NUM_SHARDS,
        block_bytes=4096,
        show_progress=False,
    )
    return root / "shards"


def config(shard_dir: Path, table_dir: Path, **kwargs: Any) -> EtlConfig:
    return EtlConfig(shard_dir=shard_dir, table_dir=table_dir, show_progress=False, **kwargs)


@pytest.fixture(scope="module")
def local_clustered(
    tmp_path_factory: pytest.TempPathFactory, shards: Path
) -> tuple[Path, EtlReport]:
    table = tmp_path_factory.mktemp("local") / "table"
    return table, run_etl(config(shards, table, row_group_rows=50))


def test_units_cover_every_frame_once(shards: Path) -> None:
    paths = sorted(shards.glob("shard-*.zst"))
    units = plan_units(paths, unit_bytes=UNIT_BYTES)
    assert len(units) > len(paths), "the tiny shards should split into several units"
    for path in paths:
        expected = [(f.index, f.offset, f.data) for f in iter_frames(path)]
        got = [
            (f.index, f.offset, f.data)
            for u in units
            if u.path == str(path.absolute())
            for f in iter_unit_frames(u)
        ]
        assert got == expected
    assert [u.index for u in units] == list(range(len(units)))
    assert len(plan_units(paths, unit_bytes=None)) == len(paths)


def test_spark_schema_maps_the_catalogue_types(tiny_catalogue: Catalogue) -> None:
    schema = spark_schema(tiny_catalogue.arrow_schema())
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    assert types[SESSION_ID] == types[TS] == "bigint"
    assert types["item_price"] == types["label"] == "float"
    assert types["user_history"] == "array<bigint>"
    assert all(f.nullable for f in schema.fields)


def test_clustered_table_matches_the_local_engine(
    spark: SparkSession,
    shards: Path,
    tmp_path: Path,
    local_clustered: tuple[Path, EtlReport],
    tiny_catalogue: Catalogue,
) -> None:
    local_table, local = local_clustered
    table = tmp_path / "table"
    report = run_spark_etl(
        config(shards, table, row_group_rows=50),
        spark=spark,
        unit_bytes=UNIT_BYTES,
        output_partitions=2,
    )
    assert report.engine == "spark" and report.clustered
    # The same multiset of rows (full content; request_id is unique) and the same partitions.
    assert all_rows(table).equals(all_rows(local_table))
    assert report.rows_per_partition == local.rows_per_partition
    assert report.rows_in == report.rows_out == report.rows_read == local.rows_in > 0
    assert report.rows_quarantined == 0 and report.quarantine_dir is None
    assert report.encodings == local.encodings  # same sample, same plan
    files = read_committed(table)
    assert report.files == len(files) and report.partitions == len(report.rows_per_partition)
    assert report.bytes_out == sum(p.stat().st_size for _, p, _ in files)
    assert report.seconds > 0 and report.rows_per_s > 0
    seen: dict[tuple[str, int], Path] = {}
    for relpath, path, rows in files:
        assert is_clustered(rows), f"{path}: not sorted by (session_id, ts, request_id)"
        assert session_runs(rows) == pc.count_distinct(rows.column(SESSION_ID)).as_py(), path
        for session in pc.unique(rows.column(SESSION_ID)).to_pylist():
            assert (relpath, session) not in seen, f"session {session} in two files of {relpath}"
            seen[(relpath, session)] = path
        hours = np.unique(rows.column(TS).to_numpy() // MS_PER_HOUR)
        assert [Partition.from_hour_id(int(h)).relpath for h in hours] == [relpath]
        meta = pq.read_metadata(path)
        assert all(meta.row_group(i).num_rows <= 50 for i in range(meta.num_row_groups))
        assert meta.row_group(0).column(0).compression == "ZSTD"
        schema = pq.read_schema(path)
        check_schema(schema, tiny_catalogue, source=str(path))  # exact types: list<int64>...
        assert schema.remove_metadata().equals(tiny_catalogue.table_schema().remove_metadata())
        assert catalogue_from_schema(schema).to_json() == tiny_catalogue.to_json()
    assert_only_committed_files_on_disk(table)
    assert report.table_format == "iceberg" and report.snapshot_id is not None
    dataset = ds.dataset(table, format="parquet", partitioning="hive")
    assert dataset.count_rows() == report.rows_out
    assert catalogue_from_schema(dataset.schema).to_json() == tiny_catalogue.to_json()
    assert dataset.schema.field("user_history").type.equals(
        pa.list_(pa.field("item", pa.int64(), nullable=False))
    )
    assert not [p.name for p in table.iterdir() if p.name.startswith(("_tmp", "_trash"))]


def test_day_partitions_match_the_local_engine(
    spark: SparkSession, shards: Path, tmp_path: Path
) -> None:
    local = run_etl(config(shards, tmp_path / "local", row_group_rows=50, partition_by="day"))
    report = run_spark_etl(
        config(shards, tmp_path / "spark", row_group_rows=50, partition_by="day"),
        spark=spark,
        unit_bytes=UNIT_BYTES,
        output_partitions=2,
    )
    assert report.partition_by == local.partition_by == "day"
    assert report.rows_per_partition == local.rows_per_partition
    assert all(relpath.count("/") == 0 for relpath in report.rows_per_partition)
    assert all_rows(tmp_path / "spark").equals(all_rows(tmp_path / "local"))
    for partition, files in committed_files(tmp_path / "spark").partitions:
        assert partition.hour is None and len(files) == 2
        for path in files:
            assert path.parent == tmp_path / "spark" / partition.relpath
            rows = pq.read_table(path)
            assert is_clustered(rows), path
            days = np.unique(rows.column(TS).to_numpy() // (24 * MS_PER_HOUR))
            assert [Partition.from_unit_id(int(d), "day") for d in days] == [partition]


def plain_rows(table_dir: Path) -> pa.Table:
    """Every committed row of a table of either layout, decoded to the plain form."""
    tables = [read_plain(str(path)) for _, path, _ in read_committed(table_dir, decode=False)]
    return as_nullable(pa.concat_tables(tables)).sort_by(REQUEST_ID)


def test_dedup_layout_holds_the_local_engines_rows(
    spark: SparkSession,
    shards: Path,
    tmp_path: Path,
    local_clustered: tuple[Path, EtlReport],
) -> None:
    local_plain, _ = local_clustered
    every = read_catalogue(shards).sparse_names
    options: dict[str, Any] = {"row_group_rows": 50, "layout": "dedup", "dedup_features": every}
    local = run_etl(config(shards, tmp_path / "local", **options))
    report = run_spark_etl(
        config(shards, tmp_path / "spark", **options),
        spark=spark,
        unit_bytes=UNIT_BYTES,
        output_partitions=2,
    )
    # The same sample, the same measured fractions; the files differ (Spark writes one file per
    # task and hour, so its row groups, where sequences restart, fall elsewhere): the rows
    # they decode to are the same, and the same as the plain table's.
    assert report.layout == local.layout == "dedup"
    assert report.encoded_features == local.encoded_features == every
    assert report.stored_id_fraction == local.stored_id_fraction
    expected = all_rows(local_plain)
    assert plain_rows(tmp_path / "spark").equals(expected)
    assert plain_rows(tmp_path / "local").equals(expected)
    for _, path, _ in read_committed(tmp_path / "spark", decode=False):
        encoded = layout_of(pq.read_schema(path), source=str(path)).encoded
        assert encoded == tuple(report.encoded_features), path


def partition_rows(table_dir: Path) -> dict[str, pa.Table]:
    """Each committed partition's rows: its files concatenated in name order."""
    files: dict[str, list[pa.Table]] = {}
    for relpath, _, rows in read_committed(table_dir):
        files.setdefault(relpath, []).append(rows)
    return {relpath: pa.concat_tables(tables) for relpath, tables in files.items()}


def test_baseline_partitions_hold_the_local_engines_rows_in_order(
    spark: SparkSession, shards: Path, tmp_path: Path
) -> None:
    local_report = run_etl(config(shards, tmp_path / "local", baseline=True))
    assert local_report.files == local_report.partitions  # one file per partition
    # Two write tasks, each a contiguous run of shards: two files per hour.
    report = run_spark_etl(
        config(shards, tmp_path / "spark", baseline=True), spark=spark, output_partitions=2
    )
    assert not report.clustered
    assert report.partitions < report.files <= 2 * report.partitions
    local = partition_rows(tmp_path / "local")
    ours = partition_rows(tmp_path / "spark")
    assert ours.keys() == local.keys()
    for relpath, rows in ours.items():
        # Shard after shard, each in arrival order, over the files in name order.
        assert rows.equals(local[relpath]), f"{relpath}: not the local engine's arrival order"
    assert not all(is_clustered(t) for t in ours.values())  # the input really was interleaved


def test_a_requests_candidates_keep_their_order(spark: SparkSession, tmp_path: Path) -> None:
    """Impression logs: a request's candidate rows share session, ts and request_id; both
    engines keep them together and in their logged order (``position`` 0, 1, ...): the local
    engine by a stable sort, Spark by ``_seq``, the input order, as the last sort key (its
    sort makes no promise for equal keys)."""
    catalogue = load_catalogue("impressions")
    generate_logs(catalogue, tmp_path / "raw", seed=3, num_sessions=60, show_progress=False)
    shard_logs(
        tmp_path / "raw",
        tmp_path / "shards",
        key="session",
        num_shards=2,
        block_bytes=8192,
        show_progress=False,
    )
    run_spark_etl(
        config(tmp_path / "shards", tmp_path / "table"),
        spark=spark,
        unit_bytes=UNIT_BYTES,
        output_partitions=2,
    )
    run_etl(config(tmp_path / "shards", tmp_path / "local"))
    for root in (tmp_path / "table", tmp_path / "local"):
        for _, path, rows in read_committed(root):
            request = rows.column("request_id").to_numpy()
            position = rows.column("position").to_numpy()
            starts = np.flatnonzero(np.r_[True, request[1:] != request[:-1]])
            sizes = np.diff(np.r_[starts, len(request)])
            expected = np.arange(len(request)) - np.repeat(starts, sizes)
            assert np.array_equal(position, expected), f"{path}: candidates out of list order"
            assert len(np.unique(request)) == len(starts), f"{path}: a request split in two"


def test_default_output_partitions_aim_at_the_target_file_size() -> None:
    gib = 1 << 30

    def partitions(target_file_bytes: int, decoded_bytes: int = 48 * gib) -> int:
        # 48 GiB decoded over 24 hours, files 1/6 of decoded: 341 MiB of files per hour.
        return default_output_partitions(
            decoded_bytes=decoded_bytes,
            parquet_fraction=1 / 6,
            hours=24,
            target_file_bytes=target_file_bytes,
        )

    assert partitions(256 << 20) == 2
    assert partitions(100 << 20) == 4
    assert partitions(4 * gib) == 1
    assert partitions(1, decoded_bytes=0) == 1


def bad_shard_dir(tmp_path: Path, shards: Path, *, kinds: str) -> Path:
    """A copy of ``shards`` plus shard-0003.zst holding bad input of the given kinds."""
    directory = tmp_path / "bad-shards"
    shutil.copytree(shards, directory)
    good = next(iter_shard(shard_path(shards, 0))).batch.slice(0, 8)
    blocks = [good]
    if "rows" in kinds:
        ts = good.column(TS).to_pylist()
        ts[2] = None
        ts[5] = 10**15  # ms in the year 33658: wrong unit
        sessions = good.column(SESSION_ID).to_pylist()
        sessions[6] = None
        bad = good.set_column(good.schema.get_field_index(TS), TS, pa.array(ts, pa.int64()))
        idx = bad.schema.get_field_index(SESSION_ID)
        bad = bad.set_column(idx, SESSION_ID, pa.array(sessions, pa.int64()))
        history = good.column("user_history").to_pylist()
        history[3] = [1, None]  # a null id: the table would stop every reader at this row
        idx = bad.schema.get_field_index("user_history")
        blocks.append(
            bad.set_column(idx, "user_history", pa.array(history, bad.schema.field(idx).type))
        )
    if "block" in kinds:
        blocks.append(good.append_column("surprise", pa.array(np.zeros(8, np.int64))))
    blocks.append(good)
    path = shard_path(directory, 3)
    with path.open("wb") as f:
        for batch in blocks:
            write_frame(f, encode_block(batch, zstandard.ZstdCompressor()))
        if "frame" in kinds:
            f.write((1000).to_bytes(8, "little") + b"\x28\xb5\x2f\xfd" + b"\0" * 20)
    return directory


def assert_only_committed_files_on_disk(table: Path) -> None:
    """The table's directories hold exactly the files of its (only) snapshot."""
    committed = committed_files(table)
    assert committed.table_format == "iceberg" and committed.files
    on_disk = sorted(table.glob("ds=*/hour=*/*"))
    assert on_disk == sorted(committed.files)


def test_bad_row_fails_with_the_local_engines_error(
    spark: SparkSession, shards: Path, tmp_path: Path
) -> None:
    bad = bad_shard_dir(tmp_path, shards, kinds="rows")
    with pytest.raises(BadRowError) as local_error:
        run_etl(config(bad, tmp_path / "local"))
    with pytest.raises(BadRowError) as spark_error:
        run_spark_etl(config(bad, tmp_path / "spark"), spark=spark, unit_bytes=UNIT_BYTES)
    message = str(spark_error.value)
    assert message == str(local_error.value)
    assert "shard-0003.zst: block 1: row 2: field 'ts': ts is null" in message
    assert committed_files(tmp_path / "spark").files == []  # nothing visible
    assert [p.name for p in (tmp_path / "spark").iterdir()] == ["_etl.lock"]


def test_quarantine_counts_and_keeps_what_the_local_engine_does_despite_retries(
    spark: SparkSession,
    shards: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bad = bad_shard_dir(tmp_path, shards, kinds="rows block frame")
    local = run_etl(config(bad, tmp_path / "local", on_bad_rows="quarantine"))
    # The read task of the bad shard fails once after writing its quarantine, write task 0
    # after its first file: Spark retries them; counts, quarantine and files stay exactly once.
    markers = tmp_path / "fail-once"
    markers.mkdir()
    monkeypatch.setenv(FAIL_ONCE_ENV, str(markers))
    report = run_spark_etl(
        config(bad, tmp_path / "spark", on_bad_rows="quarantine"),
        spark=spark,
        unit_bytes=UNIT_BYTES,
    )
    units = plan_units(sorted(bad.glob("shard-*.zst")), unit_bytes=UNIT_BYTES)
    assert units[-1].path.endswith("shard-0003.zst")
    retried = sorted(p.name for p in markers.iterdir())
    assert retried == [f"read-{units[-1].name}", "write-task-00000"]
    counts = ["rows_read", "rows_in", "rows_out", "rows_quarantined"]
    counts += ["blocks_quarantined", "frames_quarantined", "rows_per_partition"]
    counts += ["rows_quarantined_by_field"]
    assert {k: getattr(report, k) for k in counts} == {k: getattr(local, k) for k in counts}
    assert (report.rows_quarantined, report.blocks_quarantined, report.frames_quarantined) == (
        4 + 8,
        1,
        1,
    )
    assert report.rows_quarantined_by_field == {SESSION_ID: 1, TS: 2, "user_history": 1}
    assert report.rows_in == report.rows_out + report.rows_quarantined
    assert report.files == report.partitions  # default output size: one file per hour here
    assert all_rows(tmp_path / "spark").equals(all_rows(tmp_path / "local"))
    assert report.quarantine_dir is not None and local.quarantine_dir is not None
    ours, theirs = Path(report.quarantine_dir), Path(local.quarantine_dir)
    assert ours.parent == tmp_path / "spark" / QUARANTINE_DIR
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir())
    assert pq.read_table(ours / "rows.parquet").equals(pq.read_table(theirs / "rows.parquet"))
    summary = json.loads((ours / "_summary.json").read_text())
    assert summary == json.loads((theirs / "_summary.json").read_text())
    reasons = pq.read_table(ours / "rows.parquet").column("_field").to_pylist()
    assert sorted(reasons) == [SESSION_ID, TS, TS, "user_history"]
    table = tmp_path / "spark"
    assert_only_committed_files_on_disk(table)  # no leftovers of the failed attempts
    assert [p.name for p in table.glob("ds=*/hour=*/*") if p.name.startswith(".")] == []


def test_cli_engine_spark_with_a_window(
    spark: SparkSession, shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="recd")
    register(parser.add_subparsers(dest="command"))
    table = tmp_path / "table"
    argv = ["etl", str(shards), "--table", str(table), "--engine", "spark", "--no-progress"]
    argv += ["--start", "2026-11-01/01", "--end", "2026-11-01T02:00:00"]
    argv += ["--target-file-mb", "0.01"]  # ~10 KB files: the hour is spread over several tasks
    args = parser.parse_args([*argv, "--json", str(tmp_path / "r.json")])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["engine"] == "spark" and "rows/s" in out
    assert list(report["rows_per_partition"]) == ["ds=2026-11-01/hour=01"]
    assert report["files"] > 1
    assert report["rows_out"] == report["rows_in"] > 0 and report["rows_outside_window"] > 0
    assert report["rows_read"] == report["rows_in"] + report["rows_outside_window"]
    hours = all_rows(table).column(TS).to_numpy() // MS_PER_HOUR
    assert len(hours) == report["rows_out"]
    assert {Partition.from_hour_id(int(h)).relpath for h in hours} == {"ds=2026-11-01/hour=01"}
    assert SparkSession.getActiveSession() is spark  # the active session was used, not stopped


def test_spark_driver_killed_before_its_commit_leaves_the_table_as_it_was(
    spark: SparkSession, shards: Path, tmp_path: Path
) -> None:
    """A real `recd etl --engine spark` process SIGKILLed after its executors wrote every file
    but before the driver's Iceberg commit: readers see the previous run whole; a rerun
    commits every row once and removes the killed run's files."""
    table = tmp_path / "table"
    run_etl(config(shards, table, baseline=True))
    before = committed_files(table)
    argv = [sys.executable, "-m", "recd", "etl", str(shards), "--table", str(table)]
    argv += ["--engine", "spark", "--row-group-rows", "50", "--no-progress"]
    env = {**os.environ, COMMIT_DELAY_ENV: "120", "RECD_PROGRESS": "0"}
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while len(list(table.glob("ds=*/hour=*/*.parquet"))) <= len(before.files):
            assert child.poll() is None, child.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "the Spark run never reached its commit"
            time.sleep(0.1)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert committed_files(table) == before
    old_rows = all_rows(table)
    report = run_spark_etl(config(shards, table), spark=spark, unit_bytes=UNIT_BYTES)
    assert report.rows_out == report.rows_in == old_rows.num_rows
    assert all_rows(table).equals(old_rows)
    on_disk = {p.name.split("-")[1] for p in table.glob("ds=*/hour=*/*.parquet")}
    runs = {p.name.split("-")[1] for p in [*before.files, *committed_files(table).files]}
    assert on_disk == runs, "files of the killed run were left behind"
