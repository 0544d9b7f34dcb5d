"""Storage benchmark (RecD O1 + O2): shard and table bytes, and ETL speed against DuckDB.

    python benchmarks/storage.py            # rm1-like and clickstream, 1M rows each, 64 shards
    python benchmarks/storage.py --quick    # both profiles, 40k rows each, 8 shards (CI size)
    python benchmarks/storage.py --profile impressions   # storage_impressions.*

The DuckDB reference needs much more memory than recd on rm1-like's 1M rows (its peak RSS is
in the results). Needs a DuckDB whose ``COPY`` takes ``ORDER_BY`` with ``PARTITION_BY`` (sorted
partitioned writes: 2.0).

For each profile (``--profile``, default both: rm1-like, then clickstream), measured side by side
on the same generated log:

- raw log bytes (Arrow IPC segments, uncompressed, arrival order);
- log-bus shard bytes with the session key vs the random key (O1), and their ratio;
- table bytes: baseline (arrival order, from the random shards) vs clustered (O2), the ratio,
  and bytes per sample (byte counts are deterministic: one run each);
- ETL speed, ``recd etl`` against a DuckDB reference doing the same work, in repetitions.

The same work. ``recd etl`` (recd/etl/local.py) reads the session shards, decodes and validates
every block (nulls, ts range: ``recd.etl.validate``), sorts each shard's rows by (hour,
session_id, ts, request_id), and appends each hour's rows to one open file per partition
``ds=YYYY-MM-DD/hour=HH/part-*.parquet`` (non-null schema, zstd level 3, row groups of
``--row-group-rows``), with ``--threads`` threads. The reference decodes and validates the same
frames with the same code on ``--threads`` Python threads (zstd and Arrow IPC release the GIL),
then one DuckDB statement (``SET threads`` = ``--threads``) writes the same hourly Hive layout
with the same zstd level and row-group size, each partition's rows sorted by (session_id, ts,
request_id) (``COPY ... ORDER_BY``: a local sort, as recd's per-shard sort; a session lives in
one shard, so both give each session as one contiguous ts-sorted run per partition file). The
secondary figure ``etl_speed_vs_reference_global_sort`` is the earlier reference: a global
``ORDER BY`` over all shards before the partitioned write (more work; DuckDB's partitioned
write does not keep that order inside a file, see ``sessions_clustered`` in the JSON). Known
differences: DuckDB writes OPTIONAL Parquet columns from an Arrow scan, recd REQUIRED ones;
the reference decodes every shard before DuckDB starts, while recd decodes the next shard
while it writes the current one (both on ``--threads`` threads; the reference's decode time is
reported apart, ``decode_seconds``).

Protocol. ``--repetitions`` (default 3) rounds; in each, every side runs once in its own child
process, in an order drawn from ``random.Random("SEED/PROFILE")`` (``--order-seed``; the order
is in the JSON). A side's rows/s is rows read / in-process seconds from reading the shards to
the last file written (interpreter start-up and imports excluded on both sides; dirty pages
are written back with ``os.sync`` once before the runs). Reported: median and min-max of each
side's rows/s; the ratio of the medians; the min-max of the paired per-round ratios. Beside
every such per-row ratio, the whole-wall figure of the same runs (``KEY_whole_wall``, e.g.
``etl_speed_vs_reference_whole_wall``): the other side's whole wall / recd's, where a whole
wall is the child process's wall from spawn to exit (``wall_seconds_with_startup``), as the
ratio of the medians and the min-max of the paired per-round ratios (> 1: recd is faster, as
for rows/s); with each side's median whole wall (``whole_wall_seconds``) and start-up
(``startup_seconds``: whole wall - in-process seconds, i.e. interpreter start-up, imports,
set-up before the timer and exit). A failed repetition is counted and reported, never dropped
silently. Every output is checked (untimed): rows, partitions, row groups, columns and whether
sessions are clustered.

Writes benchmarks/results/storage.json and storage.md (``--quick``: storage_quick.*). The
headline keys at the JSON's top level are rm1-like's (``shard_compression_ratio``,
``table_compression_ratio``, ``etl_speed_vs_reference`` and ``etl_speed_vs_reference_whole_wall``
beside it); ``profiles`` holds every profile's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recd.etl.config import EtlConfig
from recd.etl.encodings import measure_encodings
from recd.etl.local import list_shards, run_etl
from recd.etl.validate import (
    Frame,
    bad_row_codes,
    bad_row_error,
    check_block_schema,
    decode_frame,
    iter_frames,
)
from recd.logs.generate import generate_logs
from recd.logs.rawlog import read_catalogue
from recd.logs.shard import compare_sharding
from recd.schema import REQUEST_ID, SESSION_ID, TS, load_catalogue
from recd.stats import spread
from recd.table.layout import GROUP_IDS_SUFFIX, GROUP_LENGTHS_SUFFIX

RESULTS = Path(__file__).resolve().parent / "results"
PROFILES = ("rm1-like", "clickstream", "impressions")
DEFAULT_PROFILES = ("rm1-like", "clickstream")
"""Measured by default (storage.json); ``--profile impressions`` writes storage_impressions.*."""
HEADLINE_PROFILE = "rm1-like"
GROUP_KEY = "__group"
"""``column_bytes``: a dedup group's two columns, under its first member's name + this."""
FULL_ROWS = 1_000_000
QUICK_ROWS = 40_000
FULL_SHARDS = 64
QUICK_SHARDS = 8
ZSTD_LEVEL = 3  # recd etl's default (EtlConfig.zstd_level), passed to both sides explicitly
# Sides of the speed comparison, and the figures that divide recd's rows/s by a reference's.
RECD = "recd"
RECD_DEDUP = "recd_dedup_layout"
REFERENCE = "reference"
REFERENCE_GLOBAL = "reference_global_sort"
SIDES = (RECD, RECD_DEDUP, REFERENCE, REFERENCE_GLOBAL)
RECD_SIDES = (RECD, RECD_DEDUP)
RATIOS = {
    "etl_speed_vs_reference": REFERENCE,
    "etl_speed_vs_reference_global_sort": REFERENCE_GLOBAL,
}
SPEED_RATIOS = {
    **{key: (RECD, side) for key, side in RATIOS.items()},
    "dedup_layout_etl_speed_vs_plain": (RECD_DEDUP, RECD),
}
"""Each per-row speed ratio: (the side whose rows/s is divided, the side it is divided by)."""
WHOLE_WALL = "_whole_wall"
"""Suffix of the whole-wall figure beside each per-row ratio (``KEY_whole_wall``)."""
WALL = "wall_seconds_with_startup"
"""A run's whole wall: its child process from spawn to exit, start-up and imports included."""
SORTS = {REFERENCE: "partition", REFERENCE_GLOBAL: "global"}
CHILD_TIMEOUT_S = 3600
# What a recd run's record keeps from its `recd etl --json` report.
RECD_REPORT_KEYS = (
    "rows_in",
    "seconds",
    "rows_per_s",
    "bytes_out",
    "files",
    "row_groups_flushed_early",
    "peak_rss_bytes",
    "workers",
)


def default_threads() -> int:
    """``recd etl``'s default worker count, min(2, cores): used by both sides."""
    return max(1, min(2, os.cpu_count() or 1))


def load_avg() -> list[float]:
    """1, 5 and 15-minute load averages, rounded (recorded before and after each phase)."""
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------- the reference (child side)


@dataclass(kw_only=True, slots=True)
class ReferenceSpec:
    """What one reference run does (written as JSON for its child process)."""

    shard_dir: Path
    """Session shards to read (the same ones ``recd etl`` reads)."""
    out_dir: Path
    """Table root to write (must not exist yet)."""
    result: Path
    """Where the child writes its measurements (JSON)."""
    sort: str
    """``partition``: sort each hourly partition's rows (the same work as recd);
    ``global``: one ORDER BY over all rows before the partitioned write."""
    threads: int
    """DuckDB threads and decode threads."""
    row_group_rows: int
    zstd_level: int
    temp_dir: Path
    """DuckDB's spill directory (kept out of the working tree)."""


def reference_sql(*, sort: str, out_dir: Path, row_group_rows: int, zstd_level: int) -> str:
    """The DuckDB statement of the reference: hourly ds/hour Hive partitions, zstd Parquet.

    ``partition``: ``COPY ... ORDER_BY`` sorts each partition's rows by (session_id, ts,
    request_id) as it writes them. ``global``: the earlier reference, an ORDER BY over all
    rows in the query (DuckDB's partitioned write does not keep it inside a file).
    """
    if sort not in ("partition", "global"):
        raise ValueError(f"sort must be 'partition' or 'global', got {sort!r}")
    keys = f"{SESSION_ID}, {TS}, {REQUEST_ID}"
    hours = f"strftime(epoch_ms({TS}), '%Y-%m-%d') AS ds, strftime(epoch_ms({TS}), '%H') AS hour"
    query = f"SELECT *, {hours} FROM logs" + (f" ORDER BY {keys}" if sort == "global" else "")
    options = [
        "FORMAT PARQUET",
        "COMPRESSION ZSTD",
        f"COMPRESSION_LEVEL {zstd_level}",
        f"ROW_GROUP_SIZE {row_group_rows}",
        "PARTITION_BY (ds, hour)",
    ]
    if sort == "partition":
        options.append(f"ORDER_BY ({keys})")
    return f"COPY ({query}) TO '{out_dir}' ({', '.join(options)})"


def decode_checked(frame: Frame, row_schema: pa.Schema) -> pa.RecordBatch:
    """Decode one shard block and validate it as ``recd etl`` does (``on_bad_rows="fail"``):
    the catalogue's columns, no null key, feature or id, ts in range."""
    batch = decode_frame(frame)
    check_block_schema(batch.schema, row_schema, where=frame.where)
    codes = bad_row_codes(batch)
    if codes.any():
        raise bad_row_error(batch, codes, where=frame.where)
    return batch


def decode_shards(shard_dir: Path, threads: int) -> pa.Table:
    """Every block of every shard, decoded and validated by ``threads`` threads, in order."""
    row_schema = read_catalogue(shard_dir).arrow_schema().remove_metadata()
    frames = (frame for shard in list_shards(shard_dir) for frame in iter_frames(shard))
    with ThreadPoolExecutor(threads, thread_name_prefix="reference-decode") as pool:
        batches = list(pool.map(lambda frame: decode_checked(frame, row_schema), frames))
    return pa.Table.from_batches(batches, schema=row_schema)


def reference_etl(spec: ReferenceSpec) -> dict[str, Any]:
    """Run the reference once (in this process) and return its measurements."""
    import duckdb

    spec.temp_dir.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(config={"threads": spec.threads, "temp_directory": str(spec.temp_dir)})
    sql = reference_sql(
        sort=spec.sort,
        out_dir=spec.out_dir,
        row_group_rows=spec.row_group_rows,
        zstd_level=spec.zstd_level,
    )
    start = time.perf_counter()
    table = decode_shards(spec.shard_dir, spec.threads)
    decoded = time.perf_counter()
    con.register("logs", table)
    con.execute(sql).fetchall()
    end = time.perf_counter()
    threads, memory_limit = con.execute(
        "SELECT current_setting('threads'), current_setting('memory_limit')"
    ).fetchall()[0]
    return {
        "rows": table.num_rows,
        "seconds": end - start,
        "decode_seconds": decoded - start,
        "sort_write_seconds": end - decoded,
        "rows_per_s": table.num_rows / (end - start),
        "duckdb_threads": int(threads),
        "duckdb_memory_limit": str(memory_limit),
        "duckdb_version": duckdb.__version__,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "sql": sql,
    }


def run_reference_child(spec_path: Path) -> int:
    """The child side of a reference run: read its spec, run it, write its measurements."""
    raw = json.loads(spec_path.read_text())
    spec = ReferenceSpec(
        shard_dir=Path(raw["shard_dir"]),
        out_dir=Path(raw["out_dir"]),
        result=Path(raw["result"]),
        sort=str(raw["sort"]),
        threads=int(raw["threads"]),
        row_group_rows=int(raw["row_group_rows"]),
        zstd_level=int(raw["zstd_level"]),
        temp_dir=Path(raw["temp_dir"]),
    )
    spec.result.write_text(json.dumps(reference_etl(spec)))
    return 0


# ---------------------------------------------------------------- the parent: one run per side


@dataclass(kw_only=True, slots=True)
class SpeedSetup:
    """What every ETL run of one profile shares."""

    shard_dir: Path
    work: Path
    threads: int
    row_group_rows: int
    zstd_level: int
    timeout_s: float


def recd_argv(setup: SpeedSetup, table: Path, report: Path, *, layout: str) -> list[str]:
    """``recd etl`` on the session shards with the protocol's row groups, zstd and threads."""
    return [
        sys.executable,
        "-m",
        "recd",
        "etl",
        str(setup.shard_dir),
        "--table",
        str(table),
        "--row-group-rows",
        str(setup.row_group_rows),
        "--zstd-level",
        str(setup.zstd_level),
        "--workers",
        str(setup.threads),
        "--layout",
        layout,
        "--json",
        str(report),
        "--no-progress",
    ]


def run_child(argv: list[str], timeout_s: float) -> tuple[bool, float, str]:
    """Run a child process; return (succeeded, wall seconds with start-up, error text)."""
    start = time.perf_counter()
    env = {**os.environ, "RECD_PROGRESS": "0"}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, time.perf_counter() - start, f"timed out after {timeout_s:.0f} s"
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        return False, seconds, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    return True, seconds, ""


def run_side(side: str, rep: int, setup: SpeedSetup) -> tuple[dict[str, Any], Path]:
    """One timed run of ``side``: (its record, the table it wrote)."""
    table = setup.work / f"{side}-{rep}"
    result = setup.work / f"{side}-{rep}.json"
    if side in RECD_SIDES:
        argv = recd_argv(setup, table, result, layout="dedup" if side == RECD_DEDUP else "plain")
    else:
        spec = ReferenceSpec(
            shard_dir=setup.shard_dir,
            out_dir=table,
            result=result,
            sort=SORTS[side],
            threads=setup.threads,
            row_group_rows=setup.row_group_rows,
            zstd_level=setup.zstd_level,
            temp_dir=setup.work / "duckdb-tmp",
        )
        spec_path = setup.work / f"{side}-{rep}.spec.json"
        spec_path.write_text(json.dumps(asdict(spec), default=str))
        argv = [sys.executable, str(Path(__file__).resolve()), "--reference-child", str(spec_path)]
    record: dict[str, Any] = {"side": side, "rep": rep, "load_avg_before": load_avg()}
    ok, wall_s, error = run_child(argv, setup.timeout_s)
    record.update({"ok": ok, WALL: wall_s})
    if not ok:
        record["error"] = error
        return record, table
    data = json.loads(result.read_text())
    if side in RECD_SIDES:
        record.update({k: data[k] for k in RECD_REPORT_KEYS} | {"rows": data["rows_in"]})
    else:
        record.update(data)
    return record, table


def inspect_table(root: Path) -> dict[str, Any]:
    """What a run wrote (untimed): rows, partitions, files, row groups, columns, bytes, and
    whether every file holds each of its sessions as one contiguous ts-sorted run."""
    files = sorted(root.rglob("*.parquet"))
    partitions = sorted({f.parent.relative_to(root).as_posix() for f in files})
    rows = row_groups = max_group = unclustered = 0
    columns: list[str] = []
    for path in files:
        meta = pq.ParquetFile(path).metadata
        rows += meta.num_rows
        row_groups += meta.num_row_groups
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        max_group = max([max_group, *sizes])
        columns = columns or pq.read_schema(path).names
        keys = pq.read_table(path, columns=[SESSION_ID, TS])
        unclustered += not sessions_clustered(
            keys.column(SESSION_ID).to_numpy(), keys.column(TS).to_numpy()
        )
    return {
        "rows": rows,
        "partitions": len(partitions),
        "partitions_digest": hashlib.sha1("\n".join(partitions).encode()).hexdigest()[:12],
        "files": len(files),
        "row_groups": row_groups,
        "max_row_group_rows": max_group,
        "columns": columns,
        "bytes": sum(f.stat().st_size for f in files),
        "files_not_clustered": unclustered,
    }


def sessions_clustered(session_ids: np.ndarray, ts: np.ndarray) -> bool:
    """True if each session is one contiguous run and ts never decreases inside it."""
    if len(session_ids) == 0:
        return True
    same = session_ids[1:] == session_ids[:-1]
    runs = int(np.count_nonzero(~same)) + 1
    return runs == len(np.unique(session_ids)) and not bool(np.any(np.diff(ts)[same] < 0))


def interleaved_order(repetitions: int, sides: tuple[str, ...], seed: int | str) -> list[list[Any]]:
    """[rep, side] pairs: ``repetitions`` rounds, every side once per round, each round in an
    order drawn from ``random.Random(seed)`` (so no side keeps a slot)."""
    rng = random.Random(seed)
    return [[rep, side] for rep in range(repetitions) for side in rng.sample(sides, len(sides))]


def ratio_summary(ours: dict[int, float], theirs: dict[int, float]) -> dict[str, Any]:
    """Ratio of the medians of ``ours`` / ``theirs`` (rows/s by rep; or whole-wall seconds
    by rep with the sides swapped, see :func:`speed_ratios`) and the min-max of the paired
    ratios of the reps where both succeeded."""
    paired = [ours[rep] / theirs[rep] for rep in sorted(ours) if rep in theirs]
    both = ours and theirs
    return {
        "ratio_of_medians": (
            statistics.median(ours.values()) / statistics.median(theirs.values()) if both else None
        ),
        "paired_min": min(paired) if paired else None,
        "paired_max": max(paired) if paired else None,
        "paired": paired,
    }


def measure_speed(
    setup: SpeedSetup, *, repetitions: int, order_seed: int | str, keep: dict[str, Path]
) -> dict[str, Any]:
    """Run every side ``repetitions`` times, interleaved in a seeded random order; summarise.

    The first table of each side in ``keep`` is moved there (for the encodings and column
    summaries); every other output is checked and removed.
    """
    order = interleaved_order(repetitions, SIDES, order_seed)
    load_before = load_avg()
    runs: list[dict[str, Any]] = []
    for rep, side in order:
        print(f"  rep {rep + 1}/{repetitions}: {side} ...", flush=True)
        record, table = run_side(side, rep, setup)
        if record["ok"]:
            record["table"] = inspect_table(table)
            if side in keep and not keep[side].exists():
                table.rename(keep[side])
        shutil.rmtree(table, ignore_errors=True)
        runs.append(record)
    load_after = load_avg()
    return {
        "order": order,
        "order_seed": order_seed,
        "load_avg_before": load_before,
        "load_avg_after": load_after,
        **summarise_speed(runs),
        "runs": runs,
    }


def summarise_speed(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``sides``: each side's summary (:func:`side_summary`, layouts compared with recd's);
    ``ratios``: the per-row and whole-wall ratios (:func:`speed_ratios`)."""
    sides = {side: side_summary([r for r in runs if r["side"] == side]) for side in SIDES}
    compare_layouts(sides)
    return {"sides": sides, "ratios": speed_ratios(runs)}


def speed_ratios(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every per-row speed ratio of :data:`SPEED_RATIOS` (rows/s over rows/s) and, beside
    each (``KEY_whole_wall``), the whole-wall ratio of the same successful runs: the divisor
    side's whole wall / the divided side's, so that > 1 means the divided side (recd) is
    faster, as for rows/s."""

    def by_rep(side: str, key: str) -> dict[int, float]:
        return {r["rep"]: r[key] for r in runs if r["side"] == side and r["ok"]}

    ratios: dict[str, dict[str, Any]] = {}
    for key, (ours, theirs) in SPEED_RATIOS.items():
        ratios[key] = ratio_summary(by_rep(ours, "rows_per_s"), by_rep(theirs, "rows_per_s"))
        ratios[key + WHOLE_WALL] = ratio_summary(by_rep(theirs, WALL), by_rep(ours, WALL))
    return ratios


def side_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Spread of one side's rows/s and seconds over its successful runs, failures counted."""
    good = [r for r in runs if r["ok"]]
    tables = [r["table"] for r in good]
    summary: dict[str, Any] = {
        "rows_per_s": spread([r["rows_per_s"] for r in good]),
        "seconds": spread([r["seconds"] for r in good]),
        WALL: spread([r[WALL] for r in good]),
        "startup_seconds": spread([r[WALL] - r["seconds"] for r in good]),
        "repetitions": len(runs),
        "failed_repetitions": len(runs) - len(good),
        "errors": [r["error"] for r in runs if not r["ok"]],
        "peak_rss_bytes": max((r["peak_rss_bytes"] for r in good), default=None),
        "bytes_out": spread([t["bytes"] for t in tables]),
        "rows_in_table": sorted({t["rows"] for t in tables}),
        "partitions": sorted({t["partitions"] for t in tables}),
        "partitions_digest": sorted({t["partitions_digest"] for t in tables}),
        "files": sorted({t["files"] for t in tables}),
        "columns": sorted({tuple(t["columns"]) for t in tables}),
        "max_row_group_rows": max((t["max_row_group_rows"] for t in tables), default=None),
        "sessions_clustered": all(t["files_not_clustered"] == 0 for t in tables)
        if tables
        else None,
    }
    if good and "decode_seconds" in good[0]:
        summary["decode_seconds"] = spread([r["decode_seconds"] for r in good])
        summary["sort_write_seconds"] = spread([r["sort_write_seconds"] for r in good])
    return summary


def compare_layouts(sides: dict[str, dict[str, Any]]) -> None:
    """Mark each side whose tables have recd's rows, partitions and columns (in place)."""
    ours = sides[RECD]
    for side in sides.values():
        for key in ("rows_in_table", "partitions_digest", "columns"):
            side[f"same_{key}_as_recd"] = bool(ours[key]) and side[key] == ours[key]


# ---------------------------------------------------------------- one profile


def measure_profile(profile: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Generate ``profile``'s log, shard it both ways, measure bytes, then ETL speed."""
    rows, num_shards = args.rows, args.shards
    catalogue = load_catalogue(profile)
    print(f"[{profile}] generating ~{rows:,} rows ...", flush=True)
    gen = generate_logs(
        catalogue, work / "raw", seed=args.seed, rows=rows, overwrite=True, show_progress=False
    )
    print(f"[{profile}] sharding into {num_shards} shards, both keys ...", flush=True)
    shards = compare_sharding(work / "raw", work / "shards", num_shards=num_shards)
    shutil.rmtree(work / "raw")  # only the shards are read from here on
    print(f"[{profile}] baseline ETL (random shards, arrival order; bytes only) ...", flush=True)
    baseline = run_etl(
        EtlConfig(
            shard_dir=work / "shards" / "random",
            table_dir=work / "table_baseline",
            baseline=True,
            row_group_rows=args.row_group_rows,
            zstd_level=ZSTD_LEVEL,
            workers=args.threads,
            show_progress=False,
        )
    )
    print(f"[{profile}] ETL speed: {args.repetitions} interleaved repetitions ...", flush=True)
    setup = SpeedSetup(
        shard_dir=work / "shards" / "session",
        work=work / "speed",
        threads=args.threads,
        row_group_rows=args.row_group_rows,
        zstd_level=ZSTD_LEVEL,
        timeout_s=args.child_timeout_s,
    )
    setup.work.mkdir(parents=True, exist_ok=True)
    kept = work / "table_clustered"
    kept_dedup = work / "table_dedup"
    os.sync()  # the shards and the baseline table are on disk: no writeback during the runs
    order_seed = f"{args.order_seed}/{profile}"  # an order of its own for each profile
    speed = measure_speed(
        setup,
        repetitions=args.repetitions,
        order_seed=order_seed,
        keep={RECD: kept, RECD_DEDUP: kept_dedup},
    )
    bytes_clustered = speed["sides"][RECD]["bytes_out"]["median"]
    encodings = encodings_summary(kept, args.row_group_rows) if kept.exists() else {}
    columns = {
        "plain": column_bytes(kept) if kept.exists() else {},
        "dedup_layout": column_bytes(kept_dedup) if kept_dedup.exists() else {},
        "baseline": column_bytes(work / "table_baseline"),
    }
    return profile_block(
        profile=profile,
        gen=gen,
        shards=shards,
        num_shards=num_shards,
        baseline_bytes=baseline.bytes_out,
        baseline_rows=baseline.rows_out,
        bytes_clustered=bytes_clustered,
        speed=speed,
        encodings=encodings,
        columns=columns,
        args=args,
    )


def column_bytes(table_dir: Path) -> dict[str, int]:
    """Compressed bytes of each column (``f__new_ids`` and ``f__start`` counted as ``f``, a
    group's two columns as ``g__group``, after its first member ``g``) of a table's files, and
    ``footers`` (the rest of the files: footers, page indexes)."""
    out: dict[str, int] = {}
    total = 0
    for path in sorted(table_dir.rglob("*.parquet")):
        meta = pq.ParquetFile(path).metadata
        total += path.stat().st_size
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            for j in range(group.num_columns):
                chunk = group.column(j)
                name = chunk.path_in_schema.split(".")[0]
                for suffix in ("__new_ids", "__start"):
                    name = name.removesuffix(suffix)
                for suffix in (GROUP_IDS_SUFFIX, GROUP_LENGTHS_SUFFIX):
                    if name.endswith(suffix):
                        name = name.removesuffix(suffix) + GROUP_KEY
                out[name] = out.get(name, 0) + chunk.total_compressed_size
    out["footers"] = total - sum(out.values())
    return out


def encodings_summary(table_dir: Path, row_group_rows: int) -> dict[str, Any]:
    """Parquet bytes per column under each encoding, on one file of a clustered table."""
    files = sorted(table_dir.rglob("*.parquet"))
    return measure_encodings(pq.read_table(files[0]), row_group_rows=row_group_rows)


def profile_block(
    *,
    profile: str,
    gen: Any,
    shards: Any,
    num_shards: int,
    baseline_bytes: int,
    baseline_rows: int,
    bytes_clustered: float | None,
    speed: dict[str, Any],
    encodings: dict[str, Any],
    columns: dict[str, dict[str, int]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One profile's figures (flat, as before) with the speed protocol beside them."""
    sides, ratios = speed["sides"], speed["ratios"]
    rows_out = max(sides[RECD]["rows_in_table"], default=gen.rows)
    block: dict[str, Any] = {
        "profile": profile,
        "rows": gen.rows,
        "sessions": gen.sessions,
        "num_shards": num_shards,
        "raw_bytes": gen.raw_bytes,
        "shard_bytes_session": shards.session.compressed_bytes,
        "shard_bytes_random": shards.random.compressed_bytes,
        "shard_compression_session": shards.session.compression_ratio,
        "shard_compression_random": shards.random.compression_ratio,
        "shard_compression_ratio": shards.ratio,
        "table_bytes_baseline": baseline_bytes,
        "table_bytes_clustered": bytes_clustered,
        "table_compression_ratio": baseline_bytes / bytes_clustered if bytes_clustered else None,
        "bytes_per_sample_baseline": baseline_bytes / baseline_rows,
        "bytes_per_sample_clustered": bytes_clustered / rows_out if bytes_clustered else None,
        "etl_rows_per_s": sides[RECD]["rows_per_s"]["median"],
        "reference_rows_per_s": sides[REFERENCE]["rows_per_s"]["median"],
        "reference_global_sort_rows_per_s": sides[REFERENCE_GLOBAL]["rows_per_s"]["median"],
        "peak_rss_bytes": sides[RECD]["peak_rss_bytes"],
    }
    for key, ratio in ratios.items():
        block[key] = ratio["ratio_of_medians"]
        block[f"{key}_range"] = [ratio["paired_min"], ratio["paired_max"]]
    # The whole walls of the runs the ratios above summarise, and their start-up (medians).
    block["whole_wall_seconds"] = {side: sides[side][WALL]["median"] for side in SIDES}
    block["startup_seconds"] = {side: sides[side]["startup_seconds"]["median"] for side in SIDES}
    ref_bytes = sides[REFERENCE]["bytes_out"]["median"]
    block["reference_bytes_ratio"] = (
        ref_bytes / bytes_clustered if ref_bytes and bytes_clustered else None
    )
    bytes_dedup = sides[RECD_DEDUP]["bytes_out"]["median"]
    block["table_bytes_dedup_layout"] = bytes_dedup
    block["table_ratio_dedup_layout"] = baseline_bytes / bytes_dedup if bytes_dedup else None
    block["bytes_per_sample_dedup_layout"] = bytes_dedup / rows_out if bytes_dedup else None
    block["dedup_layout_etl_rows_per_s"] = sides[RECD_DEDUP]["rows_per_s"]["median"]
    # What no sparse dedup can remove: the columns that are not sparse features (keys, ts,
    # labels, dense features) and the footers, as the dedup layout stores them.
    sparse = set(load_catalogue(profile).sparse_names)
    fixed = sum(
        v for k, v in columns["dedup_layout"].items() if k.removesuffix(GROUP_KEY) not in sparse
    )
    block["dedup_layout_non_sparse_bytes"] = fixed
    block["table_ratio_bound_without_sparse"] = baseline_bytes / fixed if fixed else None
    block["column_bytes"] = columns
    block["failed_repetitions"] = {side: sides[side]["failed_repetitions"] for side in SIDES}
    block["etl_speed"] = {"protocol": speed_protocol(gen.rows, sides, speed, args), **speed}
    block["encodings"] = encodings
    return block


def speed_protocol(
    rows_read: int, sides: dict[str, Any], speed: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """How the speed figures were measured, next to them."""
    sql = {
        side: reference_sql(
            sort=SORTS[side],
            out_dir=Path("OUT"),
            row_group_rows=args.row_group_rows,
            zstd_level=ZSTD_LEVEL,
        )
        for side in (REFERENCE, REFERENCE_GLOBAL)
    }
    return {
        "rows_read": rows_read,
        "rows_in_table": sides[RECD]["rows_in_table"],
        "repetitions": args.repetitions,
        "threads": args.threads,
        "row_group_rows": args.row_group_rows,
        "zstd_level": ZSTD_LEVEL,
        "order": speed["order"],
        "order_seed": speed["order_seed"],
        "load_avg_before": speed["load_avg_before"],
        "load_avg_after": speed["load_avg_after"],
        "command": args.command,
        "side_commands": {
            **{
                side: "python -m recd etl SHARDS --table OUT "
                f"--row-group-rows {args.row_group_rows} --zstd-level {ZSTD_LEVEL} "
                f"--workers {args.threads} --layout {layout} --json REPORT --no-progress"
                for side, layout in ((RECD, "plain"), (RECD_DEDUP, "dedup"))
            },
            REFERENCE: "decode + validate shards on "
            f"{args.threads} threads (recd.etl.validate), then DuckDB: {sql[REFERENCE]}",
            REFERENCE_GLOBAL: "decode + validate shards on "
            f"{args.threads} threads (recd.etl.validate), then DuckDB: {sql[REFERENCE_GLOBAL]}",
        },
        "timing": "in-process seconds from reading the shards to the last file written; "
        "interpreter start-up and imports excluded (wall_seconds_with_startup per run)",
        "whole_wall": "beside each per-row ratio KEY, KEY_whole_wall: the other side's "
        "wall_seconds_with_startup (the child process from spawn to exit) / recd's, ratio of "
        "the medians and min-max of the paired per-round ratios (> 1: recd faster); "
        "startup_seconds = wall_seconds_with_startup - seconds",
        "nullability": "recd writes REQUIRED columns; DuckDB writes OPTIONAL ones from an "
        "Arrow scan (both reject null rows in validation)",
    }


# ---------------------------------------------------------------- output


def fmt_rate(side: dict[str, Any]) -> str:
    rate = side["rows_per_s"]
    if rate["median"] is None:
        return "n/a (every repetition failed)"
    return f"{rate['median']:,.0f} rows/s ({rate['min']:,.0f}-{rate['max']:,.0f})"


def fmt_ratio(block: dict[str, Any], key: str) -> str:
    value, (lo, hi) = block[key], block[f"{key}_range"]
    if value is None:
        return "n/a"
    paired = "" if lo is None else f" ({lo:.2f}-{hi:.2f}x)"
    return f"**{value:.2f}x**{paired}"


def fmt_walls(b: dict[str, Any], sides: tuple[str, ...]) -> str:
    """Median whole wall (start-up in it) of each of ``sides``, joined by " / "."""
    walls, startups = b["whole_wall_seconds"], b["startup_seconds"]
    return " / ".join(
        "n/a" if walls[s] is None else f"{walls[s]:.2f} s ({startups[s]:.2f} s)" for s in sides
    )


def fmt_bold_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"**{value:.2f}x**"


def fmt_flag(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "no")


def fmt_bytes(nbytes: float | None, per_sample: float | None) -> str:
    if nbytes is None or per_sample is None:
        return "n/a"
    return f"{nbytes / 1e6:,.1f} MB ({per_sample:.0f} B/sample)"


def profile_rows(b: dict[str, Any]) -> list[tuple[str, str]]:
    """(measure, value) rows of one profile's column."""
    sides = b["etl_speed"]["sides"]
    mib = 2**20
    return [
        ("rows (sessions)", f"{b['rows']:,} ({b['sessions']:,})"),
        ("raw log (Arrow IPC, uncompressed)", f"{b['raw_bytes'] / 1e6:,.1f} MB"),
        (
            "shards, random key",
            f"{b['shard_bytes_random'] / 1e6:,.1f} MB ({b['shard_compression_random']:.2f}x)",
        ),
        (
            "shards, session key",
            f"{b['shard_bytes_session'] / 1e6:,.1f} MB ({b['shard_compression_session']:.2f}x)",
        ),
        (
            "**shard_compression_ratio** (random / session)",
            f"**{b['shard_compression_ratio']:.2f}x**",
        ),
        (
            "table, arrival order (baseline)",
            fmt_bytes(b["table_bytes_baseline"], b["bytes_per_sample_baseline"]),
        ),
        (
            "table, clustered by session",
            fmt_bytes(b["table_bytes_clustered"], b["bytes_per_sample_clustered"]),
        ),
        (
            "**table_compression_ratio** (baseline / clustered)",
            fmt_bold_ratio(b["table_compression_ratio"]),
        ),
        (
            "table, dedup layout (`--layout dedup`)",
            fmt_bytes(b["table_bytes_dedup_layout"], b["bytes_per_sample_dedup_layout"]),
        ),
        (
            "**table_ratio_dedup_layout** (baseline / dedup layout)",
            fmt_bold_ratio(b["table_ratio_dedup_layout"]),
        ),
        (
            "bound: baseline / the dedup table's non-sparse columns and footers",
            "n/a"
            if b["table_ratio_bound_without_sparse"] is None
            else f"{b['table_ratio_bound_without_sparse']:.2f}x "
            f"({b['dedup_layout_non_sparse_bytes'] / 1e6:,.1f} MB that sparse dedup cannot remove)",
        ),
        ("recd etl, median (min-max)", fmt_rate(sides[RECD])),
        ("recd etl --layout dedup, median (min-max)", fmt_rate(sides[RECD_DEDUP])),
        (
            "**dedup_layout_etl_speed_vs_plain** (ratio of medians; paired min-max)",
            fmt_ratio(b, "dedup_layout_etl_speed_vs_plain"),
        ),
        (
            "dedup_layout_etl_speed_vs_plain_whole_wall (plain's whole wall / dedup layout's)",
            fmt_ratio(b, "dedup_layout_etl_speed_vs_plain_whole_wall").replace("**", ""),
        ),
        ("DuckDB, same work: sort per hourly partition", fmt_rate(sides[REFERENCE])),
        (
            "**etl_speed_vs_reference** (ratio of medians; paired min-max)",
            fmt_ratio(b, "etl_speed_vs_reference"),
        ),
        (
            "**etl_speed_vs_reference_whole_wall** (DuckDB's whole wall / recd's: start-up "
            "in; ratio of medians; paired min-max)",
            fmt_ratio(b, "etl_speed_vs_reference_whole_wall"),
        ),
        ("DuckDB, global ORDER BY (earlier reference)", fmt_rate(sides[REFERENCE_GLOBAL])),
        (
            "etl_speed_vs_reference_global_sort (secondary)",
            fmt_ratio(b, "etl_speed_vs_reference_global_sort").replace("**", ""),
        ),
        (
            "etl_speed_vs_reference_global_sort_whole_wall (secondary; whole walls)",
            fmt_ratio(b, "etl_speed_vs_reference_global_sort_whole_wall").replace("**", ""),
        ),
        (
            "whole wall, median (start-up in it): recd / dedup layout / same work / global",
            fmt_walls(b, SIDES),
        ),
        (
            "peak RSS: recd / DuckDB same work",
            " / ".join(
                "n/a" if s["peak_rss_bytes"] is None else f"{s['peak_rss_bytes'] / mib:,.0f} MiB"
                for s in (sides[RECD], sides[REFERENCE])
            ),
        ),
        (
            "sessions clustered in every file (recd / dedup layout / same work / global)",
            " / ".join(fmt_flag(sides[s]["sessions_clustered"]) for s in SIDES),
        ),
        (
            "failed repetitions (recd / dedup layout / same work / global)",
            " / ".join(str(b["failed_repetitions"][s]) for s in SIDES),
        ),
    ]


def markdown(result: dict[str, Any]) -> str:
    """The table (one column per profile) and its protocol; no heading line (docs/benchmarks.md
    embeds it under its own)."""
    blocks = [result["profiles"][p] for p in result["protocol"]["profiles"]]
    columns = [profile_rows(b) for b in blocks]
    header = "| measure | " + " | ".join(b["profile"] for b in blocks) + " |"
    lines = [header, "|---|" + "---|" * len(blocks)]
    for i, (name, _) in enumerate(columns[0]):
        lines.append(f"| {name} | " + " | ".join(col[i][1] for col in columns) + " |")
    p = result["protocol"]
    note = (
        f"ETL speed: {p['repetitions']} repetitions per side, each in its own process, "
        f"interleaved in a random order (seed {p['order_seed']}/profile); {p['threads']} "
        "threads on "
        "every side; rows/s = rows read / seconds from reading the shards to the last file "
        "written. Same work: the reference decodes and validates the same shards with recd's "
        "code on the same threads, then DuckDB writes the same hourly partitions (zstd level "
        f"{ZSTD_LEVEL}, row groups of {p['row_group_rows']:,}) with each partition sorted by "
        "(session_id, ts, request_id). Whole wall: each run's child process from spawn to "
        "exit (interpreter start-up and imports included); a *_whole_wall ratio is the other "
        "side's whole wall / recd's (> 1: recd faster), over the same runs as the rows/s ratio "
        "above it; start-up = whole wall - in-process seconds. Load average (1 min) "
        f"{p['load_avg_before'][0]:.2f} before, {p['load_avg_after'][0]:.2f} after."
    )
    return f"Command: `{p['command']}`\n\n" + "\n".join(lines) + f"\n\n{note}\n"


def top_level(blocks: dict[str, dict[str, Any]], protocol: dict[str, Any]) -> dict[str, Any]:
    """The JSON: rm1-like's flat figures (the headline) at the top, every profile nested."""
    head = blocks.get(HEADLINE_PROFILE) or next(iter(blocks.values()))
    flat = {k: v for k, v in head.items() if k not in ("etl_speed", "encodings")}
    return {
        "benchmark": "storage",
        **flat,
        "headline_profile": head["profile"],
        "protocol": protocol,
        "profiles": blocks,
    }


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="CI size: 40k rows per profile")
    parser.add_argument(
        "--profile",
        nargs="+",
        choices=PROFILES,
        default=list(DEFAULT_PROFILES),
        help="profiles to measure (default: rm1-like and clickstream; others write "
        "storage_<profiles>.*)",
    )
    parser.add_argument("--rows", type=int, help="rows per profile (default 1M, quick 40k)")
    parser.add_argument("--shards", type=int, help="log-bus shards (default 64, quick 8)")
    parser.add_argument("--repetitions", type=int, default=3, help="runs per side (>= 3)")
    parser.add_argument(
        "--threads", type=int, default=default_threads(), help="threads per side (recd's default)"
    )
    parser.add_argument("--row-group-rows", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=1, help="data seed")
    parser.add_argument("--order-seed", type=int, default=1, help="seed of the run order")
    parser.add_argument("--child-timeout-s", type=float, default=CHILD_TIMEOUT_S)
    parser.add_argument("--work-dir", type=Path, help="keep the data here (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--reference-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repetitions < 1 or args.threads < 1:
        parser.error("--repetitions and --threads must be >= 1")
    args.rows = args.rows or (QUICK_ROWS if args.quick else FULL_ROWS)
    args.shards = args.shards or (QUICK_SHARDS if args.quick else FULL_SHARDS)
    given = sys.argv[1:] if argv is None else argv
    args.command = " ".join(["python benchmarks/storage.py", *given])
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reference_child:
        return run_reference_child(args.reference_child)
    load_before = load_avg()
    blocks: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="recd-storage-") as tmp:
        root = args.work_dir or Path(tmp)
        for profile in args.profile:
            work = root / profile
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            blocks[profile] = measure_profile(profile, args, work)
            if args.work_dir is None:
                shutil.rmtree(work, ignore_errors=True)
    protocol = {
        "profiles": list(args.profile),
        "rows_requested": args.rows,
        "num_shards": args.shards,
        "repetitions": args.repetitions,
        "threads": args.threads,
        "row_group_rows": args.row_group_rows,
        "zstd_level": ZSTD_LEVEL,
        "seed": args.seed,
        "order_seed": args.order_seed,
        "cpu_count": os.cpu_count(),
        "load_avg_before": load_before,
        "load_avg_after": load_avg(),
        "command": args.command,
        "quick": args.quick,
    }
    result = top_level(blocks, protocol)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "storage_quick" if args.quick else "storage"
    if list(args.profile) != list(DEFAULT_PROFILES):
        stem += "_" + "_".join(p.replace("-", "_") for p in args.profile)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    table = markdown(result)
    (args.out / f"{stem}.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
