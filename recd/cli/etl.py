"""``recd etl``: cluster session shards into hourly zstd Parquet partitions (O2)."""

from __future__ import annotations

import argparse
from pathlib import Path

from recd.cli.output import add_json_option, emit
from recd.etl.config import (
    DEFAULT_TARGET_FILE_BYTES,
    DICTIONARY_MODES,
    ENGINES,
    ON_BAD_ROWS,
    TABLE_FORMATS,
    EtlConfig,
)
from recd.etl.local import run_etl
from recd.table.layout import LAYOUTS
from recd.table.partitions import PARTITION_BY


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "etl",
        help="cluster shards by session into hourly Parquet partitions (O2)",
        description=(
            "Read the session shards of a time window and write hourly partitions "
            "TABLE/ds=YYYY-MM-DD/hour=HH/part-*.parquet, rows clustered by session_id and "
            "sorted by ts inside each session (--baseline: arrival order). A new table is an "
            "Iceberg table: the whole run becomes visible in one commit, or nothing of it "
            "(see docs/tables.md)."
        ),
    )
    parser.add_argument(
        "shard_dir", type=Path, metavar="SHARD_DIR", help="output of `recd logs shard`"
    )
    parser.add_argument(
        "--table", type=Path, required=True, metavar="DIR", help="table root directory"
    )
    parser.add_argument("--start", metavar="ISO", help="window start, inclusive (UTC, on an hour)")
    parser.add_argument("--end", metavar="ISO", help="window end, exclusive (UTC, on an hour)")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="write rows in arrival order (refused into an Iceberg table that records the "
        "clustered order; see docs/tables.md)",
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="plain",
        help="plain: every row's lists in full; dedup: each session's repeated and sliding "
        "sparse values stored once (recd readers build IKJTs from it without hashing; "
        "see docs/layout.md)",
    )
    parser.add_argument(
        "--dedup-features",
        type=_feature_list,
        metavar="A,B,...",
        help="with --layout dedup: the sparse features to encode (default: all)",
    )
    parser.add_argument(
        "--row-group-rows", type=int, default=8192, metavar="N", help="rows per row group"
    )
    parser.add_argument(
        "--target-file-mb",
        type=float,
        default=DEFAULT_TARGET_FILE_BYTES / 2**20,
        metavar="MB",
        help="roll a partition's file at about this size (MiB, default %(default)g)",
    )
    parser.add_argument("--zstd-level", type=int, default=3, metavar="L", help="zstd level (1..22)")
    parser.add_argument(
        "--memory-budget",
        type=float,
        metavar="MB",
        help="bound on rows held in memory (MiB); larger shards are processed in several passes",
    )
    parser.add_argument(
        "--dictionary", choices=DICTIONARY_MODES, default="auto", help="dictionary encoding"
    )
    parser.add_argument(
        "--on-bad-rows",
        choices=ON_BAD_ROWS,
        default="fail",
        help="a row with a null key, bad ts, null feature or null id: fail (naming file, block, "
        "row, field), or quarantine it under TABLE/_quarantine/ and count it",
    )
    parser.add_argument(
        "--table-format",
        choices=TABLE_FORMATS,
        default=None,
        help="iceberg: one snapshot per run (all or nothing); hive: each hour's directory "
        "commits on its own (default: the table's format; iceberg for a new table)",
    )
    parser.add_argument(
        "--partition-by",
        choices=tuple(PARTITION_BY),
        default=None,
        help="partition granularity: hour (ds=D/hour=HH) or day (ds=D, for sparse logs; iceberg "
        "tables only) (default: the table's own; hour for a new table)",
    )
    parser.add_argument(
        "--catalog",
        metavar="NAME",
        help="Iceberg: register a new table in this pyiceberg catalog (configured in "
        "~/.pyiceberg.yaml or PYICEBERG_CATALOG__NAME__* variables); default: an embedded "
        "SQLite catalog in TABLE/_iceberg/",
    )
    parser.add_argument(
        "--table-identifier",
        metavar="NS.NAME",
        help="Iceberg: the new table's name in its catalog (default recd.table)",
    )
    parser.add_argument(
        "--engine", choices=ENGINES, default="local", help="local (embedded) or spark"
    )
    parser.add_argument(
        "--spark-master",
        metavar="URL",
        help="Spark master for --engine spark (default: $SPARK_MASTER, spark-submit's, or "
        "local[*]); shards and table must be on a filesystem every executor sees",
    )
    parser.add_argument(
        "--workers",
        type=_workers,
        default=None,
        metavar="N",
        help="threads of the local engine: 1 serial, 2+ reads the next shard while writing "
        "(same bytes out); 'auto' (default): min(2, cores)",
    )
    add_json_option(parser, "the run's report")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    config = EtlConfig(
        shard_dir=args.shard_dir,
        table_dir=args.table,
        start=args.start,
        end=args.end,
        row_group_rows=args.row_group_rows,
        target_file_bytes=round(args.target_file_mb * 2**20),
        zstd_level=args.zstd_level,
        baseline=args.baseline,
        memory_budget_bytes=None if args.memory_budget is None else int(args.memory_budget * 2**20),
        dictionary=args.dictionary,
        on_bad_rows=args.on_bad_rows,
        engine=args.engine,
        spark_master=args.spark_master,
        show_progress=not args.no_progress,
        workers=args.workers,
        layout=args.layout,
        dedup_features=args.dedup_features,
        table_format=args.table_format,
        partition_by=args.partition_by,
        catalog=args.catalog,
        table_identifier=args.table_identifier,
    )
    report = run_etl(config)

    def show() -> None:
        print(f"recd etl: {config.shard_dir} -> {config.table_dir}")
        print(report.summary())

    emit(args, report.to_dict(), show)
    return 0


def _feature_list(text: str) -> list[str]:
    """``--dedup-features``: comma-separated feature names."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated feature names, got {text!r}")
    return names


def _workers(text: str) -> int | None:
    """``--workers``: a positive integer, or ``auto`` (None)."""
    if text == "auto":
        return None
    problem = f"expected a positive integer or 'auto', got {text!r}"
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(problem) from exc
    if value < 1:
        raise argparse.ArgumentTypeError(problem)
    return value
