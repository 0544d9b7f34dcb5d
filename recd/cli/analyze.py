"""``recd analyze``: per-feature dedup analysis of a table and a dedup_sparse_features proposal."""

from __future__ import annotations

import argparse
from pathlib import Path

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
            "deduplicating makes the training job faster on this machine. The job is the "
            "training config given with --config (its model, preprocessing, train.num_threads "
            "and [reader] batch_size), else the default training config (every [model] key at "
            "its default: rm1, embedding_dim 16, max_rows 100000; batch --batch-size). Each "
            "configuration of groups is timed as that job runs it, on a sample of the table's "
            "own batches: the reader's conversion + sparse preprocessing (one thread) plus the "
            "training step of the job's model (zero dense features and labels: that work is "
            "the same in every configuration), with every candidate deduplicated and each one "
            f"left out in turn (seconds to minutes); a group stays if leaving it out costs "
            f"more than {PAY_MARGIN:.0%} of the plain job. The printout splits each group's "
            "saving into reader and trainer. --reader-only times the reader alone (a single "
            "feature of one id per row is then never proposed); --factor-only applies the "
            "paper's rule. `recd run` runs this same analysis on its table and training job, "
            "and prints the command that reruns it."
        ),
    )
    parser.add_argument("table", type=Path, metavar="TABLE", help="table root directory")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="B",
        help="batch size B (default: the [reader] batch_size of --config, else "
        f"{DEFAULT_BATCH_SIZE})",
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
        "--config",
        type=Path,
        metavar="TRAIN_TOML",
        help="price the proposal for this training job: its model, [reader] preprocessing, "
        "train.num_threads and (unless --batch-size) [reader] batch_size; its table, window "
        "and dedup groups are replaced by the analysed ones, its [eval] is not read (default: "
        "the default training config)",
    )
    job.add_argument("--reader-config", type=Path, dest="config", help=argparse.SUPPRESS)
    job.add_argument(
        "--preprocessed",
        action="store_true",
        help="the default job's reader hashes every sparse id (hash_modulo): dedup also saves "
        "that work on repeated rows (default: only ids beyond model.max_rows are hashed; "
        "with --reader-only: no preprocessing)",
    )
    rule = parser.add_mutually_exclusive_group()
    rule.add_argument(
        "--reader-only",
        action="store_true",
        help="price the reader alone (conversion + the job's sparse preprocessing; without "
        "--config, none or --preprocessed's): a single feature of one id per row is never "
        "proposed",
    )
    rule.add_argument(
        "--factor-only",
        action="store_true",
        help="propose by the dedup factor alone, without timing anything (the paper's rule)",
    )
    add_json_option(parser, "the analysis")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # The analysis needs torch and torchrec; imported here so that the rest of the command
    # line (--help, --version, every other command) starts without them.
    from recd.analyze import analyze_for_job, format_report

    if args.preprocessed and args.factor_only:
        raise ConfigError(
            "analyze: --preprocessed prices the reader's hashing; --factor-only times nothing"
        )
    analysis = analyze_for_job(
        args.table,
        config=args.config,
        pricing="factor" if args.factor_only else "reader" if args.reader_only else "job",
        batch_size=args.batch_size,
        threshold=args.threshold,
        sync_threshold=args.sync_threshold,
        features=args.features,
        start=args.start,
        end=args.end,
        preprocessed=args.preprocessed,
        show_progress=True,
    )
    emit(args, analysis.to_dict(), lambda: print(format_report(analysis)))
    return 0
