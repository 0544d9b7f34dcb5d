"""Failure-recovery benchmark: survivor recovery against restart-and-reload, same launcher, same job.

    python benchmarks/recovery.py            # 1.05 GB checkpoint, 3 reps per route, torchrun too
    python benchmarks/recovery.py --quick    # 8 MB checkpoint, 3 reps, no torchrun
                                             # (writes recovery_quick.json / .md)

The job is ``recd train --nproc 2`` (a drill of :mod:`recd.recovery.drill`, what ``recd
recover`` runs): 2 CPU worker processes (gloo, one torch thread each) under recd's launcher
(:mod:`recd.recovery.agent`), a DLRM whose tables torchrec shards row-wise, on a table of
``--profile`` (``--sessions`` sessions through generate -> shard -> ETL, built once). Full
size: the rm1-like profile's 56 sparse features, at most 100,000 rows each, width 16: a
1.05 GB checkpoint (weights, Adam m and v: 12 bytes a parameter). 10 steps, global batch 128,
a checkpoint every 5 (written on the training thread, and at the end); rank 1 SIGKILLs itself
inside its optimizer update of step 9 (its gradients were all-reduced, so the survivor
applied its own update). Run directories are deleted after each run.

Routes, each run ``--reps`` times, all runs of all routes in one seeded random order
(``protocol.order``); a failed run is recorded with its error and counted
(``failed_runs``), never left out silently:

- ``survivor``: ``--recovery survivor`` (:mod:`recd.recovery.rejoin`): the survivor takes its
  update of step 9 back, the warm spare replaces rank 1, gets the dense state from the
  survivor and loads rank 1's table shards from the newest checkpoint;
- ``restart``: ``--recovery elastic`` from the same launcher: every worker stopped, a new
  group started that reloads the checkpoint and replays the steps since (torchrun's policy):
  the headline's baseline;
- ``capture``: the failure-free cost of survivor mode on the same job (the update-undo
  capture every step, the warm spare): a failure-free run of each of the two routes above, in
  a seeded order; the step time of each is ``train.json``'s training time less the
  checkpoint writes, per step (``step_s``: restart route, ``captured_step_s``: survivor);
  the overhead is their difference over the restart route's step;
- ``torchrun`` (default unless ``--quick``; ``--torchrun`` / ``--no-torchrun``): cold torchrun (``recd train --resume`` under
  ``torchrun --max-restarts 1``, :mod:`recd.recovery.elastic`) on a *different*, tiny job
  (the tiny profile's table): fresh interpreters, imports, rendezvous, DMP build, full
  checkpoint load, replay. Reported on its own, never the headline's baseline.

Recovery time = from the kill until the step in flight at the failure completes again (the
lost work included), from the trainer's event log (:func:`recd.recovery.audit.
recovery_timeline`); the restart route's workers do not log their rendezvous and load apart,
so its ``first_step`` phase holds them (and the new interpreters' start-up). Reload is from
the page cache (the checkpoint was just written): a lower bound of a reload from storage.

Headline ``recovery_time_ratio`` = median survivor / median restart; its range is min
survivor / max restart .. max survivor / min restart.

Simulation (SwIFT's methodology): a job needing ``--work-hours`` of failure-free training;
failures arrive with gaps uniform on [0, 2 x ``--mtbf-median-hours``] (the scenario, not a
measurement), ``--trials`` Monte-Carlo runs with the same gaps for both strategies; both
write the same periodic checkpoints. Checkpoint strategy: a failure rolls back to the last
checkpoint and costs the restart route's fixed recovery time; survivor: a failure loses
its measured lost steps and costs the survivor route's fixed recovery time, and every step
pays the failure-free overhead. ``simulated_speedup`` (checkpoint wall / survivor wall at
``--headline-cadence``) uses only measured costs: overhead, step time, checkpoint stall
(the write time the checkpointer logs), fixed recovery times, lost steps; when the measured
checkpoint is smaller than ``--reload-target-gb`` the checkpoint stall is scaled to that size
and both routes' fixed costs grow by the time to read one rank's share of the extra bytes at
the page-cache read speed measured on the runs' own checkpoints (``simulation.
reload_scaling``: every rank of a restart and the survivor's replacement each read their own
blocks). ``simulated_speedup_range``: the headline cadence at the bad and the good end of the
measured overhead and recovery times. Variants with an assumed number are named
``simulated_speedup_assumed_*`` and marked ``assumption: true`` in the JSON:
``assumed_capture_0_05`` (survivor mode costs 5% of a step) and ``assumed_at_scale`` (0.5 s
steps, 60 s checkpoints, recovery costs x10, the measured overhead).

Writes benchmarks/results/recovery.json and .md (``--quick``: recovery_quick.*); the
Markdown starts with the headline (no title: docs/benchmarks.md puts it under its own heading).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from recd.recovery.drill import Drill, DrillReport, generate_table, run_drill  # noqa: E402
from recd.stats import spread  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
KILL_RANK = 1
KILL_POINT = "optimizer"
"""Inside rank 1's update: the survivor applied its own and takes it back."""
WORLD_SIZE = 2
GLOBAL_BATCH = 128
FIXED_PHASES = ("detection", "restart", "rendezvous", "load", "first_step")
"""Phases of a recovery that do not depend on how much work was lost (the simulation's
fixed cost per failure)."""
TIMELINE_KEYS = ("survivor_detection", "detection", *FIXED_PHASES[1:], "replay")
"""The phases whose medians a route reports (None where the route does not log one)."""
ASSUMED_CAPTURE_FRACTION = 0.05
"""The failure-free overhead the previous protocol assumed (5% of a step)."""
CHECKPOINT_LOG = re.compile(r"checkpoint \S+ written \(periodic, ([0-9.]+) s")
"""The checkpointer's log line of a periodic checkpoint, with its write time."""

TORCHRUN_TOML = """
[reader]
table = "{table}"
end = "2026-11-01T01:00"
batch_size = 64
shuffle = "session"
num_epochs = 5
preprocessing = [{{ kind = "log1p", features = ["user_age_days", "item_price"] }}]

[model]
kind = "dlrm"
embedding_dim = 8
max_rows = 1000

[optim]
lr = 0.01

[train]
steps = {steps}
log_every = 1
eval_every = 0
seed = 0
plot = false
run_dir = "{run_dir}"
sharding = "table_wise"

[checkpoint]
checkpoint_every = {every}
"""
TORCHRUN_STEPS = 16


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelSize:
    """The job's embedding tables: the profile's sparse features, at most ``rows`` x ``dim``."""

    profile: str
    """The generated table's profile (its sparse features are the tables)."""
    rows: int
    """Rows per table at most (``model.max_rows``)."""
    dim: int
    """Embedding width."""


FULL_SIZE = ModelSize(profile="rm1-like", rows=100_000, dim=16)
"""rm1-like: 56 tables, 5.46 M rows x 16: a 1.05 GB checkpoint."""
QUICK_SIZE = ModelSize(profile="rm1-like", rows=1_500, dim=8)
"""rm1-like: 56 tables, 84 k rows x 8: an 8 MB checkpoint."""


# ----------------------------------------------------------------------------- the job


def make_drill(args: argparse.Namespace, run_dir: Path, route: str, *, kill: bool = True) -> Drill:
    """The benchmark's job on ``route`` (``survivor`` or ``restart``), rank 1 killed."""
    return Drill(
        run_dir=run_dir,
        table=args.table,
        route=route,  # type: ignore[arg-type]
        world_size=WORLD_SIZE,
        steps=args.steps,
        checkpoint_every=args.checkpoint_every,
        rows=args.rows,
        dim=args.dim,
        batch_size=GLOBAL_BATCH,
        seed=args.seed,
        kill_rank=KILL_RANK,
        kill_step=args.kill_step if kill else 0,
        kill_point=KILL_POINT,
        timeout_s=args.job_timeout_s,
    )


def checkpoint_stalls_s(report: DrillReport) -> list[float]:
    """Seconds each periodic checkpoint held training up: the write time the checkpointer
    logs (written on the training thread, so training waits for all of it)."""
    text = report.log_path.read_text(errors="replace") if report.log_path.exists() else ""
    return [float(m.group(1)) for m in CHECKPOINT_LOG.finditer(text)]


def page_cache_read_bytes_per_s(run_dir: Path) -> float | None:
    """Read speed of the run's newest checkpoint file, just written (in the page cache)."""
    files = sorted(run_dir.glob("step_*.bin"))
    if not files:
        return None
    began = time.perf_counter()
    with files[-1].open("rb", buffering=0) as f:
        while f.read(1 << 24):
            pass
    return files[-1].stat().st_size / (time.perf_counter() - began)


def _drill(args: argparse.Namespace, run_dir: Path, route: str, *, kill: bool) -> dict[str, Any]:
    """Run one drill; its report's figures (the run directory is deleted afterwards)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    try:
        report = run_drill(make_drill(args, run_dir, route, kill=kill))
        if report.returncode != 0:
            raise RuntimeError(
                f"{route}: recd train exited with {report.returncode}: {report.log_tail(3)}"
            )
        train_dir = report.drill.train_dir
        return {
            "report": report,
            "checkpoint_file_bytes": sorted(
                {p.stat().st_size for p in train_dir.glob("step_*.bin")}
            ),
            "checkpoint_stalls_s": checkpoint_stalls_s(report),
            "reload_bytes_per_s": page_cache_read_bytes_per_s(train_dir),
        }
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)  # 1 GB a checkpoint: keep the disk free


def measure_job(route: str, work: Path, args: argparse.Namespace, rep: int) -> dict[str, Any]:
    """One run of the job on ``route`` with rank 1 killed: its recovery timeline, its audit
    records and its checkpoint stalls."""
    out = _drill(args, work / f"{route}_{rep}", route, kill=True)
    report: DrillReport = out.pop("report")
    if report.timeline is None:
        raise RuntimeError(f"{route}: no complete recovery in the event log")
    want = "survivor" if route == "survivor" else "restart"
    if [r.get("route") for r in report.recoveries] != [want]:
        raise RuntimeError(f"{route}: recorded recoveries {report.recoveries}")
    (record,) = report.recoveries
    return {
        "timeline": report.timeline,
        "audit": {
            **{k: record.get(k) for k in AUDIT_KEYS if k in record},
            "rows_lost": sum((record.get("rows_lost_updates") or {}).values()),
        },
        "job_wall_s": report.wall_s,
        **out,
    }


AUDIT_KEYS = (
    "route",
    "agreed_step",
    "checkpoint_step",
    "embedding_checkpoint_step",
    "steps_lost",
    "undone",
    "bit_exact",
)
"""The fields of a run's audit record kept in the results (with ``rows_lost``: the rows that
lost updates, over every table)."""


# ----------------------------------------------------------------------------- capture cost


def _step_s(out: dict[str, Any]) -> float:
    """Training seconds per step of a failure-free run, its checkpoint writes left out."""
    result = out["report"].result
    steps = result["steps"] - result["first_step"]
    return (result["train_s"] - sum(out["checkpoint_stalls_s"])) / max(steps, 1)


def measure_capture(work: Path, args: argparse.Namespace, rep: int) -> dict[str, Any]:
    """Failure-free cost of survivor mode on the job: one failure-free run per route, in an
    order seeded by the repetition."""
    routes = ["survivor", "restart"]
    random.Random(args.seed + rep).shuffle(routes)
    runs = {
        route: _drill(args, work / f"capture_{route}_{rep}", route, kill=False) for route in routes
    }
    plain, captured = _step_s(runs["restart"]), _step_s(runs["survivor"])
    extra = captured - plain
    capture = {
        "step_s": plain,
        "captured_step_s": captured,
        "train_step_s": plain,
        "capture_extra_s": extra,
        "overhead_fraction": max(extra, 0.0) / plain,
    }
    return {
        "capture": capture,
        "order": routes,
        "checkpoint_file_bytes": sorted(
            {s for o in runs.values() for s in o["checkpoint_file_bytes"]}
        ),
        "checkpoint_stalls_s": [s for o in runs.values() for s in o["checkpoint_stalls_s"]],
    }


# ----------------------------------------------------------------------------- tables


def job_table(work: Path, args: argparse.Namespace) -> Path:
    """The job's table: ``--profile``'s, ``--sessions`` sessions, built once."""
    root = work / f"{args.profile}_src"
    if not (root / "table").exists():
        generate_table(root, profile=args.profile, sessions=args.sessions)
    return root / "table"


def make_table(work: Path) -> Path:
    """The tiny profile (1000 sessions) through the real generate -> shard -> ETL."""
    from recd.pipeline import build_tables

    root = work / "table_src"
    if not (root / "table").exists():
        build_tables(root, "tiny", seed=3, num_sessions=1000, num_shards=2, row_group_rows=256)
    return root / "table"


def measure_torchrun(work: Path, args: argparse.Namespace, rep: int) -> dict[str, Any]:
    """One cold torchrun restart of the tiny ``recd train`` job (a different job)."""
    from recd.recovery.elastic import run_elastic

    table = make_table(work)
    run_dir = work / f"torchrun_{rep}"
    shutil.rmtree(run_dir, ignore_errors=True)
    config = work / f"torchrun_{rep}.toml"
    config.write_text(
        TORCHRUN_TOML.format(
            table=table, run_dir=run_dir, steps=TORCHRUN_STEPS, every=args.checkpoint_every
        )
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", RECD_PROGRESS="0")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    report = run_elastic(
        config, run_dir, kill_after_step=args.kill_step, timeout_s=args.job_timeout_s, env=env
    )
    sizes = sorted({p.stat().st_size for p in run_dir.glob("step_*.bin")})
    if report.returncode != 0 or report.timeline is None:
        tail = [line for _, line in report.lines if "Error" in line][-3:]
        return {"error": f"exit code {report.returncode}, no recovery observed: {tail}"}
    return {
        "timeline": report.timeline.to_dict(),
        "restarts": report.restarts,
        "checkpoint_file_bytes": sizes,
    }


# ----------------------------------------------------------------------------- the schedule


def plan_order(routes: Sequence[str], reps: int, seed: int) -> list[tuple[str, int]]:
    """Every (route, repetition) once, in a seeded random order (routes interleaved)."""
    order = [(route, rep) for rep in range(reps) for route in routes]
    random.Random(seed).shuffle(order)
    return order


def run_schedule(
    order: Sequence[tuple[str, int]], measure: Callable[[str, int], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Run ``measure(route, rep)`` in ``order``; a run that raises or returns ``error`` is
    kept as a failed run (with its error), never dropped."""
    runs = []
    for position, (route, rep) in enumerate(order):
        before = os.getloadavg()
        began = time.monotonic()
        try:
            result = measure(route, rep)
        except Exception as error:  # a failed repetition is a result too
            result = {"error": f"{type(error).__name__}: {error}"}
        run = {"route": route, "rep": rep, "position": position, **result}
        run.update(
            wall_s=time.monotonic() - began,
            loadavg_before=list(before),
            loadavg_after=list(os.getloadavg()),
        )
        runs.append(run)
        print(f"[{position + 1}/{len(order)}] {route} rep {rep}: {_run_line(run)}", flush=True)
    return runs


def _run_line(run: dict[str, Any]) -> str:
    if "error" in run:
        return f"FAILED {run['error']}"
    if "capture" in run:
        return f"capture overhead {run['capture']['overhead_fraction']:.3f} of a step"
    return f"recovery {run['timeline']['total']:.3f} s"


# ----------------------------------------------------------------------------- summaries


def summarize_route(runs: list[dict[str, Any]], route: str) -> dict[str, Any]:
    """A route's successful and failed runs, its recovery time and phases (medians)."""
    mine = [r for r in runs if r["route"] == route]
    ok = [r for r in mine if "error" not in r]
    failed = [
        {"rep": r["rep"], "position": r["position"], "error": r["error"]}
        for r in mine
        if "error" in r
    ]
    summary: dict[str, Any] = {"runs": len(mine), "runs_ok": len(ok), "failed_runs": failed}
    timelines = [r["timeline"] for r in ok if "timeline" in r]
    if timelines:
        summary["recovery_s"] = spread([t["total"] for t in timelines])
        summary["lost_steps"] = spread([t["lost_steps"] for t in timelines])
        summary["phases_median_s"] = {
            k: _median_finite([t.get(k) for t in timelines]) for k in TIMELINE_KEYS
        }
    return summary


def _median_finite(values: list[float | None]) -> float | None:
    finite = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return float(statistics.median(finite)) if finite else None


def ratio(num: dict[str, Any], den: dict[str, Any]) -> dict[str, Any]:
    """median(num) / median(den), and the range min(num)/max(den) .. max(num)/min(den)."""
    if not num.get("n") or not den.get("n"):
        return {"value": None, "range": None}
    return {
        "value": num["median"] / den["median"],
        "range": [num["min"] / den["max"], num["max"] / den["min"]],
    }


def fixed_cost_s(summary: dict[str, Any]) -> float:
    """Sum of a route's fixed recovery phases (medians)."""
    return sum(summary["phases_median_s"].get(k) or 0.0 for k in FIXED_PHASES)


# ----------------------------------------------------------------------------- simulation


def simulate(
    *,
    work_s: float,
    gaps_s: np.ndarray,
    cadence_s: float,
    checkpoint_cost_s: float,
    restart_fixed_s: float,
    rollback_to_checkpoint: bool,
    lost_s: float,
    overhead: float,
) -> float:
    """Wall time to finish ``work_s`` of failure-free training with failures at ``gaps_s``."""
    speed = 1.0 / (1.0 + overhead)  # useful seconds per wall second while training
    wall, progress, last_ckpt = 0.0, 0.0, 0.0
    for gap in gaps_s:
        budget = float(gap)  # wall seconds until the next failure
        while budget > 0 and progress < work_s:
            next_ckpt = (math.floor(progress / cadence_s) + 1) * cadence_s
            target = min(next_ckpt, work_s)
            need = (target - progress) / speed
            if need > budget:
                progress += budget * speed
                wall += budget
                budget = 0.0
                break
            progress, wall, budget = target, wall + need, budget - need
            if target == next_ckpt and target < work_s:
                cost = min(checkpoint_cost_s, budget)
                wall += cost
                budget -= cost
                if cost == checkpoint_cost_s:
                    last_ckpt = progress
        if progress >= work_s:
            return wall
        # the failure
        progress = last_ckpt if rollback_to_checkpoint else max(progress - lost_s, 0.0)
        wall += restart_fixed_s
    raise RuntimeError("simulate: not enough failure gaps drawn")


def draw_gaps(args: argparse.Namespace) -> np.ndarray:
    """trials x gaps: seconds between failures, uniform on [0, 2 x median], seeded."""
    rng = np.random.default_rng(args.seed)
    mtbf_s = args.mtbf_median_hours * 3600
    n_gaps = int(args.work_hours * 3600 / mtbf_s * 4) + 50
    return rng.uniform(0.0, 2 * mtbf_s, (args.trials, n_gaps))


def simulate_speedup(
    inputs: dict[str, float], gaps: np.ndarray, work_s: float, hours: float
) -> dict[str, float]:
    """Mean wall hours of both strategies over the trials at one cadence, and their ratio."""
    walls: dict[str, list[float]] = {"checkpoint": [], "survivor": []}
    common = {
        "work_s": work_s,
        "cadence_s": hours * 3600,
        "checkpoint_cost_s": inputs["checkpoint_cost_s"],
    }
    for trial in gaps:
        walls["checkpoint"].append(
            simulate(
                **common,
                gaps_s=trial,
                restart_fixed_s=inputs["restart_fixed_s"],
                rollback_to_checkpoint=True,
                lost_s=0.0,
                overhead=0.0,
            )
        )
        walls["survivor"].append(
            simulate(
                **common,
                gaps_s=trial,
                restart_fixed_s=inputs["survivor_fixed_s"],
                rollback_to_checkpoint=False,
                lost_s=inputs["survivor_lost_steps"] * inputs["step_s"],
                overhead=inputs["undo_overhead"],
            )
        )
    a, b = float(np.mean(walls["checkpoint"])), float(np.mean(walls["survivor"]))
    return {
        "cadence_hours": hours,
        "checkpoint_wall_hours": a / 3600,
        "survivor_wall_hours": b / 3600,
        "speedup": a / b,
    }


def run_variant(
    inputs: dict[str, float], assumed: Sequence[str], gaps: np.ndarray, args: argparse.Namespace
) -> dict[str, Any]:
    """One simulation variant over every cadence; ``assumed``: its inputs not measured."""
    rows = [simulate_speedup(inputs, gaps, args.work_hours * 3600, h) for h in args.cadence_hours]
    headline = next(r for r in rows if r["cadence_hours"] == args.headline_cadence)
    return {
        "assumption": bool(assumed),
        "assumed_inputs": list(assumed),
        "inputs": inputs,
        "rows": rows,
        "simulated_speedup": headline["speedup"],
    }


def reload_scaling(
    checkpoint_bytes: int, stall_s: float, target_bytes: float, read_bytes_per_s: float | None
) -> dict[str, Any]:
    """The factor that scales the measured checkpoint to ``target_bytes`` (1 when it is at
    least that large), and the reload time the extra bytes add to a recovery: every rank of
    a restart, and the survivor's replacement, read their own blocks (one rank's share) of the
    checkpoint, at the measured read speed."""
    factor = max(target_bytes / checkpoint_bytes, 1.0)
    extra_bytes = max(target_bytes - checkpoint_bytes, 0.0) / WORLD_SIZE
    extra_s = extra_bytes / read_bytes_per_s if read_bytes_per_s and factor > 1.0 else 0.0
    return {
        "measured_checkpoint_bytes": checkpoint_bytes,
        "target_checkpoint_bytes": target_bytes,
        "factor": factor,
        "scaled": factor > 1.0,
        "rule": "checkpoint stall x factor; each route's fixed cost + one rank's share of the "
        "extra bytes at the measured page-cache read speed",
        "checkpoint_write_bytes_per_s": checkpoint_bytes / stall_s if stall_s else None,
        "reload_bytes_per_s": read_bytes_per_s,
        "extra_load_s": extra_s,
    }


def measured_inputs(
    routes: dict[str, Any], capture: dict[str, Any], stall: dict[str, Any], scaling: dict[str, Any]
) -> dict[str, float]:
    """The simulation's inputs, all measured on the job (scaled to the target size)."""
    return {
        "step_s": capture["train_step_s"]["median"],
        "undo_overhead": capture["overhead_fraction"]["median"],
        "checkpoint_cost_s": stall["median"] * scaling["factor"],
        "restart_fixed_s": fixed_cost_s(routes["restart"]) + scaling["extra_load_s"],
        "survivor_fixed_s": fixed_cost_s(routes["survivor"]) + scaling["extra_load_s"],
        "survivor_lost_steps": routes["survivor"]["lost_steps"]["median"],
    }


def run_simulation(
    routes: dict[str, Any],
    capture: dict[str, Any],
    stall: dict[str, Any],
    checkpoint_bytes: int,
    read_bytes_per_s: float | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The measured simulation, its spread, and the named assumed variants."""
    gaps = draw_gaps(args)
    scaling = reload_scaling(
        checkpoint_bytes, stall["median"], args.reload_target_gb * 1e9, read_bytes_per_s
    )
    measured = measured_inputs(routes, capture, stall, scaling)
    variants = {
        "measured": run_variant(measured, [], gaps, args),
        "assumed_capture_0_05": run_variant(
            {**measured, "undo_overhead": ASSUMED_CAPTURE_FRACTION}, ["undo_overhead"], gaps, args
        ),
        "assumed_at_scale": run_variant(
            {
                **measured,
                "step_s": args.at_scale_step_s,
                "checkpoint_cost_s": args.at_scale_checkpoint_cost_s,
                "restart_fixed_s": measured["restart_fixed_s"] * args.at_scale_cost_factor,
                "survivor_fixed_s": measured["survivor_fixed_s"] * args.at_scale_cost_factor,
            },
            ["step_s", "checkpoint_cost_s", "cost_factor"],
            gaps,
            args,
        ),
    }
    return {
        "scenario": _scenario(args),
        "reload_scaling": scaling,
        "simulated_speedup_range": _speedup_range(measured, routes, capture, gaps, args),
        "at_scale_assumptions": {
            "step_s": args.at_scale_step_s,
            "checkpoint_cost_s": args.at_scale_checkpoint_cost_s,
            "cost_factor": args.at_scale_cost_factor,
        },
        "variants": variants,
    }


def _speedup_range(
    measured: dict[str, float],
    routes: dict[str, Any],
    capture: dict[str, Any],
    gaps: np.ndarray,
    args: argparse.Namespace,
) -> list[float]:
    """The headline cadence's speedup at the bad and the good end of the measured capture
    fraction and recovery times (min-max over the repetitions)."""
    work_s, hours = args.work_hours * 3600, args.headline_cadence
    ends = []
    for survivor_end, restart_end in (("max", "min"), ("min", "max")):
        inputs = {
            **measured,
            "undo_overhead": capture["overhead_fraction"][survivor_end],
            "survivor_fixed_s": measured["survivor_fixed_s"]
            * routes["survivor"]["recovery_s"][survivor_end]
            / routes["survivor"]["recovery_s"]["median"],
            "restart_fixed_s": measured["restart_fixed_s"]
            * routes["restart"]["recovery_s"][restart_end]
            / routes["restart"]["recovery_s"]["median"],
        }
        ends.append(simulate_speedup(inputs, gaps, work_s, hours)["speedup"])
    return ends


def _scenario(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "what": "the simulated job and its failures: a scenario, not a measurement",
        "work_hours": args.work_hours,
        "mtbf_median_hours": args.mtbf_median_hours,
        "failure_gaps": "uniform on [0, 2 x median] for the whole job",
        "trials": args.trials,
        "cadence_hours": args.cadence_hours,
        "headline_cadence_hours": args.headline_cadence,
        "seed": args.seed,
    }


# ----------------------------------------------------------------------------- main


def routes_of(args: argparse.Namespace) -> list[str]:
    return ["survivor", "restart", "capture"] + (["torchrun"] if args.torchrun else [])


def measurer(work: Path, args: argparse.Namespace) -> Callable[[str, int], dict[str, Any]]:
    """``measure(route, rep)`` for :func:`run_schedule`."""

    def measure(route: str, rep: int) -> dict[str, Any]:
        if route == "capture":
            return measure_capture(work, args, rep)
        if route == "torchrun":
            return measure_torchrun(work, args, rep)
        return measure_job(route, work, args, rep)

    return measure


def protocol(
    args: argparse.Namespace,
    order: list[tuple[str, int]],
    loads: list[list[float]],
    runs: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """How the survivor, restart and capture figures were measured."""
    from recd.models.rm1 import table_sizes
    from recd.schema import load_catalogue

    drill = make_drill(args, Path("."), "survivor")
    sizes = table_sizes(load_catalogue(args.profile), max_rows=args.rows)
    files = [
        s for r in runs if r["route"] != "torchrun" for s in r.get("checkpoint_file_bytes", [])
    ]
    return {
        "job": "recd train --nproc 2 (recd.recovery.drill): DLRM, tables row-wise sharded, "
        "ShardedAdam, recd's launcher",
        "world_size": drill.world_size,
        "steps": drill.steps,
        "checkpoint_every": drill.checkpoint_every,
        "kill_step": args.kill_step,
        "kill_rank": KILL_RANK,
        "kill_point": drill.kill_point,
        "global_batch_size": drill.batch_size,
        "model": {
            "profile": args.profile,
            "sessions": args.sessions,
            "tables": len(sizes),
            "rows": args.rows,
            "table_rows": sum(sizes.values()),
            "dim": args.dim,
        },
        "checkpoint_bytes": max(files) if files else None,
        "repetitions": args.reps,
        "threads": {
            "torch_threads_per_worker": 1,
            "workers": drill.world_size,
            "cpu_count": os.cpu_count(),
        },
        "launcher": "recd's (recd.recovery.agent): a warm spare replaces the dead rank "
        "(survivor); every worker stopped, a new group started (restart)",
        "reload": "from the page cache: the checkpoint was just written",
        "loadavg_before": loads[0],
        "loadavg_after": loads[1],
        "order": [f"{route}:{rep}" for route, rep in order],
        "seed": args.seed,
        "command": args.command,
    }


def torchrun_protocol(args: argparse.Namespace, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The cold-torchrun route's own job (different from the headline's)."""
    sizes = sorted(
        {s for r in runs if r["route"] == "torchrun" for s in r.get("checkpoint_file_bytes", [])}
    )
    return {
        "job": "recd train --resume under torchrun --max-restarts 1, tiny profile "
        "(1000 sessions), batch 64, embedding_dim 8, max_rows 1000, table_wise",
        "world_size": 2,
        "steps": TORCHRUN_STEPS,
        "checkpoint_every": args.checkpoint_every,
        "kill": f"rank {KILL_RANK} SIGKILLed once rank 0 logged step {args.kill_step}",
        "checkpoint_bytes": sizes,
        "repetitions": args.reps,
        "threads": {"OMP_NUM_THREADS": 1, "workers": 2},
        "launcher": "cold: fresh interpreters, imports, rendezvous",
        "order": "interleaved with the other routes: see protocol.order",
        "command": args.command,
    }


CAPTURE_KEYS = ("overhead_fraction", "train_step_s", "step_s", "captured_step_s", "capture_extra_s")


def capture_spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and min-max over the successful capture runs of each capture figure."""
    ok = [r for r in runs if r["route"] == "capture" and "error" not in r]
    return {k: spread([r["capture"][k] for r in ok]) for k in CAPTURE_KEYS}


def stall_spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Checkpoint stalls of every successful run of the job (failing and failure-free)."""
    jobs = [r for r in runs if r["route"] != "torchrun" and "error" not in r]
    return spread([s for r in jobs for s in r.get("checkpoint_stalls_s", [])])


def read_speed(runs: list[dict[str, Any]]) -> float | None:
    """Median page-cache read speed of the job's checkpoints (bytes/s) over the runs."""
    return _median_finite([r.get("reload_bytes_per_s") for r in runs if "error" not in r])


def summarize(
    args: argparse.Namespace, runs: list[dict[str, Any]], proto: dict[str, Any]
) -> dict[str, Any]:
    """Every figure from the runs: ratios with ranges, capture cost, simulation."""
    routes = {route: summarize_route(runs, route) for route in routes_of(args)}
    capture, stall = capture_spread(runs), stall_spread(runs)
    complete = all("recovery_s" in routes[r] for r in ("survivor", "restart"))
    simulation = (
        run_simulation(routes, capture, stall, proto["checkpoint_bytes"], read_speed(runs), args)
        if complete and capture["overhead_fraction"]["n"] and stall["n"]
        else None
    )
    return {
        "quick": args.quick,
        **_ratios(routes),
        **_speedups(simulation),
        "failed_runs": {route: len(s["failed_runs"]) for route, s in routes.items()},
        "recovery_time_s": _route_medians(routes, "recovery_s"),
        "lost_steps": _route_medians(routes, "lost_steps"),
        "routes": routes,
        "undo_capture": capture,
        "checkpoint_stall_s": stall,
        "simulation": simulation,
        "protocol": proto,
        "protocol_torchrun": torchrun_protocol(args, runs) if args.torchrun else None,
        "runs": runs,
    }


def _ratios(routes: dict[str, Any]) -> dict[str, Any]:
    """The headline ratio (survivor / same-launcher restart) and the secondary ones."""
    survivor = routes["survivor"].get("recovery_s", {})
    headline = ratio(survivor, routes["restart"].get("recovery_s", {}))
    cold = ratio(survivor, routes.get("torchrun", {}).get("recovery_s", {}))
    return {
        "recovery_time_ratio": headline["value"],
        "recovery_time_ratio_range": headline["range"],
        "ratio_baseline": "restart",
        "recovery_time_ratio_vs_cold_torchrun": cold["value"],
        "recovery_time_ratio_vs_cold_torchrun_range": cold["range"],
    }


def _speedups(simulation: dict[str, Any] | None) -> dict[str, Any]:
    """The measured simulated speedup, its range, and the named assumed variants."""
    variants = simulation["variants"] if simulation else {}

    def of(name: str) -> float | None:
        return variants[name]["simulated_speedup"] if name in variants else None

    return {
        "simulated_speedup": of("measured"),
        "simulated_speedup_range": simulation["simulated_speedup_range"] if simulation else None,
        "simulated_speedup_assumed_capture_0_05": of("assumed_capture_0_05"),
        "simulated_speedup_assumed_at_scale": of("assumed_at_scale"),
    }


def _route_medians(routes: dict[str, Any], key: str) -> dict[str, float | None]:
    return {r: s.get(key, {}).get("median") for r, s in routes.items() if r != "capture"}


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    order = plan_order(routes_of(args), args.reps, args.seed)
    args.table = job_table(work, args)  # the tables are built once, before any timed run
    if args.torchrun:
        make_table(work)
    before = list(os.getloadavg())
    runs = run_schedule(order, measurer(work, args))
    proto = protocol(args, order, [before, list(os.getloadavg())], runs)
    return summarize(args, runs, proto)


# ----------------------------------------------------------------------------- output


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _fmt_range(values: Sequence[float] | None, digits: int = 3) -> str:
    return "n/a" if not values else f"{values[0]:.{digits}f}-{values[1]:.{digits}f}"


def markdown_lines(result: dict[str, Any]) -> list[str]:
    """The Markdown report: headline, spread per route, simulation table (no ``# `` title:
    docs/benchmarks.md embeds it under its own heading)."""
    proto = result["protocol"]
    lines = [
        f"recovery_time_ratio (survivor / restart-and-reload, same launcher, same job, "
        f"{_size_text(proto['checkpoint_bytes'])} checkpoint): "
        f"**{_fmt(result['recovery_time_ratio'])}** "
        f"(range {_fmt_range(result['recovery_time_ratio_range'])}; repetitions per route: "
        f"{proto['repetitions']}, in random order; failed runs: "
        + ", ".join(f"{k} {v}" for k, v in result["failed_runs"].items())
        + ")",
        "",
        f"Simulated speedup at measured costs: **{_fmt(result['simulated_speedup'])}x** "
        f"(range {_fmt_range(result['simulated_speedup_range'])}); assumed variants: "
        f"survivor mode 5% of a step "
        f"{_fmt(result['simulated_speedup_assumed_capture_0_05'])}x, "
        f"at-scale costs {_fmt(result['simulated_speedup_assumed_at_scale'])}x. "
        f"Cold torchrun (a different, tiny job): survivor / torchrun "
        f"{_fmt(result['recovery_time_ratio_vs_cold_torchrun'])}.",
        "",
        f"Job: `recd train --nproc {proto['world_size']}`, 1 thread each, "
        f"{proto['model']['profile']} table, {proto['model']['tables']} tables of at most "
        f"{proto['model']['rows']:,} rows x {proto['model']['dim']}, {proto['steps']} steps, "
        f"checkpoint every {proto['checkpoint_every']}, rank {proto['kill_rank']} killed in step "
        f"{proto['kill_step']} ({proto['kill_point']}); load average {proto['loadavg_before'][0]:.2f} before, "
        f"{proto['loadavg_after'][0]:.2f} after; `{proto['command']}`",
        "",
        "| route | recovery s (median) | min-max | lost steps | runs ok / failed |",
        "|---|---|---|---|---|",
    ]
    for route, s in result["routes"].items():
        if route == "capture":
            continue
        rec = s.get("recovery_s", {})
        lines.append(
            f"| {route} | {_fmt(rec.get('median'))} | "
            f"{_fmt_range([rec['min'], rec['max']] if rec.get('n') else None)} | "
            f"{_fmt(s.get('lost_steps', {}).get('median'), 0)} | "
            f"{s['runs_ok']} / {len(s['failed_runs'])} |"
        )
    failed = [
        f"- failed: {route} rep {f['rep']} (run {f['position'] + 1}): {f['error']}"
        for route, s in result["routes"].items()
        for f in s["failed_runs"]
    ]
    return (
        lines
        + (["", *failed] if failed else [])
        + _capture_lines(result)
        + _simulation_lines(result)
    )


def _size_text(size_bytes: float | None) -> str:
    if size_bytes is None:
        return "unknown-size"
    return f"{size_bytes / 1e9:.2f} GB" if size_bytes >= 1e8 else f"{size_bytes / 1e6:.1f} MB"


def _capture_lines(result: dict[str, Any]) -> list[str]:
    cap = result["undo_capture"]["overhead_fraction"]
    step = result["undo_capture"]["train_step_s"]
    return [
        "",
        f"Failure-free cost of survivor mode (update-undo capture, warm spare): "
        f"{_fmt(cap['median'])} of a {_fmt(step['median'], 4)} s step "
        f"(range {_fmt_range([cap['min'], cap['max']] if cap['n'] else None)}); checkpoint "
        f"stall {_fmt(result['checkpoint_stall_s']['median'], 2)} s.",
    ]


def _simulation_lines(result: dict[str, Any]) -> list[str]:
    sim = result["simulation"]
    if sim is None:
        return ["", "Simulation: not run (a route has no successful run)."]
    scaling = sim["reload_scaling"]
    note = (
        f"reload and checkpoint costs scaled x{scaling['factor']:.1f} from "
        f"{_size_text(scaling['measured_checkpoint_bytes'])} to "
        f"{_size_text(scaling['target_checkpoint_bytes'])} at the measured bytes/s"
        if scaling["scaled"]
        else "costs as measured"
    )
    lines = [
        "",
        f"Simulation at measured costs ({note}; {sim['scenario']['work_hours']:.0f} h of work, "
        f"failures every {sim['scenario']['mtbf_median_hours']:.0f} h median):",
        "",
        "| cadence h | checkpoint wall h | survivor wall h | speedup |",
        "|---|---|---|---|",
    ]
    for row in sim["variants"]["measured"]["rows"]:
        lines.append(
            f"| {row['cadence_hours']} | {row['checkpoint_wall_hours']:.2f} | "
            f"{row['survivor_wall_hours']:.2f} | {row['speedup']:.3f} |"
        )
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="8 MB checkpoint, no torchrun")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per route")
    parser.add_argument("--profile", help="the table's profile, default rm1-like")
    parser.add_argument("--sessions", type=int, default=300, help="sessions of the table")
    parser.add_argument(
        "--rows", type=int, help="rows per table at most, default 100000 (quick 1500)"
    )
    parser.add_argument("--dim", type=int, help="embedding width, default 16 (quick 8)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--kill-step", type=int, default=9)
    parser.add_argument("--job-timeout-s", type=float, default=300.0)
    parser.add_argument("--torchrun", action="store_true", default=None, help="default: not quick")
    parser.add_argument("--no-torchrun", dest="torchrun", action="store_false")
    parser.add_argument("--work-hours", type=float, default=7 * 24.0)
    parser.add_argument("--mtbf-median-hours", type=float, default=17.0)
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument(
        "--reload-target-gb",
        type=float,
        default=1.0,
        help="scale the simulation's reload and checkpoint costs up to this checkpoint size",
    )
    parser.add_argument(
        "--cadence-hours", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0]
    )
    parser.add_argument("--headline-cadence", type=float, default=1.0)
    at_scale = parser.add_argument_group("the assumed at-scale variant (not the headline)")
    at_scale.add_argument("--at-scale-step-s", type=float, default=0.5)
    at_scale.add_argument("--at-scale-checkpoint-cost-s", type=float, default=60.0)
    at_scale.add_argument("--at-scale-cost-factor", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    size = QUICK_SIZE if args.quick else FULL_SIZE
    args.profile = args.profile or size.profile
    args.rows = args.rows or size.rows
    args.dim = args.dim or size.dim
    if args.torchrun is None:
        args.torchrun = not args.quick
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.headline_cadence not in args.cadence_hours:
        parser.error("--headline-cadence must be one of --cadence-hours")
    given = sys.argv[1:] if argv is None else argv
    args.command = " ".join(["python benchmarks/recovery.py", *given])
    args.table = None  # built by run()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="recd-recovery-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = run(args, work)
    out = args.out or RESULTS / ("recovery_quick.json" if args.quick else "recovery.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_json_safe(result), indent=1) + "\n")
    out.with_suffix(".md").write_text("\n".join(markdown_lines(result)) + "\n")
    print(markdown_lines(result)[0])
    print(f"simulated_speedup {_fmt(result['simulated_speedup'])}; wrote {out}")
    return 0


def _json_safe(value: Any) -> Any:
    """NaN and inf as null: strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


if __name__ == "__main__":
    raise SystemExit(main())
