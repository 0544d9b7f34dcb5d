"""The embedded clustering ETL (O2): session shards -> hourly (or daily) zstd Parquet partitions.

One shard at a time (session sharding puts each session in exactly one shard, so clustering a
shard's rows clusters them in every partition they land in), appended to one open file per
partition::

    for shard in shards:                      memory: the shard's rows, or 1/P of them
        for p in range(P):                    P = passes, from the shard's decoded size / budget
            rows = good rows of the window    (blocks streamed, validated, sessions of bucket p)
            order = sort by (hour, session_id, ts, request_id)   (baseline: by hour, stable;
                                               ``hour``: the partition, an hour or a day)
            pieces = each hour's rows in order (one ``take`` per partition from the contiguous
                                               rows: a take from the chunked blocks would
                                               concatenate their list columns on every call)
            append each hour's rows to its    TABLE/_tmp-<run>/ds=D/hour=HH/part-NNNNN.parquet
            partition's open file             (PartitionWriter: full row groups, rolled files)
    close every file, commit every partition  (recd.table.hive: _SUCCESS, rename into place)

Few, large files (the small-files problem). A partition gets rows from every shard; writing one
file per (shard, pass, partition) made thousands of files of a few hundred rows, whose footers
(a column chunk's metadata per column, the Arrow schema, the catalogue) outweighed the data and
whose row groups were far below ``row_group_rows``. Instead each partition keeps one open
``part-NNNNN.parquet`` across shards and passes; its rows are buffered and written in row groups
of exactly ``row_group_rows``; once the file holds ``target_file_bytes`` it is closed at the
next session boundary and ``part-{N+1}`` starts. Row groups are therefore full except the last
one of a file, and ones flushed early because the write buffers hit their cap: the buffers of
all partitions together hold at most ``write_buffer_bytes`` (a quarter of the memory budget, or
DEFAULT_WRITE_BUFFER_BYTES without one); at the cap the largest buffer is compressed (zstd,
Arrow IPC), and only once all are is the largest written early. At most MAX_OPEN_FILES files
are open at once (least recently written closed first, between shard-passes).

Layout inside a file (clustered): the rows of shard 0 (pass 0, 1, ...), then shard 1, ...; each
shard-pass's rows sorted by (session_id, ts, request_id). A session lives in one shard and one
pass, so it is one contiguous, ts-sorted run in exactly one file of each partition it touches
(files roll only between sessions). Session ids are *not* sorted across shards, so the files
declare no Parquet ``sorting_columns`` (they would be false). Baseline: shard after shard, each
in arrival order.

Sorting and the ``take`` are pyarrow kernels; the only Python loops run over shards, passes,
blocks, partitions and row groups. A re-run on the same input writes byte-identical Parquet
files (shards, passes and partitions in a fixed order, deterministic names, encodings, buffer
flushes and writer).

Threads (``EtlConfig.workers``, ``recd etl --workers N``; default ``min(2, cores)``). The
pyarrow kernels doing the work (zstd, Arrow IPC decoding, sort, take, Parquet encoding) release
the GIL, so threads use several cores. Work is split into *preparing* a shard-pass (read,
decode, validate, sort, take the pieces) and *writing* it (append to the partition writers);
this thread alone writes, in the fixed order above, so the output is byte-identical to
``workers=1`` whatever the threads' timing (tests/unit/test_etl_parallel.py):

* read-ahead (no memory budget, or every shard fits in one pass of half the pass budget): a
  reader thread prepares pass k+1 while this thread writes pass k. Two passes are in memory at
  once: without a budget the peak is about two shards' rows instead of one; with a budget each
  shard fits in half of it, so the bound holds.
* otherwise (a budget that splits shards into passes), the passes stay the same as with one
  worker (halving them would double the decoding, every pass decodes every block of its shard)
  and ``workers - 1`` threads decode the next blocks (zstd + IPC) while this thread validates
  and filters the current one; at most ``workers`` blocks are decoded ahead.
* at the end, the partitions' last row groups are written and their files closed by
  ``workers`` threads (each partition writes only its own files, so this is order-free).

Validation errors, quarantine (written in block order by whichever thread reads), row counts
and progress bars (one per shard, opened when its first pass is read) are the same as with one
worker. A failure on either thread stops the other (the reader checks between blocks) before
the staging directory is removed.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import math
import os
import shutil
import sqlite3
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recd.errors import ConfigError, SchemaError, StorageError
from recd.etl.config import EtlConfig, EtlReport, window_of
from recd.etl.encodings import (
    SAMPLE_MAX_BYTES,
    SAMPLE_ROWS,
    EncodingPlan,
    plan_encodings,
    smallest_bytes,
)
from recd.etl.inputs import list_shards, output_order
from recd.etl.tables import commit_and_report, prepare_table, refuse_foreign_table
from recd.etl.validate import (
    BlockValidator,
    Frame,
    Quarantine,
    decode_frame,
    frame_content_sizes,
    iter_frames,
)
from recd.logs.hashing import splitmix64
from recd.logs.rawlog import MANIFEST_FILE, read_catalogue
from recd.progress import peak_rss_bytes, progress_bar
from recd.schema import SESSION_ID, TS, Catalogue, as_table_schema, strict_schema
from recd.table.hive import (
    QUARANTINE_DIR,
    lock_table,
    new_run_id,
    staging_dir,
)
from recd.table.iceberg import is_iceberg_table, load_table
from recd.table.layout import (
    PLAIN,
    Layout,
    choose_encoded,
    dedup_schema,
    encode_row_group,
    statistics_columns,
)
from recd.table.partitions import Partition, unit_ids
from recd.table.snapshot import table_format
from recd.writable import DISK_FULL_ERRNOS, NOT_WRITABLE_ERRNOS, os_error_reason, storage_error

log = logging.getLogger(__name__)

# Peak memory of a pass, as a multiple of the decoded bytes of the rows it holds: the rows (the
# blocks, then one contiguous copy), the sort keys and indices, the per-partition pieces taken
# from them, a row group being encoded, allocator slack: set just above what the data of
# tests/integration/test_etl_memory.py measures with jemalloc. The budget left after the write
# buffers (pass_budget_bytes) splits a shard into P passes so that PASS_MEMORY_FACTOR x decoded
# / P <= that. On top comes a fixed cost (Parquet writers, zstd contexts, encoding trial, which
# depends on the allocator).
PASS_MEMORY_FACTOR = 3.0
# Under a memory budget the partitions' write buffers get 1/WRITE_BUFFER_SHARE of it, passes the
# rest; without one they hold at most DEFAULT_WRITE_BUFFER_BYTES (all partitions together).
WRITE_BUFFER_SHARE = 4
DEFAULT_WRITE_BUFFER_BYTES = 256 << 20
# When the write buffers reach their cap, the largest decoded buffer is first compressed (Arrow
# IPC record batch messages in one zstd frame each, level 1: several times smaller on clustered
# rows, and cheap); only when every buffer is compressed is the largest written early as a
# shorter row group. Fast while memory allows, and full row groups long after it no longer does.
SPOOL_ZSTD_LEVEL = 1
# Files open at once (one per partition being written); past this the least recently written
# partition's file is closed (its next rows start the next part file). A long window keeps
# hundreds of hourly partitions, and every open file holds a descriptor and a footer builder.
MAX_OPEN_FILES = 128
# Salt so that pass buckets are independent of the shard routing hash of the same session ids.
PASS_BUCKET_SALT = np.uint64(0x5EED_0F_E7_1A_55_E5)
# Test hook: seconds to sleep after each shard pass is staged (lets a test SIGKILL a real run
# before its commit phase). Unset in normal runs. See also commit.COMMIT_DELAY_ENV.
SHARD_DELAY_ENV = "RECD_ETL_TEST_SHARD_DELAY_S"


def run_etl(config: EtlConfig) -> EtlReport:
    """Run the ETL described by ``config`` and return what it did.

    ``engine="spark"`` hands over to ``recd.etl.spark.run_spark_etl`` (the ``recd[spark]``
    extra); ``"local"`` runs the embedded engine in this process.

    A table recd cannot write (a file in the way, a read-only file system, no permission) or a
    disk that fills up during the run ends in a StorageError naming the table and saying what
    the table holds (:func:`table_write_error`); a baseline run into a clustered table is
    refused (:func:`refuse_mixed_order`).
    """
    refuse_foreign_table(config.table_dir)  # before the lock file is made in it
    try:
        if config.engine == "spark":
            refuse_mixed_order(config)
            return _run_spark(config)
        return LocalEtl(config).run()
    except Exception as exc:
        error = table_write_error(config.table_dir, exc)
        if error is None:
            raise
        raise error from exc


def table_write_error(table_dir: Path, exc: BaseException) -> StorageError | None:
    """The StorageError of ``exc`` raised by an ETL run writing ``table_dir``, or None when it
    is not about writing there (e.g. an unreadable input, which stays as it is).

    A full disk or quota (an OSError, or the embedded Iceberg catalog's SQLite "database or
    disk is full") names the table and what it holds now: an Iceberg table is as it was before
    the run (its commit is the run's last write), a Hive-layout one may hold some of the run's
    hours, each whole. Other refusals (read-only, no permission, a file in the way) count when
    they concern a path in the table, or no path (pyarrow's writers name none).
    """
    full = _disk_full(exc)
    if full is not None:
        found = table_format(table_dir) if table_dir.is_dir() else None
        if found == "hive":
            state = (
                "every hour is whole: as it was, or this run's where it was committed before "
                "the disk filled"
            )
        elif found is None:
            state = "nothing was committed"
        else:
            state = "nothing of this run was committed: the table reads as it did before"
        return StorageError(
            f"{table_dir}: {full} while this ETL run wrote the table; {state}. "
            "Free space (or write the table to another disk) and run again"
        )
    if not isinstance(exc, OSError):
        return None
    if exc.errno in NOT_WRITABLE_ERRNOS and (
        exc.filename is None or _inside(Path(os.fsdecode(exc.filename)), table_dir)
    ):
        return storage_error(table_dir, exc)
    return None


def _disk_full(exc: BaseException) -> str | None:
    """Why ``exc`` (or an error it was raised from) says the disk is full, or None."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short chain: SQLAlchemy's error wraps sqlite3's
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno in DISK_FULL_ERRNOS:
            return os_error_reason(seen)
        if isinstance(seen, sqlite3.Error) and (
            getattr(seen, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
            or "disk is full" in str(seen)
        ):
            return "the disk is full (the Iceberg catalog's database could not grow)"
        seen = seen.__cause__ or seen.__context__
    return None


def _inside(path: Path, directory: Path) -> bool:
    return path.absolute().is_relative_to(directory.absolute())


def refuse_mixed_order(config: EtlConfig) -> None:
    """ConfigError when a baseline (arrival-order) run would write into an Iceberg table that
    records a clustered sort order (``session_id, ts``, set when the table was created by a
    clustered run or migrated without ``--baseline``): the table would claim an order that
    some of its rows do not have.

    The reverse is allowed: a table that records no order (a baseline table) claims nothing
    about its rows, so clustered rows keep it true, and rewriting an arrival-order table's
    hours clustered is how a run replaces a baseline run. A Hive-layout table records no order
    and is not checked.
    """
    if not config.baseline or not is_iceberg_table(config.table_dir):
        return
    table = load_table(config.table_dir)
    schema = table.schema()
    order = [
        schema.find_column_name(f.source_id) or str(f.source_id) for f in table.sort_order().fields
    ]
    if order:
        raise ConfigError(
            f"{config.table_dir}: the table holds rows clustered by session (its Iceberg sort "
            f"order is {', '.join(order)}); a --baseline run would add rows in arrival order "
            "to it: write the baseline to another table"
        )


def _run_spark(config: EtlConfig) -> EtlReport:
    try:
        spark = importlib.import_module("recd.etl.spark")
    except ModuleNotFoundError as exc:
        if exc.name is not None and (
            exc.name == "recd.etl.spark" or exc.name.startswith("pyspark")
        ):
            raise ConfigError(
                "engine 'spark' is not available: install the Spark extra "
                f"(the `spark` extra: pip install 'pyspark>=4.0'; Java 17 needed) ({exc})"
            ) from exc
        raise
    report: EtlReport = spark.run_spark_etl(config)
    return report


def read_shard_manifest(shard_dir: Path) -> dict[str, Any]:
    """``_manifest.json`` of a shard directory (recd.logs.shard), or {} if absent/unreadable."""
    try:
        data = json.loads((shard_dir / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def shard_size(shard: Path, manifest: dict[str, Any]) -> tuple[int, int]:
    """(decoded bytes, blocks) of a shard: from the manifest if it lists them, else from the
    zstd frame headers (exact when frames record their content size, as recd's writer does)."""
    try:
        index = int(shard.name.removeprefix("shard-").split(".")[0])
        for entry in manifest.get("shards", []):
            if int(entry["shard"]) == index:
                return int(entry["uncompressed_bytes"]), int(entry["blocks"])
    except (KeyError, ValueError, TypeError, AttributeError):
        pass
    sizes = frame_content_sizes(shard)
    return sum(sizes), len(sizes)


def count_passes(decoded_bytes: int, pass_budget_bytes: int | None) -> int:
    """Passes needed so that one pass holds at most ``pass_budget_bytes`` (see
    :func:`pass_budget_bytes`; PASS_MEMORY_FACTOR included). None: one pass."""
    if pass_budget_bytes is None or decoded_bytes <= 0:
        return 1
    return max(1, math.ceil(PASS_MEMORY_FACTOR * decoded_bytes / max(1, pass_budget_bytes)))


def write_buffer_bytes(memory_budget_bytes: int | None) -> int:
    """Cap on the rows buffered by all partition writers together (decoded bytes)."""
    if memory_budget_bytes is None:
        return DEFAULT_WRITE_BUFFER_BYTES
    return max(1, memory_budget_bytes // WRITE_BUFFER_SHARE)


def pass_budget_bytes(memory_budget_bytes: int | None, *, in_flight: int = 1) -> int | None:
    """What one pass may hold: the memory budget less the write buffers' share, split evenly
    between the ``in_flight`` passes held at once (2 when a reader thread prepares the next
    pass while the current one is written). None: no bound."""
    if memory_budget_bytes is None:
        return None
    rest = memory_budget_bytes - write_buffer_bytes(memory_budget_bytes)
    return max(1, rest // max(1, in_flight))


def session_buckets(session_ids: np.ndarray, passes: int) -> np.ndarray:
    """Pass of every session id, in [0, passes): all rows of a session share one pass."""
    mixed = splitmix64(np.asarray(session_ids, dtype=np.int64).view(np.uint64) ^ PASS_BUCKET_SALT)
    return (mixed % np.uint64(passes)).astype(np.int64)


def take_partitions(
    table: pa.Table, hours: np.ndarray, order: pa.Array, partition_by: str = "hour"
) -> list[tuple[Partition, pa.Table]]:
    """``table``'s rows in output ``order``, one fresh table per partition, by partition.

    ``hours``: the partition unit id (``recd.table.partitions.unit_ids`` of ``partition_by``)
    of every row of ``table`` (N,); ``order`` sorts by it first.
    ``table`` should be contiguous (one chunk per column): a ``take`` from a chunked table
    concatenates its list columns anew on every call.
    """
    order_np = order.to_numpy()
    sorted_hours = hours[order_np]
    bounds = np.flatnonzero(np.diff(sorted_hours)) + 1
    starts = np.concatenate([[0], bounds]).tolist()
    ends = np.concatenate([bounds, [len(sorted_hours)]]).tolist()
    return [
        (
            Partition.from_unit_id(int(sorted_hours[start]), partition_by),
            table.take(order.slice(start, end - start)),
        )
        for start, end in zip(starts, ends, strict=True)
    ]


def try_decode_frame(frame: Frame) -> pa.RecordBatch | SchemaError:
    """:func:`decode_frame`, with a bad frame's error returned instead of raised."""
    try:
        return decode_frame(frame)
    except SchemaError as exc:
        return exc


def copy_rows(table: pa.Table) -> pa.Table:
    """``table``'s rows in buffers of their own: a slice shares (and keeps alive) the whole
    buffers of the table it was cut from, e.g. a pass's sorted rows."""
    return table.take(pa.array(np.arange(table.num_rows)))


def part_file_name(index: int) -> str:
    """``part-NNNNN.parquet``: the ``index``-th file of a partition (0, 1, ... as files roll)."""
    return f"part-{index:05d}.parquet"


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class _ReaderStopped(Exception):
    """The reader thread was told to stop (the writer failed or was interrupted)."""


@dataclass(frozen=True, slots=True)
class PassJob:
    """One pass over one shard: the sessions of hash bucket ``pass_index`` of ``passes``."""

    shard: Path
    pass_index: int
    passes: int
    blocks: int
    """Blocks of the shard (for its progress bar: ``blocks * passes`` in all)."""


@dataclass(kw_only=True, slots=True)
class PreparedPass:
    """A shard-pass read, validated and sorted: what the reader hands the writer."""

    job: PassJob
    pieces: list[tuple[Partition, pa.Table]] = field(default_factory=list)
    """The pass's good in-window rows in output order, split by partition (in partition
    order), each a fresh table of its own (see :func:`take_partitions`)."""
    rows_read: int = 0
    rows_outside_window: int = 0
    rows_quarantined: int = 0


@dataclass(slots=True)
class _ShardBars:
    """A progress bar per shard, opened with its first pass and closed after its last."""

    enabled: bool
    bars: dict[Path, Any] = field(default_factory=dict)

    def bar(self, job: PassJob) -> Any:
        bar = self.bars.get(job.shard)
        if bar is None:
            bar = self.bars[job.shard] = (
                progress_bar(
                    desc=f"etl {job.shard.name}", total=job.blocks * job.passes, unit="block"
                )
                if self.enabled
                else _NoBar()
            )
        return bar

    def done(self, job: PassJob) -> None:
        if job.pass_index == job.passes - 1:
            self.bars.pop(job.shard).close()

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()


class SpoolCodec:
    """Compresses buffered rows: Arrow IPC record batch messages in one zstd frame.

    The schema is known (every buffered table has the pass tables' schema), so only the record
    batch messages are stored. Compressed and decoded buffers come from Arrow's memory pool:
    with Python ``bytes`` (glibc's heap) the churn of freed frames stayed resident.
    """

    def __init__(self, schema: pa.Schema, *, level: int = SPOOL_ZSTD_LEVEL) -> None:
        self.schema = schema
        self._codec = pa.Codec("zstd", compression_level=level)

    def encode(self, table: pa.Table) -> SpoolFrame:
        sink = pa.BufferOutputStream()
        for batch in table.to_batches():
            sink.write(batch.serialize())
        raw = sink.getvalue()
        compressed = self._codec.compress(raw, asbytes=False)  # capacity: zstd's bound, ~raw
        data = pa.allocate_buffer(compressed.size)  # so keep a right-sized copy
        pa.FixedSizeBufferWriter(data).write(compressed)
        return SpoolFrame(data=data, raw_size=raw.size)

    def decode(self, frame: SpoolFrame) -> pa.Table:
        raw = self._codec.decompress(frame.data, decompressed_size=frame.raw_size, asbytes=False)
        reader = pa.ipc.MessageReader.open_stream(raw)
        batches = [pa.ipc.read_record_batch(message, self.schema) for message in reader]
        return pa.Table.from_batches(batches, schema=self.schema)


@dataclass(frozen=True, slots=True)
class SpoolFrame:
    """Buffered rows compressed by :class:`SpoolCodec`."""

    data: pa.Buffer
    raw_size: int
    """Bytes of the uncompressed IPC messages."""

    @property
    def size(self) -> int:
        return int(self.data.size)


class PartitionWriter:
    """Streams one partition's rows into ``part-00000.parquet``, ``part-00001.parquet``, ...

    Rows arrive in output order (:meth:`add`, at most what completes the current row group at a
    time) and wait in a buffer until they fill a row group of exactly ``row_group_rows``, which
    is then written to the open file. The buffer holds decoded tables, or zstd frames once
    :meth:`compress` was called (memory pressure, see :class:`PartitionWriters`). Once the file
    holds ``target_file_bytes`` it is closed before the next row group, at a session boundary
    when ``split_at_sessions`` (so a session never spans two files): the rows that finish the
    file's last session are written as its last, shorter row group. Files open lazily, so a
    partition that gets no more rows opens no empty file.
    """

    def __init__(
        self,
        directory: Path,
        *,
        schema: pa.Schema,
        writer_options: dict[str, Any],
        row_group_rows: int,
        target_file_bytes: int,
        split_at_sessions: bool,
        codec: SpoolCodec,
        layout: Layout = PLAIN,
    ) -> None:
        self.directory = directory
        self.schema = schema  # the catalogue's, metadata included
        self.strict_schema = strict_schema(schema)  # no nulls reach a table (recd.etl.validate)
        self.layout = layout
        """The dedup layout's features and groups (recd.table.layout), each row group encoded alone."""
        self.file_schema = (
            dedup_schema(self.strict_schema, layout.encoded, layout.groups)
            if layout.encoded
            else self.strict_schema
        )
        self.writer_options = writer_options
        self.row_group_rows = row_group_rows
        self.target_file_bytes = target_file_bytes
        self.split_at_sessions = split_at_sessions
        self.codec = codec
        self.pending_rows = 0
        """Rows buffered for the next row group (always < row_group_rows between calls)."""
        self.pending_bytes = 0
        """Bytes the buffer holds (decoded tables at their size, compressed ones at theirs)."""
        self.decoded_bytes = 0
        """The part of ``pending_bytes`` not compressed yet."""
        self.files = 0
        """Files started so far (the open one included)."""
        self._pending: list[pa.Table | SpoolFrame] = []
        self._sink: pa.NativeFile | None = None
        self._writer: pq.ParquetWriter | None = None
        self._last_session: int | None = None

    @property
    def is_open(self) -> bool:
        return self._writer is not None

    def add(self, rows: pa.Table, *, owned: bool = False) -> None:
        """Append ``rows`` (at most ``row_group_rows - pending_rows``); write a filled group.

        ``owned``: ``rows`` has buffers of its own (not a slice) and may wait in the buffer as
        it is; else rows that wait are copied first (see :func:`copy_rows`).
        """
        assert 0 < rows.num_rows <= self.row_group_rows - self.pending_rows, "over a row group"
        if self.pending_rows + rows.num_rows < self.row_group_rows:
            self._buffer(rows if owned else copy_rows(rows))
        else:
            self._write_group(pa.concat_tables([*self._unbuffer(), rows]))

    def compress(self) -> None:
        """Compress the decoded part of the buffer (memory pressure); rows are unchanged."""
        frames = [
            item if isinstance(item, SpoolFrame) else self.codec.encode(item)
            for item in self._pending
        ]
        self._pending = list(frames)
        self.pending_bytes = sum(frame.size for frame in frames)
        self.decoded_bytes = 0

    def flush(self) -> None:
        """Write the buffered rows now, as a shorter row group (the buffers' cap was hit)."""
        while self.pending_rows:
            self._write_group(pa.concat_tables(self._unbuffer()))

    def close_file(self) -> None:
        """Write the buffered rows and close the open file (the next rows start a new one)."""
        self.flush()
        if self._writer is not None:
            self._close_file()

    def abort(self) -> None:
        """Drop the buffer and close the open file (the run failed; staging is removed)."""
        self._unbuffer()
        if self._writer is not None:
            self._close_file()

    def _buffer(self, rows: pa.Table) -> None:
        """Keep ``rows`` (fresh rows, see :func:`copy_rows`) for the next row group."""
        self._pending.append(rows)
        self.pending_rows += rows.num_rows
        size = rows.get_total_buffer_size()  # fresh rows: no buffer is shared or sliced
        self.pending_bytes += size
        self.decoded_bytes += size

    def _unbuffer(self) -> list[pa.Table]:
        """The buffered rows, decoded, in order (the buffer is emptied)."""
        tables = [
            self.codec.decode(item) if isinstance(item, SpoolFrame) else item
            for item in self._pending
        ]
        self._pending = []
        self.pending_rows = self.pending_bytes = self.decoded_bytes = 0
        return tables

    def _write_group(self, table: pa.Table) -> None:
        """Write ``table`` (at most a row group) as one row group, rolling the file first if it
        is full; rows after a mid-group roll point go back into the buffer for the next file."""
        cut = table.num_rows
        if self._sink is not None and self._sink.tell() >= self.target_file_bytes:
            cut = self._roll_point(table)
            if cut == 0:
                self._close_file()
                cut = table.num_rows
        self._write(table.slice(0, cut))
        if cut < table.num_rows:  # the file's last session ended inside the group
            self._close_file()
            self._buffer(copy_rows(table.slice(cut)))  # not the written rows' buffers

    def _roll_point(self, table: pa.Table) -> int:
        """Rows of ``table`` that still belong to the full open file: 0 in baseline order or if
        ``table`` starts a new session, else up to the end of the file's last session."""
        if not self.split_at_sessions:
            return 0
        sessions = table.column(SESSION_ID).to_numpy()
        if int(sessions[0]) != self._last_session:
            return 0
        changes = np.flatnonzero(sessions[1:] != sessions[:-1])
        return int(changes[0]) + 1 if len(changes) else len(sessions)

    def _write(self, rows: pa.Table) -> None:
        if self._writer is None:
            self._open()
        assert self._writer is not None
        table = as_table_schema(rows, self.strict_schema)
        if self.layout.encoded:
            table = encode_row_group(
                table, self.layout.encoded, groups=self.layout.groups, schema=self.file_schema
            )
        self._writer.write_table(table, row_group_size=self.row_group_rows)
        if self.split_at_sessions:
            self._last_session = int(rows.column(SESSION_ID)[-1].as_py())

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._sink = pa.OSFile(str(self.directory / part_file_name(self.files)), mode="w")
        self.files += 1
        self._writer = pq.ParquetWriter(self._sink, self.file_schema, **self.writer_options)

    def _close_file(self) -> None:
        """Close the open file (footer written); the buffer is left as it is."""
        writer, sink = self._writer, self._sink
        self._writer = self._sink = None
        self._last_session = None
        try:
            if writer is not None:
                writer.close()
        finally:
            if sink is not None:
                sink.close()


class PartitionWriters:
    """The open :class:`PartitionWriter` of every partition of a run, with bounded buffers.

    ``append`` takes the rows of one partition (a slice of a pass's sorted rows), one row
    group's worth at a time. After each, while the buffers
    of all partitions hold more than ``buffer_bytes``, the largest decoded buffer is compressed
    or, once all are, the largest buffer is written early as a shorter row group. After each
    append (a whole shard-pass's rows of the partition, so whole sessions), files beyond
    ``max_open_files`` are closed, least recently written first; the partition's next rows
    start its next file.
    """

    def __init__(
        self,
        staging: Path,
        *,
        schema: pa.Schema,
        row_group_rows: int,
        target_file_bytes: int,
        buffer_bytes: int,
        split_at_sessions: bool,
        writer_options: dict[str, Any],
        max_open_files: int = MAX_OPEN_FILES,
        layout: Layout = PLAIN,
    ) -> None:
        if max_open_files < 1:
            raise ConfigError(f"max_open_files must be >= 1, got {max_open_files}")
        self.staging = staging
        self.schema = schema
        self.writer_options = writer_options
        """``pq.ParquetWriter`` options of every file (compression, encodings)."""
        self.row_group_rows = row_group_rows
        self.target_file_bytes = target_file_bytes
        self.buffer_bytes = buffer_bytes
        self.split_at_sessions = split_at_sessions
        self.max_open_files = max_open_files
        self.layout = layout
        self.codec = SpoolCodec(schema.remove_metadata())
        self.writers: dict[Partition, PartitionWriter] = {}
        self.rows_per_partition: dict[Partition, int] = {}
        self.buffered_bytes = 0
        """Bytes held by all buffers (kept <= ``buffer_bytes`` after every append)."""
        self.compressions = 0
        """Buffers compressed because the buffers hit ``buffer_bytes``."""
        self.early_flushes = 0
        """Row groups written short because the buffers hit ``buffer_bytes``."""
        self._recent: OrderedDict[Partition, None] = OrderedDict()  # open files, LRU first

    def append(self, partition: Partition, rows: pa.Table, *, owned: bool = False) -> None:
        """Append ``rows`` (in output order) to ``partition``.

        ``owned``: ``rows`` has buffers of its own (e.g. fresh from a ``take``), so if all of it
        waits for the next row group it is kept without a copy. Slices of it that wait (the
        rows after the last full row group) are always copied.
        """
        writer = self.writers.get(partition)
        if writer is None:
            writer = self.writers[partition] = PartitionWriter(
                partition.path(self.staging),
                schema=self.schema,
                writer_options=self.writer_options,
                row_group_rows=self.row_group_rows,
                target_file_bytes=self.target_file_bytes,
                split_at_sessions=self.split_at_sessions,
                codec=self.codec,
                layout=self.layout,
            )
        position, total = 0, rows.num_rows
        while position < total:
            take = min(self.row_group_rows - writer.pending_rows, total - position)
            before = writer.pending_bytes
            if take == total:
                writer.add(rows, owned=owned)
            else:
                writer.add(rows.slice(position, take))
            self.buffered_bytes += writer.pending_bytes - before
            position += take
            self._touched(partition, writer)
            self._bound_buffers()
        self.rows_per_partition[partition] = self.rows_per_partition.get(partition, 0) + total
        self._close_least_recent()

    def close(self, *, threads: int = 1) -> None:
        """Write every buffer and close every file, ``threads`` partitions at a time.

        Each partition writes only its own files from its own buffer (the spool codec is
        stateless), so the bytes do not depend on ``threads`` or on thread timing.
        """
        partitions = sorted(self.writers)
        threads = min(threads, len(partitions))
        if threads > 1:
            with ThreadPoolExecutor(threads, thread_name_prefix="recd-etl-close") as pool:
                for _ in pool.map(lambda p: self.writers[p].close_file(), partitions):
                    pass
        else:
            for partition in partitions:
                self.writers[partition].close_file()
        self._recent.clear()
        self.buffered_bytes = 0

    def abort(self) -> None:
        """Close every file without writing the buffers (the run failed). The files are
        deleted next, so an error closing one (its footer on a full disk) is ignored: the
        run's own error is the one raised."""
        for writer in self.writers.values():
            with suppress(OSError):
                writer.abort()
        self._recent.clear()
        self.buffered_bytes = 0

    def _touched(self, partition: Partition, writer: PartitionWriter) -> None:
        if writer.is_open:
            self._recent[partition] = None
            self._recent.move_to_end(partition)
        else:
            self._recent.pop(partition, None)

    def _close_least_recent(self) -> None:
        """Close files beyond ``max_open_files``, least recently written first. Runs between
        appends only, when every partition's rows end with a whole session."""
        while len(self._recent) > self.max_open_files:
            oldest, _ = self._recent.popitem(last=False)
            victim = self.writers[oldest]
            self.buffered_bytes -= victim.pending_bytes
            victim.close_file()

    def _bound_buffers(self) -> None:
        # Largest first; ties broken by partition, so that the layout is deterministic.
        while self.buffered_bytes > self.buffer_bytes:
            writers = self.writers
            partition = max(writers, key=lambda p: (writers[p].decoded_bytes, p))
            writer = writers[partition]
            before = writer.pending_bytes
            if writer.decoded_bytes > 0:
                writer.compress()
                self.compressions += 1
            else:
                partition = max(writers, key=lambda p: (writers[p].pending_bytes, p))
                writer = writers[partition]
                before = writer.pending_bytes
                if before == 0:
                    break
                writer.flush()
                self.early_flushes += 1
                self._touched(partition, writer)
            self.buffered_bytes += writer.pending_bytes - before


class LocalEtl:
    """One run of the embedded engine (use :func:`run_etl`).

    Work is a list of :class:`PassJob` (shard after shard, pass after pass). Each job is
    *prepared* (:meth:`_prepare_pass`: blocks decoded, validated, filtered to the pass's
    sessions, sorted into output order) and then *written* (:meth:`_write_pass`: appended to
    the partition writers). With ``workers`` >= 2 a reader thread prepares job k+1 while this
    thread writes job k; jobs are written in order by this thread alone, so the output does not
    depend on the number of threads or their timing.
    """

    def __init__(self, config: EtlConfig) -> None:
        self.config = config
        self.workers = config.worker_threads
        self.catalogue: Catalogue = read_catalogue(config.shard_dir)
        self.schema = self.catalogue.arrow_schema()  # with the catalogue in its metadata
        self.run_id = new_run_id()
        self.staging = staging_dir(config.table_dir, self.run_id)
        self.candidates = config.dedup_candidates(self.catalogue)
        self.layout = PLAIN  # the dedup layout's: chosen on the first rows (_start_writers)
        self.report = EtlReport(
            run_id=self.run_id,
            engine="local",
            clustered=not config.baseline,
            layout=config.layout,
            window=window_of(config),
            workers=self.workers,
        )
        self.quarantine: Quarantine | None = None
        if config.on_bad_rows == "quarantine":
            self.quarantine = Quarantine(
                config.table_dir / QUARANTINE_DIR / self.run_id, self.catalogue
            )
        self.validator = BlockValidator(
            catalogue=self.catalogue,
            start_ms=config.start_ms,
            end_ms=config.end_ms,
            quarantine=self.quarantine,
        )
        self.plan: EncodingPlan | None = None
        self.writers: PartitionWriters | None = None  # made with the plan, on the first rows
        self.manifest = read_shard_manifest(config.shard_dir)
        self.partition_by = "hour"  # the table's granularity, resolved when the run starts
        self.read_ahead = False
        """Whether a reader thread prepares the next pass while this one writes (decided by
        :meth:`_plan_jobs`); else extra workers decode a shard's blocks in parallel."""
        self._stop = threading.Event()  # tells the reader thread to give up
        self._decoder: ThreadPoolExecutor | None = None  # decodes blocks ahead (no read-ahead)

    def run(self) -> EtlReport:
        started = time.perf_counter()
        shards = list_shards(self.config.shard_dir)
        if self.manifest.get("key") == "random" and not self.config.baseline:
            log.warning(
                "%s was sharded by a random key: each file is clustered, but a session may span "
                "several files of a partition (shard by session for O2)",
                self.config.shard_dir,
            )
        jobs = self._plan_jobs(shards)
        with lock_table(self.config.table_dir):
            refuse_mixed_order(self.config)
            target = prepare_table(self.config)
            self.partition_by = target.partition_by
            try:
                self._run_jobs(jobs)
                if self.writers is not None:  # every file complete before anything is committed
                    self.writers.close(threads=self.workers)
            except BaseException:
                if self.writers is not None:
                    self.writers.abort()
                shutil.rmtree(self.staging, ignore_errors=True)  # hidden anyway; tidy up
                raise
            finally:
                if self.quarantine is not None:
                    self.quarantine.close()
            self._count_quarantine()
            rows_per_partition = {} if self.writers is None else self.writers.rows_per_partition
            try:
                commit_and_report(
                    self.config,
                    self.staging,
                    rows_per_partition,
                    self.report,
                    target=target,
                )
            except BaseException:
                # What was not committed is never visible; its space is given back now (a
                # full disk) rather than by the next run's clean-up.
                shutil.rmtree(self.staging, ignore_errors=True)
                raise
        report = self.report
        report.row_groups_flushed_early = 0 if self.writers is None else self.writers.early_flushes
        report.seconds = time.perf_counter() - started
        report.rows_per_s = report.rows_in / report.seconds if report.seconds > 0 else 0.0
        report.peak_rss_bytes = peak_rss_bytes()
        return report

    def _count_quarantine(self) -> None:
        q = self.quarantine
        if q is not None and q.used:
            self.report.blocks_quarantined = q.blocks
            self.report.frames_quarantined = q.frames
            self.report.rows_quarantined_by_field = dict(sorted(q.rows_by_field.items()))
            self.report.quarantine_dir = str(q.directory)
            assert q.rows == self.report.rows_quarantined, "quarantine count differs"

    def _plan_jobs(self, shards: list[Path]) -> list[PassJob]:
        """Every shard's passes, in order, and whether to read ahead.

        A shard's passes come from its decoded size and the budget, the same for any number of
        workers (so that the output is too). Reading ahead holds two passes at once, so it is
        chosen only when every shard fits in one pass of half the pass budget (always without a
        budget); otherwise more passes would decode every block more often, and the workers
        decode blocks in parallel instead.
        """
        budget = self.config.memory_budget_bytes
        sizes = [shard_size(shard, self.manifest) for shard in shards]
        half = pass_budget_bytes(budget, in_flight=2)
        self.read_ahead = self.workers > 1 and all(
            count_passes(decoded, half) == 1 for decoded, _ in sizes
        )
        jobs: list[PassJob] = []
        for shard, (decoded_bytes, blocks) in zip(shards, sizes, strict=True):
            passes = count_passes(decoded_bytes, pass_budget_bytes(budget))
            self.report.passes_per_shard[shard.name] = passes
            if passes > 1:
                log.info("%s: %d decoded bytes -> %d passes", shard.name, decoded_bytes, passes)
            jobs.extend(PassJob(shard, index, passes, blocks) for index in range(passes))
        return jobs

    def _run_jobs(self, jobs: list[PassJob]) -> None:
        """Prepare and write every job in order: with a reader thread one job ahead (at most
        two prepared passes exist at once: the next one is submitted only once the one before
        the current one is dropped), or one job at a time (blocks decoded by ``workers - 1``
        extra threads when there are any)."""
        with ExitStack() as stack:
            bars = _ShardBars(self.config.show_progress)
            stack.callback(bars.close)
            if not self.read_ahead:
                if self.workers > 1:
                    self._decoder = stack.enter_context(
                        ThreadPoolExecutor(self.workers - 1, thread_name_prefix="recd-etl-decode")
                    )  # on the way out: waits for the few blocks decoded ahead
                for job in jobs:
                    self._write_pass(self._prepare_pass(job, bars.bar(job)))
                    bars.done(job)
                    self._after_pass()
                return
            reader = stack.enter_context(
                ThreadPoolExecutor(1, thread_name_prefix="recd-etl-reader")
            )
            stack.callback(self._stop.set)  # on the way out first: the reader stops early

            def submit(index: int) -> Future[PreparedPass] | None:
                if index >= len(jobs):
                    return None
                return reader.submit(self._prepare_pass, jobs[index], bars.bar(jobs[index]))

            future = submit(0)
            for index, job in enumerate(jobs):
                assert future is not None
                prepared = future.result()  # the reader's error, if any, is raised here
                future = submit(index + 1)
                self._write_pass(prepared)
                del prepared  # before the next submit: two passes in flight at most
                bars.done(job)
                self._after_pass()

    def _after_pass(self) -> None:
        if self.config.memory_budget_bytes is not None:
            # Give the freed pass memory back, so that RSS follows the budget. Without one the
            # next pass reuses it: releasing costs far more CPU in page faults than the peak RSS
            # it saves.
            pa.default_memory_pool().release_unused()
        delay_s = float(os.environ.get(SHARD_DELAY_ENV, "0") or 0)
        if delay_s > 0:
            time.sleep(delay_s)

    def _prepare_pass(self, job: PassJob, bar: Any) -> PreparedPass:
        """Read one shard-pass and sort its rows into output order (the reader's job)."""
        prepared = PreparedPass(job=job)
        table = self._read_pass(job, bar, prepared)
        if table.num_rows:
            hours = unit_ids(table.column(TS), self.partition_by)
            order = output_order(table, hours, clustered=not self.config.baseline)
            table = table.combine_chunks()  # blocks -> one chunk; the blocks are freed
            prepared.pieces = take_partitions(table, hours, order, self.partition_by)
        return prepared

    def _read_pass(self, job: PassJob, bar: Any, counts: PreparedPass) -> pa.Table:
        """The good in-window rows of the job's shard whose session falls in its bucket."""
        shard, pass_index, passes = job.shard, job.pass_index, job.passes
        record = pass_index == 0  # count and quarantine each input once, on the first pass
        batches: list[pa.RecordBatch] = []
        for frame, decoded in self._iter_decoded(shard):
            bar.update(1)
            if isinstance(decoded, SchemaError):
                if self.quarantine is None:
                    raise decoded
                if record:
                    self.quarantine.add_frame(frame, reason=str(decoded))
                continue
            batch = decoded
            result = self.validator.check(batch, path=shard, block=frame.index, record=record)
            del batch
            if record:
                counts.rows_read += result.rows_read
                counts.rows_outside_window += result.rows_outside_window
                counts.rows_quarantined += result.rows_quarantined
            rows = result.rows
            if rows is None:
                continue
            if passes > 1:
                sessions = rows.column(SESSION_ID).to_numpy(zero_copy_only=False)
                rows = rows.filter(pa.array(session_buckets(sessions, passes) == pass_index))
            if rows.num_rows:
                batches.append(rows)
        return pa.Table.from_batches(batches, schema=self.validator.row_schema)

    def _iter_decoded(self, shard: Path) -> Iterator[tuple[Frame, pa.RecordBatch | SchemaError]]:
        """The shard's frames in order, each with its decoded block or why it cannot be decoded.

        With a decoder pool, up to ``workers`` blocks are decoded ahead by its threads (zstd and
        Arrow IPC release the GIL); validation, quarantine and counting stay in block order.
        """
        pool = self._decoder
        ahead: deque[tuple[Frame, Future[pa.RecordBatch | SchemaError]]] = deque()
        for frame in iter_frames(shard):
            if self._stop.is_set():
                raise _ReaderStopped(str(shard))
            if pool is None:
                yield frame, try_decode_frame(frame)
                continue
            ahead.append((frame, pool.submit(try_decode_frame, frame)))
            if len(ahead) > self.workers:
                done, future = ahead.popleft()
                yield done, future.result()
        while ahead:
            done, future = ahead.popleft()
            yield done, future.result()

    def _write_pass(self, prepared: PreparedPass) -> None:
        """Count a prepared pass and append each hour's rows to its partition's open file."""
        report = self.report
        report.rows_read += prepared.rows_read
        report.rows_outside_window += prepared.rows_outside_window
        report.rows_in += prepared.rows_read - prepared.rows_outside_window
        report.rows_quarantined += prepared.rows_quarantined
        pieces, prepared.pieces = prepared.pieces, []
        if not pieces:
            return
        writers = self.writers or self._start_writers(pa.concat_tables(t for _, t in pieces))
        while pieces:  # hand each piece over, so the writers hold the only reference to it
            partition, rows = pieces.pop(0)
            writers.append(partition, rows, owned=True)
            del rows

    def _start_writers(self, table: pa.Table) -> PartitionWriters:
        """Plan the encodings on the first pass's rows (in output order); open the writers."""
        config = self.config
        if self.candidates:  # the columns as the dedup layout writes them
            sample = table.slice(0, SAMPLE_ROWS)
            self.layout, fractions = choose_encoded(
                sample,
                self.candidates,
                listed=config.dedup_features is not None,
                sizes=functools.partial(
                    smallest_bytes,
                    zstd_level=config.zstd_level,
                    row_group_rows=config.row_group_rows,
                ),
            )
            self.report.encoded_features = list(self.layout.encoded)
            self.report.encoded_groups = [list(g) for g in self.layout.groups]
            self.report.stored_id_fraction = fractions
            table = encode_row_group(sample, self.layout.encoded, groups=self.layout.groups)
        self.plan = plan_encodings(
            table,
            sample_bytes=self._sample_bytes(),
            mode=config.dictionary,
            zstd_level=config.zstd_level,
            row_group_rows=config.row_group_rows,
        )
        self.report.encodings = self.plan.describe()
        for column in self.plan.columns:
            log.debug("encoding %s: %s (%s)", column.column, column.encoding, column.reason)
        self.writers = PartitionWriters(
            self.staging,
            schema=self.schema,
            row_group_rows=config.row_group_rows,
            target_file_bytes=config.target_file_bytes,
            buffer_bytes=write_buffer_bytes(config.memory_budget_bytes),
            split_at_sessions=not config.baseline,
            writer_options={
                "compression": "zstd",
                "compression_level": config.zstd_level,
                **self.plan.writer_options(),
                **self._statistics(),
            },
            max_open_files=MAX_OPEN_FILES,
            layout=self.layout,
        )
        return self.writers

    def _statistics(self) -> dict[str, Any]:
        """Writer option: no min/max statistics for the dedup layout's encoded columns."""
        if not self.layout.encoded:
            return {}
        schema = dedup_schema(strict_schema(self.schema), self.layout.encoded, self.layout.groups)
        return {"write_statistics": statistics_columns(schema)}

    def _sample_bytes(self) -> int:
        budget = self.config.memory_budget_bytes
        return SAMPLE_MAX_BYTES if budget is None else min(SAMPLE_MAX_BYTES, budget // 16)
