"""``recd analyze``: per-feature dedup analysis of a table and a dedup_sparse_features proposal."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from recd.analyze.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_SYNC_THRESHOLD,
    DEFAULT_THRESHOLD,
    PAY_MARGIN,
)
from recd.cli.output import add_json_option, emit
from recd.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "analyze",
        help="per-feature S, d(f), l(f) and dedup factors of a table; propose dedup groups",
        description=(
            "Measure, per sparse feature of TABLE's committed partitions, S (samples per "
            "session), d(f) (unchanged fraction of adjacent pairs in a session) and l(f) (mean "
            "length); print the analytic DedupeLen / DedupeFactor and the factor measured in "
            "the reader's own batches of B rows, and propose dedup_sparse_features: features "
            "whose factor exceeds the threshold, synchronised ones grouped, kept only where "
            "deduplicating makes the reader faster: the reader's conversion and the job's "
            "preprocessing are timed on a sample of the table's own batches, with every "
            "candidate deduplicated and each one left out in turn (seconds to a minute); a "
            f"group stays if leaving it out costs more than {PAY_MARGIN:.0%} of the plain "
            "job. A single feature of one id per row is never proposed."
        ),
    )
    parser.add_argument("table", type=Path, metavar="TABLE", help="table root directory")
    parser.add_argument(
        "--batch-size", type=int, default=DEFAULT_BATCH_SIZE, metavar="B", help="batch size B"
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        metavar="X",
        help=f"deduplicate features with a measured factor above X (default {DEFAULT_THRESHOLD})",
    )
    parser.add_argument(
        "--sync-threshold",
        type=float,
        default=DEFAULT_SYNC_THRESHOLD,
        metavar="F",
        help="group features whose change points coincide on this fraction of adjacent pairs",
    )
    parser.add_argument(
        "--features", nargs="+", metavar="NAME", help="sparse features (default: all)"
    )
    parser.add_argument("--start", metavar="ISO", help="first partition hour, inclusive")
    parser.add_argument("--end", metavar="ISO", help="partition hour to stop before, exclusive")
    job = parser.add_mutually_exclusive_group()
    job.add_argument(
        "--preprocessed",
        action="store_true",
        help="the reader job hashes every sparse id (hash_modulo): dedup also saves that work "
        "on repeated rows (default: no preprocessing)",
    )
    job.add_argument(
        "--reader-config",
        type=Path,
        metavar="TOML",
        help="time the job's own preprocessing: the [reader] preprocessing list of this "
        "training config",
    )
    job.add_argument(
        "--factor-only",
        action="store_true",
        help="propose by the dedup factor alone, without timing the reader (the paper's rule)",
    )
    add_json_option(parser, "the analysis")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # The analysis needs torch and torchrec; imported here so that the rest of the command
    # line (--help, --version, every other command) starts without them.
    from recd.analyze import (
        analyze_table,
        format_report,
        hash_all_preprocessing,
        table_sparse_features,
    )
    from recd.reader.memory import keep_freed_memory

    keep_freed_memory()  # time the reader as its worker processes run
    preprocessing: list[dict[str, Any]] = []
    if args.preprocessed:
        preprocessing = hash_all_preprocessing(args.features or table_sparse_features(args.table))
    elif args.reader_config is not None:
        preprocessing = _job_preprocessing(args.reader_config)
    analysis = analyze_table(
        args.table,
        batch_size=args.batch_size,
        threshold=args.threshold,
        sync_threshold=args.sync_threshold,
        features=args.features,
        start=args.start,
        end=args.end,
        cost_aware=not args.factor_only,
        preprocessing=preprocessing,
        show_progress=True,
    )
    emit(args, analysis.to_dict(), lambda: print(format_report(analysis)))
    return 0


def _job_preprocessing(path: Path) -> list[dict[str, Any]]:
    """The ``[reader] preprocessing`` list of a training config (empty when it has none)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the reader config: {exc}") from exc
    specs = data.get("reader", {}).get("preprocessing", [])
    if not isinstance(specs, list) or not all(
        isinstance(s, dict) and "kind" in s and "features" in s for s in specs
    ):
        raise ConfigError(
            f"{path}: [reader] preprocessing must be a list of tables with kind and features"
        )
    return specs
