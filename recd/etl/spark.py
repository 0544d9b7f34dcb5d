"""The clustering ETL (O2) on Spark: ``recd etl --engine spark`` (extra ``recd[spark]``).

Same input, same table, same checks as the embedded engine (recd.etl.local), but the work is
spread over a Spark cluster::

    driver    plan units: (shard file, frame range) of about UNIT_BYTES decoded bytes each
              (frame headers only); plan encodings on a sample of the first shard
    stage 1   source "recd_shards": one task per unit decodes its zstd frames (Arrow IPC) and
              validates them with recd.etl.validate (the same checks, messages and quarantine
              as the local engine); yields Arrow record batches + ``_hour`` = ts // 1 h (UTC:
              integer ms since the epoch; a day-partitioned table: ts // 1 day)
    shuffle   repartition(N, session_id)            (Spark's murmur3 hash of session_id;
              sortWithinPartitions(_hour, session_id,  N sized for target_file_bytes)
                                   ts, request_id, _seq)
    stage 2   sink "recd_table": each task streams its sorted rows into one zstd Parquet file
              per hour, TABLE/_tmp-<run>/ds=D/hour=HH/part-NNNNN.parquet, written by pyarrow
    driver    commit every staged partition with recd.table.hive (_SUCCESS, rename)

A session lives in exactly one shuffle partition, so each session's rows of an hour are
contiguous and ts-sorted in exactly one file, as with the local engine; ``_seq`` (= unit << 40
| row in unit), the last key, keeps rows with equal keys (a request's candidates) in shard
order, as the local engine's stable sort does. ``baseline`` keeps arrival order instead: one
unit per shard, no shuffle, ``coalesce(N)`` and a sort by hour and ``_seq``, so the files of a
partition in name order hold exactly the rows of the local engine's files, in the same order.

pyarrow writes the files (through the Python data source API, hence PySpark >= 4.0) because
readers need the catalogue in the Arrow schema metadata, ``list<int64>`` sparse columns and
recd.etl.encodings' per-column encodings, none of which Spark's Parquet writer can give without
a second pass over the table; Spark's commit protocol still hands the driver exactly the files
of the successful task attempts. Every unit task writes its counts and quarantined rows under
``TABLE/_tmp-<run>/_units/`` (a retried attempt renames a fresh directory into place, so
counts are exactly once); the driver sums and merges them, and re-raises a failing task's
BadRowError / SchemaError. docs/scaling.md has how to run it on a cluster (shared filesystem,
``PYSPARK_PYTHON``, ``spark-submit``), the file sizing (``output_partitions``) and memory.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import shutil
import struct
import sys
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

import recd.errors
from recd.durable import write_bytes_atomic
from recd.errors import BadRowError, ConfigError, RecdError, SchemaError
from recd.etl.config import EtlConfig, EtlReport, window_of
from recd.etl.encodings import (
    SAMPLE_MAX_BYTES,
    SAMPLE_ROWS,
    EncodingPlan,
    column_chunk_bytes,
    plan_encodings,
    smallest_bytes,
)
from recd.etl.inputs import CLUSTER_KEYS, list_shards, output_order
from recd.etl.tables import commit_and_report, prepare_table
from recd.etl.validate import (
    FRAME_HEADER_BYTES,
    ZSTD_MAX_FRAME_HEADER_BYTES,
    BlockValidator,
    Frame,
    Quarantine,
    decode_frame,
)
from recd.logs.rawlog import read_catalogue
from recd.progress import peak_rss_bytes
from recd.schema import SESSION_ID, TS, Catalogue
from recd.table.hive import (
    QUARANTINE_DIR,
    data_files,
    lock_table,
    new_run_id,
    staging_dir,
)
from recd.table.layout import (
    PLAIN,
    Layout,
    choose_encoded,
    dedup_schema,
    encode_row_group,
    statistics_columns,
)
from recd.table.partitions import PARTITION_BY, Partition, parse_partition_relpath, unit_ids

log = logging.getLogger(__name__)

SPARK_MASTER_ENV = "SPARK_MASTER"
APP_NAME = "recd-etl"
SHARD_SOURCE = "recd_shards"
TABLE_SINK = "recd_table"
# Decoded bytes of shard frames per read task (frames are never split).
UNIT_BYTES = 128 << 20
HOUR_COLUMN = "_hour"
SEQ_COLUMN = "_seq"
UNIT_SHIFT = 40  # _seq = unit << UNIT_SHIFT | row within the unit (baseline order key)
UNITS_DIR = "_units"
ERRORS_DIR = "_errors"
FILES_MANIFEST = "_files.json"
STATS_FILE = "stats.json"
UNIT_QUARANTINE = "quarantine"
# Test hook: a directory; the first attempt of the last read task (after its rows and
# quarantine are out, before its counts land) and of write task 0 (after its first file
# landed, if it writes two or more) fails, a marker file there remembering it, so that a test
# sees Spark retry them. Read by the driver and carried to the tasks in the job (executors do
# not see the driver's environment). Unset in normal runs.
FAIL_ONCE_ENV = "RECD_SPARK_TEST_FAIL_ONCE_DIR"


# --------------------------------------------------------------------------- units of input


@dataclass(frozen=True, kw_only=True, slots=True)
class Unit:
    """A read task: ``frames`` consecutive frames of one shard file, from ``offset``."""

    index: int
    """Position in the run's unit list (names the unit's side files)."""
    path: str
    """Shard file (absolute: executors open it)."""
    first_frame: int
    """Block index of the first frame in the shard."""
    offset: int
    """Byte offset of the first frame's length prefix."""
    frames: int
    """Frames to read (a truncated last frame included: reading it reports it)."""
    decoded_bytes: int
    """Decoded size from the zstd frame headers (8x compressed where a header has none)."""

    @property
    def name(self) -> str:
        return f"unit-{self.index:06d}"


def scan_frames(path: Path) -> list[tuple[int, int]]:
    """``(byte offset, decoded bytes)`` of every frame of a shard, from the headers only.

    A truncated tail counts as one more frame (its reader reports it as corrupt).
    """
    frames: list[tuple[int, int]] = []
    offset = 0
    with path.open("rb") as f:
        while True:
            header = f.read(FRAME_HEADER_BYTES)
            if not header:
                return frames
            if len(header) != FRAME_HEADER_BYTES:
                frames.append((offset, 0))
                return frames
            (size,) = struct.unpack("<Q", header)
            head = f.read(min(size, ZSTD_MAX_FRAME_HEADER_BYTES))
            try:
                content = zstandard.frame_content_size(head)
            except zstandard.ZstdError:
                content = -1
            frames.append((offset, content if content >= 0 else 8 * size))
            f.seek(size - len(head), 1)
            offset += FRAME_HEADER_BYTES + size
            if f.tell() != offset:  # the frame is shorter than its prefix says
                return frames


def plan_units(shards: Sequence[Path], *, unit_bytes: int | None) -> list[Unit]:
    """Split shards into units of at most ``unit_bytes`` decoded bytes (None: one per shard).

    A unit holds at least one frame; units follow shard and frame order.
    """
    if unit_bytes is not None and unit_bytes < 1:
        raise ConfigError(f"unit_bytes must be >= 1 or None, got {unit_bytes}")
    units: list[Unit] = []
    for shard in shards:
        frames = scan_frames(shard)
        start = acc = 0
        for i, (_, size) in enumerate(frames):
            if unit_bytes is not None and i > start and acc + size > unit_bytes:
                units.append(_unit(len(units), shard, frames, start, i, acc))
                start, acc = i, 0
            acc += size
        if frames:
            units.append(_unit(len(units), shard, frames, start, len(frames), acc))
    return units


def _unit(
    index: int, shard: Path, frames: list[tuple[int, int]], start: int, end: int, size: int
) -> Unit:
    return Unit(
        index=index,
        path=str(shard.absolute()),
        first_frame=start,
        offset=frames[start][0],
        frames=end - start,
        decoded_bytes=size,
    )


def iter_unit_frames(unit: Unit) -> Iterator[Frame]:
    """The frames of a unit, read like recd.etl.validate.iter_frames (truncation reported)."""
    path = Path(unit.path)
    with path.open("rb") as f:
        f.seek(unit.offset)
        offset = unit.offset
        for index in range(unit.first_frame, unit.first_frame + unit.frames):
            header = f.read(FRAME_HEADER_BYTES)
            if not header:
                return
            if len(header) != FRAME_HEADER_BYTES:
                problem = f"truncated length prefix ({len(header)} of 8 bytes)"
                yield Frame(path, index, offset, header, problem)
                return
            (size,) = struct.unpack("<Q", header)
            data = f.read(size)
            if len(data) != size:
                problem = f"truncated frame ({len(data)} of {size} bytes)"
                yield Frame(path, index, offset, data, problem)
                return
            yield Frame(path, index, offset, data)
            offset += FRAME_HEADER_BYTES + size


# --------------------------------------------------------------------------- schemas


def spark_type(arrow_type: pa.DataType) -> DataType:
    """The Spark type of a catalogue column type (int64, float32, list<int64>, ...)."""
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return ArrayType(spark_type(arrow_type.value_type), containsNull=True)
    simple: list[tuple[pa.DataType, DataType]] = [
        (pa.int64(), LongType()),
        (pa.int32(), IntegerType()),
        (pa.float32(), FloatType()),
        (pa.float64(), DoubleType()),
        (pa.string(), StringType()),
    ]
    for arrow, spark in simple:
        if arrow_type.equals(arrow):
            return spark
    raise SchemaError(f"no Spark type for Arrow type {arrow_type}")


def spark_schema(schema: pa.Schema) -> StructType:
    """Spark schema of an Arrow schema (every field nullable, like the catalogue's)."""
    return StructType([StructField(f.name, spark_type(f.type), nullable=True) for f in schema])


# --------------------------------------------------------------------------- the job


@dataclass(kw_only=True, slots=True)
class SparkJob:
    """Everything a task needs, passed to the data sources as one JSON option."""

    catalogue_json: str
    staging: str
    """Absolute staging directory of the run (TABLE/_tmp-<run>)."""
    units: list[Unit]
    baseline: bool
    start_ms: int | None
    end_ms: int | None
    on_bad_rows: str
    row_group_rows: int
    zstd_level: int
    writer_options: dict[str, Any] = field(default_factory=dict)
    """``use_dictionary`` / ``column_encoding`` from the encoding plan (same for every file)."""
    encoded: list[str] = field(default_factory=list)
    """Features written in the dedup layout (recd.table.layout), each row group encoded alone."""
    groups: list[list[str]] = field(default_factory=list)
    """Of ``encoded``, those stored together (``recd.table.layout.Layout.groups``)."""
    fail_once_dir: str | None = None
    """Test hook (FAIL_ONCE_ENV); None in normal runs."""
    partition_by: str = "hour"
    """The table's partition granularity (``hour`` or ``day``)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SparkJob:
        data = json.loads(text)
        data["units"] = [Unit(**u) for u in data["units"]]
        return cls(**data)

    def catalogue(self) -> Catalogue:
        return Catalogue.from_dict(json.loads(self.catalogue_json), source="spark job")

    @property
    def units_dir(self) -> Path:
        return Path(self.staging) / UNITS_DIR

    @property
    def errors_dir(self) -> Path:
        return Path(self.staging) / ERRORS_DIR

    def row_spark_schema(self) -> StructType:
        """Schema of the rows stage 1 yields: the catalogue's columns + order keys."""
        extra = [pa.field(HOUR_COLUMN, pa.int64()), pa.field(SEQ_COLUMN, pa.int64())]
        row_schema = self.catalogue().arrow_schema().remove_metadata()
        return spark_schema(pa.schema([*row_schema, *extra]))


@dataclass(kw_only=True, slots=True)
class UnitStats:
    """Row accounting of one unit (written by its task, summed by the driver)."""

    rows_read: int = 0
    rows_outside_window: int = 0
    rows_quarantined: int = 0
    blocks_quarantined: int = 0
    frames_quarantined: int = 0


def read_unit(job: SparkJob, unit: Unit) -> Iterator[pa.RecordBatch]:
    """Stage 1 on an executor: decode and validate one unit, yield its good in-window rows.

    Runs the local engine's checks (recd.etl.validate) block by block; memory is one block.
    On completion the unit's counts and quarantine land in ``_units/<unit>/`` (atomically);
    with ``on_bad_rows="fail"`` the first bad input raises after recording the error.
    """
    catalogue = job.catalogue()
    attempt = job.units_dir / f".{unit.name}.{uuid.uuid4().hex}"
    quarantine = None
    if job.on_bad_rows == "quarantine":
        quarantine = Quarantine(attempt / UNIT_QUARANTINE, catalogue)
    validator = BlockValidator(
        catalogue=catalogue, start_ms=job.start_ms, end_ms=job.end_ms, quarantine=quarantine
    )
    stats = UnitStats()
    seq = unit.index << UNIT_SHIFT
    path = Path(unit.path)
    try:
        for frame in iter_unit_frames(unit):
            try:
                batch = decode_frame(frame)
            except SchemaError as exc:
                if quarantine is None:
                    raise
                quarantine.add_frame(frame, reason=str(exc))
                stats.frames_quarantined += 1
                continue
            result = validator.check(batch, path=path, block=frame.index, record=True)
            stats.rows_read += result.rows_read
            stats.rows_outside_window += result.rows_outside_window
            stats.rows_quarantined += result.rows_quarantined
            stats.blocks_quarantined += int(result.block_quarantined)
            rows = result.rows
            if rows is None or rows.num_rows == 0:
                continue
            yield with_order_keys(rows, seq=seq, partition_by=job.partition_by)
            seq += rows.num_rows
    except RecdError as exc:
        _record_error(job.errors_dir / f"{unit.name}.json", exc)
        raise
    finally:
        if quarantine is not None:
            quarantine.close()
    if unit.index == len(job.units) - 1:
        _fail_once(job, f"read-{unit.name}")
    attempt.mkdir(parents=True, exist_ok=True)
    (attempt / STATS_FILE).write_text(json.dumps(asdict(stats)))
    _rename_once(attempt, job.units_dir / unit.name)


def with_order_keys(
    rows: pa.RecordBatch, *, seq: int | None, partition_by: str = "hour"
) -> pa.RecordBatch:
    """Append ``_hour`` (hours, or days, since the epoch, UTC) and ``_seq`` (the rows' input
    order from ``seq`` on; None: no ``_seq``)."""
    columns = [*rows.columns, pa.array(unit_ids(rows.column(TS), partition_by))]
    names = [*rows.schema.names, HOUR_COLUMN]
    if seq is not None:
        columns.append(pa.array(np.arange(seq, seq + rows.num_rows, dtype=np.int64)))
        names.append(SEQ_COLUMN)
    return pa.RecordBatch.from_arrays(columns, names=names)


def _fail_once(job: SparkJob, name: str) -> None:
    if job.fail_once_dir is None:
        return
    marker = Path(job.fail_once_dir) / name
    if not marker.exists():
        marker.touch()
        raise RuntimeError(f"{FAIL_ONCE_ENV}: injected failure of the first attempt of {name}")


def _rename_once(attempt: Path, final: Path) -> None:
    """Move a finished attempt's directory into place; a twin attempt may have won."""
    try:
        os.rename(attempt, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(attempt, ignore_errors=True)


def _record_error(path: Path, exc: RecdError) -> None:
    if isinstance(exc, BadRowError):
        body: dict[str, Any] = {
            "type": "BadRowError",
            "path": exc.path,
            "row": exc.row,
            "field": exc.field,
            "problem": exc.problem,
        }
    else:
        body = {"type": type(exc).__name__, "message": str(exc)}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, json.dumps(body).encode(), durable=False)  # read by the driver


def load_error(path: Path) -> RecdError:
    """Rebuild the RecdError a task recorded (the same class and message)."""
    body = json.loads(path.read_text())
    if body["type"] == "BadRowError":
        return BadRowError(body["path"], body["row"], body["field"], body["problem"])
    cls = getattr(recd.errors, body["type"], RecdError)
    if not (isinstance(cls, type) and issubclass(cls, RecdError)):
        cls = RecdError
    return cls(body["message"])


class _UnitPartition(InputPartition):
    def __init__(self, index: int) -> None:
        super().__init__(index)


class _ShardReader(DataSourceReader):
    def __init__(self, job: SparkJob) -> None:
        self.job = job

    def partitions(self) -> Sequence[InputPartition]:
        return [_UnitPartition(unit.index) for unit in self.job.units]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_unit(self.job, self.job.units[partition.value])


class ShardSource(DataSource):
    """Spark data source ``recd_shards``: the rows of a run's units (option ``job``)."""

    @classmethod
    def name(cls) -> str:
        return SHARD_SOURCE

    def schema(self) -> StructType:
        return SparkJob.from_json(self.options["job"]).row_spark_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        return _ShardReader(SparkJob.from_json(self.options["job"]))


# --------------------------------------------------------------------------- the sink


@dataclass
class StagedFiles(WriterCommitMessage):
    """What one write task staged: ``[partition relpath, file name, rows]`` per file."""

    files: list[tuple[str, str, int]]


class HourFileWriter:
    """Streams sorted rows of one hour into one Parquet file, in row groups of exactly N rows.

    Writes ``.NAME.<random>.tmp`` and renames it to NAME on :meth:`finish`, so a retried or
    speculative twin task never leaves a torn file under the final name.
    """

    def __init__(self, job: SparkJob, schema: pa.Schema, partition: Partition, name: str) -> None:
        self.partition = partition
        self.name = name
        self.rows = 0
        self.schema = schema  # the table schema (Catalogue.table_schema), metadata included
        self.layout = Layout("dedup", tuple(job.encoded), tuple(tuple(g) for g in job.groups))
        self.file_schema = (
            dedup_schema(schema, self.layout.encoded, self.layout.groups)
            if self.layout.encoded
            else schema
        )
        self.row_group_rows = job.row_group_rows
        directory = partition.path(Path(job.staging))
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / name
        self.tmp = directory / f".{name}.{uuid.uuid4().hex}.tmp"
        sorting = None
        if not job.baseline:
            sorting = [pq.SortingColumn(self.file_schema.get_field_index(n)) for n in CLUSTER_KEYS]
        self.writer = pq.ParquetWriter(
            self.tmp,
            self.file_schema,
            compression="zstd",
            compression_level=job.zstd_level,
            sorting_columns=sorting,
            **job.writer_options,
        )
        self.pending: list[pa.Table] = []
        self.pending_rows = 0

    def write(self, rows: pa.Table) -> None:
        """Append rows (catalogue columns, any list field names: cast here)."""
        self.pending.append(rows.select(self.schema.names).cast(self.schema))
        self.pending_rows += rows.num_rows
        while self.pending_rows >= self.row_group_rows:
            self._flush(self.row_group_rows)

    def _flush(self, rows: int) -> None:
        table = pa.concat_tables(self.pending)
        group = table.slice(0, rows)
        if self.layout.encoded:
            group = encode_row_group(
                group, self.layout.encoded, groups=self.layout.groups, schema=self.file_schema
            )
        self.writer.write_table(group, row_group_size=self.row_group_rows)
        rest = table.slice(rows)
        self.pending = [rest] if rest.num_rows else []
        self.pending_rows = rest.num_rows
        self.rows += rows

    def finish(self) -> tuple[str, str, int]:
        if self.pending_rows:
            self._flush(self.pending_rows)
        self.writer.close()
        os.replace(self.tmp, self.path)
        return (self.partition.relpath, self.name, self.rows)

    def abort(self) -> None:
        self.writer.close()
        self.tmp.unlink(missing_ok=True)


def write_sorted_rows(
    job: SparkJob, batches: Iterator[pa.RecordBatch], *, task: int
) -> list[tuple[str, str, int]]:
    """Stage 2 on an executor: rows sorted by ``_hour`` first -> one file per hour.

    File names: ``part-NNNNN.parquet``, NNNNN the task's partition (clustered and baseline).
    """
    schema = job.catalogue().table_schema()  # no nulls reach a table (recd.etl.validate)
    files: list[tuple[str, str, int]] = []
    current: HourFileWriter | None = None
    done_hours: set[int] = set()
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            hours = batch.column(HOUR_COLUMN).to_numpy(zero_copy_only=False)
            starts = np.concatenate([[0], np.flatnonzero(np.diff(hours)) + 1])
            ends = np.concatenate([starts[1:], [len(hours)]])
            for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
                hour = int(hours[start])
                rows = pa.Table.from_batches([batch.slice(start, end - start)])
                if current is None or current.partition.unit_id != hour:
                    if current is not None:
                        files.append(current.finish())
                        current = None
                        if task == 0:
                            _fail_once(job, f"write-task-{task:05d}")
                    assert hour not in done_hours, f"task {task}: rows not sorted by hour"
                    done_hours.add(hour)
                    name = f"part-{task:05d}.parquet"
                    partition = Partition.from_unit_id(hour, job.partition_by)
                    current = HourFileWriter(job, schema, partition, name)
                current.write(rows)
        if current is not None:
            files.append(current.finish())
            current = None
    finally:
        if current is not None:
            current.abort()
    return files


class _TableWriter(DataSourceArrowWriter):
    def __init__(self, job: SparkJob) -> None:
        self.job = job

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        return StagedFiles(files=write_sorted_rows(self.job, iterator, task=task))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Runs once on the driver side after every task succeeded: list the staged files."""
        files = [f for m in messages if isinstance(m, StagedFiles) for f in m.files]
        path = Path(self.job.staging) / FILES_MANIFEST
        write_bytes_atomic(path, json.dumps(sorted(files)).encode(), durable=False)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # the driver removes the whole staging directory


class TableSink(DataSource):
    """Spark data source ``recd_table``: stages sorted rows as Parquet files (option ``job``)."""

    @classmethod
    def name(cls) -> str:
        return TABLE_SINK

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return _TableWriter(SparkJob.from_json(self.options["job"]))


# --------------------------------------------------------------------------- driver


def run_spark_etl(
    config: EtlConfig,
    *,
    spark: SparkSession | None = None,
    master: str | None = None,
    output_partitions: int | None = None,
    unit_bytes: int = UNIT_BYTES,
) -> EtlReport:
    """Run the ETL described by ``config`` on Spark and return what it did (engine "spark").

    ``spark``: the session to use (default: the active one, else a new one, stopped at the
    end). ``master``: Spark master URL for a new session (default: ``config.spark_master`` if
    the config has it, else ``$SPARK_MASTER``, else spark-submit's or ``local[*]``).
    ``output_partitions``: write tasks = files per hour (default: sized so that files hold
    about ``config.target_file_bytes``, see the module docstring).
    ``unit_bytes``: decoded shard bytes per read task.
    """
    if output_partitions is not None and output_partitions < 1:
        raise ConfigError(f"output_partitions must be >= 1, got {output_partitions}")
    started = time.perf_counter()
    owned = False
    if spark is None:
        master = master or config.spark_master
        spark, owned = get_spark(master=master, show_progress=config.show_progress)
    try:
        etl = SparkEtl(config, output_partitions=output_partitions, unit_bytes=unit_bytes)
        report = etl.run(spark)
    finally:
        if owned:
            spark.stop()
    report.seconds = time.perf_counter() - started
    report.rows_per_s = report.rows_in / report.seconds if report.seconds > 0 else 0.0
    return report


def get_spark(
    *, master: str | None = None, show_progress: bool = True
) -> tuple[SparkSession, bool]:
    """The active SparkSession, or a new one: ``(session, True if this call started it)``."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    master = master or os.environ.get(SPARK_MASTER_ENV) or None
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # driver launched by spark-submit
    builder = SparkSession.builder.appName(APP_NAME)
    if master is None and not submitted:
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # no INFO line per connection
    if master is not None and master.startswith("local"):
        # Python workers run on this machine: use this interpreter (it has recd), not the
        # first python3 on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = builder.config("spark.ui.showConsoleProgress", str(show_progress).lower())
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # JVM missing or not starting: PySparkRuntimeError, OSError
        raise ConfigError(
            f"engine 'spark': cannot start Spark (master {master or 'from spark-submit'}; "
            f"Java 17 must be on PATH or JAVA_HOME): {exc}"
        ) from exc
    return session, True


class SparkEtl:
    """The driver side of one Spark run (use :func:`run_spark_etl`)."""

    def __init__(
        self, config: EtlConfig, *, output_partitions: int | None, unit_bytes: int
    ) -> None:
        self.config = config
        self.catalogue = read_catalogue(config.shard_dir)
        self.table_dir = config.table_dir.absolute()
        self.run_id = new_run_id()
        self.staging = staging_dir(self.table_dir, self.run_id)
        self.output_partitions = output_partitions
        self.unit_bytes = unit_bytes
        self.partition_by = "hour"  # the table's granularity, resolved when the run starts
        self.parquet_fraction = 1.0
        """File bytes per decoded byte, measured on the encoding sample (1.0 until then)."""
        self.candidates = config.dedup_candidates(self.catalogue)
        self.layout = PLAIN  # the dedup layout's: chosen on the encoding sample (_plan_encodings)
        self.report = EtlReport(
            run_id=self.run_id,
            engine="spark",
            clustered=not config.baseline,
            layout=config.layout,
            window=window_of(config),
        )

    def run(self, spark: SparkSession) -> EtlReport:
        shards = list_shards(self.config.shard_dir)
        with lock_table(self.table_dir):
            target = prepare_table(self.config)
            self.partition_by = target.partition_by
            try:
                self.staging.mkdir(parents=True)
                units = plan_units(
                    shards, unit_bytes=None if self.config.baseline else self.unit_bytes
                )
                job = self._job(units)
                partitions = self.output_partitions or self._default_partitions(units)
                self._run_job(spark, job, partitions=partitions)
                self._count_units(units)
                staged = self._staged_files()
            except BaseException:
                shutil.rmtree(self.staging, ignore_errors=True)
                raise
            report = self.report
            report.passes_per_shard = {shard.name: 1 for shard in shards}
            rows_per_partition: dict[Partition, int] = {}
            for relpath, _, rows in staged:
                partition = parse_partition_relpath(relpath)
                assert partition is not None, relpath
                rows_per_partition[partition] = rows_per_partition.get(partition, 0) + rows
            commit_and_report(self.config, self.staging, rows_per_partition, report, target=target)
        report.peak_rss_bytes = peak_rss_bytes()
        return report

    def _job(self, units: list[Unit]) -> SparkJob:
        plan = self._plan_encodings(units)
        if plan is not None:
            self.report.encodings = plan.describe()
        return SparkJob(
            catalogue_json=self.catalogue.to_json(),
            staging=str(self.staging),
            units=units,
            baseline=self.config.baseline,
            start_ms=self.config.start_ms,
            end_ms=self.config.end_ms,
            on_bad_rows=self.config.on_bad_rows,
            row_group_rows=self.config.row_group_rows,
            zstd_level=self.config.zstd_level,
            writer_options={} if plan is None else {**plan.writer_options(), **self._statistics()},
            encoded=list(self.layout.encoded),
            groups=[list(g) for g in self.layout.groups],
            fail_once_dir=os.environ.get(FAIL_ONCE_ENV) or None,
            partition_by=self.partition_by,
        )

    def _plan_encodings(self, units: list[Unit]) -> EncodingPlan | None:
        """Plan encodings on the first rows of the first shard with good rows (in output
        order), as the local engine does; bad blocks are skipped here (the job reports them).
        """
        validator = BlockValidator(
            catalogue=self.catalogue, start_ms=self.config.start_ms, end_ms=self.config.end_ms
        )
        batches: list[pa.RecordBatch] = []
        rows = nbytes = 0
        shard = None
        for unit in units:
            if batches and unit.path != shard:
                break  # the first shard with rows is read (up to the sample size)
            shard = unit.path
            for frame in iter_unit_frames(unit):
                try:
                    result = validator.check(
                        decode_frame(frame), path=Path(unit.path), block=frame.index, record=False
                    )
                except RecdError:
                    continue
                if result.rows is not None and result.rows.num_rows:
                    batches.append(result.rows)
                    rows += result.rows.num_rows
                    nbytes += result.rows.nbytes
                if rows >= SAMPLE_ROWS or nbytes >= SAMPLE_MAX_BYTES:
                    break
            if rows >= SAMPLE_ROWS or nbytes >= SAMPLE_MAX_BYTES:
                break
        if not batches:
            return None  # no good rows anywhere: nothing will be written
        table = pa.Table.from_batches(batches)
        order = output_order(
            table, unit_ids(table.column(TS), self.partition_by), clustered=not self.config.baseline
        )
        budget = self.config.memory_budget_bytes
        sample = table.take(order.slice(0, SAMPLE_ROWS))
        decoded_bytes = sample.nbytes
        if self.candidates:  # the columns as the dedup layout writes them
            self.layout, fractions = choose_encoded(
                sample,
                self.candidates,
                listed=self.config.dedup_features is not None,
                sizes=functools.partial(
                    smallest_bytes,
                    zstd_level=self.config.zstd_level,
                    row_group_rows=self.config.row_group_rows,
                ),
            )
            self.report.encoded_features = list(self.layout.encoded)
            self.report.encoded_groups = [list(g) for g in self.layout.groups]
            self.report.stored_id_fraction = fractions
            sample = encode_row_group(sample, self.layout.encoded, groups=self.layout.groups)
        plan = plan_encodings(
            sample,
            sample_bytes=SAMPLE_MAX_BYTES
            if budget is None
            else min(SAMPLE_MAX_BYTES, budget // 16),
            mode=self.config.dictionary,
            zstd_level=self.config.zstd_level,
            row_group_rows=self.config.row_group_rows,
        )
        # File bytes per decoded byte, for sizing the output (small row groups of a small
        # sample compress worse than the table: an overestimate, so files err on the small side).
        written = column_chunk_bytes(
            sample,
            plan,
            zstd_level=self.config.zstd_level,
            row_group_rows=self.config.row_group_rows,
        )
        if decoded_bytes:
            self.parquet_fraction = min(1.0, sum(written.values()) / decoded_bytes)
        return plan

    def _statistics(self) -> dict[str, Any]:
        """Writer option: no min/max statistics for the dedup layout's encoded columns."""
        if not self.layout.encoded:
            return {}
        schema = dedup_schema(
            self.catalogue.table_schema(), self.layout.encoded, self.layout.groups
        )
        return {"write_statistics": statistics_columns(schema)}

    def _default_partitions(self, units: list[Unit]) -> int:
        """Write tasks for files of about ``target_file_bytes`` (see the module docstring)."""
        partitions = default_output_partitions(
            decoded_bytes=sum(u.decoded_bytes for u in units),
            parquet_fraction=self.parquet_fraction,
            hours=self._estimate_hours(units),
            target_file_bytes=self.config.target_file_bytes,
        )
        log.info("spark: %d output partitions (files per hour)", partitions)
        return partitions

    def _estimate_hours(self, units: list[Unit]) -> int:
        """Partitions (hours or days) the table spans: the window's, else the first shard's
        first to last frame."""
        start_ms, end_ms = self.config.start_ms, self.config.end_ms
        unit_ms = PARTITION_BY[self.partition_by]
        if start_ms is not None and end_ms is not None:
            return max(1, (end_ms - start_ms) // unit_ms)
        if not units:
            return 1
        shard_units = [u for u in units if u.path == units[0].path]
        first = _frame_span_ms(self.catalogue, next(iter_unit_frames(shard_units[0]), None))
        last_frame = deque(iter_unit_frames(shard_units[-1]), maxlen=1)
        last = _frame_span_ms(self.catalogue, last_frame[0] if last_frame else None)
        if first is None or last is None:
            return 1
        low, high = first[0] // unit_ms, last[1] // unit_ms
        if start_ms is not None:
            low = max(low, start_ms // unit_ms)
        if end_ms is not None:
            high = min(high, end_ms // unit_ms - 1)
        return max(1, high - low + 1)

    def _run_job(self, spark: SparkSession, job: SparkJob, *, partitions: int) -> None:
        spark.dataSource.register(ShardSource)
        spark.dataSource.register(TableSink)
        options = {"job": job.to_json()}
        rows = spark.read.format(SHARD_SOURCE).schema(job.row_spark_schema()).options(**options)
        df = rows.load()
        if job.baseline:
            df = df.coalesce(partitions).sortWithinPartitions(HOUR_COLUMN, SEQ_COLUMN)
        else:
            df = df.repartition(partitions, SESSION_ID).sortWithinPartitions(
                HOUR_COLUMN, *CLUSTER_KEYS, SEQ_COLUMN
            )
        try:
            df.write.format(TABLE_SINK).options(**options).mode("append").save()
        except Exception as exc:  # Py4JJavaError / PythonException from a failed task
            error = self._first_task_error()
            if error is None and "ModuleNotFoundError" in str(exc):
                raise ConfigError(
                    f"engine 'spark': Spark's Python workers ({spark.sparkContext.pythonExec}) "
                    "cannot import recd or its dependencies; set PYSPARK_PYTHON to a Python "
                    f"with recd installed (this driver runs {sys.executable}) before Spark "
                    f"starts: {_last_line(str(exc), 'ModuleNotFoundError')}"
                ) from None
            if error is None:
                raise
            log.debug("Spark job failed: %s", exc)
            # The task's own RecdError, rebuilt; the Spark wrapper (a JVM stack trace holding a
            # Python traceback) adds nothing for the user.
            raise error from None

    def _first_task_error(self) -> RecdError | None:
        errors = sorted(self.staging.joinpath(ERRORS_DIR).glob("unit-*.json"))
        return load_error(errors[0]) if errors else None

    def _count_units(self, units: list[Unit]) -> None:
        """Sum the units' counts and merge their quarantines (each unit ran exactly once)."""
        unit_dirs = [self.staging / UNITS_DIR / unit.name for unit in units]
        missing = [d.name for d in unit_dirs if not (d / STATS_FILE).is_file()]
        assert not missing, f"units without counts after a successful job: {missing}"
        report = self.report
        for d in unit_dirs:
            stats = UnitStats(**json.loads((d / STATS_FILE).read_text()))
            report.rows_read += stats.rows_read
            report.rows_outside_window += stats.rows_outside_window
            report.rows_in += stats.rows_read - stats.rows_outside_window
            report.rows_quarantined += stats.rows_quarantined
            report.blocks_quarantined += stats.blocks_quarantined
            report.frames_quarantined += stats.frames_quarantined
        quarantined = merge_quarantines(
            [d / UNIT_QUARANTINE for d in unit_dirs],
            self.table_dir / QUARANTINE_DIR / self.run_id,
        )
        if quarantined is not None:
            report.quarantine_dir = str(quarantined)
            summary = json.loads((quarantined / "_summary.json").read_text())
            report.rows_quarantined_by_field = summary["rows_by_field"]

    def _staged_files(self) -> list[tuple[str, str, int]]:
        """The files the job committed (manifest), after removing anything else staged."""
        manifest = self.staging / FILES_MANIFEST
        files = [tuple(f) for f in json.loads(manifest.read_text())] if manifest.is_file() else []
        expected = {(relpath, name) for relpath, name, _ in files}
        for partition_dir in self.staging.glob("ds=*/hour=*"):
            relpath = f"{partition_dir.parent.name}/{partition_dir.name}"
            for path in partition_dir.iterdir():
                if (relpath, path.name) not in expected:  # a failed attempt's temp file
                    path.unlink()
            assert {p.name for p in data_files(partition_dir)} == {
                n for r, n in expected if r == relpath
            }, f"{partition_dir}: staged files differ from the job's manifest"
        return [(str(r), str(n), int(k)) for r, n, k in files]


def default_output_partitions(
    *, decoded_bytes: int, parquet_fraction: float, hours: int, target_file_bytes: int
) -> int:
    """Write tasks so that each of an hour's files holds about ``target_file_bytes``:
    ``ceil(decoded_bytes x parquet_fraction / (hours x target_file_bytes))``, at least 1."""
    file_bytes = decoded_bytes * parquet_fraction / max(1, hours)
    return max(1, math.ceil(file_bytes / target_file_bytes))


def _frame_span_ms(catalogue: Catalogue, frame: Frame | None) -> tuple[int, int] | None:
    """(first, last) ts of the valid rows of one shard frame, or None if it has none."""
    if frame is None:
        return None
    validator = BlockValidator(catalogue=catalogue, start_ms=None, end_ms=None)
    try:
        result = validator.check(
            decode_frame(frame), path=frame.path, block=frame.index, record=False
        )
    except RecdError:
        return None
    if result.rows is None or result.rows.num_rows == 0:
        return None
    ts = result.rows.column(TS).to_numpy(zero_copy_only=False)
    return int(ts.min()), int(ts.max())


def _last_line(text: str, marker: str) -> str:
    lines = [line.strip() for line in text.splitlines() if marker in line]
    return lines[-1] if lines else text.splitlines()[0]


def merge_quarantines(sources: list[Path], target: Path) -> Path | None:
    """Merge per-unit quarantine dirs into one with the local engine's layout.

    ``rows.parquet`` (rows of every unit, in unit order), ``block-*.arrow`` / ``frame-*.zst``
    (names are unique per shard and block) and one ``_summary.json``. Returns ``target``, or
    None when nothing was quarantined.
    """
    summaries = [s for s in sources if (s / "_summary.json").is_file()]
    if not summaries:
        return None
    target.mkdir(parents=True, exist_ok=True)
    merged: dict[str, Any] = {"rows": 0, "blocks": 0, "frames": 0, "entries": []}
    rows_by_field: Counter[str] = Counter()
    writer: pq.ParquetWriter | None = None
    try:
        for source in summaries:
            summary = json.loads((source / "_summary.json").read_text())
            for key in ("rows", "blocks", "frames"):
                merged[key] += summary[key]
            rows_by_field.update(summary["rows_by_field"])
            merged["entries"].extend(summary["entries"])
            rows_file = source / "rows.parquet"
            if rows_file.is_file():
                part = pq.ParquetFile(rows_file)
                if writer is None:
                    writer = pq.ParquetWriter(
                        target / "rows.parquet", part.schema_arrow, compression="zstd"
                    )
                for i in range(part.num_row_groups):
                    writer.write_table(part.read_row_group(i))
            for path in [*source.glob("block-*.arrow"), *source.glob("frame-*.zst")]:
                os.replace(path, target / path.name)
    finally:
        if writer is not None:
            writer.close()
    merged["rows_by_field"] = dict(sorted(rows_by_field.items()))
    (target / "_summary.json").write_text(json.dumps(merged, indent=1) + "\n")
    return target
