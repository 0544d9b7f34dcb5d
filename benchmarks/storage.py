"""Storage benchmark (RecD O1 + O2): log-bus shard bytes and table bytes, with a reference ETL.

    python benchmarks/storage.py            # rm1-like, 1M rows (minutes)
    python benchmarks/storage.py --quick    # rm1-like, 40k rows (CI size)

Measured in one run, side by side:
- raw log bytes (Arrow IPC segments, uncompressed, arrival order);
- log-bus shard bytes with the session key vs the random key (O1), and their ratio;
- table bytes: baseline (arrival order, from the random shards) vs clustered (O2), the ratio,
  and bytes per sample;
- ETL rows/s and peak RSS of `recd etl` (a child process each, so RSS is the ETL's own);
- a reference doing the same work on the same shards with DuckDB: decode the shards, sort by
  (session_id, ts) and write zstd Parquet partitioned by ds/hour (a child process too);
- Parquet bytes per column under each encoding and what `dictionary=auto` picks.

Writes benchmarks/results/storage.json and storage.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from recd.etl.encodings import measure_encodings
from recd.logs import rawlog
from recd.logs.generate import generate_logs
from recd.logs.shard import compare_sharding
from recd.schema import load_catalogue

RESULTS = Path(__file__).resolve().parent / "results"


def dir_bytes(path: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file())


def run_child(argv: list[str]) -> tuple[float, int, str]:
    """Run a child process; return (wall seconds, its peak RSS bytes, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    proc = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, "RECD_PROGRESS": "0"}
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the max over all waited-for children: valid only when it grew.
    return seconds, max(after, before) * 1024, proc.stdout


def run_etl_child(
    shard_dir: Path, table_dir: Path, report: Path, *, baseline: bool, row_group_rows: int
) -> dict[str, Any]:
    argv = [sys.executable, "-m", "recd", "etl", str(shard_dir), "--table", str(table_dir)]
    argv += ["--row-group-rows", str(row_group_rows), "--json", str(report)]
    if baseline:
        argv.append("--baseline")
    seconds, _, _ = run_child(argv)
    data = json.loads(report.read_text())
    data["wall_seconds_with_startup"] = seconds
    return data


def reference_etl(shard_dir: Path, out_dir: Path, row_group_rows: int) -> dict[str, Any]:
    """DuckDB reference: decode all shards, sort by (session_id, ts), zstd Parquet by ds/hour."""
    import duckdb

    start = time.perf_counter()
    batches = [
        block.batch
        for path in sorted(shard_dir.glob(rawlog.SHARD_GLOB))
        for block in rawlog.iter_shard(path)
    ]
    table = pa.Table.from_batches(batches)
    decoded = time.perf_counter()
    con = duckdb.connect()
    con.register("logs", table)
    out_dir.mkdir(parents=True, exist_ok=True)
    con.execute(
        f"""
        COPY (
            SELECT *,
                   strftime(to_timestamp(ts / 1000), '%Y-%m-%d') AS ds,
                   strftime(to_timestamp(ts / 1000), '%H') AS hour
            FROM logs ORDER BY session_id, ts, request_id
        ) TO '{out_dir}' (FORMAT PARQUET, COMPRESSION ZSTD, PARTITION_BY (ds, hour),
                          ROW_GROUP_SIZE {row_group_rows}, OVERWRITE_OR_IGNORE)
        """
    )
    end = time.perf_counter()
    return {
        "rows": table.num_rows,
        "seconds": end - start,
        "decode_seconds": decoded - start,
        "sort_write_seconds": end - decoded,
        "rows_per_s": table.num_rows / (end - start),
        "bytes_out": dir_bytes(out_dir, "*.parquet"),
        "threads": int(con.execute("SELECT current_setting('threads')").fetchone()[0]),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def encodings_summary(table_dir: Path, row_group_rows: int) -> dict[str, Any]:
    files = sorted(table_dir.rglob("*.parquet"))
    table = pq.read_table(files[0])
    return measure_encodings(table, row_group_rows=row_group_rows)


def markdown(r: dict[str, Any]) -> str:
    mb = 1e6
    rows = [
        ("rows", f"{r['rows']:,}"),
        ("raw log (Arrow IPC, uncompressed)", f"{r['raw_bytes'] / mb:,.1f} MB"),
        (
            "shards, random key",
            f"{r['shard_bytes_random'] / mb:,.1f} MB ({r['shard_compression_random']:.2f}x)",
        ),
        (
            "shards, session key",
            f"{r['shard_bytes_session'] / mb:,.1f} MB ({r['shard_compression_session']:.2f}x)",
        ),
        (
            "**shard_compression_ratio** (random / session)",
            f"**{r['shard_compression_ratio']:.2f}x**",
        ),
        (
            "table, arrival order (baseline)",
            f"{r['table_bytes_baseline'] / mb:,.1f} MB ({r['bytes_per_sample_baseline']:.0f} B/sample)",
        ),
        (
            "table, clustered by session",
            f"{r['table_bytes_clustered'] / mb:,.1f} MB ({r['bytes_per_sample_clustered']:.0f} B/sample)",
        ),
        (
            "**table_compression_ratio** (baseline / clustered)",
            f"**{r['table_compression_ratio']:.2f}x**",
        ),
        (
            "recd etl (clustered)",
            f"{r['etl_rows_per_s']:,.0f} rows/s ({r['etl_clustered'].get('workers', 1)} threads), "
            f"peak RSS {r['peak_rss_bytes'] / 2**20:,.0f} MiB",
        ),
        (
            "reference: DuckDB sort + zstd Parquet",
            f"{r['reference']['rows_per_s']:,.0f} rows/s ({r['reference']['threads']} threads), peak RSS {r['reference']['peak_rss_bytes'] / 2**20:,.0f} MiB",
        ),
        (
            "**etl_speed_vs_reference** (ours / reference)",
            f"**{r['etl_speed_vs_reference']:.2f}x**",
        ),
    ]
    lines = ["| measure | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="CI size: 40k rows")
    parser.add_argument("--rows", type=int, help="rows to generate (default 1M, quick 40k)")
    parser.add_argument("--shards", type=int, help="log-bus shards (default 64, quick 8)")
    parser.add_argument("--row-group-rows", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, help="keep the data here (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--reference-child", nargs=3, metavar=("SHARDS", "OUT", "RESULT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)

    if args.reference_child:
        shards, out, result = map(Path, args.reference_child)
        result.write_text(json.dumps(reference_etl(shards, out, args.row_group_rows)))
        return 0

    rows = args.rows or (40_000 if args.quick else 1_000_000)
    num_shards = args.shards or (8 if args.quick else 64)
    with tempfile.TemporaryDirectory(prefix="recd-storage-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        catalogue = load_catalogue("rm1-like")
        print(f"generating rm1-like, ~{rows:,} rows ...", flush=True)
        gen = generate_logs(catalogue, work / "raw", seed=args.seed, rows=rows, overwrite=True)
        print(f"sharding into {num_shards} shards, both keys ...", flush=True)
        shards = compare_sharding(work / "raw", work / "shards", num_shards=num_shards)
        print("ETL clustered (session shards) and baseline (random shards) ...", flush=True)
        clustered = run_etl_child(
            work / "shards" / "session",
            work / "table",
            work / "etl_clustered.json",
            baseline=False,
            row_group_rows=args.row_group_rows,
        )
        baseline = run_etl_child(
            work / "shards" / "random",
            work / "table_baseline",
            work / "etl_baseline.json",
            baseline=True,
            row_group_rows=args.row_group_rows,
        )
        print("reference ETL (DuckDB) ...", flush=True)
        ref_json = work / "reference.json"
        run_child(
            [
                sys.executable,
                __file__,
                "--row-group-rows",
                str(args.row_group_rows),
                "--reference-child",
                str(work / "shards" / "session"),
                str(work / "reference"),
                str(ref_json),
            ]
        )
        reference = json.loads(ref_json.read_text())
        print("per-column encodings ...", flush=True)
        encodings = encodings_summary(work / "table", args.row_group_rows)

    result: dict[str, Any] = {
        "profile": "rm1-like",
        "quick": args.quick,
        "rows": gen.rows,
        "sessions": gen.sessions,
        "num_shards": num_shards,
        "raw_bytes": gen.raw_bytes,
        "shard_bytes_session": shards.session.compressed_bytes,
        "shard_bytes_random": shards.random.compressed_bytes,
        "shard_compression_session": shards.session.compression_ratio,
        "shard_compression_random": shards.random.compression_ratio,
        "shard_compression_ratio": shards.ratio,
        "table_bytes_clustered": clustered["bytes_out"],
        "table_bytes_baseline": baseline["bytes_out"],
        "table_compression_ratio": baseline["bytes_out"] / clustered["bytes_out"],
        "bytes_per_sample_clustered": clustered["bytes_out"] / clustered["rows_out"],
        "bytes_per_sample_baseline": baseline["bytes_out"] / baseline["rows_out"],
        "etl_rows_per_s": clustered["rows_per_s"],
        "etl_seconds": clustered["seconds"],
        "peak_rss_bytes": clustered["peak_rss_bytes"],
        "reference": reference,
        "etl_speed_vs_reference": clustered["rows_per_s"] / reference["rows_per_s"],
        "reference_bytes_ratio": reference["bytes_out"] / clustered["bytes_out"],
        "etl_clustered": clustered,
        "etl_baseline": baseline,
        "encodings": encodings,
        "command": "python benchmarks/storage.py" + (" --quick" if args.quick else ""),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "storage_quick" if args.quick else "storage"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    table = markdown(result)
    (args.out / f"{stem}.md").write_text(f"Command: `{result['command']}`\n\n{table}")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
