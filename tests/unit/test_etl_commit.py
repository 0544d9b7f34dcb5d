"""Atomic partition commit: staging, _SUCCESS, rename into place, crash leftovers, the lock."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recd.errors import CommitError
from recd.table.hive import (
    SUCCESS_FILE,
    TRASH_PREFIX,
    TRASH_SEPARATOR,
    clean_stale,
    commit_partitions,
    list_committed_files,
    list_committed_partitions,
    lock_table,
    read_success,
    staging_dir,
    verify_partition,
)
from recd.table.partitions import Partition

P0 = Partition(ds="2026-11-01", hour=0)
P1 = Partition(ds="2026-11-01", hour=1)


def stage(
    staging: Path, partition: Partition, values: list[int], name: str = "part-0000.parquet"
) -> None:
    directory = partition.path(staging)
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"x": pa.array(values, pa.int64())}), directory / name)


def values_of(table: Path, partition: Partition) -> list[int]:
    files = sorted(partition.path(table).glob("*.parquet"))
    return [v for f in files for v in pq.read_table(f).column("x").to_pylist()]


def test_commit_writes_success_and_replaces_old_partitions(tmp_path: Path) -> None:
    table = tmp_path / "table"
    stage(staging_dir(table, "a"), P0, [1, 2])
    stage(staging_dir(table, "a"), P0, [3], name="part-0001.parquet")
    records = commit_partitions(table, staging_dir(table, "a"), [P0], run_id="a")
    assert records[0].rows == 3 and [f.name for f in records[0].files] == [
        "part-0000.parquet",
        "part-0001.parquet",
    ]
    assert read_success(P0.path(table)) == records[0]
    assert not staging_dir(table, "a").exists()
    # A second run replaces the partition wholesale (stale part-0001 disappears) and adds P1.
    stage(staging_dir(table, "b"), P0, [7])
    stage(staging_dir(table, "b"), P1, [8, 9])
    commit_partitions(table, staging_dir(table, "b"), [P1, P0], run_id="b")
    assert values_of(table, P0) == [7] and values_of(table, P1) == [8, 9]
    assert list_committed_partitions(table) == [P0, P1]
    assert [p.name for p in list_committed_files(table)] == ["part-0000.parquet"] * 2
    assert not list(table.glob(f"ds=*/{TRASH_PREFIX}*"))
    assert verify_partition(P1.path(table)).rows == 2


def test_success_is_deterministic_and_verify_catches_tampering(tmp_path: Path) -> None:
    for run in ("a", "b"):
        stage(staging_dir(tmp_path / run, run), P0, [1, 2, 3])
        commit_partitions(tmp_path / run, staging_dir(tmp_path / run, run), [P0], run_id=run)
    marker_a = (P0.path(tmp_path / "a") / SUCCESS_FILE).read_bytes()
    assert marker_a == (P0.path(tmp_path / "b") / SUCCESS_FILE).read_bytes()
    pq.write_table(pa.table({"x": [4]}), P0.path(tmp_path / "a") / "part-0000.parquet")
    with pytest.raises(CommitError, match="differs"):
        verify_partition(P0.path(tmp_path / "a"))
    # The same size, one byte changed: only the sha256 tells.
    path = P0.path(tmp_path / "b") / "part-0000.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CommitError, match="differs"):
        verify_partition(P0.path(tmp_path / "b"))


def test_readers_ignore_partitions_without_success(tmp_path: Path) -> None:
    table = tmp_path / "table"
    stage(table, P0, [1])  # visible dir but no _SUCCESS: not committed
    assert list_committed_partitions(table) == []
    with pytest.raises(CommitError, match=SUCCESS_FILE):
        read_success(P0.path(table))


def test_clean_stale_removes_staging_and_restores_orphaned_trash(tmp_path: Path) -> None:
    table = tmp_path / "table"
    stage(staging_dir(table, "old"), P0, [1])
    commit_partitions(table, staging_dir(table, "old"), [P0], run_id="old")
    stage(staging_dir(table, "old"), P1, [2])
    commit_partitions(table, staging_dir(table, "old"), [P1], run_id="old")
    # Crash 1: P0 was moved to trash but the new one never landed -> the old one comes back.
    trash0 = P0.path(table).parent / f"{TRASH_PREFIX}crash{TRASH_SEPARATOR}hour=00"
    P0.path(table).rename(trash0)
    # Crash 2: P1 was swapped in but its trash not yet deleted -> the trash goes.
    trash1 = P1.path(table).parent / f"{TRASH_PREFIX}crash{TRASH_SEPARATOR}hour=01"
    trash1.mkdir()
    pq.write_table(pa.table({"x": [99]}), trash1 / "part-0000.parquet")
    stage(staging_dir(table, "crash"), P1, [5])  # half-written staging
    handled = clean_stale(table)
    assert set(handled) == {staging_dir(table, "crash"), trash0, trash1}
    assert values_of(table, P0) == [1] and (P0.path(table) / SUCCESS_FILE).is_file()
    assert not trash1.exists() and not staging_dir(table, "crash").exists()
    assert values_of(table, P1) == [2]
    assert list_committed_partitions(table) == [P0, P1]


def test_lock_allows_one_writer(tmp_path: Path) -> None:
    table = tmp_path / "table"
    with lock_table(table), pytest.raises(CommitError, match="another ETL run"), lock_table(table):
        pass
    with lock_table(tmp_path / "table"):  # released after the first one ends
        pass


def test_commit_of_missing_staged_partition_fails(tmp_path: Path) -> None:
    with pytest.raises(CommitError, match="does not exist"):
        commit_partitions(tmp_path / "t", staging_dir(tmp_path / "t", "x"), [P0], run_id="x")
