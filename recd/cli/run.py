"""``recd run``: the end-to-end job of a pipeline config (what ``make run`` calls)."""

from __future__ import annotations

import argparse
from pathlib import Path

from recd.pipeline import PipelineConfig, run_pipeline
from recd.progress import progress_enabled


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "run",
        help="run the end-to-end job of a pipeline config (logs or ingest, shard, ETL, analyze, "
        "train)",
        description="Run every stage of a pipeline config: synthetic logs ([logs]) or your own "
        "event log ([ingest], see pipelines/own_data.toml and docs/own-data.md) -> "
        "session-sharded log bus (O1) -> clustered zstd Parquet table (O2) -> per-feature dedup "
        "analysis -> training ([train]). Prints row counts and compression ratios, and where "
        "the model and its metrics are; writes WORK_DIR/report.json.",
    )
    parser.add_argument(
        "--config", type=Path, required=True, help="pipeline TOML, e.g. pipelines/small.toml"
    )
    parser.add_argument("--work-dir", type=Path, help="override [run] work_dir")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    config = PipelineConfig.from_toml(args.config)
    if args.work_dir is not None:
        config.work_dir = args.work_dir.resolve()
    run_pipeline(config, show_progress=progress_enabled())
    return 0
