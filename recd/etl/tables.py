"""What a reader may read of a table: its committed files, by partition, in order.

Two table formats exist (see docs/tables.md): **iceberg** (the default for new tables; one
snapshot per ETL run, recd.etl.iceberg) and **hive** (a directory per hour holding
``_SUCCESS``; each partition commits on its own, recd.etl.commit). Readers also take a
**parquet** table: a directory of Parquet files written by another tool (pandas, Spark,
DuckDB), read as it is (every ``*.parquet`` file under it whose path has no hidden ``_``/``.``
part; files under ``ds=D/hour=HH`` or ``ds=D`` directories belong to that partition, others
to none). recd never writes one. Readers, ``recd analyze`` and the benchmarks ask here and
never look at the directories themselves.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from recd.errors import ConfigError, SchemaError
from recd.etl.commit import (
    SUCCESS_FILE,
    SuccessRecord,
    clean_stale,
    commit_partitions,
    committed_partition_dirs,
    data_files,
    describe_partition,
    fsync_file,
)
from recd.etl.config import TABLE_FORMATS, EtlConfig, EtlReport
from recd.etl.iceberg import (
    commit_files,
    is_iceberg_table,
    load_table,
    remove_orphans,
    snapshot_files,
    table_partition_by,
)
from recd.etl.partitions import (
    PARTITION_BY,
    Partition,
    format_time_ms,
    iter_partition_dirs,
    parse_partition_relpath,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CommittedFiles:
    """A table's committed data files, grouped by partition (in partition order)."""

    table_format: str
    """``iceberg``, ``hive`` or ``parquet`` (files written by another tool)."""
    snapshot_id: int | None
    """Iceberg: the snapshot read (None: nothing committed yet). Others: always None."""
    partitions: list[tuple[Partition, list[Path]]]
    """Each partition with its data files, sorted by name."""
    unpartitioned: list[Path] = field(default_factory=list)
    """A ``parquet`` table's files outside partition directories, sorted by path."""

    @property
    def files(self) -> list[Path]:
        return [path for _, paths in self.partitions for path in paths] + self.unpartitioned


def table_format(table_dir: Path) -> str | None:
    """``iceberg``, ``hive`` (a committed hourly partition and no Iceberg metadata),
    ``parquet`` (Parquet files and neither), or None for a directory holding none of these
    (a new table)."""
    if is_iceberg_table(table_dir):
        return "iceberg"
    if any((path / SUCCESS_FILE).is_file() for _, path in iter_partition_dirs(table_dir)):
        return "hive"
    if plain_parquet_files(table_dir):
        return "parquet"
    return None


def plain_parquet_files(table_dir: Path) -> list[Path]:
    """Every ``*.parquet`` file under ``table_dir`` whose path (relative to it) has no part
    starting with ``_`` or ``.`` (what Hive-style readers skip), sorted by path."""
    if not table_dir.is_dir():
        return []
    return sorted(
        path
        for path in table_dir.rglob("*.parquet")
        if path.is_file()
        and not any(part.startswith(("_", ".")) for part in path.relative_to(table_dir).parts)
    )


def _parquet_table(table_dir: Path, start_ms: int | None, end_ms: int | None) -> CommittedFiles:
    by_partition: dict[Partition, list[Path]] = {}
    loose: list[Path] = []
    for path in plain_parquet_files(table_dir):
        relpath = path.parent.relative_to(table_dir).as_posix()
        partition = parse_partition_relpath(relpath) if relpath != "." else None
        if partition is None:
            loose.append(path)
        else:
            by_partition.setdefault(partition, []).append(path)
    if loose and (start_ms is not None or end_ms is not None):
        raise ConfigError(
            f"{table_dir}: {len(loose)} Parquet file(s) are not in ds=YYYY-MM-DD[/hour=HH] "
            f"directories (e.g. {loose[0]}), so a time window (start / end) cannot select "
            "them: read the whole table, or give the held-out rows their own table "
            "([eval] table)"
        )
    partitions = [
        (p, by_partition[p])
        for p in sorted(by_partition)
        if (start_ms is None or p.start_ms >= start_ms) and (end_ms is None or p.start_ms < end_ms)
    ]
    return CommittedFiles("parquet", None, partitions, loose)


def committed_files(
    table_dir: Path,
    *,
    snapshot_id: int | None = None,
    start_ms: int | None = None,
    end_ms: int | None = None,
) -> CommittedFiles:
    """The committed files of partitions whose hour starts in [start_ms, end_ms).

    ``snapshot_id`` pins an Iceberg table's snapshot (None: the current one); it is an error
    for a Hive-layout table, which has no snapshots.
    """
    if not table_dir.is_dir():
        raise ConfigError(f"{table_dir}: table directory does not exist")
    if is_iceberg_table(table_dir):
        resolved, partitions = snapshot_files(
            table_dir, snapshot_id=snapshot_id, start_ms=start_ms, end_ms=end_ms
        )
        return CommittedFiles("iceberg", resolved, partitions)
    found = table_format(table_dir)
    if snapshot_id is not None:
        what = "a Hive-layout" if found == "hive" else "a plain Parquet"
        raise ConfigError(
            f"{table_dir}: {what} table has no snapshots (asked for {snapshot_id})"
            + ("; convert it with `recd table migrate`" if found == "hive" else "")
        )
    if found == "parquet":
        return _parquet_table(table_dir, start_ms, end_ms)
    partitions = [
        (partition, [f for f in data_files(path) if f.suffix == ".parquet"])
        for partition, path in committed_partition_dirs(table_dir, start_ms=start_ms, end_ms=end_ms)
    ]
    return CommittedFiles("hive", None, partitions)


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


def existing_partition_by(table_dir: Path) -> str | None:
    """``hour`` or ``day`` for a table that has partitions (an Iceberg table: its spec),
    None for a new one."""
    if is_iceberg_table(table_dir):
        return table_partition_by(load_table(table_dir))
    found = iter_partition_dirs(table_dir) if table_dir.is_dir() else []
    return found[0][0].partition_by if found else None


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


def schema_difference(table_schema: pa.Schema, run_schema: pa.Schema) -> str | None:
    """What differs between two file schemas (names, order, types), or None if they match.
    Schema metadata and field nullability are ignored."""

    def fields(schema: pa.Schema) -> list[tuple[str, str]]:
        return [(f.name, str(f.type).replace(" not null", "")) for f in schema]

    old, new = fields(table_schema), fields(run_schema)
    if old == new:
        return None
    old_names, new_names = dict(old), dict(new)
    parts = []
    missing = [n for n in old_names if n not in new_names]
    extra = [n for n in new_names if n not in old_names]
    changed = [
        f"{n} ({old_names[n]} -> {new_names[n]})"
        for n in old_names
        if n in new_names and old_names[n] != new_names[n]
    ]
    if missing:
        parts.append(f"missing columns {missing}")
    if extra:
        parts.append(f"new columns {extra}")
    if changed:
        parts.append(f"changed types {changed}")
    if not parts:
        parts.append("columns in another order")
    return "; ".join(parts)


def check_run_schema(table_dir: Path, run_files: list[Path]) -> None:
    """Refuse (SchemaError) a run whose files differ in schema from each other or from the
    table's current files, before anything of the run becomes visible."""
    if not run_files:
        return
    run_schema = pq.read_schema(run_files[0])
    for path in run_files[1:]:
        diff = schema_difference(run_schema, pq.read_schema(path))
        if diff is not None:
            raise SchemaError(f"{path}: schema differs from {run_files[0]}: {diff}")
    current = committed_files(table_dir).files if table_dir.is_dir() else []
    if not current:
        return
    diff = schema_difference(pq.read_schema(current[0]), run_schema)
    if diff is not None:
        raise SchemaError(
            f"{table_dir}: this run's files do not match the table's schema ({diff}); nothing "
            "was committed. Write them to a new table, or remove this one first (with the "
            "dedup layout, --dedup-features pins the encoded columns)"
        )


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
    gives the table, whether rows are clustered, the layout and a new table's catalog. Call under the table's lock (recd.etl.commit.lock_table)."""
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
