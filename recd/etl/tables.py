"""Where an ETL run writes and how it commits: the table's format and granularity, checked
against the run's config, and the commit of the staged files (readers ask recd.table.snapshot).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from recd.durable import fsync_file
from recd.errors import ConfigError
from recd.etl.config import TABLE_FORMATS, EtlConfig, EtlReport
from recd.table.hive import (
    SuccessRecord,
    clean_stale,
    commit_partitions,
    data_files,
    describe_partition,
)
from recd.table.iceberg import (
    commit_files,
    remove_orphans,
)
from recd.table.partitions import (
    PARTITION_BY,
    Partition,
    format_time_ms,
)
from recd.table.snapshot import (
    check_run_schema,
    existing_partition_by,
    table_format,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TableTarget:
    """What an ETL run writes: the table's format and partition granularity."""

    table_format: str
    """``iceberg`` or ``hive``."""
    partition_by: str
    """``hour`` or ``day``."""


def prepare_table(config: EtlConfig) -> TableTarget:
    """At the start of a run, under the table's lock: remove what killed runs left (staging
    directories, trashed Hive partitions, Iceberg files moved in but never committed) and
    return the format (:func:`resolve_table_format`) and granularity
    (:func:`resolve_partition_by`) the run writes."""
    table_dir = config.table_dir
    table_format = resolve_table_format(table_dir, config.table_format)
    partition_by = resolve_partition_by(config, table_format)
    stale = clean_stale(table_dir)
    if table_format == "iceberg":
        stale += remove_orphans(table_dir)
    if stale:
        log.info("cleaned %d leftovers of killed runs in %s", len(stale), table_dir)
    return TableTarget(table_format, partition_by)


def resolve_partition_by(config: EtlConfig, table_format: str) -> str:
    """The granularity a run writes: the table's own if it has one (``config.partition_by``
    must agree), else ``config.partition_by`` or ``hour``. Day partitions need the Iceberg
    format, and a day-partitioned run's window must start and end at midnight (UTC)."""
    existing = existing_partition_by(config.table_dir)
    requested = config.partition_by
    if existing is not None and requested is not None and requested != existing:
        raise ConfigError(
            f"{config.table_dir}: the table is partitioned by {existing}, not {requested} "
            "(write another table to change it)"
        )
    partition_by = existing or requested or "hour"
    if partition_by == "day" and table_format != "iceberg":
        raise ConfigError(
            f"{config.table_dir}: day partitions need the iceberg table format "
            f"(this table is {table_format})"
        )
    unit_ms = PARTITION_BY[partition_by]
    for name, ms in (("start", config.start_ms), ("end", config.end_ms)):
        if ms is not None and ms % unit_ms:
            raise ConfigError(
                f"{name} must be on a whole {partition_by} (the table is partitioned by "
                f"{partition_by}; a partial {partition_by} would replace a partition with part "
                f"of its rows), got {format_time_ms(ms)}"
            )
    return partition_by


def refuse_foreign_table(table_dir: Path) -> None:
    """ConfigError when ``table_dir`` holds Parquet files recd did not write (a ``parquet``
    table): the ETL never writes into another tool's table, not even its lock file."""
    if table_dir.is_dir() and table_format(table_dir) == "parquet":
        raise _foreign_table(table_dir)


def _foreign_table(table_dir: Path) -> ConfigError:
    return ConfigError(
        f"{table_dir}: holds Parquet files that recd did not write (no Iceberg metadata, "
        "no _SUCCESS partitions); write the ETL's table to another directory"
    )


def resolve_table_format(table_dir: Path, requested: str | None) -> str:
    """The format a run writes: the table's own if it has one (``requested`` must agree),
    else ``requested`` or ``iceberg``."""
    if requested is not None and requested not in TABLE_FORMATS:
        raise ConfigError(f"table format must be one of {TABLE_FORMATS}, got {requested!r}")
    existing = table_format(table_dir) if table_dir.is_dir() else None
    if existing is None:
        return requested or "iceberg"
    if existing == "parquet":
        raise _foreign_table(table_dir)
    if requested is not None and requested != existing:
        hint = " (convert it with `recd table migrate`)" if existing == "hive" else ""
        raise ConfigError(
            f"{table_dir}: the table is in the {existing} format, not {requested}{hint}"
        )
    if existing == "hive" and requested is None:
        log.warning(
            "%s: Hive-layout table: each hour commits on its own, so a run killed midway "
            "leaves some hours new and some old; `recd table migrate` converts it to Iceberg "
            "(one commit per run, nothing rewritten)",
            table_dir,
        )
    return existing


@dataclass(frozen=True, slots=True)
class RunCommit:
    """What one ETL run committed."""

    records: list[SuccessRecord]
    """Per partition: rows, files (names as staged), bytes and checksums."""
    snapshot_id: int | None
    """The Iceberg snapshot the run made (None for a Hive-layout table)."""


def commit_run(
    config: EtlConfig,
    staging: Path,
    partitions: Iterable[Partition],
    *,
    run_id: str,
    target: TableTarget,
) -> RunCommit:
    """Commit the partitions a run staged under ``staging`` (see :func:`resolve_table_format`)
    once its schema has been checked: one Iceberg snapshot, or Hive partition swaps. The
    staging directory is removed (also when the schema check refuses the run). ``config``
    gives the table, whether rows are clustered, the layout and a new table's catalog. Call under the table's lock (recd.table.hive.lock_table)."""
    table_dir = config.table_dir
    partitions = sorted(partitions)
    staged_files = [
        path
        for partition in partitions
        if partition.path(staging).is_dir()
        for path in data_files(partition.path(staging))
    ]
    try:
        check_run_schema(table_dir, staged_files)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # the run's files: refused, never visible
        raise
    if target.table_format == "hive":
        records = commit_partitions(table_dir, staging, partitions, run_id=run_id)
        return RunCommit(records, None)
    records = []
    staged: list[tuple[Partition, Path]] = []
    for partition in partitions:
        source = partition.path(staging)
        files = data_files(source)
        for path in files:
            fsync_file(path)
        records.append(describe_partition(source, partition, checksums=False))
        staged.extend((partition, path) for path in files)
    snapshot_id = commit_files(
        table_dir,
        staged,
        run_id=run_id,
        clustered=not config.baseline,
        layout=config.layout,
        catalog=config.catalog,
        identifier=config.table_identifier,
        partition_by=target.partition_by,
    )
    shutil.rmtree(staging, ignore_errors=True)
    return RunCommit(records, snapshot_id)


def commit_and_report(
    config: EtlConfig,
    staging: Path,
    rows_per_partition: dict[Partition, int],
    report: EtlReport,
    *,
    target: TableTarget,
) -> RunCommit:
    """The end of an ETL run (either engine), under the table's lock: check that every row
    is accounted for, commit (:func:`commit_run`) and fill the report's output figures."""
    report.rows_out = sum(rows_per_partition.values())
    report.rows_per_partition = {p.relpath: n for p, n in sorted(rows_per_partition.items())}
    report.check_row_accounting()
    committed = commit_run(config, staging, rows_per_partition, run_id=report.run_id, target=target)
    records = committed.records
    assert sum(r.rows for r in records) == report.rows_out, "committed rows differ"
    report.partitions = len(records)
    report.files = sum(len(r.files) for r in records)
    report.bytes_out = sum(f.bytes for r in records for f in r.files)
    report.table_format = target.table_format
    report.partition_by = target.partition_by
    report.snapshot_id = committed.snapshot_id
    return committed
