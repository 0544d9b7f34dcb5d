"""A real ETL process SIGKILLed mid-run leaves nothing partial visible; a re-run completes.

Iceberg tables (the default) show a killed run not at all: a reader sees the table exactly as
before the run. Hive-layout tables commit hour by hour: each partition is old or new.

The child slows down deterministically through the documented test hooks
``RECD_ETL_TEST_SHARD_DELAY_S`` (sleep after each shard pass is staged) and
``RECD_ETL_TEST_COMMIT_DELAY_S`` (Hive: sleep before each partition is renamed into place;
Iceberg: between moving the run's files into the partition directories and the commit). It writes
row groups of ROW_GROUP_ROWS rows, so that the partitions' files (open across all shards) are
being written while shards are still read: the first kill hits half-written Parquet files.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

try:  # tests/ is a package (tests/__init__.py) or pytest put tests/ itself on sys.path
    from tests.unit.etl_shards import (
        MS_PER_HOUR,
        all_rows,
        make_rows,
        read_committed,
        sessions_clustered,
        write_shards,
    )
except ModuleNotFoundError:
    from unit.etl_shards import (  # type: ignore[no-redef]
        MS_PER_HOUR,
        all_rows,
        make_rows,
        read_committed,
        sessions_clustered,
        write_shards,
    )

from recd.etl.config import EtlConfig
from recd.etl.local import SHARD_DELAY_ENV, run_etl
from recd.schema import REQUEST_ID, TS, Catalogue
from recd.table.hive import (
    COMMIT_DELAY_ENV,
    STAGING_PREFIX,
    SUCCESS_FILE,
    TRASH_PREFIX,
    list_committed_partitions,
    verify_partition,
)
from recd.table.iceberg import load_table, referenced_paths
from recd.table.partitions import iter_partition_dirs
from recd.table.snapshot import committed_files

ROW_GROUP_ROWS = 16
CHILD = f"""
import sys
from pathlib import Path
from recd.etl.config import EtlConfig
from recd.table.iceberg import load_table, referenced_paths
from recd.etl.local import run_etl
engine = sys.argv[4] if len(sys.argv) > 4 else "local"
if engine == "spark":  # a light local Spark (the engine uses the active session), as in
    from pyspark.sql import SparkSession  # tests/integration/test_etl_spark.py
    (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
     .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
     .config("spark.driver.memory", "512m")
     .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
     .getOrCreate())
print("ready", flush=True)  # the kill campaign times its kills from here, past start-up
run_etl(EtlConfig(shard_dir=Path(sys.argv[1]), table_dir=Path(sys.argv[2]), show_progress=False,
                  row_group_rows={ROW_GROUP_ROWS}, table_format=sys.argv[3], engine=engine))
print("finished")
"""


@pytest.fixture()
def rows(tiny_catalogue: Catalogue) -> pa.Table:
    return make_rows(
        tiny_catalogue, num_sessions=80, mean_samples=5.0, duration_ms=6 * MS_PER_HOUR, seed=11
    )


@pytest.fixture()
def shard_dir(tmp_path: Path, tiny_catalogue: Catalogue, rows: pa.Table) -> Path:
    write_shards(tmp_path / "shards", tiny_catalogue, rows, num_shards=6, block_rows=32)
    return tmp_path / "shards"


def start_child(
    shard_dir: Path,
    table: Path,
    env: dict[str, str],
    table_format: str = "hive",
    engine: str = "local",
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(shard_dir), str(table), table_format, engine],
        env={**os.environ, "RECD_PROGRESS": "0", "PYSPARK_PYTHON": sys.executable, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def kill_when(
    child: subprocess.Popen[bytes], ready: Callable[[], bool], *, after_s: float = 0.0
) -> None:
    deadline = time.monotonic() + 60
    while not ready():
        assert child.poll() is None, f"child ended early: {child.communicate()}"
        assert time.monotonic() < deadline, "child never reached the kill point"
        time.sleep(0.02)
    time.sleep(after_s)
    assert child.poll() is None, "child finished before the kill"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


def wait_ready(child: subprocess.Popen[bytes]) -> float:
    """Block until the child prints ``ready`` (its engine is up); the monotonic time then."""
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip() == b"ready", f"child ended before it was ready: {child.communicate()}"
    return time.monotonic()


def assert_no_partial_partition(table: Path, rows: pa.Table) -> None:
    """Every visible partition is complete: _SUCCESS present and matching, rows of its hour."""
    hours = rows.column(TS).to_numpy() // MS_PER_HOUR
    for partition, path in iter_partition_dirs(table):
        assert (path / SUCCESS_FILE).is_file(), f"{path} visible without {SUCCESS_FILE}"
        verify_partition(path)
        got = pa.concat_tables(t for rel, _, t in read_committed(table) if rel == partition.relpath)
        expected = rows.filter(pa.array(hours == partition.hour_id)).sort_by(REQUEST_ID)
        assert got.replace_schema_metadata(None).sort_by(REQUEST_ID).equals(expected), path


def rerun_completes(
    shard_dir: Path, table: Path, rows: pa.Table, table_format: str = "hive"
) -> None:
    report = run_etl(
        EtlConfig(
            shard_dir=shard_dir,
            table_dir=table,
            show_progress=False,
            row_group_rows=ROW_GROUP_ROWS,
            table_format=table_format,
        )
    )
    assert report.rows_out == report.rows_in == rows.num_rows
    assert all_rows(table).equals(rows.sort_by(REQUEST_ID))
    assert all(sessions_clustered(t) for _, _, t in read_committed(table))
    if table_format == "hive":
        assert_no_partial_partition(table, rows)
    assert not list(table.glob(f"{STAGING_PREFIX}*")) and not list(
        table.glob(f"ds=*/{TRASH_PREFIX}*")
    )


def test_kill_while_staging_shards_leaves_nothing_visible(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    table = tmp_path / "table"
    child = start_child(shard_dir, table, {SHARD_DELAY_ENV: "0.3"})
    # A staged file exists after the first shard; five more shards (>= 1.5 s) keep it open.
    staged = f"{STAGING_PREFIX}*/ds=*/hour=*/part-00000.parquet"
    kill_when(child, lambda: any(table.glob(staged)))
    assert list(table.glob(f"{STAGING_PREFIX}*")), "the kill should leave a staging dir behind"
    assert list_committed_partitions(table) == []
    assert list(iter_partition_dirs(table)) == []
    rerun_completes(shard_dir, table, rows)


def markers(table: Path) -> dict[str, bytes]:
    return {p.relpath: (path / SUCCESS_FILE).read_bytes() for p, path in iter_partition_dirs(table)}


def test_kill_mid_commit_over_an_old_table_leaves_each_partition_old_or_new(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    table = tmp_path / "table"
    baseline = run_etl(
        EtlConfig(
            shard_dir=shard_dir,
            table_dir=table,
            baseline=True,
            show_progress=False,
            table_format="hive",
        )
    )
    assert baseline.partitions >= 5
    old = markers(table)
    child = start_child(shard_dir, table, {COMMIT_DELAY_ENV: "0.5"}, "hive")
    staged_success = f"{STAGING_PREFIX}*/ds=*/hour=*/{SUCCESS_FILE}"
    kill_when(child, lambda: any(table.glob(staged_success)), after_s=0.7)
    assert_no_partial_partition(table, rows)
    after_kill = markers(table)
    rerun_completes(shard_dir, table, rows)
    new = markers(table)
    assert set(new) == set(old)
    replaced = {rel for rel, marker in after_kill.items() if marker != old[rel]}
    assert all(after_kill[rel] == new[rel] for rel in replaced), (
        "a partition is neither old nor new"
    )
    assert replaced, "no partition of the killed run was committed"
    assert len(replaced) < len(old), "the killed run committed everything"


def test_kill_mid_commit_of_a_fresh_table_then_rerun(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    table = tmp_path / "table"
    child = start_child(shard_dir, table, {COMMIT_DELAY_ENV: "0.5"})
    kill_when(child, lambda: bool(list_committed_partitions(table)))
    committed = list_committed_partitions(table)
    assert 1 <= len(committed) < len(set((rows.column(TS).to_numpy() // MS_PER_HOUR).tolist()))
    assert_no_partial_partition(table, rows)
    rerun_completes(shard_dir, table, rows)


# ------------------------------------------------------------------------------ Iceberg
def run_tags(table: Path) -> set[str]:
    """The run tags (``part-<tag>-NNNNN``) of the files a reader sees now."""
    return {p.name.split("-")[1] for p in committed_files(table).files}


def test_iceberg_kill_while_staging_leaves_nothing_visible(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    table = tmp_path / "table"
    child = start_child(shard_dir, table, {SHARD_DELAY_ENV: "0.3"}, "iceberg")
    staged = f"{STAGING_PREFIX}*/ds=*/hour=*/part-00000.parquet"
    kill_when(child, lambda: any(table.glob(staged)))
    assert committed_files(table).files == []
    rerun_completes(shard_dir, table, rows, "iceberg")


def test_iceberg_kill_between_files_and_commit_shows_the_old_run_whole(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    table = tmp_path / "table"
    run_etl(EtlConfig(shard_dir=shard_dir, table_dir=table, baseline=True, show_progress=False))
    before = committed_files(table)
    child = start_child(shard_dir, table, {COMMIT_DELAY_ENV: "30"}, "iceberg")
    # Files moved into the partition directories, beside the old ones, not yet committed.
    kill_when(child, lambda: len(list(table.glob("ds=*/hour=*/*.parquet"))) > len(before.files))
    after_kill = committed_files(table)
    assert after_kill == before, "a reader sees something of the killed run"
    assert all_rows(table).equals(rows.sort_by(REQUEST_ID))
    assert not all(sessions_clustered(t) for _, _, t in read_committed(table))  # the old run
    rerun_completes(shard_dir, table, rows, "iceberg")
    # The killed run's files were cleaned up; the old run's stay for its snapshot.
    on_disk = {p.name.split("-")[1] for p in table.glob("ds=*/hour=*/*.parquet")}
    assert on_disk == run_tags(table) | {p.name.split("-")[1] for p in before.files}


SPARK = pytest.mark.skipif(
    importlib.util.find_spec("pyspark") is None or shutil.which("java") is None,
    reason="the Spark engine needs PySpark and Java",
)


@pytest.mark.parametrize(
    "engine", ["local", pytest.param("spark", marks=[SPARK, pytest.mark.spark, pytest.mark.slow])]
)
def test_iceberg_kill_campaign_reader_never_sees_a_partial_run(
    tmp_path: Path, shard_dir: Path, rows: pa.Table, engine: str
) -> None:
    """SIGKILL at random moments of real runs (either engine; Spark: the driver process, in
    local mode) over a committed table: after every kill a reader sees exactly one whole run
    (all rows, files of one run), and a final rerun with the same engine leaves every row
    once and no leftovers."""
    table = tmp_path / "table"
    run_etl(EtlConfig(shard_dir=shard_dir, table_dir=table, baseline=True, show_progress=False))
    delays = {SHARD_DELAY_ENV: "0.05", COMMIT_DELAY_ENV: "0.3"}
    clean = start_child(shard_dir, table, delays, "iceberg", engine)
    ready_at = wait_ready(clean)
    _, err = clean.communicate(timeout=300)
    assert clean.returncode == 0, err.decode()
    duration = time.monotonic() - ready_at
    # Kill moments from the child's "ready" (past interpreter and JVM start-up, where a kill
    # tests nothing), one in each of `planned` equal slices of 90% of the clean run's ETL time
    # (later runs are often faster: warm caches), at a random point of its slice: early kills
    # hit the staging, late ones the commit. Spark pays a JVM start per attempt: fewer kills.
    planned = 10 if engine == "local" else 5
    window = duration * 0.9 / planned
    rng = random.Random(7)
    outcomes = {"killed, old run visible": 0, "killed, new run visible": 0, "finished": 0}
    kills = attempts = 0
    while kills < planned and attempts < 2 * planned + 5:
        attempts += 1
        tags_before = run_tags(table)
        child = start_child(shard_dir, table, delays, "iceberg", engine)
        wait_ready(child)
        try:
            child.wait(timeout=window * (kills + rng.random()))
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        if child.returncode == 0:
            outcomes["finished"] += 1
        else:
            assert child.returncode == -signal.SIGKILL, child.communicate()
            kills += 1
            tags = run_tags(table)
            assert len(tags) == 1, f"files of several runs visible: {tags}"
            key = "old" if tags == tags_before else "new"
            outcomes[f"killed, {key} run visible"] += 1
        assert all_rows(table).equals(rows.sort_by(REQUEST_ID)), outcomes
    print(f"kill campaign ({engine}): {outcomes}")
    assert kills >= planned, outcomes
    tags_before = run_tags(table)
    rerun = start_child(shard_dir, table, {}, "iceberg", engine)
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err.decode()[-2000:]
    assert all_rows(table).equals(rows.sort_by(REQUEST_ID))
    assert all(sessions_clustered(t) for _, _, t in read_committed(table))
    assert len(run_tags(table)) == 1 and run_tags(table) != tags_before
    assert not list(table.glob(f"{STAGING_PREFIX}*"))
    live = {p.resolve() for p in committed_files(table).files}
    referenced = referenced_paths(load_table(table))
    on_disk = {p.resolve() for p in table.glob("ds=*/hour=*/*.parquet")}
    assert live <= referenced and on_disk == referenced, "files of killed runs left behind"
