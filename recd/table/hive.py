"""Atomic commit of table partitions: stage hidden, mark ``_SUCCESS``, rename into place.

Protocol (any engine: the local one and Spark use the same functions)::

    TABLE/_etl.lock                      flock held for the whole run (one writer per table)
    TABLE/_tmp-<run>/ds=D/hour=HH/...    1. write + fsync the partition's files (hidden: readers
                                            such as pyarrow.dataset and Hive skip names starting
                                            with ``_`` or ``.``)
    TABLE/_tmp-<run>/ds=D/hour=HH/_SUCCESS  2. rows, files (bytes, sha256) and a checksum
    TABLE/ds=D/_trash-<run>--hour=HH     3. an existing partition is renamed aside (hidden) ...
    TABLE/ds=D/hour=HH                   4. ... the staged one is renamed in, the trash deleted

A visible ``ds=*/hour=*`` directory therefore always holds a complete partition with its
``_SUCCESS``. After a crash, :func:`clean_stale` (run at the start of the next run, under the
lock) deletes staging dirs and puts back a trashed partition whose replacement never landed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq

from recd.durable import fsync_directory, fsync_file
from recd.errors import CommitError
from recd.table.partitions import Partition, iter_partition_dirs
from recd.writable import check_writable_dir, storage_error

SUCCESS_FILE = "_SUCCESS"
STAGING_PREFIX = "_tmp-"
TRASH_PREFIX = "_trash-"
TRASH_SEPARATOR = "--"
LOCK_FILE = "_etl.lock"
QUARANTINE_DIR = "_quarantine"
SUCCESS_FORMAT = "recd.partition/1"
# Test hook: seconds to sleep before committing each partition, so that a test can SIGKILL a
# real ETL process in the middle of the commit phase deterministically. Unset in normal runs.
COMMIT_DELAY_ENV = "RECD_ETL_TEST_COMMIT_DELAY_S"


@dataclass(kw_only=True, slots=True)
class FileRecord:
    """One data file of a committed partition, as listed in its ``_SUCCESS``."""

    name: str
    rows: int
    bytes: int
    sha256: str


@dataclass(kw_only=True, slots=True)
class SuccessRecord:
    """Content of a partition's ``_SUCCESS`` marker (deterministic for the same files)."""

    partition: str
    """``ds=.../hour=..``."""
    rows: int
    """Rows over all files."""
    files: list[FileRecord]
    """The partition's Parquet files, sorted by name."""
    checksum: str
    """sha256 over the files' names and sha256s: one value that identifies the content."""

    def to_json(self) -> str:
        body = {"format": SUCCESS_FORMAT, **asdict(self)}
        return json.dumps(body, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str) -> SuccessRecord:
        try:
            data = json.loads(text)
            if data.get("format") != SUCCESS_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {SUCCESS_FORMAT!r}")
            return cls(
                partition=data["partition"],
                rows=int(data["rows"]),
                files=[FileRecord(**f) for f in data["files"]],
                checksum=data["checksum"],
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CommitError(f"{source}: invalid {SUCCESS_FILE} marker: {exc}") from exc


def new_run_id() -> str:
    """A unique, sortable run id: UTC time + pid + random (safe in file names)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


def staging_dir(table_dir: Path, run_id: str) -> Path:
    """The hidden directory where run ``run_id`` stages its partitions."""
    return table_dir / f"{STAGING_PREFIX}{run_id}"


@contextlib.contextmanager
def lock_table(table_dir: Path) -> Iterator[None]:
    """Hold the table's writer lock (an flock, released by the kernel if the process dies).

    A table directory recd cannot write (a file in the way, a read-only file system, no
    permission) is a StorageError naming it, raised before anything is written."""
    check_writable_dir(table_dir)
    path = table_dir / LOCK_FILE
    try:
        table_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise storage_error(table_dir, exc) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise CommitError(f"{table_dir}: another ETL run holds {path}") from exc
            raise
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def clean_stale(table_dir: Path) -> list[Path]:
    """Remove what crashed runs left behind; call under :func:`lock_table`.

    Staging dirs are deleted. A trashed partition is put back if its replacement never landed
    (the crash hit between the two renames), else deleted. Returns the paths dealt with.
    """
    handled: list[Path] = []
    if not table_dir.is_dir():
        return handled
    for path in sorted(table_dir.glob(f"{STAGING_PREFIX}*")):
        shutil.rmtree(path, ignore_errors=True)
        handled.append(path)
    for trash in sorted(table_dir.glob(f"ds=*/{TRASH_PREFIX}*")):
        hour_name = trash.name.rpartition(TRASH_SEPARATOR)[2]
        target = trash.parent / hour_name
        if hour_name.startswith("hour=") and not target.exists():
            os.rename(trash, target)
            fsync_directory(trash.parent)
        else:
            shutil.rmtree(trash, ignore_errors=True)
        handled.append(trash)
    return handled


def data_files(partition_dir: Path) -> list[Path]:
    """The visible data files of a partition directory (hidden ``_``/``.`` names skipped)."""
    return sorted(
        p for p in partition_dir.iterdir() if p.is_file() and not p.name.startswith(("_", "."))
    )


def describe_partition(
    partition_dir: Path, partition: Partition, *, checksums: bool = True
) -> SuccessRecord:
    """Build the ``_SUCCESS`` record of a (staged) partition from its files. ``checksums=False``
    leaves the sha256 fields empty (an Iceberg commit records no checksum: no need to read
    every byte written again)."""
    files = []
    for path in data_files(partition_dir):
        try:
            rows = pq.read_metadata(path).num_rows
        except OSError as exc:
            raise CommitError(f"{path}: not a readable Parquet file: {exc}") from exc
        files.append(
            FileRecord(
                name=path.name,
                rows=rows,
                bytes=path.stat().st_size,
                sha256=_sha256(path) if checksums else "",
            )
        )
    listing = "".join(f"{f.name}:{f.sha256}\n" for f in files)
    checksum = hashlib.sha256(listing.encode()).hexdigest() if checksums else ""
    return SuccessRecord(
        partition=partition.relpath, rows=sum(f.rows for f in files), files=files, checksum=checksum
    )


def write_success(partition_dir: Path, partition: Partition) -> SuccessRecord:
    """fsync a staged partition's files and write its ``_SUCCESS`` marker (fsynced too)."""
    for path in data_files(partition_dir):
        fsync_file(path)
    record = describe_partition(partition_dir, partition)
    marker = partition_dir / SUCCESS_FILE
    with marker.open("w") as f:
        f.write(record.to_json())
        f.flush()
        os.fsync(f.fileno())
    fsync_directory(partition_dir)
    return record


def commit_partitions(
    table_dir: Path,
    staging: Path,
    partitions: Iterable[Partition],
    *,
    run_id: str | None = None,
    on_commit: Callable[[Partition, SuccessRecord], None] | None = None,
) -> list[SuccessRecord]:
    """Commit staged partitions ``staging/ds=D/hour=HH`` into ``table_dir``, one at a time.

    Each partition gets its ``_SUCCESS`` then replaces the visible one (if any) by two renames.
    Partitions commit independently: a crash leaves every partition either old or new, never
    partial. Returns the ``_SUCCESS`` records in commit order. The staging dir is removed.
    ``run_id`` names the hidden trash dirs (default: a fresh id); ``on_commit`` is called after
    each partition lands. Call under :func:`lock_table`.
    """
    run_id = run_id or new_run_id()
    delay_s = float(os.environ.get(COMMIT_DELAY_ENV, "0") or 0)
    records = []
    for partition in sorted(partitions):
        source = partition.path(staging)
        if not source.is_dir():
            raise CommitError(f"{source}: staged partition {partition} does not exist")
        record = write_success(source, partition)
        if delay_s > 0:
            time.sleep(delay_s)
        _swap_in(source, partition.path(table_dir), run_id=run_id)
        records.append(record)
        if on_commit is not None:
            on_commit(partition, record)
    shutil.rmtree(staging, ignore_errors=True)
    return records


def _swap_in(source: Path, target: Path, *, run_id: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    trash = target.parent / f"{TRASH_PREFIX}{run_id}{TRASH_SEPARATOR}{target.name}"
    try:
        if target.exists():
            os.rename(target, trash)
        os.rename(source, target)
        fsync_directory(target.parent)
    except OSError as exc:
        raise CommitError(
            f"{target}: cannot rename the staged partition into place: {exc}"
        ) from exc
    if trash.exists():
        shutil.rmtree(trash)


def read_success(partition_dir: Path) -> SuccessRecord:
    """The ``_SUCCESS`` record of a committed partition (CommitError if missing or invalid)."""
    marker = partition_dir / SUCCESS_FILE
    if not marker.is_file():
        raise CommitError(f"{partition_dir}: no {SUCCESS_FILE}: partition is not committed")
    return SuccessRecord.from_json(marker.read_text(), source=str(marker))


def verify_partition(partition_dir: Path) -> SuccessRecord:
    """Check a committed partition's files against its ``_SUCCESS`` (names, sizes, sha256)."""
    record = read_success(partition_dir)
    names = [p.name for p in data_files(partition_dir)]
    listed = [f.name for f in record.files]
    if names != listed:
        raise CommitError(f"{partition_dir}: files {names} differ from {SUCCESS_FILE} {listed}")
    for f in record.files:
        path = partition_dir / f.name
        if path.stat().st_size != f.bytes or _sha256(path) != f.sha256:
            raise CommitError(f"{path}: content differs from {SUCCESS_FILE} (size or sha256)")
    return record


def committed_partition_dirs(
    table_dir: Path, *, start_ms: int | None = None, end_ms: int | None = None
) -> list[tuple[Partition, Path]]:
    """Committed partitions (visible ``ds=*/hour=*`` dirs holding ``_SUCCESS``) whose hour
    starts in [start_ms, end_ms), with their directories, in partition order."""
    out = []
    for partition, path in iter_partition_dirs(table_dir):
        if not (path / SUCCESS_FILE).is_file():
            continue
        if start_ms is not None and partition.start_ms < start_ms:
            continue
        if end_ms is not None and partition.start_ms >= end_ms:
            continue
        out.append((partition, path))
    return out


def list_committed_partitions(table_dir: Path) -> list[Partition]:
    """The partitions a reader may use: visible ``ds=*/hour=*`` dirs holding ``_SUCCESS``."""
    return [p for p, _ in committed_partition_dirs(table_dir)]


def list_committed_files(table_dir: Path) -> list[Path]:
    """The data files listed by the ``_SUCCESS`` of every committed partition, in order."""
    files: list[Path] = []
    for partition in list_committed_partitions(table_dir):
        path = partition.path(table_dir)
        files.extend(path / f.name for f in read_success(path).files)
    return files


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
