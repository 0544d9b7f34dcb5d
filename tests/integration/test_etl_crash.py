"""A real ETL process SIGKILLed mid-run leaves no visible partial partition; a re-run completes.

The child slows down deterministically through the documented test hooks
``RECD_ETL_TEST_SHARD_DELAY_S`` (sleep after each shard pass is staged) and
``RECD_ETL_TEST_COMMIT_DELAY_S`` (sleep before each partition is renamed into place). It writes
row groups of ROW_GROUP_ROWS rows, so that the partitions' files (open across all shards) are
being written while shards are still read: the first kill hits half-written Parquet files.
"""

from __future__ import annotations

import os
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

from recd.etl.commit import (
    COMMIT_DELAY_ENV,
    STAGING_PREFIX,
    SUCCESS_FILE,
    TRASH_PREFIX,
    list_committed_partitions,
    verify_partition,
)
from recd.etl.config import EtlConfig
from recd.etl.local import SHARD_DELAY_ENV, run_etl
from recd.etl.partitions import iter_partition_dirs
from recd.schema import REQUEST_ID, TS, Catalogue

ROW_GROUP_ROWS = 16
CHILD = f"""
import sys
from pathlib import Path
from recd.etl.config import EtlConfig
from recd.etl.local import run_etl
run_etl(EtlConfig(shard_dir=Path(sys.argv[1]), table_dir=Path(sys.argv[2]), show_progress=False,
                  row_group_rows={ROW_GROUP_ROWS}))
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


def start_child(shard_dir: Path, table: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(shard_dir), str(table)],
        env={**os.environ, "RECD_PROGRESS": "0", **env},
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


def assert_no_partial_partition(table: Path, rows: pa.Table) -> None:
    """Every visible partition is complete: _SUCCESS present and matching, rows of its hour."""
    hours = rows.column(TS).to_numpy() // MS_PER_HOUR
    for partition, path in iter_partition_dirs(table):
        assert (path / SUCCESS_FILE).is_file(), f"{path} visible without {SUCCESS_FILE}"
        verify_partition(path)
        got = pa.concat_tables(t for rel, _, t in read_committed(table) if rel == partition.relpath)
        expected = rows.filter(pa.array(hours == partition.hour_id)).sort_by(REQUEST_ID)
        assert got.replace_schema_metadata(None).sort_by(REQUEST_ID).equals(expected), path


def rerun_completes(shard_dir: Path, table: Path, rows: pa.Table) -> None:
    report = run_etl(
        EtlConfig(
            shard_dir=shard_dir, table_dir=table, show_progress=False, row_group_rows=ROW_GROUP_ROWS
        )
    )
    assert report.rows_out == report.rows_in == rows.num_rows
    assert all_rows(table).equals(rows.sort_by(REQUEST_ID))
    assert all(sessions_clustered(t) for _, _, t in read_committed(table))
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
        EtlConfig(shard_dir=shard_dir, table_dir=table, baseline=True, show_progress=False)
    )
    assert baseline.partitions >= 5
    old = markers(table)
    child = start_child(shard_dir, table, {COMMIT_DELAY_ENV: "0.5"})
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
