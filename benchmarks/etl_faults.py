"""ETL kill campaign: what a reader sees after a real `recd etl` process is SIGKILLed.

    python benchmarks/etl_faults.py                     # 40 kills per table format
    python benchmarks/etl_faults.py --kills 10 --formats iceberg
    python benchmarks/etl_faults.py --engine spark --kills 10    # the Spark engine (local mode)

Protocol. A small log (``tiny`` profile, ``--sessions`` sessions over several hours) is
generated and session-sharded once. For each table format (``iceberg``, ``hive``) and each
kill: the table is first brought back to a known old state by an uninterrupted baseline run
(``--baseline``: arrival order, so its partitions are not clustered), then a clustered run
starts in a child process and is SIGKILLed after a delay drawn uniformly from [0, 1.05 x the
duration of an unkilled clustered run] (``random.Random(--seed)``). The child sleeps at the
documented test hooks (``RECD_ETL_TEST_SHARD_DELAY_S`` after each shard pass,
``RECD_ETL_TEST_COMMIT_DELAY_S`` at the commit) so that kills land in every phase. After the
kill, what a reader plans (``recd.table.snapshot.committed_files``) is classified:

- ``old``: every visible partition is the baseline run's, all rows present;
- ``new``: every visible partition is the clustered run's, all rows present;
- ``mixed``: some partitions of each run (a partial run is visible);
- ``rows_wrong``: rows missing or duplicated; ``reader_error``: planning or reading failed;
- ``finished``: the child ended before the kill (not counted as a kill).

Then one more clustered run completes and must leave every row exactly once. Writes
``benchmarks/results/etl_faults.json`` and ``etl_faults.md`` (``--engine spark``:
``etl_faults_spark.*``). The baseline runs use the local engine in both cases.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recd.etl.config import EtlConfig  # noqa: E402
from recd.etl.local import SHARD_DELAY_ENV, run_etl  # noqa: E402
from recd.logs.generate import generate_logs  # noqa: E402
from recd.logs.shard import shard_logs  # noqa: E402
from recd.schema import REQUEST_ID, SESSION_ID, load_catalogue  # noqa: E402
from recd.table.hive import COMMIT_DELAY_ENV  # noqa: E402
from recd.table.snapshot import committed_files  # noqa: E402

CHILD = """
import sys
from pathlib import Path
from recd.etl.config import EtlConfig
from recd.etl.local import run_etl
run_etl(EtlConfig(shard_dir=Path(sys.argv[1]), table_dir=Path(sys.argv[2]), show_progress=False,
                  row_group_rows=64, table_format=sys.argv[3], engine=sys.argv[4]))
"""
OUTCOMES = ("old", "new", "mixed", "rows_wrong", "reader_error")


def clustered(table: pa.Table) -> bool:
    """Whether each session's rows are one contiguous run (the clustered run's files)."""
    ids = table.column(SESSION_ID).to_numpy()
    if len(ids) == 0:
        return True
    runs = 1 + int(np.count_nonzero(ids[1:] != ids[:-1]))
    return runs == len(np.unique(ids))


def classify(table_dir: Path, expected_ids: np.ndarray) -> str:
    try:
        view = committed_files(table_dir)
        kinds = set()
        ids = []
        for _, files in view.partitions:
            part = pa.concat_tables(
                pq.read_table(f, columns=[SESSION_ID, REQUEST_ID]) for f in files
            )
            kinds.add("new" if clustered(part) else "old")
            ids.append(part.column(REQUEST_ID).to_numpy())
    except Exception:  # any failure to plan or read is an outcome to count
        return "reader_error"
    got = np.sort(np.concatenate(ids)) if ids else np.zeros(0, np.int64)
    if not np.array_equal(got, expected_ids):
        return "rows_wrong"
    return kinds.pop() if len(kinds) == 1 else "mixed"


def child(
    shards: Path, table: Path, fmt: str, engine: str, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(shards), str(table), fmt, engine],
        env={**os.environ, "RECD_PROGRESS": "0", "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def campaign(
    shards: Path, work: Path, fmt: str, engine: str, kills: int, rng: random.Random
) -> dict[str, Any]:
    table = work / f"table_{fmt}"
    shutil.rmtree(table, ignore_errors=True)
    delays = {SHARD_DELAY_ENV: "0.05", COMMIT_DELAY_ENV: "0.15"}

    def baseline() -> None:
        run_etl(
            EtlConfig(
                shard_dir=shards,
                table_dir=table,
                baseline=True,
                table_format=fmt,
                show_progress=False,
            )
        )

    baseline()
    expected = np.sort(
        np.concatenate(
            [
                pq.read_table(f, columns=[REQUEST_ID]).column(0).to_numpy()
                for f in committed_files(table).files
            ]
        )
    )
    started = time.monotonic()
    proc = child(shards, table, fmt, engine, delays)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    duration = time.monotonic() - started
    counts = dict.fromkeys((*OUTCOMES, "finished"), 0)
    done = attempts = 0
    while done < kills and attempts < 4 * kills:
        attempts += 1
        baseline()
        proc = child(shards, table, fmt, engine, delays)
        try:
            proc.wait(timeout=rng.uniform(0.0, duration * 1.05))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        if proc.returncode == 0:
            counts["finished"] += 1
            continue
        done += 1
        counts[classify(table, expected)] += 1
        print(f"{fmt}: kill {done}/{kills}: {counts}", flush=True)
    report = run_etl(
        EtlConfig(shard_dir=shards, table_dir=table, table_format=fmt, show_progress=False)
    )
    final = classify(table, expected)
    return {
        "table_format": fmt,
        "engine": engine,
        "kills": done,
        "attempts": attempts,
        "unkilled_run_seconds": duration,
        "outcomes": counts,
        "partial_run_visible": counts["mixed"] + counts["rows_wrong"],
        "after_rerun": final,
        "rows_after_rerun": report.rows_out,
        "rows_expected": len(expected),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=40, help="kills per format (default 40)")
    parser.add_argument("--engine", choices=("local", "spark"), default="local")
    parser.add_argument("--formats", default="iceberg,hive", help="comma-separated formats")
    parser.add_argument("--sessions", type=int, default=600, help="sessions in the log")
    parser.add_argument("--seed", type=int, default=11, help="seed of the kill delays")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/recd-etl-faults"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    work = args.work_dir
    shutil.rmtree(work, ignore_errors=True)
    catalogue = load_catalogue("tiny")
    generate_logs(catalogue, work / "raw", seed=3, num_sessions=args.sessions, show_progress=False)
    shard_logs(work / "raw", work / "shards", key="session", num_shards=4, show_progress=False)
    rng = random.Random(args.seed)
    results = [
        campaign(work / "shards", work, fmt, args.engine, args.kills, rng)
        for fmt in args.formats.split(",")
    ]
    body = {
        "protocol": __doc__.split("Protocol. ")[1].split("Writes")[0].strip(),
        "command": "python benchmarks/" + Path(__file__).name + " " + " ".join(sys.argv[1:]),
        "sessions": args.sessions,
        "seed": args.seed,
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "etl_faults" if args.engine == "local" else f"etl_faults_{args.engine}"
    (args.out / f"{stem}.json").write_text(json.dumps(body, indent=1) + "\n")
    lines = [
        f"`{body['command'].strip()}`",
        "",
        "| format | engine | kills | old run whole | new run whole | partial run visible | rows wrong "
        "| reader error | after rerun |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        o = r["outcomes"]
        lines.append(
            f"| {r['table_format']} | {r['engine']} | {r['kills']} | {o['old']} | {o['new']} | {o['mixed']} | "
            f"{o['rows_wrong']} | {o['reader_error']} | {r['after_rerun']}, "
            f"{r['rows_after_rerun']:,} of {r['rows_expected']:,} rows |"
        )
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
