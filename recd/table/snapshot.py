"""What a reader may read of a table: its committed files, by partition, in order.

Two table formats exist (see docs/tables.md): **iceberg** (the default for new tables; one
snapshot per ETL run, recd.table.iceberg) and **hive** (a directory per hour holding
``_SUCCESS``; each partition commits on its own, recd.table.hive). Readers also take a
**parquet** table: a directory of Parquet files written by another tool (pandas, Spark,
DuckDB), read as it is (every ``*.parquet`` file under it whose path has no hidden ``_``/``.``
part; files under ``ds=D/hour=HH`` or ``ds=D`` directories belong to that partition, others
to none). recd never writes one. Readers, ``recd analyze`` and the benchmarks ask here and
never look at the directories themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from recd.errors import ConfigError, SchemaError
from recd.table.hive import SUCCESS_FILE, committed_partition_dirs, data_files
from recd.table.iceberg import is_iceberg_table, load_table, snapshot_files, table_partition_by
from recd.table.partitions import Partition, iter_partition_dirs, parse_partition_relpath


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


def existing_partition_by(table_dir: Path) -> str | None:
    """``hour`` or ``day`` for a table that has partitions (an Iceberg table: its spec),
    None for a new one."""
    if is_iceberg_table(table_dir):
        return table_partition_by(load_table(table_dir))
    found = iter_partition_dirs(table_dir) if table_dir.is_dir() else []
    return found[0][0].partition_by if found else None


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
