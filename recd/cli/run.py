"""``recd run``: the end-to-end job of a pipeline config (what ``make run`` calls)."""

from __future__ import annotations

import argparse
from pathlib import Path

from recd.errors import ConfigError
from recd.pipeline import PipelineConfig, run_pipeline
from recd.pipelines import resolve_pipeline_config, shipped_names
from recd.progress import progress_enabled


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "run",
        help="run the end-to-end job of a pipeline config (logs or ingest, shard, ETL, analyze, "
        "train)",
        description="Run every stage of a pipeline config: synthetic logs ([logs]) or your own "
        "event log ([ingest], see `recd init own_data DIR` and docs/own-data.md) -> "
        "session-sharded log bus (O1) -> clustered zstd Parquet table (O2) -> per-feature dedup "
        "analysis -> training ([train]: one `recd train` run; with demo_resume = true, as in "
        "the small pipeline, it is stopped with SIGTERM after its first checkpoint and "
        "resumed). Prints row counts and compression ratios, and where "
        "the model and its metrics are; writes WORK_DIR/report.json. [run] work_dir is "
        "relative to the current directory, the other paths to the TOML's directory. A "
        f"shipped pipeline ({shipped_names()}; `recd init --list`) runs by name: its "
        "training template comes from the installed package, its work_dir and [ingest] input "
        "are relative to the current directory.",
    )
    parser.add_argument(
        "--config",
        required=True,
        metavar="TOML|NAME",
        help="pipeline TOML (e.g. myproj/own_data.toml), or the name of a shipped pipeline "
        "(e.g. small) when no such file exists",
    )
    parser.add_argument("--work-dir", type=Path, help="override [run] work_dir")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    path, shipped = resolve_pipeline_config(args.config)
    config = PipelineConfig.from_toml(path)
    if args.work_dir is not None:
        config.work_dir = args.work_dir.resolve()
    if shipped is not None:
        # The user's files are not in the installed package: their event log is relative to
        # the current directory, like work_dir (which PipelineConfig resolves against it).
        if config.ingest is not None:
            source = Path.cwd() / config.ingest.input
            if not source.is_file():
                raise ConfigError(
                    f"[ingest] input = {config.ingest.input!r}: {source} does not exist (the "
                    f"shipped pipeline {shipped.name} reads it from the current directory; "
                    "`python -m recd.logs.example_events` writes an example there, "
                    f"`recd init {shipped.name} DIR` copies the pipeline to point at your file)"
                )
            config.ingest.input = str(source)
        print(f"[pipeline]    shipped {shipped.name} ({path}): work_dir {config.work_dir}")
    run_pipeline(config, show_progress=progress_enabled())
    return 0
