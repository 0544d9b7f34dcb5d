"""``recd analyze``: per-feature dedup analysis of a table and a dedup_sparse_features proposal."""

from __future__ import annotations

import argparse
from pathlib import Path

from recd.analyze import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_SYNC_THRESHOLD,
    DEFAULT_THRESHOLD,
    analyze_table,
    format_report,
    machine_cost_model,
    write_json,
)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "analyze",
        help="per-feature S, d(f), l(f) and dedup factors of a table; propose dedup groups",
        description=(
            "Measure, per sparse feature of TABLE's committed partitions, S (samples per "
            "session), d(f) (unchanged fraction of adjacent pairs in a session) and l(f) (mean "
            "length); print the analytic DedupeLen / DedupeFactor and the factor measured in "
            "the reader's own batches of B rows, and propose dedup_sparse_features: features "
            "whose factor exceeds the threshold, synchronised ones grouped, kept only where a "
            "cost model of this machine (calibrated once in a few seconds, then cached) "
            "expects the group to save the reader more than 10% of its plain "
            "KJT cost. A single feature of one id per row is never proposed."
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
    parser.add_argument(
        "--preprocessed",
        action="store_true",
        help="the reader job hashes the sparse ids (hash_modulo): dedup also saves that work "
        "on repeated rows (default: no per-id preprocessing, the cautious choice)",
    )
    parser.add_argument(
        "--factor-only",
        action="store_true",
        help="propose by the dedup factor alone, without the cost model (the paper's rule)",
    )
    parser.add_argument(
        "--recalibrate",
        action="store_true",
        help="measure this machine's dedup costs again instead of using the cached model",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the analysis as JSON")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    cost_model = None if args.factor_only else machine_cost_model(recalibrate=args.recalibrate)
    analysis = analyze_table(
        args.table,
        cost_model=cost_model,
        preprocessed=args.preprocessed,
        show_progress=True,
        batch_size=args.batch_size,
        threshold=args.threshold,
        sync_threshold=args.sync_threshold,
        features=args.features,
        start=args.start,
        end=args.end,
    )
    print(format_report(analysis))
    if args.json is not None:
        write_json(analysis, args.json)
    return 0
