"""``recd logs generate``: write synthetic production inference logs (a raw log)."""

from __future__ import annotations

import argparse
from pathlib import Path

from recd.logs.generate import FLUSH_INTERVAL_S, generate_logs
from recd.progress import progress_enabled
from recd.schema import PROFILE_NAMES, load_catalogue

DESCRIPTION = """\
Write synthetic inference logs as a raw log (Arrow IPC segment files in arrival order plus
_catalogue.json). Many sessions run concurrently: each request is logged by one of a fleet of
inference servers that flush their buffers periodically, so the log interleaves sessions and
is only roughly time-ordered, like a real log bus. Per sparse feature the catalogue sets the
mean length l(f), the probability d(f) of being unchanged from the session's previous row
and Zipf ids over a cardinality; samples per session are heavy-tailed with mean S.
An impression log (sessions.candidates_per_request > 1, profile impressions) writes one row
per candidate item a request scored: the rows of a request share its id, time and request
features, differ in the candidate's item, price and position, and at most one is clicked.
The same catalogue, seed and size always give byte-identical files."""

EPILOG = """\
examples:
  recd logs generate --profile small --out runs/raw
  recd logs generate --profile rm1-like --rows 1000000 --seed 7 --out runs/raw-rm1
  recd logs generate --profile impressions --out runs/raw-impressions
  recd logs generate --catalogue my_features.toml --sessions 5000 --out runs/raw-mine"""


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "generate",
        help="write synthetic inference logs (deterministic for a seed)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--profile",
        choices=PROFILE_NAMES,
        help="built-in feature catalogue: tiny (tests), small (make run), rm1-like (paper-like), "
        "clickstream (the shape of a real session log: few, short features), impressions "
        "(an impression log: one row per candidate item of a request, at most one click)",
    )
    source.add_argument(
        "--catalogue",
        type=Path,
        metavar="FILE.toml",
        help="feature catalogue file (see recd/profiles/*.toml for the format)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="raw-log directory to write"
    )
    parser.add_argument(
        "--seed", type=_non_negative_int, default=0, metavar="N", help="random seed (default 0)"
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--sessions",
        type=_positive_int,
        metavar="N",
        help="number of sessions (default: the catalogue's sessions.num_sessions)",
    )
    size.add_argument(
        "--rows",
        type=_positive_int,
        metavar="N",
        help="about this many rows instead (sessions = N / sessions.mean_samples)",
    )
    parser.add_argument(
        "--segment-rows",
        type=_positive_int,
        default=200_000,
        metavar="N",
        help="rows per segment file (default 200000)",
    )
    parser.add_argument(
        "--flush-interval-s",
        type=float,
        default=FLUSH_INTERVAL_S,
        metavar="S",
        help=f"how often each inference server flushes its log buffer (default {FLUSH_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a raw log already in --out"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Generate the raw log described by ``args`` and print a one-line summary."""
    catalogue = load_catalogue(args.catalogue if args.catalogue is not None else args.profile)
    report = generate_logs(
        catalogue,
        args.out,
        seed=args.seed,
        num_sessions=args.sessions,
        rows=args.rows,
        segment_rows=args.segment_rows,
        show_progress=progress_enabled(),
        overwrite=args.overwrite,
        flush_interval_s=args.flush_interval_s,
    )
    print(
        f"generated {report.rows:,} rows in {report.sessions:,} sessions "
        f"({catalogue.name}, seed {args.seed}): {report.segments} "
        f"segment{'s' if report.segments != 1 else ''}, "
        f"{_format_bytes(report.raw_bytes)} raw, {report.seconds:.1f} s "
        f"({report.rows_per_s:,.0f} rows/s) -> {args.out}"
    )
    return 0


def _format_bytes(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size} B"


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)  # also accepts 1_000_000
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
