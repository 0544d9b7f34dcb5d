"""Convert a Hive-layout table (a directory per hour holding ``_SUCCESS``) to Iceberg in place.

The data files stay where they are and are not rewritten: one Iceberg commit registers every
committed partition's files, then the ``_SUCCESS`` markers go (the Iceberg table is the only
record of what is committed from then on). A migration killed before its commit leaves the
Hive-layout table as it was (the half-made Iceberg metadata is removed by the next attempt).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from recd.errors import ConfigError
from recd.table.hive import SUCCESS_FILE, lock_table, new_run_id
from recd.table.iceberg import (
    DEFAULT_IDENTIFIER,
    ICEBERG_DIR,
    create_table,
    register_files,
    write_table_pointer,
)
from recd.table.layout import layout_of
from recd.table.snapshot import check_run_schema, committed_files, table_format


@dataclass(frozen=True, slots=True)
class Migration:
    partitions: int
    files: int
    rows: int
    snapshot_id: int


def migrate_to_iceberg(
    table_dir: Path,
    *,
    clustered: bool = True,
    catalog: str | None = None,
    identifier: str | None = None,
) -> Migration:
    """Register a Hive-layout table's committed files as an Iceberg table (one commit)."""
    if not table_dir.is_dir():
        raise ConfigError(f"{table_dir}: table directory does not exist")
    with lock_table(table_dir):
        found = table_format(table_dir)
        if found != "hive":
            raise ConfigError(
                f"{table_dir}: not a Hive-layout table ({found or 'no committed partition'})"
            )
        shutil.rmtree(table_dir / ICEBERG_DIR, ignore_errors=True)  # an earlier attempt's
        view = committed_files(table_dir)
        files = view.files
        check_run_schema(table_dir, files)  # every file must have the same schema
        schema = pq.read_schema(files[0])
        table = create_table(
            table_dir,
            schema,
            clustered=clustered,
            layout=layout_of(schema, source=str(files[0])).name,
            catalog=catalog,
            identifier=identifier,
            write_pointer=False,  # readers keep the Hive layout until the commit is in
        )
        snapshot_id = register_files(table, files, run_id=f"migrate.{new_run_id()}")
        write_table_pointer(table_dir, catalog=catalog, identifier=identifier or DEFAULT_IDENTIFIER)
        for partition, _ in view.partitions:
            (partition.path(table_dir) / SUCCESS_FILE).unlink(missing_ok=True)
    rows = sum(pq.read_metadata(path).num_rows for path in files)
    return Migration(len(view.partitions), len(files), rows, snapshot_id)
