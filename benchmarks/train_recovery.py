"""Recovery inside ``recd train``: survivor recovery against restart-and-reload, same launcher.

    python benchmarks/train_recovery.py            # 10 kills per killed route, 4 free runs
    python benchmarks/train_recovery.py --quick    # 2 kills per route, 1 free run, 60 steps
                                                   # (writes train_recovery_quick.json / .md)

The job is the user's: ``recd train --nproc 2`` on the tiny profile's table (1000 sessions
through the real generate -> shard -> ETL), a DLRM with its tables sharded row-wise over 2 CPU
processes (gloo, one torch thread each), ``--steps`` steps, a checkpoint every
``--checkpoint-every``. Every route runs under recd's launcher (:mod:`recd.recovery.agent`):

- ``survivor`` (``--recovery survivor``): the survivor keeps its state, the warm spare
  (started with the group; the next one once the recovery is over, importing at idle
  priority) replaces the dead rank, the dead shard
  comes from the newest checkpoint (its rows updated since lose those updates: audited);
- ``survivor_peer`` (``--recovery survivor --peer-copy``): the same, the dead shard from the
  survivor's in-memory copy (bit-exact);
- ``elastic`` (``--recovery elastic --max-restarts 1``): every worker is stopped and the
  group restarts from the newest checkpoint, replaying the steps since (torchrun's policy,
  from the same launcher, so both pay the same process start-up);
- failure-free only: ``survivor_nospare`` (``--no-spare``), which separates the spare's cost
  from the capture's.

Each failing run SIGKILLs one worker (rank and step drawn uniformly, after the first
checkpoint) at a phase drawn uniformly from the forward (before the input all-to-all), the
sharded lookup (between the all-to-alls), the backward and the optimizer step
(``RECD_TEST_KILL``); the draws are seeded and the same schedule is used for every killed
route. All runs (failing ones and failure-free ones of every route) go in one seeded random
order; a failed run is counted and reported.

Measured:

- **recovery time** of a run = its wall time minus the median wall time of the same route's
  failure-free runs (everything the failure cost: detection, restart or replacement, state,
  replayed steps); ``recovery_time_ratio`` = median survivor / median elastic, with a 95%
  bootstrap interval (``recovery_time_ratio_ci95``: the target, <= 0.3, is judged by its
  upper end) and the range of the extremes (min / max .. max / min), and the same with
  ``--peer-copy``;
- survivor phases from the workers' events (``recovery/events.jsonl``): detection (kill ->
  the survivor's failed collective), agreement (+ undo), join (the replacement built and in
  the new process group), transfer (plan, dense state, the dead shard), first step; whether
  the spare had finished its imports when it was swapped in;
- **failure-free cost** on this job: each route's median step time over the elastic route's
  (``train.json``: training time / steps); and, from ``benchmarks/undo_overhead.py``, the
  same cost on the trainer benchmark's model, where the step is long enough to measure it
  with a confidence interval;
- **simulated speedup** (SwIFT's methodology, :func:`benchmarks.recovery.simulate_speedup`):
  a job of ``--work-hours`` with failures uniform on [0, 2 x 17 h]; the checkpoint strategy
  rolls back to the last checkpoint and pays the elastic route's fixed cost; survivor loses
  the step in flight and pays its fixed cost, and every step pays the failure-free overhead.
  Checkpoint writes cost both strategies the same and are left out. Two scales: *this job*
  (every input measured here) and *at scale* (the headline): the trainer benchmark's step and
  measured overhead, a ``--scale-checkpoint-gb`` checkpoint reloaded whole by the restart and
  half (the dead rank's shards) by the survivor at the cold-read bandwidth measured here (a
  1 GB file evicted from the page cache), or sent by the peer copy at the ring bandwidth
  measured from the runs' peer-copy seeds; every other cost as measured on this job. A
  variant at the overhead interval's bad end is reported beside it.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.recovery import draw_gaps, make_table, simulate_speedup  # noqa: E402
from recd.recovery.audit import read_events  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PHASES = ("forward", "lookup", "backward", "optimizer")
ROUTE_OPTIONS: dict[str, list[str]] = {
    "survivor": ["--recovery", "survivor"],
    "survivor_nospare": ["--recovery", "survivor", "--no-spare"],
    "survivor_peer": ["--recovery", "survivor", "--peer-copy"],
    "elastic": ["--recovery", "elastic", "--max-restarts", "1"],
}
KILLED_ROUTES = ("survivor", "survivor_peer", "elastic")
"""Routes run with kills (the failure-free runs: every route of ROUTE_OPTIONS)."""


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


def train_command(
    config: Path, run_dir: Path, options: list[str], kill: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """The ``recd train --nproc 2`` command of a route (``options``) and its environment
    (one torch thread, no progress bars, ``RECD_TEST_KILL`` only when ``kill`` is given)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), RECD_PROGRESS="0", OMP_NUM_THREADS="1")
    env.pop("RECD_TEST_KILL", None)
    if kill:
        env["RECD_TEST_KILL"] = kill
    command = [sys.executable, "-m", "recd", "train", "--config", str(config), "--nproc", "2"]
    return [*command, "--run-dir", str(run_dir), *options], env


def run_one(config: Path, run_dir: Path, route: str, kill: str | None) -> dict[str, Any]:
    command, env = train_command(config, run_dir, ROUTE_OPTIONS[route], kill)
    began = time.perf_counter()
    proc = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600, check=False
    )
    wall = time.perf_counter() - began
    ended = time.time()  # the events' clock
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
    events = read_events(run_dir)
    started = next((e["t"] for e in events if e["event"] == "started"), None)
    out["after_start_s"] = None if started is None else ended - started
    if kill and route.startswith("survivor"):
        out["phases"] = survivor_phases(events)
        out["replacement"] = [e["how"] for e in events if e["event"] == "spawn" and "replaced" in e]
    seeds = [e for e in events if e["event"] == "peer_seed"]
    if seeds:
        out["peer_seed"] = {
            "bytes": sum(e["bytes"] for e in seeds[:2]),
            "seconds": max(e["seconds"] for e in seeds[:2]),
        }
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


def cold_read_bytes_per_s(work: Path, size_bytes: int) -> float:
    """Read bandwidth of a file not in the page cache (written, fsynced, evicted with
    POSIX_FADV_DONTNEED): what a restart reloading a checkpoint of that size pays."""
    path = work / "read_probe.bin"
    block = os.urandom(1 << 20)
    with path.open("wb") as f:
        for _ in range(size_bytes >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        began = time.perf_counter()
        while os.read(fd, 1 << 24):
            pass
        seconds = time.perf_counter() - began
    finally:
        os.close(fd)
        path.unlink()
    return size_bytes / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--kills", type=int, default=10, help="failing runs per killed route")
    parser.add_argument("--pairs", type=int, default=4, help="failure-free runs per route")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=20)
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
    parser.add_argument(
        "--scale-checkpoint-gb",
        type=float,
        default=1.0,
        help="checkpoint size (weights + Adam m, v) the scaled simulation reloads",
    )
    parser.add_argument(
        "--overhead-json",
        type=Path,
        default=RESULTS / "undo_overhead.json",
        help="the failure-free overhead measured on the trainer benchmark's model",
    )
    parser.add_argument(
        "--resummarize",
        type=Path,
        help="recompute the figures from this result's runs (e.g. after a new --overhead-json); "
        "runs nothing",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.kills, args.pairs, args.steps, args.checkpoint_every = 2, 1, 60, 10
    overhead = json.loads(args.overhead_json.read_text()) if args.overhead_json.is_file() else None
    if args.resummarize is not None:
        old = json.loads(args.resummarize.read_text())
        load = old["protocol"]["load_average_1min"]
        report = summarize(
            old["runs"],
            args,
            (load["before"], load["after"]),
            _bandwidth(old),
            overhead,
        )
        write_outputs(report, args)
        return 0
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
    runs_planned = [(route, i) for route in KILLED_ROUTES for i in range(args.kills)]
    runs_planned += [(f"{route}_free", i) for route in ROUTE_OPTIONS for i in range(args.pairs)]
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
    load_after = os.getloadavg()[0]
    bandwidth = cold_read_bytes_per_s(args.work, 1 << 30)
    report = summarize(runs, args, (load_before, load_after), bandwidth, overhead)
    write_outputs(report, args)
    return 0


def _bandwidth(report: dict[str, Any]) -> float:
    """The cold-read bandwidth a result measured (older results: in the scaled block)."""
    if "cold_read_bytes_per_s" in report:
        return float(report["cold_read_bytes_per_s"])
    return float(report["simulation"]["at_scale"]["cold_read_bytes_per_s"])


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> tuple[float | None, list[float] | None]:
    """median a / median b, and the range min a / max b .. max a / min b."""
    if a["median"] is None or not b["median"]:
        return None, None
    return a["median"] / b["median"], [a["min"] / b["max"], a["max"] / b["min"]]


TARGET_RATIO = 0.3
BOOTSTRAP_RESAMPLES = 10_000


def median_ratio_ci95(a: list[float], b: list[float], seed: int = 0) -> list[float] | None:
    """95% percentile-bootstrap interval of median(a) / median(b): both samples resampled
    independently with replacement (``BOOTSTRAP_RESAMPLES`` times, ``random.Random(seed)``).
    The min / max .. max / min range pairs the two extremes; this is the interval a
    threshold is judged by."""
    if len(a) < 2 or len(b) < 2:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        denominator = statistics.median(rng.choices(b, k=len(b)))
        if denominator > 0:
            ratios.append(statistics.median(rng.choices(a, k=len(a))) / denominator)
    ratios.sort()
    return [ratios[int(0.025 * len(ratios))], ratios[int(0.975 * len(ratios)) - 1]]


def summarize(
    runs: list[dict[str, Any]],
    args: argparse.Namespace,
    load: tuple[float, float],
    read_bytes_per_s: float,
    overhead_run: dict[str, Any] | None,
) -> dict[str, Any]:
    ok = [r for r in runs if r["rc"] == 0]
    free = {route: [r for r in ok if r["name"] == f"{route}_free"] for route in ROUTE_OPTIONS}
    free_wall = {
        route: statistics.median([r["wall_s"] for r in rs]) if rs else math.nan
        for route, rs in free.items()
    }

    def costs(key: str) -> dict[str, list[float]]:
        """Each failing run's ``key`` minus the median of its route's failure-free runs."""
        base = {
            route: statistics.median([r[key] for r in rs]) if rs else math.nan
            for route, rs in free.items()
        }
        return {
            route: [r[key] - base[route] for r in ok if r["name"] == route]
            for route in KILLED_ROUTES
        }

    # Headline: the time after every rank's first step (the kill is always later), so the
    # seconds of interpreter start-up and imports before it, which vary by several seconds
    # between runs on a loaded machine and have nothing to do with the failure, stay out.
    # Results of runs without the launcher's "started" event: the whole wall.
    basis = (
        "after_start_s" if ok and all(r.get("after_start_s") is not None for r in ok) else "wall_s"
    )
    cost_values = costs(basis)
    cost = {route: spread(values) for route, values in cost_values.items()}
    whole_values = costs("wall_s")
    whole_cost = {route: spread(values) for route, values in whole_values.items()}
    whole_ratio, whole_range = _ratio(whole_cost["survivor"], whole_cost["elastic"])
    steps = {route: spread([r["step_s"] for r in rs]) for route, rs in free.items()}
    job_overhead = {
        route: _ratio(steps[route], steps["elastic"])
        for route in ROUTE_OPTIONS
        if route != "elastic"
    }
    lost = [
        rec["steps_lost"]
        for r in ok
        if r["name"] == "elastic"
        for rec in r["records"]
        if rec.get("steps_lost") is not None
    ]
    phases: dict[str, dict[str, float]] = {}
    for route in ("survivor", "survivor_peer"):
        ps = [r["phases"] for r in ok if r["name"] == route and r.get("phases")]
        phases[route] = {k: statistics.median([p[k] for p in ps]) for k in ps[0]} if ps else {}
    replacements = [
        h for r in ok if r["name"].startswith("survivor") for h in r.get("replacement", [])
    ]
    ratio, ratio_range = _ratio(cost["survivor"], cost["elastic"])
    peer_ratio, peer_range = _ratio(cost["survivor_peer"], cost["elastic"])
    lost_median = statistics.median(lost) if lost else 0.0
    job_step_s = steps["elastic"]["median"]
    fixed = {
        "restart": max(cost["elastic"]["median"] - (lost_median + 1) * job_step_s, 0.0),
        "survivor": max(cost["survivor"]["median"] - job_step_s, 0.0),
        "survivor_peer": max(cost["survivor_peer"]["median"] - job_step_s, 0.0),
    }
    seeds = [r["peer_seed"] for r in ok if r.get("peer_seed")]
    peer_bytes_per_s = (
        statistics.median(x["bytes"] / x["seconds"] for x in seeds if x["seconds"])
        if seeds
        else None
    )
    gaps = draw_gaps(args)

    def variant(
        step_s: float, overheads: dict[str, float], fixed_: dict[str, float]
    ) -> dict[str, Any]:
        out = {}
        for route in ("survivor", "survivor_peer"):
            inputs = {
                "step_s": step_s,
                "undo_overhead": overheads[route],
                "checkpoint_cost_s": 0.0,
                "restart_fixed_s": fixed_["restart"],
                "survivor_fixed_s": fixed_[route],
                "survivor_lost_steps": 1.0,
            }
            rows = [
                simulate_speedup(inputs, gaps, args.work_hours * 3600, h)
                for h in args.cadence_hours
            ]
            headline = next(r for r in rows if r["cadence_hours"] == args.headline_cadence)
            out[route] = {"inputs": inputs, "rows": rows, "speedup": headline["speedup"]}
        return out

    # this job, as measured
    job_sim = variant(
        job_step_s,
        {r: max((job_overhead[r][0] or 1.0) - 1.0, 0.0) for r in ("survivor", "survivor_peer")},
        fixed,
    )
    # at scale: the trainer benchmark's model (its step and measured overhead), a checkpoint
    # of --scale-checkpoint-gb reloaded at the measured cold-read bandwidth, 2 ranks
    scale_bytes = args.scale_checkpoint_gb * 1e9
    scaled: dict[str, Any] = {"measured": False, "reason": f"{args.overhead_json} not found"}
    if overhead_run is not None:
        step_at_scale = overhead_run["methods"]["plain"]["step_ms"]["median"] / 1e3
        shard_bytes = scale_bytes / 2
        peer_bw = peer_bytes_per_s or read_bytes_per_s
        fixed_scaled = {
            "restart": fixed["restart"] + scale_bytes / read_bytes_per_s,
            "survivor": fixed["survivor"] + shard_bytes / read_bytes_per_s,
            "survivor_peer": fixed["survivor_peer"] + shard_bytes / peer_bw,
        }
        o = overhead_run
        point = {
            "survivor": max(o["failure_free_overhead"], 0.0),
            "survivor_peer": max(o["failure_free_overhead_peer_copy"], 0.0),
        }
        bad_end = {
            "survivor": max(o["failure_free_overhead_upper95"], 0.0),
            "survivor_peer": max(o["failure_free_overhead_peer_copy_ci95"][1], 0.0),
        }
        measured = variant(step_at_scale, point, fixed_scaled)
        upper = variant(step_at_scale, bad_end, fixed_scaled)
        scaled = {
            "measured": True,
            "scale": f"the trainer benchmark's RM1-like DLRM step ({step_at_scale * 1e3:.0f} ms, "
            f"2 ranks x batch {overhead_run['protocol']['batch_size']}) and its measured "
            f"failure-free overhead; a {args.scale_checkpoint_gb:g} GB checkpoint (weights + "
            "Adam m, v; about 83M parameters), the restart reloading all of it and the "
            "survivor the dead rank's half, at the measured cold-read bandwidth (peer copy: "
            "the measured ring-transfer bandwidth); launcher, imports and agreement as "
            "measured on this job",
            "checkpoint_bytes": scale_bytes,
            "cold_read_bytes_per_s": read_bytes_per_s,
            "peer_transfer_bytes_per_s": peer_bytes_per_s,
            "fixed_s": fixed_scaled,
            "measured_overhead": measured,
            "overhead_upper95": upper,
        }
    headline = scaled["measured_overhead"] if scaled.get("measured") else job_sim
    return {
        "benchmark": "train_recovery",
        "command": "python benchmarks/train_recovery.py" + (" --quick" if args.quick else ""),
        "protocol": {
            "job": f"recd train --nproc 2, tiny profile table, DLRM row-wise, {args.steps} steps, "
            f"checkpoint every {args.checkpoint_every}, batch {args.batch_size}",
            "routes": {k: " ".join(v) for k, v in ROUTE_OPTIONS.items()},
            "kills_per_route": args.kills,
            "failure_free_per_route": args.pairs,
            "schedule_seed": args.seed,
            "order": [r["name"] for r in runs],
            "recovery_time": (
                "time from the launcher's 'started' event (every rank completed its first "
                "step) to the job's end, of a failing run - the median of the same route's "
                "failure-free runs"
                if basis == "after_start_s"
                else "wall of a failing run - median wall of the same route's failure-free runs"
            ),
            "recovery_time_whole_wall": "wall of a failing run - median wall of the same "
            "route's failure-free runs (the previous headline: it also holds the start-up's "
            "run-to-run noise)",
            "overhead": "median step time of a route's failure-free runs / the elastic "
            "route's - 1 (range: min/max .. max/min)",
            "load_average_1min": {"before": load[0], "after": load[1]},
            "cpu_count": os.cpu_count(),
        },
        "failed_runs": {
            name: sum(1 for r in runs if r["name"] == name and r["rc"] != 0)
            for name in [*KILLED_ROUTES, *(f"{r}_free" for r in ROUTE_OPTIONS)]
        },
        "recovery_s": cost,
        "recovery_time_ratio": ratio,
        "recovery_time_ratio_range": ratio_range,
        "recovery_time_ratio_ci95": median_ratio_ci95(
            cost_values["survivor"], cost_values["elastic"]
        ),
        "recovery_time_ratio_peer_copy": peer_ratio,
        "recovery_time_ratio_peer_copy_range": peer_range,
        "recovery_time_ratio_peer_copy_ci95": median_ratio_ci95(
            cost_values["survivor_peer"], cost_values["elastic"]
        ),
        "recovery_time_basis": basis,
        "whole_wall": {
            "recovery_s": whole_cost,
            "recovery_time_ratio": whole_ratio,
            "recovery_time_ratio_range": whole_range,
            "recovery_time_ratio_ci95": median_ratio_ci95(
                whole_values["survivor"], whole_values["elastic"]
            ),
        },
        "survivor_phases_median_s": phases["survivor"],
        "survivor_peer_phases_median_s": phases["survivor_peer"],
        "replacements": {h: replacements.count(h) for h in sorted(set(replacements))},
        "elastic_steps_lost": spread([float(x) for x in lost]),
        "rows_lost": {
            route: spread(
                [float(rec["rows_lost"]) for r in ok if r["name"] == route for rec in r["records"]]
            )
            for route in ("survivor", "survivor_peer")
        },
        "bit_exact_recoveries": {
            route: [
                sum(
                    bool(rec["bit_exact"]) for r in ok if r["name"] == route for rec in r["records"]
                ),
                sum(len(r["records"]) for r in ok if r["name"] == route),
            ]
            for route in ("survivor", "survivor_peer")
        },
        "failure_free": {
            "wall_s": free_wall,
            "step_s": steps,
            "overhead_vs_elastic": {
                k: {"median": v[0], "range": v[1]} for k, v in job_overhead.items()
            },
        },
        "failure_free_overhead_trainer_model": None
        if overhead_run is None
        else {
            k: overhead_run[k]
            for k in (
                "failure_free_overhead",
                "failure_free_overhead_ci95",
                "failure_free_overhead_upper95",
                "failure_free_overhead_peer_copy",
                "failure_free_overhead_peer_copy_ci95",
            )
        },
        "simulation": {
            "scenario": {
                "work_hours": args.work_hours,
                "mtbf_median_hours": args.mtbf_median_hours,
                "trials": args.trials,
                "failure_gaps": "uniform on [0, 2 x median]",
                "checkpoint_writes": "cost both strategies the same: left out",
            },
            "this_job": job_sim,
            "at_scale": scaled,
        },
        "cold_read_bytes_per_s": read_bytes_per_s,
        "simulated_speedup": headline["survivor"]["speedup"],
        "simulated_speedup_peer_copy": headline["survivor_peer"]["speedup"],
        "headline_cadence_hours": args.headline_cadence,
        "runs": runs,
    }


def _f(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def write_outputs(report: dict[str, Any], args: argparse.Namespace) -> None:
    name = "train_recovery_quick" if args.quick else "train_recovery"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1, default=str))
    cost = report["recovery_s"]
    ff = report["failure_free"]
    rr = report["recovery_time_ratio_range"] or [math.nan, math.nan]
    pr = report["recovery_time_ratio_peer_copy_range"] or [math.nan, math.nan]
    rc = report.get("recovery_time_ratio_ci95") or [math.nan, math.nan]
    pc = report.get("recovery_time_ratio_peer_copy_ci95") or [math.nan, math.nan]
    verdict = "met" if rc[1] <= TARGET_RATIO else "not met"
    tm = report["failure_free_overhead_trainer_model"]
    lines = [
        f"`recovery_time_ratio` inside `recd train` (survivor / elastic restart, same launcher): "
        f"**{_f(report['recovery_time_ratio'])}**, 95% bootstrap interval "
        f"[{_f(rc[0])}, {_f(rc[1])}] (target <= {TARGET_RATIO} by the interval's upper end: "
        f"{verdict}; range of the extremes {_f(rr[0])}-{_f(rr[1])}); with `--peer-copy`: "
        f"{_f(report['recovery_time_ratio_peer_copy'])} [{_f(pc[0])}, {_f(pc[1])}] "
        f"(range {_f(pr[0])}-{_f(pr[1])}). "
        f"Failed runs: {report['failed_runs']}.",
        "",
        f"Recovery time: {report['protocol']['recovery_time']}.",
    ]
    whole = report.get("whole_wall")
    if whole is not None and report.get("recovery_time_basis") == "after_start_s":
        wc = whole["recovery_time_ratio_ci95"] or [math.nan, math.nan]
        ws = whole["recovery_s"]
        lines.append(
            f"On the whole wall of each run instead (the previous protocol, start-up noise "
            f"included): ratio {_f(whole['recovery_time_ratio'])} [{_f(wc[0])}, {_f(wc[1])}]; "
            f"survivor {_f(ws['survivor']['median'], 2)} s, elastic "
            f"{_f(ws['elastic']['median'], 2)} s (medians)."
        )
    lines += [
        "",
        f"Simulated speedup at measured costs (scaled, cadence {report['headline_cadence_hours']} "
        f"h): **{_f(report['simulated_speedup'])}x**, with `--peer-copy` "
        f"{_f(report['simulated_speedup_peer_copy'])}x.",
        "",
        f"Job: {report['protocol']['job']}; `{report['command']}`",
        "",
        "| route | recovery s (median) | min-max | steps lost | rows that lost updates | bit-exact |",
        "|---|---|---|---|---|---|",
    ]
    for route, label in (("survivor", "survivor"), ("survivor_peer", "survivor --peer-copy")):
        c, rows = cost[route], report["rows_lost"][route]
        exact = report["bit_exact_recoveries"][route]
        lines.append(
            f"| {label} | {_f(c['median'], 2)} | {_f(c['min'], 2)}-{_f(c['max'], 2)} | 0 (1 redone) "
            f"| {_f(rows['median'], 0)} (median) | {exact[0]} of {exact[1]} |"
        )
    e = cost["elastic"]
    lines += [
        f"| elastic restart | {_f(e['median'], 2)} | {_f(e['min'], 2)}-{_f(e['max'], 2)} | "
        f"{_f(report['elastic_steps_lost']['median'], 1)} (median, replayed) | 0 | all |",
        "",
        "Survivor phases (median s): "
        + ", ".join(f"{k} {v:.3f}" for k, v in report["survivor_phases_median_s"].items()),
        "; replacements: " + ", ".join(f"{k} x{v}" for k, v in report["replacements"].items()),
        "",
        "Failure-free step time of this job vs the elastic route (median ratio - 1, range): "
        + ", ".join(
            f"{k} {_f(v['median'] and v['median'] - 1, 3)}"
            for k, v in ff["overhead_vs_elastic"].items()
        )
        + ".",
    ]
    if tm is not None:
        lo, hi = tm["failure_free_overhead_ci95"]
        plo, phi = tm["failure_free_overhead_peer_copy_ci95"]
        lines.append(
            f"On the trainer benchmark's model (`benchmarks/undo_overhead.py`): "
            f"{100 * tm['failure_free_overhead']:+.2f}% [{100 * lo:+.2f}%, {100 * hi:+.2f}%], "
            f"`--peer-copy` {100 * tm['failure_free_overhead_peer_copy']:+.2f}% "
            f"[{100 * plo:+.2f}%, {100 * phi:+.2f}%]."
        )
    sim = report["simulation"]
    for title, block in (("at scale", sim["at_scale"]), ("this job", sim["this_job"])):
        if not block or block.get("measured") is False:
            continue
        rows_block = block.get("measured_overhead", block)
        lines += [
            "",
            f"Simulation, {title}" + (f": {block['scale']}" if "scale" in block else "") + ".",
            "",
            "| cadence h | checkpoint wall h | survivor wall h | speedup | with --peer-copy |",
            "|---|---|---|---|---|",
        ]
        for a, b in zip(
            rows_block["survivor"]["rows"], rows_block["survivor_peer"]["rows"], strict=True
        ):
            lines.append(
                f"| {a['cadence_hours']} | {a['checkpoint_wall_hours']:.2f} | "
                f"{a['survivor_wall_hours']:.2f} | {a['speedup']:.3f} | {b['speedup']:.3f} |"
            )
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
