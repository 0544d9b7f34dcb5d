"""``recd recover``: run a small hybrid-parallel job, kill a worker, and report the recovery.

::

    recd recover RUN_DIR [--mode survivor|restart] [--kill-step K] [--kill-rank R]
                 [--kill-point after_backward|after_step] [--steps N] [--checkpoint-every C]
                 [--world-size W] [--tables T] [--rows N] [--batch-size B] [--seed S]
                 [--timeout-s S] [--json]

Runs :class:`recd.recovery.survivor.SurvivorJob` (a DLRM sharded row-wise by torchrec over
gloo, W CPU worker processes, synthetic batches, full checkpoints every C steps). Worker R
SIGKILLs itself in step K; in ``survivor`` mode the survivors agree on the last step every
rank completed, undo their step past it bit-exactly, hand the dense state to a forked
replacement and the dead rank's table shard comes from the newest checkpoint (SwIFT; see
:mod:`recd.recovery.survivor`); ``restart`` is the torchrun baseline (every worker restarts
from the checkpoint). Prints the recovery time split into phases, the lost steps and the audit
trail (``RUN_DIR/.recovery.json``), which says whether the recovery was bit-exact.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from recd.cli.output import add_json_option, emit
from recd.errors import ConfigError

PHASES = ("detection", "restart", "rendezvous", "load", "first_step", "replay", "total")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "recover",
        help="run a small sharded job, kill a worker, report the survivor-based recovery",
        description=(
            "Run a small hybrid-parallel DLRM job (torchrec row-wise tables over gloo, "
            "--world-size CPU worker processes, synthetic batches) in which worker "
            "--kill-rank SIGKILLs itself in step --kill-step, and report how it recovered: "
            "in 'survivor' mode (SwIFT) the survivors undo their partial step bit-exactly, "
            "give the dense state to a replacement and the dead rank's table shard comes from "
            "the newest checkpoint; 'restart' is the torchrun baseline (everyone restarts "
            "from the checkpoint). Prints the recovery time by phase, the lost steps and the "
            "audit trail RUN_DIR/.recovery.json (bit_exact says whether any table rows lost "
            "updates). RUN_DIR must be new or empty."
        ),
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="new or empty directory")
    parser.add_argument(
        "--mode",
        choices=("survivor", "restart"),
        default="survivor",
        help="survivor-based recovery (default) or the restart-from-checkpoint baseline",
    )
    parser.add_argument(
        "--kill-step", type=int, default=7, metavar="K", help="step the worker dies in (0: none)"
    )
    parser.add_argument("--kill-rank", type=int, default=1, metavar="R", help="worker to kill")
    parser.add_argument(
        "--kill-point",
        choices=("after_backward", "after_step"),
        default="after_backward",
        help="die before its optimizer update (default) or after it, before recording the step",
    )
    parser.add_argument("--steps", type=int, default=10, metavar="N", help="steps of the job")
    parser.add_argument(
        "--checkpoint-every", type=int, default=4, metavar="C", help="full checkpoint cadence"
    )
    parser.add_argument("--world-size", type=int, default=2, metavar="W", help="workers")
    parser.add_argument("--tables", type=int, default=4, metavar="T", help="embedding tables")
    parser.add_argument("--rows", type=int, default=1000, metavar="N", help="rows per table")
    parser.add_argument(
        "--batch-size", type=int, default=128, metavar="B", help="global batch (split over W)"
    )
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="weights and batches")
    parser.add_argument(
        "--timeout-s", type=float, default=300.0, metavar="S", help="kill the job after this"
    )
    add_json_option(parser, "the recovery report")
    parser.set_defaults(func=run_recover)


def _check(args: argparse.Namespace) -> None:
    positive = ("steps", "checkpoint_every", "world_size", "tables", "rows", "batch_size")
    for name in positive:
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.world_size < 2:
        raise ConfigError(
            f"--world-size must be >= 2 (a survivor is needed), got {args.world_size}"
        )
    if args.kill_step < 0 or args.kill_step > args.steps:
        raise ConfigError(f"--kill-step must be in [0, --steps={args.steps}], got {args.kill_step}")
    if not 0 <= args.kill_rank < args.world_size:
        raise ConfigError(
            f"--kill-rank must be in [0, {args.world_size - 1}], got {args.kill_rank}"
        )
    if args.batch_size % args.world_size:
        raise ConfigError(
            f"--batch-size {args.batch_size} is not divisible by --world-size {args.world_size}"
        )
    if args.run_dir.exists() and (not args.run_dir.is_dir() or any(args.run_dir.iterdir())):
        raise ConfigError(f"{args.run_dir}: RUN_DIR must be a new or empty directory")


def run_recover(args: argparse.Namespace) -> int:
    from recd.recovery.survivor import SurvivorJob, run_job

    _check(args)
    job = SurvivorJob(
        run_dir=args.run_dir,
        world_size=args.world_size,
        steps=args.steps,
        checkpoint_every=args.checkpoint_every,
        tables=args.tables,
        rows=args.rows,
        batch_size=args.batch_size,
        seed=args.seed,
        mode=args.mode,
        kill_rank=args.kill_rank if args.kill_step > 0 else None,
        kill_step=args.kill_step,
        kill_point=args.kill_point,
        timeout_s=args.timeout_s,
    )
    report = run_job(job)
    summary: dict[str, Any] = {
        "run_dir": str(args.run_dir),
        "mode": args.mode,
        "steps": args.steps,
        "failures": report.failures,
        "wall_s": report.wall_s,
        "timeline": report.timeline(),
        "recoveries": report.recoveries,
    }
    emit(args, summary, lambda: print(format_report(summary)))
    return 0


def format_report(summary: dict[str, Any]) -> str:
    """The human-readable report of a ``--json`` summary (what ``recd recover`` prints)."""
    lines = [
        f"recd recover: {summary['mode']} job of {summary['steps']} steps in "
        f"{summary['run_dir']}: {summary['failures']} worker failure(s), "
        f"{summary['wall_s']:.1f} s wall"
    ]
    timeline = summary["timeline"]
    if timeline is not None:
        lines.append(
            f"  killed in step {timeline['failed_step']}, resumed at step "
            f"{timeline['resumed_at_step']} ({timeline['lost_steps']} step(s) lost)"
        )
        lines.append(
            "  recovery: " + ", ".join(f"{k} {timeline[k]:.3f} s" for k in PHASES if k in timeline)
        )
    for record in summary["recoveries"]:
        lost = sum(record.get("rows_lost_updates", {}).values())
        undone = ", ".join(
            f"rank {u['rank']} step {u['step']} {'exact' if u['exact'] else 'INEXACT'}"
            for u in record.get("undone", [])
        )
        lines.append(
            f"  audit: rank {record['failed_rank']} failed, agreed step "
            f"{record['agreed_step']}, undone: {undone or 'none'}, dense state from "
            f"{record['dense_source']}, table shard from checkpoint step "
            f"{record['embedding_checkpoint_step']} ({lost} rows lost updates), "
            f"bit_exact={record['bit_exact']}"
        )
    return "\n".join(lines)
