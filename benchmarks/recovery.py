"""Failure-recovery benchmark (issue 6): a dead worker costs seconds, not a restart (SwIFT).

    python benchmarks/recovery.py            # 2-process jobs, 3 repetitions, torchrun too
    python benchmarks/recovery.py --quick    # smoke size: 1 repetition, no torchrun job

Measured (2 CPU processes, gloo; rank 1 SIGKILLs itself at a fixed step ``--kill-step``, in
the middle of the step: after its gradients were all-reduced, before its update):

(b) ``survivor``: :mod:`recd.recovery.survivor`: survivors agree on the last step completed
    by everyone, undo their step past it, hand the dense state to a replacement (forked from
    the warm launcher), which loads only its embedding shard from the newest checkpoint;
(a) ``restart``: the same job, recovered as torchrun's agent does: every worker stopped, a
    new group started that loads the full checkpoint and replays the steps since (the same
    warm fork launcher: this isolates lost work + reload from process start-up);
(a) ``torchrun``: the real elastic baseline of :mod:`recd.recovery.elastic`: ``recd train
    --resume`` under ``torchrun --max-restarts 1`` on the tiny table, a worker SIGKILLed
    (fresh interpreters: imports, rendezvous, DMP build, full checkpoint load, replay).

Recovery time = from the kill until the step that was in flight at the failure completes
again (so it includes the lost work); lost work in steps. ``recovery_time_ratio`` = (b) / (a)
with (a) the torchrun baseline when it ran (else the same-launcher restart; ``ratio_baseline``
says which); ``recovery_time_ratio_same_launcher`` is always (b) / restart.

Also measured: the update-undo capture's extra time per step on the same model (one
process: ``step_with_undo`` vs ``ModelAdam.step``, as a fraction of a whole training step).

Simulation (SwIFT's methodology, our costs): a job needing ``--work-hours`` of failure-free
training on many ranks; failures arrive with gaps drawn uniformly from [0, 2 x 17 h] (median
17 h) for the whole job, ``--trials`` Monte-Carlo runs with the same gaps for both
strategies. Assumptions (all parameters, written into the JSON):

- both strategies write the same periodic checkpoints (the survivor route still needs them
  for the embedding shards), each costing ``--checkpoint-cost-s`` of stalled training;
- checkpoint baseline: a failure rolls progress back to the last checkpoint (lost work is
  the time since it, uniform over the cadence) and costs the measured fixed restart time
  (torchrun's detection + restart + start-up + load + first step) times ``--scale-cost``
  (start-up and rendezvous of many ranks take longer than of 2; 1 = as measured);
- survivor: a failure loses the measured lost steps (one: the undone step) of
  ``--step-s`` each and costs the measured fixed survivor recovery time times
  ``--scale-cost``; every step pays the measured undo-capture fraction (the optimizer's share
  of a step is much smaller on a GPU DLRM than on this tiny CPU model, so the headline uses
  the measured capture / optimizer-step ratio times ``--optimizer-share``, default 0.05, of a
  step; ``--undo-overhead`` overrides it; the JSON also has the variants ``none`` (SwIFT's
  premise: nothing captured) and ``as_measured_on_cpu``);
- the embedding rows lost by partial recovery cost accuracy, not time (not simulated);
- the cadence is swept (``--cadence-hours``); ``simulated_speedup`` is at ``--headline-cadence``.

Writes benchmarks/results/recovery.json (``--quick``: recovery_quick.json) and .md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from recd.recovery.survivor import SurvivorJob, run_job  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"

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


# ----------------------------------------------------------------------------- measurements


def measure_job(mode: str, work: Path, args: argparse.Namespace, rep: int) -> dict[str, Any]:
    run_dir = work / f"{mode}_{rep}"
    shutil.rmtree(run_dir, ignore_errors=True)
    job = SurvivorJob(
        run_dir=run_dir,
        mode=mode,  # type: ignore[arg-type]
        steps=args.steps,
        checkpoint_every=args.checkpoint_every,
        kill_rank=1,
        kill_step=args.kill_step,
        kill_point="after_backward",
        timeout_s=300.0,
    )
    report = run_job(job)
    timeline = report.timeline()
    if timeline is None:
        raise RuntimeError(f"{mode}: no recovery observed in {run_dir}")
    return {"timeline": timeline, "recoveries": report.recoveries, "wall_s": report.wall_s}


def make_table(work: Path) -> Path:
    """The tiny profile (1000 sessions) through the real generate -> shard -> ETL."""
    from recd.pipeline import build_tables

    root = work / "table_src"
    if not (root / "table").exists():
        build_tables(root, "tiny", seed=3, num_sessions=1000, num_shards=2, row_group_rows=256)
    return root / "table"


def measure_torchrun(work: Path, args: argparse.Namespace, rep: int) -> dict[str, Any]:
    from recd.recovery.elastic import run_elastic

    table = make_table(work)
    run_dir = work / f"torchrun_{rep}"
    shutil.rmtree(run_dir, ignore_errors=True)
    config = work / f"torchrun_{rep}.toml"
    config.write_text(
        TORCHRUN_TOML.format(table=table, run_dir=run_dir, steps=16, every=args.checkpoint_every)
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", RECD_PROGRESS="0")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    report = run_elastic(config, run_dir, kill_after_step=args.kill_step, timeout_s=300.0, env=env)
    if report.returncode != 0 or report.timeline is None:
        tail = [line for _, line in report.lines if "Error" in line][-3:]
        return {"error": f"exit code {report.returncode}, no recovery: {tail}"}
    return {"timeline": report.timeline.to_dict(), "restarts": report.restarts}


def measure_undo_overhead(reps: int = 20) -> dict[str, float]:
    """Seconds of a training step, of ModelAdam.step and of step_with_undo (medians) on the
    survivor job's model (one process, batch 128)."""
    import torch

    from models.dlrm import DLRM, bce_loss
    from recd.optim import AdamConfig, ModelAdam
    from recd.recovery import step_with_undo
    from recd.recovery.survivor import make_batch, model_config_of

    torch.set_num_threads(1)
    job = SurvivorJob(run_dir=Path("."), world_size=1)
    torch.manual_seed(0)
    model = DLRM(model_config_of(job))
    opt = ModelAdam.for_model(model, AdamConfig(lr=0.01))
    plain: list[float] = []
    captured: list[float] = []
    whole: list[float] = []
    for i in range(2 * reps + 2):
        dense, kjt, labels = make_batch(job, i + 1, 0)
        t0 = time.perf_counter()
        opt.zero_grad()
        bce_loss(model(dense, kjt), labels).backward()
        t1 = time.perf_counter()
        if i % 2:
            step_with_undo(opt)
        else:
            opt.step()
        t2 = time.perf_counter()
        if i >= 2:
            (captured if i % 2 else plain).append(t2 - t1)
            if not i % 2:
                whole.append(t2 - t0)
    step_s = statistics.median(whole)
    extra = statistics.median(captured) - statistics.median(plain)
    return {
        "train_step_s": step_s,
        "optimizer_step_s": statistics.median(plain),
        "captured_step_s": statistics.median(captured),
        "overhead_fraction": max(extra, 0.0) / step_s,
    }


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


def run_simulation(costs: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    mtbf_s = args.mtbf_median_hours * 3600
    work_s = args.work_hours * 3600
    n_gaps = int(work_s / mtbf_s * 4) + 50
    gaps = rng.uniform(0.0, 2 * mtbf_s, (args.trials, n_gaps))
    rows = []
    for hours in args.cadence_hours:
        walls: dict[str, list[float]] = {"checkpoint": [], "survivor": []}
        for trial in gaps:
            common = {
                "work_s": work_s,
                "gaps_s": trial,
                "cadence_s": hours * 3600,
                "checkpoint_cost_s": args.checkpoint_cost_s,
            }
            walls["checkpoint"].append(
                simulate(
                    **common,
                    restart_fixed_s=costs["baseline_fixed_s"] * args.scale_cost,
                    rollback_to_checkpoint=True,
                    lost_s=0.0,
                    overhead=0.0,
                )
            )
            walls["survivor"].append(
                simulate(
                    **common,
                    restart_fixed_s=costs["survivor_fixed_s"] * args.scale_cost,
                    rollback_to_checkpoint=False,
                    lost_s=costs["survivor_lost_steps"] * args.step_s,
                    overhead=costs["undo_overhead"],
                )
            )
        a, b = float(np.mean(walls["checkpoint"])), float(np.mean(walls["survivor"]))
        rows.append(
            {
                "cadence_hours": hours,
                "checkpoint_wall_hours": a / 3600,
                "survivor_wall_hours": b / 3600,
                "speedup": a / b,
            }
        )
    headline = next(r for r in rows if r["cadence_hours"] == args.headline_cadence)
    return {"rows": rows, "simulated_speedup": headline["speedup"]}


# ----------------------------------------------------------------------------- main


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    measured: dict[str, list[dict[str, Any]]] = {"survivor": [], "restart": [], "torchrun": []}
    for rep in range(args.reps):
        for mode in ("survivor", "restart"):
            measured[mode].append(measure_job(mode, work, args, rep))
            print(f"{mode} rep {rep}: {measured[mode][-1]['timeline']['total']:.3f} s", flush=True)
        if args.torchrun:
            measured["torchrun"].append(measure_torchrun(work, args, rep))
            print(f"torchrun rep {rep}: {measured['torchrun'][-1]}", flush=True)

    def med(mode: str, key: str) -> float:
        values = [m["timeline"][key] for m in measured[mode] if "timeline" in m]
        return float(statistics.median(values)) if values else math.nan

    survivor_total = med("survivor", "total")
    restart_total = med("restart", "total")
    torchrun_total = med("torchrun", "total")
    use_torchrun = not math.isnan(torchrun_total)
    baseline_total = torchrun_total if use_torchrun else restart_total
    baseline_mode = "torchrun" if use_torchrun else "restart"
    fixed_phases = {
        "torchrun": ("detection", "restart", "startup", "first_step"),
        "restart": ("detection", "restart", "rendezvous", "load", "first_step"),
    }[baseline_mode]
    survivor_phases = ("detection", "restart", "rendezvous", "load", "first_step")
    undo = measure_undo_overhead()
    costs = {
        "baseline": baseline_mode,
        "baseline_fixed_s": sum(med(baseline_mode, k) for k in fixed_phases),
        "survivor_fixed_s": sum(med("survivor", k) for k in survivor_phases),
        "survivor_lost_steps": med("survivor", "lost_steps"),
    }
    capture_ratio = undo["captured_step_s"] / undo["optimizer_step_s"]
    at_scale = (capture_ratio - 1.0) * args.optimizer_share
    overheads = {
        "at_scale": at_scale if args.undo_overhead is None else args.undo_overhead,
        "none": 0.0,
        "as_measured_on_cpu": undo["overhead_fraction"],
    }
    variants = {
        k: run_simulation({**costs, "undo_overhead": v}, args) for k, v in overheads.items()
    }
    simulation = {
        "simulated_speedup": variants["at_scale"]["simulated_speedup"],
        "undo_overhead": overheads,
        "capture_over_optimizer_step": capture_ratio,
        "variants": variants,
    }
    return {
        "quick": args.quick,
        "recovery_time_ratio": survivor_total / baseline_total,
        "ratio_baseline": baseline_mode,
        "recovery_time_ratio_same_launcher": survivor_total / restart_total,
        "simulated_speedup": simulation["simulated_speedup"],
        "recovery_time_s": {
            "survivor": survivor_total,
            "restart": restart_total,
            "torchrun": torchrun_total,
        },
        "lost_steps": {
            "survivor": med("survivor", "lost_steps"),
            "restart": med("restart", "lost_steps"),
            "torchrun": med("torchrun", "lost_steps"),
        },
        "phases_median_s": {
            mode: {
                k: med(mode, k)
                for k in (measured[mode][0].get("timeline") or {})
                if isinstance((measured[mode][0].get("timeline") or {}).get(k), float)
            }
            for mode in measured
            if measured[mode]
        },
        "undo_capture": undo,
        "simulation": {
            "assumptions": {
                "work_hours": args.work_hours,
                "mtbf_median_hours": args.mtbf_median_hours,
                "failure_gaps": "uniform on [0, 2 x median] for the whole job",
                "trials": args.trials,
                "checkpoint_cost_s": args.checkpoint_cost_s,
                "step_s": args.step_s,
                "scale_cost": args.scale_cost,
                "headline_cadence_hours": args.headline_cadence,
                "optimizer_share": args.optimizer_share,
                **costs,
            },
            **simulation,
        },
        "config": {
            "steps": args.steps,
            "checkpoint_every": args.checkpoint_every,
            "kill_step": args.kill_step,
            "reps": args.reps,
        },
        "runs": measured,
    }


def write_markdown(result: dict[str, Any], path: Path) -> None:
    lines = [
        "# Failure recovery (issue 6)",
        "",
        f"recovery_time_ratio (survivor / {result['ratio_baseline']}): "
        f"**{result['recovery_time_ratio']:.3f}**; survivor / same-launcher restart: "
        f"{result['recovery_time_ratio_same_launcher']:.3f}; simulated speedup "
        f"**{result['simulated_speedup']:.3f}x**",
        "",
        "| route | recovery s | lost steps |",
        "|---|---|---|",
    ]
    for mode in ("survivor", "restart", "torchrun"):
        lines.append(
            f"| {mode} | {result['recovery_time_s'][mode]:.3f} | {result['lost_steps'][mode]} |"
        )
    lines += [
        "",
        "| cadence h | checkpoint wall h | survivor wall h | speedup |",
        "|---|---|---|---|",
    ]
    for row in result["simulation"]["variants"]["at_scale"]["rows"]:
        lines.append(
            f"| {row['cadence_hours']} | {row['checkpoint_wall_hours']:.2f} | "
            f"{row['survivor_wall_hours']:.2f} | {row['speedup']:.3f} |"
        )
    path.write_text("\n".join(lines) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 repetition, no torchrun job")
    parser.add_argument("--reps", type=int, help="repetitions (default 3, quick 1)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--kill-step", type=int, default=9)
    parser.add_argument("--no-torchrun", dest="torchrun", action="store_false", default=None)
    parser.add_argument("--work-hours", type=float, default=7 * 24.0)
    parser.add_argument("--mtbf-median-hours", type=float, default=17.0)
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--checkpoint-cost-s", type=float, default=60.0)
    parser.add_argument("--step-s", type=float, default=0.5, help="a step at scale")
    parser.add_argument("--scale-cost", type=float, default=10.0)
    parser.add_argument(
        "--optimizer-share",
        type=float,
        default=0.05,
        help="the optimizer's share of a training step at scale (GPU DLRM)",
    )
    parser.add_argument("--undo-overhead", type=float, help="override the at-scale fraction")
    parser.add_argument(
        "--cadence-hours", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0]
    )
    parser.add_argument("--headline-cadence", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    args.reps = args.reps or (1 if args.quick else 3)
    if args.torchrun is None:
        args.torchrun = not args.quick
    if args.headline_cadence not in args.cadence_hours:
        parser.error("--headline-cadence must be one of --cadence-hours")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="recd-recovery-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = run(args, work)
    out = args.out or RESULTS / ("recovery_quick.json" if args.quick else "recovery.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    write_markdown(result, out.with_suffix(".md"))
    print(
        f"recovery_time_ratio {result['recovery_time_ratio']:.3f} "
        f"(vs {result['ratio_baseline']}), simulated_speedup {result['simulated_speedup']:.3f}"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
