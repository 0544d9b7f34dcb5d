"""Training efficiency of ``recd train`` under repeated failures (torchft's protocol).

    python benchmarks/failure_efficiency.py          # kills every 60, 15, 5 s; 3 routes
    python benchmarks/failure_efficiency.py --quick  # 800 steps, kills every 5 s (at most 2),
                                                     # 1 run each (writes *_quick.*)

The job is ``benchmarks/train_recovery.py``'s (its table and config helpers): ``recd train
--nproc 2`` on the tiny profile's table (1000 sessions through the real generate -> shard ->
ETL), a DLRM with its tables sharded row-wise over 2 CPU processes (gloo, one torch thread
each), batch 256, 4000 steps (about 90 s failure-free on an idle 2-core machine, ~20 ms a
step; the reader loops over the table as many times as the steps need), a checkpoint every
250 steps (about 5 s of training), the same for every route. Every route runs under recd's
launcher with ``--max-restarts 1000`` (never runs out):

- ``survivor`` (``--recovery survivor``): the survivor keeps its state, a replacement (the
  warm spare when it is warm, else a fresh process) takes the dead rank, the dead shard comes
  from the newest checkpoint (its rows updated since lose those updates: audited); a failure
  during a recovery (or a replacement that cannot join) falls back to the elastic restart;
- ``survivor_peer`` (``--recovery survivor --peer-copy``): the same, the dead shard from the
  survivor's in-memory copy (bit-exact);
- ``elastic`` (``--recovery elastic``): every worker is stopped and the group restarts from
  the newest checkpoint, replaying the steps since (torchrun's policy).

**Failures.** The benchmark process SIGKILLs one live worker from outside (``os.kill`` on the
PID; no fault injection inside the job): the workers are the launcher's child processes
(psutil), each one's rank read from its environment (``RANK``) or, for a warm spare swapped
in, from the launcher's ``spawn`` event; the rank is drawn by a seeded RNG (seeded per
interval and repetition, so every route gets the same rank sequence; a rank with no live
process, its replacement not started yet, is waited for 1 s, then the other rank's worker is
killed); an idle spare is never a target. The schedule is torchft's fixed interval: kill k is sent at T0 + k x interval,
T0 being the moment every rank completed its first step (the launcher's ``started`` event),
whatever the job is doing then: a kill can land during a recovery or during an elastic
restart's start-up (a failure there is a failure too). Intervals: 60, 15 and 5 s (the third
rate, the faster one of the protocol).

**Walls.** A run's wall is measured from the launch of ``recd train`` to its exit (headline)
and from T0 to its exit. **Training efficiency** = failure-free wall / wall with failures,
each of the two walls against the same kind of failure-free wall. The reference is the
median of ``--free-runs`` failure-free runs of the ``elastic`` route (the launcher and the
job with no survivor machinery: no capture, no peer copy, no spare), run first; the
efficiency against each route's own failure-free run(s) is reported beside it. A run that
does not finish is a failed run with efficiency 0 (reported, with how far it got): it is
stopped at ``--cap-factor`` (2.5) x the reference wall (efficiency below 0.4 is not
resolved), or when no new step completes for ``--stall-s`` (180) seconds: a restart loop
that never gets past the job's start-up. The stall window is longer than the 120 s a
replacement waits for its process group before it gives up (and the launcher falls back to
the elastic restart), so a recovery stuck that way is measured, not cut short. The other
runs go in one seeded random order after the reference runs (the cap needs their wall).

**Recorded per run:** kills delivered (time after T0, rank, PID, the process's role),
survivor recoveries completed (the launcher's ``recovered`` events), elastic restarts and
those completed (the restarted group's first step logged), spares used vs fresh
replacements, the recovery records (``.recovery.json``: rows that lost updates, bit-exact),
the final checkpoint's sha256 against the failure-free runs' (peer copy and elastic restart
must match it byte for byte), the final loss (mean of the last 100 steps' losses in
``.loss.json``) vs failure-free, and the load average around the run.

Targets (reported against, not tuned for): survivor efficiency >= 0.9 at one failure per
60 s and >= 0.6 at one per 15 s; the elastic restart's figures beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import random
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.recovery import make_table  # noqa: E402
from benchmarks.train_recovery import (  # noqa: E402
    ROUTE_OPTIONS,
    spread,
    train_command,
    write_config,
)

RESULTS = ROOT / "benchmarks" / "results"
ROUTES = ("survivor", "survivor_peer", "elastic")
REFERENCE_ROUTE = "elastic"
"""The failure-free reference: the job with none of the survivor machinery."""
TARGETS = {60.0: 0.9, 15.0: 0.6}
"""Survivor efficiency targets by failure interval (s)."""
LOSS_TAIL = 100
"""Final loss = mean of the last LOSS_TAIL steps' losses."""
_POLL_S = 0.02
EVENTS = Path("recovery") / "events.jsonl"


def route_options(route: str, max_restarts: int) -> list[str]:
    """train_recovery's options for the route, with ``--max-restarts`` large enough for every
    failure of the run (instead of its own)."""
    options = list(ROUTE_OPTIONS[route])
    if "--max-restarts" in options:
        at = options.index("--max-restarts")
        del options[at : at + 2]
    return [*options, "--max-restarts", str(max_restarts)]


def job_config(work: Path, table: Path, args: argparse.Namespace) -> Path:
    """train_recovery's config, with enough reader epochs for ``args.steps`` steps."""
    path = write_config(work, table, args)
    text = path.read_text()
    assert "num_epochs = 50\n" in text, "train_recovery's config changed: update job_config"
    path.write_text(text.replace("num_epochs = 50\n", "num_epochs = 100000\n"))
    return path


# ----------------------------------------------------------------------------- run dir files
def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """JSON lines, the last one skipped if torn (files written while processes die)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            if line.strip():
                out.append(json.loads(line))
    return out


def read_losses(run_dir: Path) -> dict[int, float]:
    """step -> loss from ``.loss.json`` (the last record of a step wins)."""
    return {
        int(r["step"]): float(r["loss"])
        for r in read_jsonl(run_dir / ".loss.json")
        if "step" in r and "loss" in r
    }


def final_checkpoint(run_dir: Path) -> tuple[int | None, str | None]:
    """(step, sha256) of the newest ``step_NNNNNN.bin`` (None, None: none)."""
    files = sorted(run_dir.glob("step_*.bin"), key=lambda p: int(p.stem.split("_")[-1]))
    if not files:
        return None, None
    digest = hashlib.sha256(files[-1].read_bytes()).hexdigest()
    return int(files[-1].stem.split("_")[-1]), digest


# ----------------------------------------------------------------------------- the workers
def worker_pids(launcher: Any, events: list[dict[str, Any]]) -> dict[int, int]:
    """rank -> PID of the launcher's live worker processes (not an idle spare).

    A worker, a replacement and every worker of a restarted group carry ``RANK`` in their
    environment; a warm spare has none (it learns its rank from the store): its rank is the
    one of the launcher's ``spawn`` event that swapped it in (the spare it took is the last
    one started before that event)."""
    import psutil

    assigned: dict[str, int] = {}
    spare_id: str | None = None
    for e in events:
        if e.get("event") == "spare":
            spare_id = str(e.get("spare"))
        elif e.get("event") == "spawn" and "replaced" in e:
            if str(e.get("how", "")).startswith(("warm spare", "spare")) and spare_id:
                assigned[spare_id] = int(e["replaced"])
            spare_id = None  # taken (or killed and replaced by a fresh process)
    found: dict[int, tuple[float, int]] = {}
    for child in launcher.children(recursive=False):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            env = child.environ()
            created = child.create_time()
        except psutil.Error:
            continue
        if "RANK" in env:
            rank = int(env["RANK"])
        elif env.get("RECD_SPARE_ID") in assigned:
            rank = assigned[env["RECD_SPARE_ID"]]
        else:
            continue  # an idle spare
        if rank not in found or created > found[rank][0]:
            found[rank] = (created, child.pid)
    return {rank: pid for rank, (_, pid) in found.items()}


def kill_tree(pid: int) -> None:
    import psutil

    with contextlib.suppress(psutil.Error):
        parent = psutil.Process(pid)
        for child in parent.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
        parent.kill()


# ----------------------------------------------------------------------------- one run
def run_job(
    config: Path,
    run_dir: Path,
    route: str,
    args: argparse.Namespace,
    *,
    interval: float | None,
    kill_seed: str,
    cap_s: float,
) -> dict[str, Any]:
    """One ``recd train`` job, SIGKILLing a worker every ``interval`` s after its first step
    (None: failure-free); stopped (a failed run) after ``cap_s`` or ``args.stall_s`` s
    without a completed step."""
    import psutil

    command, env = train_command(config, run_dir, route_options(route, args.max_restarts))
    rng = random.Random(kill_seed)
    log_path = run_dir.with_suffix(".log")
    load_before = os.getloadavg()
    with log_path.open("wb") as log:
        began = time.perf_counter()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        launcher = psutil.Process(proc.pid)
        t0: float | None = None
        next_kill: float | None = None
        kills: list[dict[str, Any]] = []
        loss_file = run_dir / ".loss.json"
        last_size, last_progress = -1, None
        stopped: str | None = None
        drawn: int | None = None
        while proc.poll() is None:
            time.sleep(_POLL_S)
            now = time.time()
            if t0 is None:
                started = [e for e in read_jsonl(run_dir / EVENTS) if e["event"] == "started"]
                if started:
                    t0 = started[0]["t"]
                    last_progress = t0
                    if interval is not None:
                        next_kill = t0 + interval
            with contextlib.suppress(OSError):
                size = loss_file.stat().st_size
                if size != last_size:
                    last_size, last_progress = size, now
            if next_kill is not None and now >= next_kill and len(kills) < args.max_kills:
                if drawn is None:
                    drawn = rng.randrange(2)  # one draw per kill: the same ranks on every route
                kill = deliver_kill(launcher, run_dir, drawn, now - next_kill, t0, next_kill)
                if kill is not None or now - next_kill > 5.0:  # 5 s without a worker: skipped
                    kills.append(kill or {"skipped": True, "due_s": next_kill - t0})
                    next_kill += interval  # fixed schedule, whatever the job is doing
                    drawn = None
            if time.perf_counter() - began > cap_s:
                stopped = f"did not finish in {cap_s:.0f} s (cap)"
            elif last_progress is not None and now - last_progress > args.stall_s:
                stopped = f"no step completed for {args.stall_s:.0f} s (stalled)"
            if stopped:
                kill_tree(proc.pid)
                proc.wait()
                break
        wall = time.perf_counter() - began
        ended = time.time()
    load_after = os.getloadavg()
    out: dict[str, Any] = {
        "route": route,
        "interval_s": interval,
        "kill_seed": kill_seed,
        "wall_s": wall,
        "after_start_s": None if t0 is None else ended - t0,
        "launch_to_first_step_s": None if t0 is None else wall - (ended - t0),
        "rc": proc.returncode,
        "finished": stopped is None and proc.returncode == 0,
        "stopped": stopped,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "kills": [k for k in kills if not k.get("skipped")],
        "kills_skipped": [k for k in kills if k.get("skipped")],
    }
    out["kills_delivered"] = len(out["kills"])
    if not out["finished"]:
        out["error"] = log_tail(log_path)
    out |= read_outcome(run_dir)
    return out


_NOISE = ("socket.cpp", "Warning", "warnings.warn", "return func(", "DistributedDataParallel(")


def log_tail(path: Path, lines: int = 30) -> str:
    """The job's output's last lines, without gloo's socket and torch's deprecation noise."""
    text = path.read_bytes()[-200_000:].decode(errors="replace").splitlines()
    return "\n".join([x for x in text if not any(n in x for n in _NOISE)][-lines:])


def deliver_kill(
    launcher: Any, run_dir: Path, drawn: int, late_s: float, t0: float, due: float
) -> dict[str, Any] | None:
    """SIGKILL the drawn rank's live worker; None: none to kill now. A rank with no live
    process (its replacement not started yet) is waited for 1 s, then another rank's worker
    is killed instead."""
    import psutil

    live = worker_pids(launcher, read_jsonl(run_dir / EVENTS))
    if drawn in live:
        rank = drawn
    elif live and late_s > 1.0:
        rank = sorted(live)[0]
    else:
        return None
    pid = live[rank]
    try:
        env = psutil.Process(pid).environ()
        role = env.get("RECD_RECOVERY_ROLE") if "RANK" in env else "warm spare swapped in"
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, psutil.Error):
        return None
    sent = time.time()
    return {
        "t_s": sent - t0,
        "due_s": due - t0,
        "rank": rank,
        "drawn_rank": drawn,
        "pid": pid,
        "role": role,
    }


def read_outcome(run_dir: Path) -> dict[str, Any]:
    """What the run directory says: recoveries, restarts, checkpoint, losses."""
    events = read_jsonl(run_dir / EVENTS)
    records = read_jsonl(run_dir / ".recovery.json")
    recovered = [e for e in events if e["event"] == "recovered"]
    restart_at = [i for i, e in enumerate(events) if e["event"] == "restart"]
    restarts_completed = 0
    for n, i in enumerate(restart_at):
        end = restart_at[n + 1] if n + 1 < len(restart_at) else len(events)
        ranks = {e["rank"] for e in events[i:end] if e["event"] == "step"}
        restarts_completed += len(ranks) >= 2
    spawns = [e.get("how") for e in events if e["event"] == "spawn" and "replaced" in e]
    survivor_records = [r for r in records if r.get("route") == "survivor"]
    losses = read_losses(run_dir)
    steps = sorted(losses)
    tail = [losses[s] for s in steps[-LOSS_TAIL:]]
    ckpt_step, sha = final_checkpoint(run_dir)
    train = run_dir / "train.json"
    result = json.loads(train.read_text())["result"] if train.exists() else {}
    return {
        "survivor_recoveries": len(recovered),
        "restarts": len(restart_at),
        "restarts_completed": restarts_completed,
        "recoveries_completed": len(recovered) + restarts_completed,
        "replacements": {h: spawns.count(h) for h in sorted(set(spawns), key=str)},
        "records": [
            {
                k: r.get(k)
                for k in (
                    "route",
                    "agreed_step",
                    "checkpoint_step",
                    "embedding_checkpoint_step",
                    "steps_lost",
                    "bit_exact",
                )
            }
            | {"rows_lost": sum((r.get("rows_lost_updates") or {}).values())}
            for r in records
        ],
        "rows_lost": sum(
            sum((r.get("rows_lost_updates") or {}).values()) for r in survivor_records
        ),
        "survivor_records": len(survivor_records),
        "last_step": steps[-1] if steps else 0,
        "final_loss": statistics.fmean(tail) if tail else None,
        "loss_last10_mean": result.get("loss_last10_mean"),
        "final_checkpoint_step": ckpt_step,
        "final_checkpoint_sha256": sha,
        "train_s": result.get("train_s"),
    }


# ----------------------------------------------------------------------------- the schedule
def plan_runs(args: argparse.Namespace) -> tuple[list[tuple[str, float | None, int]], ...]:
    """(reference runs, the others in seeded random order): (route, interval or None, rep)."""
    reference = [(REFERENCE_ROUTE, None, i) for i in range(args.free_runs)]
    others: list[tuple[str, float | None, int]] = [
        (route, None, i)
        for route in args.routes
        if route != REFERENCE_ROUTE
        for i in range(args.route_free_runs)
    ]
    others += [
        (route, interval, i)
        for route in args.routes
        for interval in args.intervals
        for i in range(args.reps)
    ]
    random.Random(args.seed).shuffle(others)
    return reference, others


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--checkpoint-every", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--intervals", type=float, nargs="+", default=[60.0, 15.0, 5.0])
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    parser.add_argument("--reps", type=int, default=1, help="failing runs per route and rate")
    parser.add_argument(
        "--free-runs", type=int, default=2, help="failure-free runs of the reference route"
    )
    parser.add_argument(
        "--route-free-runs",
        type=int,
        default=1,
        help="failure-free runs of each other route (its own failure-free wall)",
    )
    parser.add_argument("--max-restarts", type=int, default=1000)
    parser.add_argument(
        "--max-kills", type=int, default=1_000_000, help="at most this many kills per run"
    )
    parser.add_argument(
        "--cap-factor",
        type=float,
        default=2.5,
        help="a run still going after this x the reference wall is stopped (efficiency 0)",
    )
    parser.add_argument(
        "--stall-s",
        type=float,
        default=180.0,
        help="a run with no completed step for this long is stopped (efficiency 0)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/recd-failure-efficiency"))
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument(
        "--resummarize",
        type=Path,
        help="recompute the figures and rewrite the outputs from this result's runs; runs nothing",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--quick" in argv:  # the quick run's defaults (an option given still wins)
        parser.set_defaults(
            steps=800,
            checkpoint_every=100,
            intervals=[5.0],
            reps=1,
            free_runs=1,
            route_free_runs=0,
            max_kills=2,
            stall_s=120.0,
            cap_factor=4.0,
        )
    args = parser.parse_args(argv)
    args.argv = argv
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.resummarize is not None:
        old = json.loads(args.resummarize.read_text())
        saved = parse_args(shlex.split(old["command"])[2:])
        saved.out_dir, saved.quick = args.out_dir, saved.quick or args.quick
        m = old["machine"]
        report = summarize(
            old["runs"],
            saved,
            m["load_average_before"],
            m["load_average_after"],
            old["job"]["cap_s"],
        )
        write_outputs(report, saved)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    table = make_table(args.work)
    config = job_config(args.work, table, args)
    reference, others = plan_runs(args)
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    total = len(reference) + len(others)

    def one(route: str, interval: float | None, rep: int, cap_s: float) -> dict[str, Any]:
        n = len(runs) + 1
        run_dir = args.work / f"run_{n:03d}"
        subprocess.run(["rm", "-rf", str(run_dir), str(run_dir.with_suffix(".log"))], check=True)
        out = run_job(
            config,
            run_dir,
            route,
            args,
            interval=interval,
            kill_seed=f"{args.seed}:{interval}:{rep}",
            cap_s=cap_s,
        ) | {"rep": rep, "position": n - 1}
        if not args.keep:
            subprocess.run(["rm", "-rf", str(run_dir)], check=True)
        runs.append(out)
        every = "failure-free" if interval is None else f"kill every {interval:g} s"
        print(
            f"[{n}/{total}] {route} {every}: wall {out['wall_s']:.1f} s, rc {out['rc']}, "
            f"kills {out['kills_delivered']}, recoveries {out['recoveries_completed']}"
            + (f", {out['stopped']}" if out["stopped"] else ""),
            flush=True,
        )
        return out

    for route, interval, rep in reference:
        one(route, interval, rep, cap_s=3600.0)
    walls = [r["wall_s"] for r in runs if r["finished"]]
    if not walls:
        raise SystemExit("every failure-free reference run failed: see the logs in --work")
    cap_s = args.cap_factor * statistics.median(walls)
    for route, interval, rep in others:
        one(route, interval, rep, cap_s)
    load_after = os.getloadavg()
    report = summarize(runs, args, load_before, load_after, cap_s)
    write_outputs(report, args)
    return 0


# ----------------------------------------------------------------------------- the figures
def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(
    runs: list[dict[str, Any]],
    args: argparse.Namespace,
    load_before: tuple[float, ...],
    load_after: tuple[float, ...],
    cap_s: float,
) -> dict[str, Any]:
    free = {
        route: [r for r in runs if r["route"] == route and r["interval_s"] is None]
        for route in ROUTES
    }
    ok_free = {route: [r for r in rs if r["finished"]] for route, rs in free.items()}
    ref = ok_free[REFERENCE_ROUTE]
    ref_wall = _median([r["wall_s"] for r in ref])
    ref_after = _median([r["after_start_s"] for r in ref if r["after_start_s"] is not None])
    ref_hashes = sorted({r["final_checkpoint_sha256"] for rs in ok_free.values() for r in rs})
    ref_hash = ref[0]["final_checkpoint_sha256"] if ref else None
    ref_loss = _median([r["final_loss"] for r in ref if r["final_loss"] is not None])
    own = {
        route: (
            _median([r["wall_s"] for r in rs]),
            _median([r["after_start_s"] for r in rs if r["after_start_s"] is not None]),
        )
        for route, rs in ok_free.items()
    }

    def efficiency(r: dict[str, Any], wall: float | None, after: float | None) -> dict[str, Any]:
        if wall is None:
            return {"launch_to_exit": None, "first_step_to_exit": None}
        if not r["finished"]:
            return {"launch_to_exit": 0.0, "first_step_to_exit": 0.0}
        return {
            "launch_to_exit": wall / r["wall_s"],
            "first_step_to_exit": None
            if after is None or not r["after_start_s"]
            else after / r["after_start_s"],
        }

    for r in runs:
        r["efficiency"] = efficiency(r, ref_wall, ref_after)
        r["efficiency_vs_own_failure_free"] = efficiency(r, *own[r["route"]])
        r["final_checkpoint_equal_to_failure_free"] = (
            None
            if r["final_checkpoint_sha256"] is None or ref_hash is None
            else r["final_checkpoint_sha256"] == ref_hash
        )
        r["progress"] = r["last_step"] / args.steps
    cells: dict[str, dict[str, Any]] = {}
    for route in args.routes:
        cells[route] = {}
        for interval in args.intervals:
            rs = [r for r in runs if r["route"] == route and r["interval_s"] == interval]
            fin = [r for r in rs if r["finished"]]
            effs = [r["efficiency"]["launch_to_exit"] for r in rs]

            def med(key: str, sub: str, rs: list[dict[str, Any]] = rs) -> float | None:
                values = [r[key][sub] for r in rs if r[key][sub] is not None]
                return _median(values)

            cells[route][f"{interval:g}"] = {
                "interval_s": interval,
                "runs": len(rs),
                "failed_runs": len(rs) - len(fin),
                "efficiency": med("efficiency", "launch_to_exit"),
                "efficiency_first_step_to_exit": med("efficiency", "first_step_to_exit"),
                "efficiency_vs_own_failure_free": med(
                    "efficiency_vs_own_failure_free", "launch_to_exit"
                ),
                "efficiency_runs": effs,
                "efficiency_min": min(effs, default=None),
                "efficiency_max": max(effs, default=None),
                "kills": sum(r["kills_delivered"] for r in rs),
                "survivor_recoveries": sum(r["survivor_recoveries"] for r in rs),
                "restarts": sum(r["restarts"] for r in rs),
                "restarts_completed": sum(r["restarts_completed"] for r in rs),
                "recoveries_completed": sum(r["recoveries_completed"] for r in rs),
                "final_checkpoint_bit_exact": [
                    sum(bool(r["final_checkpoint_equal_to_failure_free"]) for r in fin),
                    len(fin),
                ],
                "rows_lost": sum(r["rows_lost"] for r in rs),
                "final_loss": _median([r["final_loss"] for r in fin if r["final_loss"]]),
                "final_loss_vs_failure_free": _median(
                    [r["final_loss"] / ref_loss - 1 for r in fin if r["final_loss"] and ref_loss]
                ),
                "progress_of_failed_runs": [r["progress"] for r in rs if not r["finished"]],
                "stopped": [
                    r["stopped"] or f"exit code {r['rc']}" for r in rs if not r["finished"]
                ],
            }
    targets = {}
    for interval, target in TARGETS.items():
        cell = cells.get("survivor", {}).get(f"{interval:g}")
        if cell is not None and cell["efficiency"] is not None:
            worst = cell["efficiency_min"]
            targets[f"survivor at {interval:g} s"] = {
                "target": target,
                "efficiency": cell["efficiency"],
                "worst_run": worst,
                "runs": cell["runs"],
                # a threshold is met by the bad end: every run, and at least 3 of them
                "met": worst is not None and worst >= target and cell["runs"] >= 3,
            }
    return {
        "benchmark": "failure_efficiency",
        "command": " ".join(["python benchmarks/failure_efficiency.py", *args.argv]),
        "protocol": __doc__,
        "job": {
            "steps": args.steps,
            "checkpoint_every": args.checkpoint_every,
            "batch_size": args.batch_size,
            "nproc": 2,
            "routes": {r: " ".join(route_options(r, args.max_restarts)) for r in args.routes},
            "intervals_s": args.intervals,
            "reps": args.reps,
            "free_runs": args.free_runs,
            "route_free_runs": args.route_free_runs,
            "max_kills_per_run": args.max_kills,
            "cap_s": cap_s,
            "cap_factor": args.cap_factor,
            "stall_s": args.stall_s,
            "seed": args.seed,
            "reference_route": REFERENCE_ROUTE,
            "order": [
                f"{r['route']}:{'free' if r['interval_s'] is None else r['interval_s']}:{r['rep']}"
                for r in runs
            ],
        },
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_before": list(load_before),
            "load_average_after": list(load_after),
        },
        "failure_free": {
            "reference_wall_s": ref_wall,
            "reference_first_step_to_exit_s": ref_after,
            "wall_s": {route: spread([r["wall_s"] for r in rs]) for route, rs in ok_free.items()},
            "first_step_to_exit_s": {
                route: spread([r["after_start_s"] for r in rs if r["after_start_s"]])
                for route, rs in ok_free.items()
            },
            "failed_runs": {route: len(free[route]) - len(ok_free[route]) for route in ROUTES},
            "final_checkpoint_sha256": ref_hash,
            "final_checkpoints_identical": len(ref_hashes) == 1,
            "final_loss": ref_loss,
        },
        "cells": cells,
        "targets": targets,
        "runs": runs,
    }


def _f(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


LABELS = {
    "survivor": "survivor",
    "survivor_peer": "survivor --peer-copy",
    "elastic": "elastic restart",
}


def markdown_lines(report: dict[str, Any]) -> list[str]:
    ff = report["failure_free"]
    job = report["job"]
    lines = [
        f"Training efficiency under repeated failures (torchft's protocol): `{report['command']}`",
        "",
        f"Job: `recd train --nproc 2`, tiny profile table, DLRM row-wise, {job['steps']} steps, "
        f"checkpoint every {job['checkpoint_every']}, batch {job['batch_size']}. One worker "
        "SIGKILLed from outside at a fixed interval after the first step (T0 + k x interval). "
        "Efficiency = failure-free wall / wall with failures, launch to exit (headline) and "
        f"first step to exit; reference: the {REFERENCE_ROUTE} route's failure-free median "
        f"{_f(ff['reference_wall_s'], 1)} s ({_f(ff['reference_first_step_to_exit_s'], 1)} s "
        f"after the first step). A run that does not finish (cap {_f(job['cap_s'], 0)} s, or "
        f"{job['stall_s']:g} s without a step) counts 0.",
        "",
    ]
    for name, t in report["targets"].items():
        worst, runs = t.get("worst_run"), t.get("runs", 1)
        if runs < 3:
            verdict = f"not shown: {runs} run(s), the measuring rules ask for 3"
        else:
            verdict = f"{'met' if t['met'] else 'not met'} by the worst run"
        lines.append(
            f"- target: {name} >= {t['target']}: median {_f(t['efficiency'], 3)}, worst of "
            f"{runs} run(s) {_f(worst, 3)} ({verdict})"
        )
    lines += [
        "",
        "| route | kill every | efficiency, median (min-max) | first step -> exit | "
        "vs own failure-free | kills "
        "| recoveries (survivor + restarts) | failed runs | final ckpt bit-exact | "
        "rows lost updates | final loss (vs failure-free) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for route, by_interval in report["cells"].items():
        for key, c in by_interval.items():
            exact = c["final_checkpoint_bit_exact"]
            lines.append(
                f"| {LABELS[route]} | {key} s | **{_f(c['efficiency'], 3)}** "
                f"({_f(c.get('efficiency_min'), 3)}-{_f(c.get('efficiency_max'), 3)}) | "
                f"{_f(c['efficiency_first_step_to_exit'], 3)} | "
                f"{_f(c['efficiency_vs_own_failure_free'], 3)} | {c['kills']} | "
                f"{c['recoveries_completed']} ({c['survivor_recoveries']} + "
                f"{c['restarts_completed']} of {c['restarts']}) | {c['failed_runs']} of "
                f"{c['runs']} | {exact[0]} of {exact[1]} | {c['rows_lost']} | "
                f"{_f(c['final_loss'], 5)} ({_pct(c['final_loss_vs_failure_free'])}) |"
            )
    lines += [
        "",
        "Failure-free (median wall s, launch to exit): "
        + ", ".join(
            f"{LABELS[k]} {_f(v['median'], 1)} (n={v['n']})"
            for k, v in ff["wall_s"].items()
            if v["n"]
        )
        + f"; final loss {_f(ff['final_loss'], 5)} (mean of the last {LOSS_TAIL} steps); final checkpoints of the failure-free runs "
        + ("identical" if ff["final_checkpoints_identical"] else "DIFFER")
        + ".",
    ]
    failed = [
        f"- {LABELS[r['route']]} every {r['interval_s']:g} s rep {r['rep']}: "
        f"{r['stopped'] or 'exit code ' + str(r['rc'])} "
        f"(reached step {r['last_step']} of {job['steps']}, {r['kills_delivered']} kills)"
        for r in report["runs"]
        if not r["finished"] and r["interval_s"] is not None
    ]
    if failed:
        lines += ["", "Failed runs:", *failed]
    m = report["machine"]
    lines += [
        "",
        f"Machine: {m['cpu_count']} CPUs, load average {m['load_average_before'][0]:.1f} "
        f"before, {m['load_average_after'][0]:.1f} after.",
    ]
    return lines


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    top = 1.05
    for route, by_interval in report["cells"].items():
        cells = sorted(by_interval.values(), key=lambda c: c["interval_s"])
        xs = [c["interval_s"] for c in cells]
        ys = [c["efficiency"] or 0.0 for c in cells]
        (line,) = ax.plot(xs, ys, "o-", label=LABELS[route])
        failed = [(x, y) for x, y, c in zip(xs, ys, cells, strict=True) if c["failed_runs"]]
        if failed:
            ax.plot(*zip(*failed, strict=True), "x", color=line.get_color(), markersize=10)
        top = max(top, max(ys) + 0.05)
    for interval, target in TARGETS.items():
        ax.plot([interval], [target], "k_", markersize=18)
    ticks = sorted({*(c["interval_s"] for b in report["cells"].values() for c in b.values())})
    ticks = sorted({*ticks, *TARGETS})
    ax.set_xscale("log")
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("failure interval, s (one worker SIGKILLed at each)")
    ax.set_ylabel("training efficiency")
    ax.set_ylim(0, top)
    ax.set_title(
        "recd train --nproc 2: efficiency under failures\n(bars: survivor targets; x: a failed run)"
    )
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(report: dict[str, Any], args: argparse.Namespace) -> None:
    name = "failure_efficiency_quick" if args.quick else "failure_efficiency"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{name}.json").write_text(json.dumps(report, indent=1, default=str))
    lines = markdown_lines(report)
    (args.out_dir / f"{name}.md").write_text("\n".join(lines) + "\n")
    plot(report, args.out_dir / f"{name}.png")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
