"""``recd table``: look at a table's commits, convert a Hive-layout table, expire snapshots."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recd.cli.output import add_json_option, emit
from recd.table.hive import lock_table
from recd.table.iceberg import expire_snapshots, snapshots
from recd.table.migrate import migrate_to_iceberg
from recd.table.snapshot import committed_files, existing_partition_by, table_format


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "table",
        help="a table's commits: info, snapshots, migrate (Hive -> Iceberg), expire",
        description="Inspect and maintain a table written by `recd etl` (see docs/tables.md).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    info = actions.add_parser(
        "info", help="format, snapshot, partitions, files and rows a reader sees now"
    )
    info.add_argument("table", type=Path, metavar="TABLE")
    info.add_argument("--snapshot", type=int, metavar="ID", help="an older Iceberg snapshot")
    add_json_option(info, "what a reader sees")
    info.set_defaults(func=_info)

    snaps = actions.add_parser("snapshots", help="the Iceberg table's snapshots, oldest first")
    snaps.add_argument("table", type=Path, metavar="TABLE")
    add_json_option(snaps, "the snapshots")
    snaps.set_defaults(func=_snapshots)

    migrate = actions.add_parser(
        "migrate",
        help="convert a Hive-layout table to Iceberg in place (no data file is rewritten)",
        description=(
            "Register every committed partition's files of a Hive-layout table (directories "
            "holding _SUCCESS) in a new Iceberg table, in one commit, then remove the _SUCCESS "
            "markers. Readers and `recd etl` use the Iceberg table from then on."
        ),
    )
    migrate.add_argument("table", type=Path, metavar="TABLE")
    migrate.add_argument(
        "--baseline",
        action="store_true",
        help="the table holds unclustered rows (`recd etl --baseline`): record no sort order",
    )
    migrate.add_argument("--catalog", metavar="NAME", help="pyiceberg catalog (default: embedded)")
    migrate.add_argument("--table-identifier", metavar="NS.NAME", help="default recd.table")
    migrate.set_defaults(func=_migrate)

    expire = actions.add_parser(
        "expire",
        help="drop old snapshots and the data files only they listed",
        description=(
            "Keep the newest KEEP snapshots (the current one always stays) and delete the data "
            "files that no kept snapshot lists. A training run that read an expired snapshot "
            "can no longer resume on the same files."
        ),
    )
    expire.add_argument("table", type=Path, metavar="TABLE")
    expire.add_argument(
        "--keep", type=int, required=True, metavar="N", help="snapshots to keep (>= 1)"
    )
    expire.set_defaults(func=_expire)


def _info(args: argparse.Namespace) -> int:
    view = committed_files(args.table, snapshot_id=args.snapshot)
    rows = sum(_rows(path) for path in view.files)
    body = {
        "table": str(args.table),
        "format": view.table_format,
        "snapshot_id": view.snapshot_id,
        "partition_by": existing_partition_by(args.table),
        "partitions": len(view.partitions),
        "files": len(view.files),
        "rows": rows,
        "first_partition": str(view.partitions[0][0]) if view.partitions else None,
        "last_partition": str(view.partitions[-1][0]) if view.partitions else None,
    }

    def show() -> None:
        for key, value in body.items():
            print(f"{key:16s} {value if value is not None else '-'}")

    emit(args, body, show)
    return 0


def _rows(path: Path) -> int:
    """Rows of a table file, from its footer (SchemaError naming a truncated or damaged one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recd.errors import SchemaError

    try:
        return int(pq.read_metadata(path).num_rows)
    except (OSError, pa.ArrowInvalid) as exc:
        raise SchemaError(f"{path}: not a readable Parquet file: {exc}") from exc


def _snapshots(args: argparse.Namespace) -> int:
    found = table_format(args.table) if args.table.is_dir() else None
    if found != "iceberg":
        what = "does not exist" if not args.table.is_dir() else f"is {found or 'empty'}"
        from recd.errors import ConfigError

        raise ConfigError(f"{args.table}: not an Iceberg table ({what}); no snapshots")
    listed = snapshots(args.table)
    emit(args, listed, lambda: _print_snapshots(listed))
    return 0


def _print_snapshots(listed: list[dict[str, Any]]) -> None:
    print(f"{'snapshot':>20s}  {'committed (UTC)':19s}  {'operation':9s}  {'rows':>10s}  run")
    for s in listed:
        when = datetime.fromtimestamp(s["committed_at"] / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
        mark = " *" if s["current"] else ""
        rows = "-" if s["total_rows"] is None else f"{s['total_rows']:,}"
        print(
            f"{s['snapshot_id']:>20d}  {when}  {s['operation'] or '-':9s}  {rows:>10s}  "
            f"{s['run_id'] or '-'}{mark}"
        )


def _migrate(args: argparse.Namespace) -> int:
    result = migrate_to_iceberg(
        args.table,
        clustered=not args.baseline,
        catalog=args.catalog,
        identifier=args.table_identifier,
    )
    print(
        f"recd table migrate: {args.table}: {result.files} files of {result.partitions} "
        f"partitions ({result.rows:,} rows) registered as Iceberg snapshot {result.snapshot_id}"
    )
    return 0


def _expire(args: argparse.Namespace) -> int:
    with lock_table(args.table):
        expired, removed = expire_snapshots(args.table, keep=args.keep)
    print(
        f"recd table expire: {args.table}: {len(expired)} snapshots expired, "
        f"{len(removed)} data files deleted"
    )
    return 0
