"""``recd etl``: cluster session shards into hourly zstd Parquet partitions (O2)."""

from __future__ import annotations

import argparse
import functools

from recd.cli.fields import add_field_option, check_field_options
from recd.cli.output import add_json_option, emit
from recd.etl.config import DEFAULT_TARGET_FILE_BYTES, EtlConfig
from recd.etl.local import run_etl


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
    field = functools.partial(add_field_option, parser, cls=EtlConfig)
    field("shard_dir", name="shard_dir", metavar="SHARD_DIR")
    field("--table", name="table_dir", required=True, metavar="DIR")
    field("--start", name="start", metavar="ISO")
    field("--end", name="end", metavar="ISO")
    field("--baseline", name="baseline")
    field("--layout", name="layout")
    field("--dedup-features", name="dedup_features", type=_feature_list, metavar="A,B,...")
    field("--row-group-rows", name="row_group_rows", metavar="N")
    # In MiB, not bytes: the field's unit is too fine for a flag.
    parser.add_argument(
        "--target-file-mb",
        type=float,
        default=DEFAULT_TARGET_FILE_BYTES / 2**20,
        metavar="MB",
        help="roll a partition's file at about this size (MiB, default %(default)g)",
    )
    field("--zstd-level", name="zstd_level", metavar="L")
    # In MiB, not bytes, as --target-file-mb.
    parser.add_argument(
        "--memory-budget",
        type=float,
        metavar="MB",
        help="bound on rows held in memory (MiB); larger shards are processed in several passes",
    )
    field("--dictionary", name="dictionary")
    field("--on-bad-rows", name="on_bad_rows")
    field("--table-format", name="table_format")
    field("--partition-by", name="partition_by")
    field("--catalog", name="catalog", metavar="NAME")
    field("--table-identifier", name="table_identifier", metavar="NS.NAME")
    field("--engine", name="engine")
    field("--spark-master", name="spark_master", metavar="URL")
    # Takes 'auto' for the field's None.
    parser.add_argument(
        "--workers",
        type=_workers,
        default=None,
        metavar="N",
        help="threads of the local engine: 1 serial, 2+ reads the next shard while writing "
        "(same bytes out); 'auto' (default): min(2, cores)",
    )
    add_json_option(parser, "the run's report")
    # The field (show_progress) defaults to true: the flag turns it off.
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    check_field_options(args)
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
