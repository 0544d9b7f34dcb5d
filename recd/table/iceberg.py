"""Apache Iceberg tables: one snapshot per ETL run, readers plan from a snapshot.

An ETL run writes its clustered Parquet files as before; what makes them visible is one
Iceberg commit (an ``append``, or an ``overwrite`` when the run rewrites hours the table
already has), so a run killed at any moment leaves the table as it was and a reader (or a
training run, which records the snapshot id it read) sees whole runs only. pyiceberg does the
table format (metadata files, manifests, the catalog's atomic swap of the metadata pointer);
this module maps recd's hourly (or daily) partitions and run files onto it. docs/tables.md
has the directory layout, the table metadata, catalogs and reading with other tools.

recd's data files carry no Parquet field ids (pyarrow writes them before the table that
assigns ids is loaded, and a migration registers files it must not rewrite), so Iceberg
readers map their columns by name through the table's name mapping
(``schema.name-mapping.default``). recd registers its files by hand (a run's commit replaces
partitions in one overwrite, which pyiceberg's ``add_files`` cannot), so it writes the mapping
itself: when it creates a table, and in the next commit to a table made before it did.
Manifest paths are absolute; the relative ones an older recd wrote are resolved against the
table root and listed again as absolute by the next commit. pyiceberg is imported lazily: the
readers' worker processes and the Hive-layout path do not need its start-up cost.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from recd.durable import fsync_directory, write_bytes_atomic
from recd.errors import CommitError, ConfigError
from recd.table.hive import COMMIT_DELAY_ENV
from recd.table.partitions import PARTITION_BY, Partition, iter_partition_dirs

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

log = logging.getLogger(__name__)

ICEBERG_DIR = "_iceberg"
TABLE_INFO_FILE = "table.json"
TABLE_INFO_FORMAT = "recd.iceberg/1"
EMBEDDED_CATALOG_DB = "catalog.db"
DEFAULT_IDENTIFIER = "recd.table"
PARTITION_FIELD = "{}_start_ms"
"""Name of the partition field; ``{}``: the granularity (``hour_start_ms``, ``day_start_ms``)."""
RUN_ID_PROPERTY = "recd.run-id"
CATALOGUE_PROPERTY = "recd.catalogue"
LAYOUT_PROPERTY = "recd.table.layout"
NAME_MAPPING_PROPERTY = "schema.name-mapping.default"
"""Iceberg's name mapping (column names -> field ids) for data files without field ids."""


@dataclass(frozen=True, slots=True)
class TableInfo:
    """Content of ``TABLE/_iceberg/table.json``: where the table's Iceberg metadata lives."""

    catalog: str | None
    """Name of a pyiceberg catalog (configured in ``~/.pyiceberg.yaml`` or
    ``PYICEBERG_CATALOG__<NAME>__*`` variables); None: the embedded SQLite catalog."""
    identifier: str
    """``namespace.name`` of the table in that catalog."""

    def to_json(self) -> str:
        body = {"format": TABLE_INFO_FORMAT, "catalog": self.catalog, "identifier": self.identifier}
        return json.dumps(body, indent=1, sort_keys=True) + "\n"


def is_iceberg_table(table_dir: Path) -> bool:
    """Whether ``table_dir`` holds an Iceberg-format recd table (``_iceberg/table.json``)."""
    return (table_dir / ICEBERG_DIR / TABLE_INFO_FILE).is_file()


def read_table_info(table_dir: Path) -> TableInfo:
    path = table_dir / ICEBERG_DIR / TABLE_INFO_FILE
    try:
        body = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CommitError(f"{path}: unreadable table pointer: {exc}") from exc
    if not isinstance(body, dict) or body.get("format") != TABLE_INFO_FORMAT:
        raise CommitError(f"{path}: not a {TABLE_INFO_FORMAT} table pointer")
    catalog, identifier = body.get("catalog"), body.get("identifier")
    if not isinstance(identifier, str) or (catalog is not None and not isinstance(catalog, str)):
        raise CommitError(f"{path}: 'identifier' (text) and 'catalog' (text or null) expected")
    return TableInfo(catalog=catalog, identifier=identifier)


def _catalog(table_dir: Path, name: str | None) -> Catalog:
    if name is not None:
        from pyiceberg.catalog import load_catalog

        try:
            return load_catalog(name)
        except Exception as exc:  # pyiceberg raises ValueError and friends for bad configs
            raise ConfigError(f"iceberg catalog {name!r}: cannot load it: {exc}") from exc
    from pyiceberg.catalog.sql import SqlCatalog

    root = (table_dir / ICEBERG_DIR).resolve()
    return SqlCatalog(
        "recd",
        uri=f"sqlite:///{root / EMBEDDED_CATALOG_DB}",
        warehouse=root.as_uri(),
    )


def load_table(table_dir: Path) -> Table:
    """The Iceberg table of ``table_dir`` (current metadata)."""
    from pyiceberg.exceptions import NoSuchTableError

    info = read_table_info(table_dir)
    try:
        return _catalog(table_dir, info.catalog).load_table(info.identifier)
    except NoSuchTableError as exc:
        raise CommitError(
            f"{table_dir}: its catalog has no table {info.identifier!r} "
            f"(named in {ICEBERG_DIR}/{TABLE_INFO_FILE})"
        ) from exc


def create_table(
    table_dir: Path,
    schema: pa.Schema,
    *,
    clustered: bool,
    layout: str,
    catalog: str | None = None,
    identifier: str | None = None,
    write_pointer: bool = True,
    partition_by: str = "hour",
) -> Table:
    """Create the Iceberg table of ``table_dir`` for files of ``schema`` (no snapshot yet):
    hourly (``partition_by="day"``: daily) partitioning on ``ts``, sort order
    ``session_id, ts`` when ``clustered``.
    ``write_pointer=False`` leaves ``_iceberg/table.json`` (what makes the directory an
    Iceberg table for readers) to the caller: :func:`write_table_pointer`."""
    from pyiceberg.transforms import IdentityTransform, TruncateTransform

    identifier = identifier or DEFAULT_IDENTIFIER
    root = table_dir.resolve()
    (root / ICEBERG_DIR).mkdir(parents=True, exist_ok=True)
    cat = _catalog(root, catalog)
    namespace = identifier.rpartition(".")[0]
    if not namespace:
        raise ConfigError(f"iceberg table identifier {identifier!r}: expected namespace.name")
    cat.create_namespace_if_not_exists(namespace)
    properties = {
        "write.metadata.path": (root / ICEBERG_DIR / "metadata").as_uri(),
        LAYOUT_PROPERTY: layout,
        "format-version": "2",
    }
    catalogue = (schema.metadata or {}).get(b"recd.catalogue")
    if catalogue is not None:
        properties[CATALOGUE_PROPERTY] = catalogue.decode()
    with cat.create_table_transaction(
        identifier,
        schema=schema.remove_metadata(),
        location=root.as_uri(),
        properties=properties,
    ) as tx:
        with tx.update_spec() as spec:
            spec.add_field(
                "ts",
                TruncateTransform(PARTITION_BY[partition_by]),
                PARTITION_FIELD.format(partition_by),
            )
        if clustered:
            with tx.update_sort_order() as order:
                order.asc("session_id", IdentityTransform())
                order.asc("ts", IdentityTransform())
        tx.set_properties(name_mapping_properties(tx.table_metadata))
    if write_pointer:
        write_table_pointer(root, catalog=catalog, identifier=identifier)
    return cat.load_table(identifier)


def name_mapping_properties(metadata: TableMetadata) -> dict[str, str]:
    """``{schema.name-mapping.default: ...}`` mapping the current schema's column names to
    its field ids, or {} when the table has a name mapping already."""
    if metadata.name_mapping() is not None:
        return {}
    return {NAME_MAPPING_PROPERTY: metadata.schema().name_mapping.model_dump_json()}


def write_table_pointer(table_dir: Path, *, catalog: str | None, identifier: str) -> None:
    """Write ``_iceberg/table.json`` atomically: from then on the directory is read as an
    Iceberg table."""
    info = TableInfo(catalog=catalog, identifier=identifier)
    write_bytes_atomic(table_dir / ICEBERG_DIR / TABLE_INFO_FILE, info.to_json().encode())


def table_partition_by(table: Table) -> str:
    """``hour`` or ``day``: the granularity of the table's partition spec."""
    from pyiceberg.transforms import TruncateTransform

    fields = table.spec().fields
    if len(fields) == 1 and isinstance(fields[0].transform, TruncateTransform):
        width = fields[0].transform.width
        for name, unit_ms in PARTITION_BY.items():
            if width == unit_ms:
                return name
    raise CommitError(
        f"{table.location()}: partition spec {table.spec()} is not one recd writes "
        "(truncate[3600000] or truncate[86400000] of ts)"
    )


def _partition_of(data_file: DataFile, partition_by: str) -> Partition:
    start_ms = int(data_file.partition[0])
    return Partition.from_unit_id(start_ms // PARTITION_BY[partition_by], partition_by)


def _local_path(uri: str) -> Path:
    if uri.startswith("file:"):
        return Path(urllib.parse.unquote(urllib.parse.urlparse(uri).path))
    return Path(uri)


def table_root(table: Table) -> Path:
    """The table's directory (its location, a ``file:`` URI or a path)."""
    return _local_path(table.location())


def data_file_path(table: Table, data_file: DataFile, partition_by: str) -> Path:
    """Where ``data_file`` lies. A relative path (written by an older recd for a relative
    ``--table``: relative to that run's working directory, which nobody recorded) is found
    in its partition's directory under the table root, where recd puts every data file."""
    path = _local_path(data_file.file_path)
    if path.is_absolute():
        return path
    return _partition_of(data_file, partition_by).path(table_root(table)) / path.name


def live_data_files(table: Table, snapshot_id: int | None = None) -> list[DataFile]:
    """The data files of a snapshot (default: the current one); [] without a snapshot."""
    snapshot = (
        table.current_snapshot() if snapshot_id is None else table.snapshot_by_id(snapshot_id)
    )
    if snapshot is None:
        return []
    out: list[DataFile] = []
    for manifest in snapshot.manifests(table.io):
        out.extend(
            e.data_file for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        )
    return out


def snapshot_files(
    table_dir: Path,
    *,
    snapshot_id: int | None = None,
    start_ms: int | None = None,
    end_ms: int | None = None,
) -> tuple[int | None, list[tuple[Partition, list[Path]]]]:
    """The files of snapshot ``snapshot_id`` (None: the current one) whose hour starts in
    [start_ms, end_ms), as (the snapshot id read, partitions with their files sorted by name);
    None for a table with no snapshot yet. A snapshot that expired or never existed is a
    ConfigError."""
    table = load_table(table_dir)
    if snapshot_id is not None and table.snapshot_by_id(snapshot_id) is None:
        known = [s.snapshot_id for s in table.snapshots()]
        raise ConfigError(
            f"{table_dir}: snapshot {snapshot_id} is not in the table (it expired, or it is "
            f"another table's); snapshots now: {known or 'none'}"
        )
    current = table.current_snapshot()
    resolved = snapshot_id
    if resolved is None and current is not None:
        resolved = current.snapshot_id
    by_partition: dict[Partition, list[Path]] = {}
    partition_by = table_partition_by(table)
    for data_file in live_data_files(table, resolved):
        partition = _partition_of(data_file, partition_by)
        if start_ms is not None and partition.start_ms < start_ms:
            continue
        if end_ms is not None and partition.start_ms >= end_ms:
            continue
        by_partition.setdefault(partition, []).append(
            data_file_path(table, data_file, partition_by)
        )
    partitions = [(p, sorted(by_partition[p])) for p in sorted(by_partition)]
    return resolved, partitions


def commit_files(
    table_dir: Path,
    staged: Iterable[tuple[Partition, Path]],
    *,
    run_id: str,
    clustered: bool,
    layout: str,
    catalog: str | None = None,
    identifier: str | None = None,
    partition_by: str = "hour",
) -> int:
    """Make a run's staged files visible in one Iceberg commit; returns the new snapshot id.

    ``staged`` are (partition, file) pairs of complete, fsynced Parquet files. They are moved
    to ``TABLE/ds=D/hour=HH/part-<run>-<name>`` (invisible: no snapshot lists them), then one
    commit replaces the table's files of the partitions the run wrote by these (an append when
    none existed). A run whose schema differs from the table's is refused before the moves.
    If the commit fails, the moved files are removed again. Call under the table's lock.
    """
    staged = sorted(staged)
    if not staged:
        raise CommitError(f"{table_dir}: nothing to commit")
    table_dir = table_dir.resolve()  # the manifests list absolute paths (module docstring)
    if is_iceberg_table(table_dir):
        table = load_table(table_dir)
    else:
        table = create_table(
            table_dir,
            pq.read_schema(staged[0][1]),
            clustered=clustered,
            layout=layout,
            catalog=catalog,
            identifier=identifier,
            partition_by=partition_by,
        )
    existing = table_partition_by(table)
    if existing != partition_by:
        raise CommitError(
            f"{table_dir}: the table is partitioned by {existing}, the run by {partition_by}"
        )
    tag = run_id.rpartition(".")[2]  # the run id's random part: unique per run
    moved: list[Path] = []
    try:
        for partition, source in staged:
            target_dir = partition.path(table_dir)
            target_dir.mkdir(parents=True, exist_ok=True)
            target = target_dir / f"{source.stem.replace('part-', f'part-{tag}-', 1)}.parquet"
            os.rename(source, target)
            moved.append(target)
        for directory in sorted({p.parent for p in moved}):
            fsync_directory(directory)
        delay_s = float(os.environ.get(COMMIT_DELAY_ENV, "0") or 0)
        if delay_s > 0:
            time.sleep(delay_s)
        snapshot_id = _commit(table, moved, {p for p, _ in staged}, run_id=run_id)
    except BaseException:
        for path in moved:
            path.unlink(missing_ok=True)
        raise
    return snapshot_id


def _commit(table: Table, files: list[Path], partitions: set[Partition], *, run_id: str) -> int:
    from pyiceberg.io.pyarrow import parquet_files_to_data_files

    partition_by = table_partition_by(table)
    live = live_data_files(table)
    replaced = [f for f in live if _partition_of(f, partition_by) in partitions]
    # Files an older recd listed by relative paths: listed again by absolute ones.
    relisted = [
        f
        for f in live
        if _partition_of(f, partition_by) not in partitions
        and not _local_path(f.file_path).is_absolute()
    ]
    replaced += relisted
    paths = [p.parent.resolve() / p.name for p in files]
    paths += [data_file_path(table, f, partition_by) for f in relisted]
    # The dedup layout writes no statistics for the columns whose min/max say nothing
    # (recd.table.layout.statistics_columns); pyiceberg warns once per such column and file.
    quiet = logging.getLogger("pyiceberg.io.pyarrow")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        new = list(parquet_files_to_data_files(table.io, table.metadata, iter(map(str, paths))))
    finally:
        quiet.setLevel(level)
    with table.transaction() as tx:
        properties = name_mapping_properties(table.metadata)
        if properties:  # a table made before recd wrote the mapping: scannable from now on
            tx.set_properties(properties)
        update = tx.update_snapshot(snapshot_properties={RUN_ID_PROPERTY: run_id})
        if replaced:
            with update.overwrite() as overwrite:
                for data_file in replaced:
                    overwrite.delete_data_file(data_file)
                for data_file in new:
                    overwrite.append_data_file(data_file)
        else:
            with update.fast_append() as append:
                for data_file in new:
                    append.append_data_file(data_file)
    return _current_snapshot_id(table)


def _current_snapshot_id(table: Table) -> int:
    snapshot = table.current_snapshot()
    assert snapshot is not None, "a commit made no snapshot"
    return snapshot.snapshot_id


def referenced_paths(table: Table) -> set[Path]:
    """Every data file any snapshot of ``table`` lists (resolved paths)."""
    out: set[Path] = set()
    partition_by = table_partition_by(table)
    for snapshot in table.snapshots():
        out.update(
            data_file_path(table, f, partition_by).resolve()
            for f in live_data_files(table, snapshot.snapshot_id)
        )
    return out


def remove_orphans(table_dir: Path) -> list[Path]:
    """Delete data files in the partition directories that no snapshot lists (moved in by a
    run killed before its commit). Call under the table's lock. Returns the files removed."""
    if not is_iceberg_table(table_dir):
        return []
    keep = referenced_paths(load_table(table_dir))
    removed = []
    for _, directory in iter_partition_dirs(table_dir):
        for path in sorted(directory.glob("*.parquet")):
            if path.resolve() not in keep:
                path.unlink()
                removed.append(path)
    return removed


def snapshots(table_dir: Path) -> list[dict[str, Any]]:
    """The table's snapshots, oldest first: id, time, operation, run id and counts."""
    table = load_table(table_dir)
    current = table.current_snapshot()
    out = []
    for snapshot in table.snapshots():
        summary = snapshot.summary
        props = {} if summary is None else dict(summary.additional_properties)
        out.append(
            {
                "snapshot_id": snapshot.snapshot_id,
                "committed_at": snapshot.timestamp_ms,
                "operation": None if summary is None else str(summary.operation.value),
                "run_id": props.get(RUN_ID_PROPERTY),
                "total_rows": _int_or_none(props.get("total-records")),
                "total_files": _int_or_none(props.get("total-data-files")),
                "current": current is not None and snapshot.snapshot_id == current.snapshot_id,
            }
        )
    return out


def _int_or_none(value: str | None) -> int | None:
    return None if value is None else int(value)


def register_files(table: Table, files: Sequence[Path], *, run_id: str) -> int:
    """Add existing files, where they lie, to ``table`` in one append (a migration); returns
    the new snapshot id."""
    return _commit(table, list(files), set(), run_id=run_id)


def expire_snapshots(table_dir: Path, *, keep: int) -> tuple[list[int], list[Path]]:
    """Keep the newest ``keep`` snapshots (>= 1; the current one always stays), expire the
    older ones and delete the data files no remaining snapshot lists. Call under the table's
    lock. Returns the expired snapshot ids and the files deleted. A training run pinned to an
    expired snapshot can no longer resume on the same files (it is told so)."""
    if keep < 1:
        raise ConfigError(f"keep must be >= 1, got {keep}")
    table = load_table(table_dir)
    ordered = sorted(table.snapshots(), key=lambda s: (s.timestamp_ms, s.sequence_number or 0))
    current = table.current_snapshot()
    old = [
        s.snapshot_id
        for s in ordered[:-keep]
        if current is None or s.snapshot_id != current.snapshot_id
    ]
    if old:
        table.maintenance.expire_snapshots().by_ids(old).commit()
    removed = remove_orphans(table_dir)
    return old, removed
