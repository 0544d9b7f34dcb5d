"""``recd logs shard``: route raw-log rows to K zstd log-bus shards by session or at random (O1)."""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

from recd.cli.output import add_json_option, emit
from recd.errors import ConfigError
from recd.logs.shard import (
    DEFAULT_BLOCK_BYTES,
    DEFAULT_ZSTD_LEVEL,
    ComparisonReport,
    ShardReport,
    compare_sharding,
    shard_logs,
)

# Up to this many shards the table lists every shard; above, min / median / max.
MAX_LISTED_SHARDS = 16
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 10**6, "mb": 10**6}
_SIZE_UNITS |= {"mib": 1 << 20, "g": 10**9, "gb": 10**9, "gib": 1 << 30}

DESCRIPTION = """\
Route every row of a raw-log directory to one of K shards by consistent hashing (Jump
Consistent Hash of a SplitMix64-mixed key) and write each shard as a zstd stream of bounded
blocks, like a log bus's buffers.

--key session   key = session_id: a whole session lands in one shard (RecD O1)
--key random    key = request_id: sessions spread over all shards (the baseline)
--key both      both, into OUT/session and OUT/random, and compare their compressed bytes

Prints rows and bytes per shard (min / median / max for many shards), overall bytes and the
compression ratio (uncompressed / compressed); with both keys also random / session bytes.
OUT is replaced atomically.
"""


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "shard",
        help="shard raw logs by session or at random into zstd blocks (O1)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("raw_dir", type=Path, metavar="RAW_DIR", help="raw-log directory")
    parser.add_argument("--out", type=Path, required=True, help="output shard directory")
    parser.add_argument("--shards", type=int, default=8, help="number of shards K (default 8)")
    parser.add_argument(
        "--key",
        choices=("session", "random", "both"),
        default="session",
        help="sharding key (default session; 'both' writes OUT/session and OUT/random)",
    )
    parser.add_argument(
        "--block-bytes",
        type=parse_size,
        default=DEFAULT_BLOCK_BYTES,
        help="flush a shard's buffer as one zstd block at this many bytes of rows "
        "(e.g. 65536, 256KiB, 1MiB; default 1MiB)",
    )
    parser.add_argument(
        "--zstd-level", type=int, default=DEFAULT_ZSTD_LEVEL, help="zstd level (default 3)"
    )
    add_json_option(parser, "the report")
    parser.set_defaults(func=run)


def parse_size(text: str) -> int:
    """Parse a byte count such as ``65536``, ``64KiB``, ``1MiB`` or ``2MB``."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (e.g. 65536, 256KiB, 1MiB)")
    return int(match.group(1)) * _SIZE_UNITS[unit]


def run(args: argparse.Namespace) -> int:
    if not args.raw_dir.is_dir():
        raise ConfigError(f"raw-log directory {args.raw_dir} does not exist")
    options = {
        "num_shards": args.shards,
        "block_bytes": args.block_bytes,
        "zstd_level": args.zstd_level,
    }
    if args.key == "both":
        both = compare_sharding(args.raw_dir, args.out, **options)

        def show() -> None:
            print(format_shard_table(both.session))
            print(format_shard_table(both.random))
            print(format_comparison(both))

        emit(args, both.to_dict(), show)
    else:
        one = shard_logs(args.raw_dir, args.out, key=args.key, **options)
        emit(args, one.to_dict(), lambda: print(format_shard_table(one)))
    return 0


def format_shard_table(report: ShardReport) -> str:
    """Per-shard rows / blocks / bytes and the totals.

    Above ``MAX_LISTED_SHARDS`` shards, three rows give the min, median and max of each column
    separately (ratio: of the per-shard ratios).
    """
    lines = [
        f"key={report.key}  shards={report.num_shards}  block={_human(report.block_bytes)}  "
        f"zstd={report.zstd_level}  -> {report.out_dir}",
        f"  {'shard':>8} {'rows':>10} {'blocks':>7} {'raw':>10} {'zstd':>10} {'ratio':>6}",
    ]
    shards = report.shards
    if len(shards) <= MAX_LISTED_SHARDS:
        for s in shards:
            lines.append(
                _row(str(s.shard), s.rows, s.blocks, s.uncompressed_bytes, s.compressed_bytes)
            )
    else:
        for name, pick in (("min", min), ("median", statistics.median_low), ("max", max)):
            lines.append(
                _row(
                    name,
                    pick(s.rows for s in shards),
                    pick(s.blocks for s in shards),
                    pick(s.uncompressed_bytes for s in shards),
                    pick(s.compressed_bytes for s in shards),
                    ratio=pick(s.compression_ratio for s in shards),
                )
            )
    lines.append(
        _row(
            "total",
            report.rows_out,
            report.blocks,
            report.uncompressed_bytes,
            report.compressed_bytes,
        )
    )
    return "\n".join(lines)


def format_comparison(report: ComparisonReport) -> str:
    s, r = report.session, report.random
    return (
        f"session: {_human(s.compressed_bytes)} ({s.compression_ratio:.2f}x)   "
        f"random: {_human(r.compressed_bytes)} ({r.compression_ratio:.2f}x)   "
        f"random/session bytes = {report.ratio:.2f}x"
    )


def _row(
    name: str, rows: int, blocks: int, raw: int, packed: int, *, ratio: float | None = None
) -> str:
    """One table row; ``ratio`` defaults to raw / packed (min/median/max rows pass their own)."""
    if ratio is None:
        ratio = raw / packed if packed else 0.0
    shown = f"{ratio:.2f}x" if ratio else "-"
    return f"  {name:>8} {rows:>10,} {blocks:>7,} {_human(raw):>10} {_human(packed):>10} {shown:>6}"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
