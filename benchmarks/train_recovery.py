"""Recovery inside ``recd train``: survivor recovery against restart-and-reload, same launcher.

    python benchmarks/train_recovery.py            # 10 kills per route, 4 failure-free pairs
    python benchmarks/train_recovery.py --quick    # 3 kills per route, 2 pairs
                                                   # (writes train_recovery_quick.json / .md)

The job is the user's: ``recd train --nproc 2`` on the tiny profile's table (1000 sessions
through the real generate -> shard -> ETL), a DLRM with its tables sharded row-wise over 2 CPU
processes (gloo, one torch thread each), ``--steps`` steps, a checkpoint every
``--checkpoint-every``. Both routes run under recd's launcher (:mod:`recd.train.agent`):

- ``survivor`` (``--recovery survivor``): the survivor keeps its state, the warm spare
  replaces the dead rank, the dead shard comes from the newest checkpoint;
- ``elastic`` (``--recovery elastic --max-restarts 1``): every worker is stopped and the
  group restarts from the newest checkpoint, replaying the steps since (torchrun's policy,
  from the same launcher, so both pay the same process start-up).

Each failing run SIGKILLs one worker (rank and step drawn uniformly, the step after the first
checkpoint) at a phase drawn uniformly from the forward (before the input all-to-all), the
sharded lookup (between the all-to-alls), the backward and the optimizer step
(``RECD_TEST_KILL``); the draws are seeded and the same schedule is used for both routes. All
runs (failing ones of both routes, failure-free pairs) go in one seeded random order.

Measured:

- **recovery time** of a run = its wall time minus the median wall time of the failure-free
  runs of the same route (everything the failure cost: detection, restart or replacement,
  state, replayed steps); ``recovery_time_ratio`` = median survivor / median elastic (range:
  min / max .. max / min);
- survivor phases from the workers' events (``recovery/events.jsonl``): detection (kill ->
  the survivor's failed collective), agreement (+ undo), join (the replacement built and in
  the new process group), transfer (plan, dense state, the dead shard from the checkpoint),
  first step; ``total`` = kill -> the step in flight completed by every rank;
- **failure-free overhead**: the update-undo capture. Failure-free runs of both routes in
  pairs (survivor captures every step, elastic does not); the overhead is the median of
  (survivor step time / elastic step time - 1) over the pairs, step time = rank 0's
  training time / steps (``train.json``);
- **simulated speedup** (SwIFT's methodology, :func:`benchmarks.recovery.simulate_speedup`):
  a job of ``--work-hours`` with failures uniform on [0, 2 x 17 h]; the checkpoint strategy
  rolls back to the last checkpoint and pays the elastic route's fixed cost; survivor loses
  the step in flight and pays its fixed cost, and every step pays the measured overhead.
  Fixed costs = the measured recovery times minus their replayed steps; checkpoint writes cost
  both strategies the same and are left out. At this job's scale (state below), not
  extrapolated.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.recovery import make_table, simulate_speedup  # noqa: E402
from recd.recovery.rejoin import read_events  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PHASES = ("forward", "lookup", "backward", "optimizer")


def write_config(work: Path, table: Path, args: argparse.Namespace) -> Path:
    path = work / "job.toml"
    path.write_text(
        f"""[reader]
table = "{table}"
end = "2026-11-01T01:00"
batch_size = {args.batch_size}
shuffle = "session"
num_epochs = 50

[model]
kind = "dlrm"
embedding_dim = 16
max_rows = 5000
hash_ids = true

[optim]
lr = 0.01

[train]
steps = {args.steps}
log_every = 10
eval_every = 0
seed = 0
run_dir = "{work / "unused"}"
sharding = "row_wise"

[checkpoint]
checkpoint_every = {args.checkpoint_every}
"""
    )
    return path


def run_one(config: Path, run_dir: Path, route: str, kill: str | None) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), RECD_PROGRESS="0", OMP_NUM_THREADS="1")
    env.pop("RECD_TEST_KILL", None)
    if kill:
        env["RECD_TEST_KILL"] = kill
    command = [
        sys.executable,
        "-m",
        "recd",
        "train",
        "--config",
        str(config),
        "--nproc",
        "2",
        "--run-dir",
        str(run_dir),
        "--recovery",
        route,
    ]
    if route == "elastic":
        command += ["--max-restarts", "1"]
    began = time.perf_counter()
    proc = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600, check=False
    )
    wall = time.perf_counter() - began
    out: dict[str, Any] = {"route": route, "kill": kill, "wall_s": wall, "rc": proc.returncode}
    if proc.returncode != 0:
        out["error"] = proc.stderr[-2000:]
        return out
    result = json.loads((run_dir / "train.json").read_text())["result"]
    out["step_s"] = result["train_s"] / max(result["steps"] - result["first_step"], 1)
    records = (
        [json.loads(x) for x in (run_dir / ".recovery.json").read_text().splitlines()]
        if (run_dir / ".recovery.json").exists()
        else []
    )
    out["records"] = [
        {
            k: r.get(k)
            for k in (
                "route",
                "agreed_step",
                "checkpoint_step",
                "steps_lost",
                "embedding_checkpoint_step",
                "bit_exact",
                "undone",
            )
        }
        | {"rows_lost": sum((r.get("rows_lost_updates") or {}).values())}
        for r in records
    ]
    if kill and route == "survivor":
        out["phases"] = survivor_phases(read_events(run_dir))
    return out


def survivor_phases(events: list[dict[str, Any]]) -> dict[str, float] | None:
    kill = next((e for e in events if e["event"] == "kill"), None)
    if kill is None:
        return None
    t0 = kill["t"]
    after = [e for e in events if e["t"] >= t0]

    def times(name: str, gen: int) -> list[float]:
        return [e["t"] for e in after if e["event"] == name and e.get("gen") == gen]

    detect, agreed = times("detect", 0), times("agreed", 0)
    rendezvous, loaded, step = times("rendezvous", 1), times("loaded", 1), times("step", 1)
    if not (detect and agreed and rendezvous and loaded and step):
        return None
    return {
        "detection": min(detect) - t0,
        "agreement": max(agreed) - min(detect),
        "join": max(max(rendezvous) - max(agreed), 0.0),
        "transfer": max(loaded) - max(rendezvous),
        "first_step": max(step) - max(loaded),
        "total": max(step) - t0,
    }


def spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--kills", type=int, default=10, help="failing runs per route")
    parser.add_argument("--pairs", type=int, default=4, help="failure-free runs per route")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/recd-train-recovery"))
    parser.add_argument("--work-hours", type=float, default=7 * 24.0)
    parser.add_argument("--mtbf-median-hours", type=float, default=17.0)
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument(
        "--cadence-hours", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0]
    )
    parser.add_argument("--headline-cadence", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.quick:
        args.kills, args.pairs = 3, 2
    args.work.mkdir(parents=True, exist_ok=True)
    table = make_table(args.work)
    config = write_config(args.work, table, args)
    rng = random.Random(args.seed)
    schedule = [
        (
            rng.randrange(2),
            rng.randrange(args.checkpoint_every + 1, args.steps - 4),
            rng.choice(PHASES),
        )
        for _ in range(args.kills)
    ]
    runs_planned = [(route, i) for route in ("survivor", "elastic") for i in range(args.kills)]
    runs_planned += [
        (f"{route}_free", i) for route in ("survivor", "elastic") for i in range(args.pairs)
    ]
    rng.shuffle(runs_planned)
    runs: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    for n, (name, i) in enumerate(runs_planned, 1):
        route = name.removesuffix("_free")
        kill = None
        if not name.endswith("_free"):
            rank, step, phase = schedule[i]
            kill = f"0:{rank}:{step}:{phase}"
        run_dir = args.work / f"run_{n:03d}"
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
        out = run_one(config, run_dir, route, kill) | {"name": name, "rep": i}
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
        runs.append(out)
        print(
            f"[{n}/{len(runs_planned)}] {name} {kill or ''} wall {out['wall_s']:.2f} s "
            f"rc {out['rc']}",
            flush=True,
        )
    report = summarize(runs, args, load_before)
    write_outputs(report, args)
    return 0


def summarize(
    runs: list[dict[str, Any]], args: argparse.Namespace, load_before: float
) -> dict[str, Any]:
    ok = [r for r in runs if r["rc"] == 0]
    free = {
        route: [r for r in ok if r["name"] == f"{route}_free"] for route in ("survivor", "elastic")
    }
    free_wall = {route: statistics.median([r["wall_s"] for r in rs]) for route, rs in free.items()}
    cost = {
        route: [r["wall_s"] - free_wall[route] for r in ok if r["name"] == route]
        for route in ("survivor", "elastic")
    }
    steps = {route: [r["step_s"] for r in rs] for route, rs in free.items()}
    pairs = [
        s / e - 1.0
        for s, e in zip(sorted(steps["survivor"]), sorted(steps["elastic"]), strict=False)
    ]
    overhead = statistics.median(steps["survivor"]) / statistics.median(steps["elastic"]) - 1.0
    step_s = statistics.median(steps["elastic"])
    lost = [
        rec["steps_lost"]
        for r in ok
        if r["name"] == "elastic"
        for rec in r["records"]
        if rec.get("steps_lost") is not None
    ]
    phases = [r["phases"] for r in ok if r["name"] == "survivor" and r.get("phases")]
    phase_medians = (
        {k: statistics.median([p[k] for p in phases]) for k in phases[0]} if phases else {}
    )
    s, e = spread(cost["survivor"]), spread(cost["elastic"])
    ratio = s["median"] / e["median"] if s["median"] is not None and e["median"] else None
    ratio_range = (
        [s["min"] / e["max"], s["max"] / e["min"]]
        if ratio is not None and e["min"] and e["max"]
        else None
    )
    lost_median = statistics.median(lost) if lost else 0.0
    inputs = {
        "step_s": step_s,
        "undo_overhead": max(overhead, 0.0),
        "checkpoint_cost_s": 0.0,
        "restart_fixed_s": max(e["median"] - (lost_median + 1) * step_s, 0.0),
        "survivor_fixed_s": max(s["median"] - step_s, 0.0),
        "survivor_lost_steps": 1.0,
    }
    rng = np.random.default_rng(args.seed)
    mtbf_s = args.mtbf_median_hours * 3600
    gaps = rng.uniform(
        0.0, 2 * mtbf_s, (args.trials, int(args.work_hours * 3600 / mtbf_s * 4) + 50)
    )
    rows = [simulate_speedup(inputs, gaps, args.work_hours * 3600, h) for h in args.cadence_hours]
    headline = next(r for r in rows if r["cadence_hours"] == args.headline_cadence)
    rows_lost = [rec["rows_lost"] for r in ok if r["name"] == "survivor" for rec in r["records"]]
    exact = sum(
        bool(rec["bit_exact"]) for r in ok if r["name"] == "survivor" for rec in r["records"]
    )
    return {
        "benchmark": "train_recovery",
        "command": "python benchmarks/train_recovery.py" + (" --quick" if args.quick else ""),
        "protocol": {
            "job": f"recd train --nproc 2, tiny profile table, DLRM row-wise, {args.steps} steps, "
            f"checkpoint every {args.checkpoint_every}, batch {args.batch_size}",
            "routes": "survivor (--recovery survivor) vs elastic (--recovery elastic "
            "--max-restarts 1), the same launcher",
            "kills_per_route": args.kills,
            "failure_free_per_route": args.pairs,
            "schedule_seed": args.seed,
            "order": [r["name"] for r in runs],
            "recovery_time": "wall of a failing run - median wall of the same route's "
            "failure-free runs",
            "overhead": "median survivor step time / median elastic step time - 1 "
            "(failure-free runs)",
            "load_average_before": load_before,
            "load_average_after": os.getloadavg()[0],
            "cpu_count": os.cpu_count(),
        },
        "failed_runs": {
            name: sum(1 for r in runs if r["name"] == name and r["rc"] != 0)
            for name in ("survivor", "elastic", "survivor_free", "elastic_free")
        },
        "recovery_s": {"survivor": s, "elastic": e},
        "recovery_time_ratio": ratio,
        "recovery_time_ratio_range": ratio_range,
        "survivor_phases_median_s": phase_medians,
        "elastic_steps_lost": spread([float(x) for x in lost]),
        "survivor_rows_lost": spread([float(x) for x in rows_lost]),
        "survivor_bit_exact_recoveries": exact,
        "failure_free": {
            "wall_s": free_wall,
            "step_s": {k: spread(v) for k, v in steps.items()},
            "overhead_fraction": overhead,
            "overhead_fraction_by_sorted_pairs": pairs,
        },
        "simulation": {
            "scale": "this job's measured costs (2 CPU ranks, tiny DLRM), not extrapolated",
            "inputs": inputs,
            "scenario": {
                "work_hours": args.work_hours,
                "mtbf_median_hours": args.mtbf_median_hours,
                "trials": args.trials,
                "failure_gaps": "uniform on [0, 2 x median]",
            },
            "rows": rows,
        },
        "simulated_speedup": headline["speedup"],
        "headline_cadence_hours": args.headline_cadence,
        "runs": runs,
    }


def write_outputs(report: dict[str, Any], args: argparse.Namespace) -> None:
    name = "train_recovery_quick" if args.quick else "train_recovery"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1, default=str))
    s, e = report["recovery_s"]["survivor"], report["recovery_s"]["elastic"]
    ff = report["failure_free"]
    rr = report["recovery_time_ratio_range"] or [math.nan, math.nan]
    lines = [
        f"`recovery_time_ratio` inside `recd train` (survivor / elastic restart, same launcher): "
        f"**{report['recovery_time_ratio']:.3f}** (range {rr[0]:.3f}-{rr[1]:.3f}; "
        f"{s['n']} + {e['n']} kills; failed runs: {report['failed_runs']})",
        "",
        f"Failure-free overhead of survivor mode (update-undo capture): "
        f"**{100 * ff['overhead_fraction']:.1f}%** of a step "
        f"({ff['step_s']['survivor']['median'] * 1e3:.1f} vs "
        f"{ff['step_s']['elastic']['median'] * 1e3:.1f} ms). Simulated speedup at measured "
        f"costs, checkpoint cadence {report['headline_cadence_hours']} h: "
        f"**{report['simulated_speedup']:.3f}x**.",
        "",
        f"Job: {report['protocol']['job']}; `{report['command']}`",
        "",
        "| route | recovery s (median) | min-max | steps lost | rows that lost updates |",
        "|---|---|---|---|---|",
        f"| survivor | {s['median']:.2f} | {s['min']:.2f}-{s['max']:.2f} | 0 (1 redone) | "
        f"{report['survivor_rows_lost']['median']} (median; "
        f"{report['survivor_bit_exact_recoveries']} bit-exact) |",
        f"| elastic restart | {e['median']:.2f} | {e['min']:.2f}-{e['max']:.2f} | "
        f"{report['elastic_steps_lost']['median']} (median) | 0 (replayed exactly) |",
        "",
        "Survivor phases (median s): "
        + ", ".join(f"{k} {v:.3f}" for k, v in report["survivor_phases_median_s"].items()),
        "",
        "| cadence h | checkpoint wall h | survivor wall h | speedup |",
        "|---|---|---|---|",
    ]
    for row in report["simulation"]["rows"]:
        lines.append(
            f"| {row['cadence_hours']} | {row['checkpoint_wall_hours']:.2f} | "
            f"{row['survivor_wall_hours']:.2f} | {row['speedup']:.3f} |"
        )
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
