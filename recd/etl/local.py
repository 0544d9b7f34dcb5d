"""The embedded clustering ETL (O2): session shards -> hourly zstd Parquet partitions.

One shard at a time (session sharding puts each session in exactly one shard, so clustering a
shard's rows clusters them in every partition they land in)::

    for shard in shards:                      memory: the shard's rows, or 1/P of them
        for p in range(P):                    P = passes, from the shard's decoded size / budget
            rows = good rows of the window    (blocks streamed, validated, sessions of bucket p)
            order = sort by (hour, session_id, ts, request_id)   (baseline: by hour, stable)
            write one part file per hour      TABLE/_tmp-<run>/ds=D/hour=HH/part-SSSS[-PP].parquet
    commit every staged partition             (recd.etl.commit: _SUCCESS, rename into place)

Sorting and the row-group ``take`` are pyarrow kernels; the only Python loops run over shards,
passes, blocks, partitions and row groups. A re-run on the same input writes byte-identical
Parquet files (deterministic names, order, encodings and writer).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import resource
import shutil
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recd.errors import ConfigError, SchemaError
from recd.etl.commit import (
    QUARANTINE_DIR,
    clean_stale,
    commit_partitions,
    lock_table,
    new_run_id,
    staging_dir,
)
from recd.etl.config import EtlConfig, EtlReport, window_of
from recd.etl.encodings import SAMPLE_MAX_BYTES, EncodingPlan, plan_encodings
from recd.etl.partitions import Partition, hour_ids
from recd.etl.validate import (
    BlockValidator,
    Quarantine,
    decode_frame,
    frame_content_sizes,
    iter_frames,
)
from recd.logs.hashing import splitmix64
from recd.logs.rawlog import MANIFEST_FILE, SHARD_GLOB, read_catalogue
from recd.progress import progress_bar
from recd.schema import REQUEST_ID, SESSION_ID, TS, Catalogue

log = logging.getLogger(__name__)

# Peak memory of a pass, as a multiple of the decoded bytes of the rows it holds: the rows, the
# sort keys and indices, one row group being taken and encoded, allocator slack. Measured about
# 2.8x with jemalloc on one 33 MB shard (tests/integration/test_etl_memory.py builds such data);
# the budget splits a shard into P passes so that PASS_MEMORY_FACTOR x decoded / P <= budget.
# On top comes a fixed cost (Parquet writer, zstd contexts, encoding trial: ~20-60 MB RSS
# depending on the allocator).
PASS_MEMORY_FACTOR = 3.0
# Salt so that pass buckets are independent of the shard routing hash of the same session ids.
PASS_BUCKET_SALT = np.uint64(0x5EED_0F_E7_1A_55_E5)
# Test hook: seconds to sleep after each shard pass is staged (lets a test SIGKILL a real run
# before its commit phase). Unset in normal runs. See also commit.COMMIT_DELAY_ENV.
SHARD_DELAY_ENV = "RECD_ETL_TEST_SHARD_DELAY_S"
CLUSTER_KEYS = (SESSION_ID, TS, REQUEST_ID)


def run_etl(config: EtlConfig) -> EtlReport:
    """Run the ETL described by ``config`` and return what it did.

    ``engine="spark"`` hands over to ``recd.etl.spark.run_spark_etl`` (the ``recd[spark]``
    extra); ``"local"`` runs the embedded engine in this process.
    """
    if config.engine == "spark":
        return _run_spark(config)
    return LocalEtl(config).run()


def _run_spark(config: EtlConfig) -> EtlReport:
    try:
        spark = importlib.import_module("recd.etl.spark")
    except ModuleNotFoundError as exc:
        if exc.name is not None and (
            exc.name == "recd.etl.spark" or exc.name.startswith("pyspark")
        ):
            raise ConfigError(
                "engine 'spark' is not available: install the Spark extra "
                f"(pip install 'recd[spark]', Java 17 needed) ({exc})"
            ) from exc
        raise
    report: EtlReport = spark.run_spark_etl(config)
    return report


def list_shards(shard_dir: Path) -> list[Path]:
    """The shard files of a shard directory, in shard order."""
    if not shard_dir.is_dir():
        raise ConfigError(f"shard_dir {shard_dir} is not a directory")
    shards = sorted(shard_dir.glob(SHARD_GLOB))
    if not shards:
        raise SchemaError(f"{shard_dir}: no {SHARD_GLOB} files: not a recd shard directory")
    return shards


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


def count_passes(decoded_bytes: int, memory_budget_bytes: int | None) -> int:
    """Passes needed so that one pass holds at most the budget (PASS_MEMORY_FACTOR included)."""
    if memory_budget_bytes is None or decoded_bytes <= 0:
        return 1
    return max(1, math.ceil(PASS_MEMORY_FACTOR * decoded_bytes / memory_budget_bytes))


def session_buckets(session_ids: np.ndarray, passes: int) -> np.ndarray:
    """Pass of every session id, in [0, passes): all rows of a session share one pass."""
    mixed = splitmix64(np.asarray(session_ids, dtype=np.int64).view(np.uint64) ^ PASS_BUCKET_SALT)
    return (mixed % np.uint64(passes)).astype(np.int64)


def output_order(table: pa.Table, hours: np.ndarray, *, clustered: bool) -> pa.Array:
    """Row order of the output: by hour, then (session_id, ts, request_id) if clustered.

    Baseline keeps arrival order inside each hour (pyarrow's sort is stable).
    """
    keys: dict[str, Any] = {"_hour": pa.array(hours)}
    if clustered:
        keys.update({name: table.column(name) for name in CLUSTER_KEYS})
    key_table = pa.table(keys)
    return pc.sort_indices(key_table, sort_keys=[(name, "ascending") for name in keys])


def part_file_name(shard: Path, pass_index: int, passes: int) -> str:
    """``part-SSSS.parquet`` (SSSS from ``shard-SSSS.zst``), ``part-SSSS-PP.parquet`` with passes."""
    number = shard.name.removeprefix("shard-").split(".")[0]
    if passes == 1:
        return f"part-{number}.parquet"
    width = max(2, len(str(passes - 1)))
    return f"part-{number}-{pass_index:0{width}d}.parquet"


def peak_rss_bytes() -> int:
    """Peak resident memory of this process.

    Linux: ``VmHWM`` from /proc/self/status, which starts afresh at exec (``ru_maxrss`` would
    include the RSS of the parent at fork time). Elsewhere: ``ru_maxrss``.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass


class LocalEtl:
    """One run of the embedded engine (use :func:`run_etl`)."""

    def __init__(self, config: EtlConfig) -> None:
        self.config = config
        self.catalogue: Catalogue = read_catalogue(config.shard_dir)
        self.schema = self.catalogue.arrow_schema()  # with the catalogue in its metadata
        self.run_id = new_run_id()
        self.staging = staging_dir(config.table_dir, self.run_id)
        self.report = EtlReport(
            run_id=self.run_id,
            engine="local",
            clustered=not config.baseline,
            window=window_of(config),
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
        self.manifest = read_shard_manifest(config.shard_dir)
        self.rows_per_partition: dict[Partition, int] = {}

    def run(self) -> EtlReport:
        started = time.perf_counter()
        shards = list_shards(self.config.shard_dir)
        if self.manifest.get("key") == "random" and not self.config.baseline:
            log.warning(
                "%s was sharded by a random key: each file is clustered, but a session may span "
                "several files of a partition (shard by session for O2)",
                self.config.shard_dir,
            )
        with lock_table(self.config.table_dir):
            stale = clean_stale(self.config.table_dir)
            if stale:
                log.info(
                    "cleaned %d leftovers of crashed runs in %s", len(stale), self.config.table_dir
                )
            try:
                for shard in shards:
                    self._process_shard(shard)
            except BaseException:
                shutil.rmtree(self.staging, ignore_errors=True)  # hidden anyway; tidy up
                raise
            finally:
                if self.quarantine is not None:
                    self.quarantine.close()
            self._count_quarantine()
            self.report.rows_out = sum(self.rows_per_partition.values())
            self.report.rows_per_partition = {
                p.relpath: n for p, n in sorted(self.rows_per_partition.items())
            }
            self.report.check_row_accounting()
            records = commit_partitions(
                self.config.table_dir, self.staging, self.rows_per_partition, run_id=self.run_id
            )
        assert sum(r.rows for r in records) == self.report.rows_out, "committed rows differ"
        report = self.report
        report.partitions = len(records)
        report.files = sum(len(r.files) for r in records)
        report.bytes_out = sum(f.bytes for r in records for f in r.files)
        report.seconds = time.perf_counter() - started
        report.rows_per_s = report.rows_in / report.seconds if report.seconds > 0 else 0.0
        report.peak_rss_bytes = peak_rss_bytes()
        return report

    def _count_quarantine(self) -> None:
        q = self.quarantine
        if q is not None and q.used:
            self.report.blocks_quarantined = q.blocks
            self.report.frames_quarantined = q.frames
            self.report.quarantine_dir = str(q.directory)
            assert q.rows == self.report.rows_quarantined, "quarantine count differs"

    def _process_shard(self, shard: Path) -> None:
        decoded_bytes, blocks = shard_size(shard, self.manifest)
        passes = count_passes(decoded_bytes, self.config.memory_budget_bytes)
        self.report.passes_per_shard[shard.name] = passes
        if passes > 1:
            log.info("%s: %d decoded bytes -> %d passes", shard.name, decoded_bytes, passes)
        bar: AbstractContextManager[Any] = (
            progress_bar(desc=f"etl {shard.name}", total=blocks * passes, unit="block")
            if self.config.show_progress
            else nullcontext(_NoBar())
        )
        with bar as b:
            for pass_index in range(passes):
                table = self._read_pass(shard, pass_index, passes, b)
                if table.num_rows:
                    self._write_pass(table, part_file_name(shard, pass_index, passes))
                del table
                pa.default_memory_pool().release_unused()  # give freed pass memory back
                delay_s = float(os.environ.get(SHARD_DELAY_ENV, "0") or 0)
                if delay_s > 0:
                    time.sleep(delay_s)

    def _read_pass(self, shard: Path, pass_index: int, passes: int, bar: Any) -> pa.Table:
        """The good in-window rows of ``shard`` whose session falls in bucket ``pass_index``."""
        record = pass_index == 0  # count and quarantine each input once, on the first pass
        batches: list[pa.RecordBatch] = []
        for frame in iter_frames(shard):
            bar.update(1)
            try:
                batch = decode_frame(frame)
            except SchemaError as exc:
                if self.quarantine is None:
                    raise
                if record:
                    self.quarantine.add_frame(frame, reason=str(exc))
                continue
            result = self.validator.check(batch, path=shard, block=frame.index, record=record)
            del batch
            if record:
                self.report.rows_read += result.rows_read
                self.report.rows_outside_window += result.rows_outside_window
                self.report.rows_in += result.rows_read - result.rows_outside_window
                self.report.rows_quarantined += result.rows_quarantined
            rows = result.rows
            if rows is None:
                continue
            if passes > 1:
                sessions = rows.column(SESSION_ID).to_numpy(zero_copy_only=False)
                rows = rows.filter(pa.array(session_buckets(sessions, passes) == pass_index))
            if rows.num_rows:
                batches.append(rows)
        return pa.Table.from_batches(batches, schema=self.validator.row_schema)

    def _write_pass(self, table: pa.Table, file_name: str) -> None:
        """Sort one pass's rows and write one part file per hourly partition into staging."""
        hours = hour_ids(table.column(TS))
        order = output_order(table, hours, clustered=not self.config.baseline)
        sorted_hours = hours[order.to_numpy()]
        if self.plan is None:
            self.plan = plan_encodings(
                table,
                order=order,
                sample_bytes=self._sample_bytes(),
                mode=self.config.dictionary,
                zstd_level=self.config.zstd_level,
                row_group_rows=self.config.row_group_rows,
            )
            self.report.encodings = self.plan.describe()
            for column in self.plan.columns:
                log.debug("encoding %s: %s (%s)", column.column, column.encoding, column.reason)
        bounds = np.flatnonzero(np.diff(sorted_hours)) + 1
        starts = np.concatenate([[0], bounds])
        ends = np.concatenate([bounds, [len(sorted_hours)]])
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            partition = Partition.from_hour_id(int(sorted_hours[start]))
            directory = partition.path(self.staging)
            directory.mkdir(parents=True, exist_ok=True)
            self._write_file(directory / file_name, table, order.slice(start, end - start))
            self.rows_per_partition[partition] = (
                self.rows_per_partition.get(partition, 0) + end - start
            )

    def _sample_bytes(self) -> int:
        budget = self.config.memory_budget_bytes
        return SAMPLE_MAX_BYTES if budget is None else min(SAMPLE_MAX_BYTES, budget // 16)

    def _write_file(self, path: Path, table: pa.Table, indices: pa.Array) -> None:
        assert self.plan is not None
        rg = self.config.row_group_rows
        sorting = None
        if not self.config.baseline:
            sorting = [pq.SortingColumn(self.schema.get_field_index(name)) for name in CLUSTER_KEYS]
        with pq.ParquetWriter(
            path,
            self.schema,
            compression="zstd",
            compression_level=self.config.zstd_level,
            sorting_columns=sorting,
            **self.plan.writer_options(),
        ) as writer:
            for start in range(0, len(indices), rg):
                chunk = table.take(indices.slice(start, rg))
                writer.write_table(
                    chunk.replace_schema_metadata(self.schema.metadata), row_group_size=rg
                )
