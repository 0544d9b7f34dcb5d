"""``recd recover``: a recovery drill: ``recd train --nproc W`` with a worker killed, reported.

::

    recd recover RUN_DIR [--mode survivor|restart] [--kill-step K] [--kill-rank R]
                 [--kill-point forward|lookup|backward|optimizer|after_update] [--steps N]
                 [--checkpoint-every C] [--world-size W] [--rows N] [--batch-size B]
                 [--seed S] [--table DIR] [--peer-copy] [--timeout-s S] [--json]

Runs :func:`recd.recovery.drill.run_drill`: the trainer's own survivor recovery (``recd train
--recovery survivor``, :mod:`recd.recovery.rejoin`) on a small DLRM sharded row-wise over W
CPU worker processes, trained on ``--table`` or on the tiny profile's table generated into
RUN_DIR/table. Worker R SIGKILLs itself in step K at the chosen point; ``restart`` runs the
baseline instead (``--recovery elastic``: every worker restarts from the newest checkpoint).
Prints the recovery time split into phases and the lost steps (from the run's event log) and
the audit trail (``RUN_DIR/train/.recovery.json``), which says whether the recovery was
bit-exact.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from recd.cli.output import add_json_option, emit
from recd.errors import ConfigError
from recd.recovery.audit import TIMELINE_PHASES
from recd.recovery.drill import KILL_POINTS

REMOVED_KILL_POINTS = {
    "after_backward": "optimizer",
    "after_step": "after_update",
}
"""The standalone job's kill points, gone with it, and the trainer's nearest ones."""


class _Removed(argparse.Action):
    """An option of the standalone job that has no meaning for ``recd train``: an error."""

    def __init__(self, *args: Any, why: str = "", **kwargs: Any) -> None:
        self.why = why
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        parser.error(f"{self.option_strings[0]} was removed: {self.why}")


def _kill_point(text: str) -> str:
    if text in REMOVED_KILL_POINTS:
        raise argparse.ArgumentTypeError(
            f"{text!r} was removed with the standalone job; the trainer's nearest point is "
            f"{REMOVED_KILL_POINTS[text]!r} (one of {', '.join(KILL_POINTS)})"
        )
    return text


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "recover",
        help="run recd train with a worker killed and report its survivor recovery",
        description=(
            "A recovery drill: run `recd train --nproc W --recovery survivor` on a small "
            "DLRM (tables sharded row-wise over W CPU worker processes) in which worker "
            "--kill-rank SIGKILLs itself in step --kill-step, and report from the trainer's "
            "own records how it recovered: the survivors undo their partial update "
            "bit-exactly, give the dense state to a replacement, and the dead rank's table "
            "shards come from the newest checkpoint (or, with --peer-copy, from a survivor's "
            "copy); --mode restart runs the baseline (--recovery elastic: every worker "
            "restarts from the newest checkpoint). Trains on --table or on the tiny profile's "
            "table generated into RUN_DIR/table. Prints the recovery time by phase, the lost "
            "steps and the audit trail RUN_DIR/train/.recovery.json (bit_exact says whether "
            "any table rows lost updates). RUN_DIR must be new or empty."
        ),
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="new or empty directory")
    parser.add_argument(
        "--mode",
        choices=("survivor", "restart"),
        default="survivor",
        help="survivor recovery (default) or the restart-from-checkpoint baseline",
    )
    parser.add_argument(
        "--kill-step", type=int, default=7, metavar="K", help="step the worker dies in (0: none)"
    )
    parser.add_argument("--kill-rank", type=int, default=1, metavar="R", help="worker to kill")
    parser.add_argument(
        "--kill-point",
        type=_kill_point,
        choices=KILL_POINTS,
        default="optimizer",
        help=(
            "where in the step it dies: in the forward, inside the sharded lookup, in the "
            "backward, inside its optimizer update (default: the survivors applied theirs and "
            "take it back) or after its update, before the step's loss all-reduce"
        ),
    )
    parser.add_argument("--steps", type=int, default=10, metavar="N", help="steps of the job")
    parser.add_argument(
        "--checkpoint-every", type=int, default=4, metavar="C", help="checkpoint cadence"
    )
    parser.add_argument("--world-size", type=int, default=2, metavar="W", help="workers")
    parser.add_argument(
        "--rows",
        type=int,
        default=1000,
        metavar="N",
        help="rows per embedding table at most (larger id spaces are hashed into N rows)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=128, metavar="B", help="global batch (split over W)"
    )
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="weights and batches")
    parser.add_argument(
        "--table",
        type=Path,
        metavar="DIR",
        help="a clustered table to train on (default: generate the tiny profile's)",
    )
    parser.add_argument(
        "--peer-copy",
        action="store_true",
        help="survivor mode: the dead rank's shards from a survivor's in-memory copy (exact)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=300.0, metavar="S", help="kill the job after this"
    )
    parser.add_argument(
        "--tables",
        action=_Removed,
        nargs="?",
        why="the tables are the sparse features of the table trained on (see --table)",
        help=argparse.SUPPRESS,
    )
    add_json_option(parser, "the recovery report")
    parser.set_defaults(func=run_recover)


def run_recover(args: argparse.Namespace) -> int:
    from recd.recovery.drill import Drill, run_drill

    run_dir: Path = args.run_dir
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ConfigError(f"{run_dir}: RUN_DIR must be a new or empty directory")
    if args.table is not None and not args.table.is_dir():
        raise ConfigError(f"--table {args.table}: not a directory")
    drill = Drill(
        run_dir=run_dir,
        table=args.table,
        route=args.mode,
        world_size=args.world_size,
        steps=args.steps,
        checkpoint_every=args.checkpoint_every,
        rows=args.rows,
        batch_size=args.batch_size,
        seed=args.seed,
        kill_rank=args.kill_rank,
        kill_step=args.kill_step,
        kill_point=args.kill_point,
        peer_copy=args.peer_copy,
        timeout_s=args.timeout_s,
    )
    drill.check(_option)
    report = run_drill(drill)
    summary = report.to_dict()
    emit(args, summary, lambda: print(format_report(summary)))
    if report.returncode != 0:
        print(
            f"recd recover: recd train exited with {report.returncode}; its output "
            f"({report.log_path}) ends with:\n{report.log_tail()}",
            file=sys.stderr,
        )
        return report.returncode if report.returncode > 0 else 1
    return 0


def _option(field: str) -> str:
    """The option that sets a :class:`~recd.recovery.drill.Drill` field."""
    return {"route": "--mode"}.get(field, "--" + field.replace("_", "-"))


def format_report(summary: dict[str, Any]) -> str:
    """The human-readable report of a ``--json`` summary (what ``recd recover`` prints)."""
    lines = [
        f"recd recover: {summary['mode']} job of {summary['steps']} steps on "
        f"{summary['world_size']} workers in {summary['train_dir']}: exit code "
        f"{summary['returncode']}, {summary['failures']} worker failure(s), "
        f"{summary['wall_s']:.1f} s wall"
    ]
    timeline = summary["timeline"]
    if timeline is not None:
        lines.append(
            f"  killed in step {timeline['failed_step']} ({timeline['failed_phase']}), resumed "
            f"at step {timeline['resumed_at_step']} ({timeline['lost_steps']} step(s) lost: "
            "done again)"
        )
        lines.append(
            "  recovery: "
            + ", ".join(
                f"{k} {timeline[k]:.3f} s" for k in TIMELINE_PHASES if timeline.get(k) is not None
            )
        )
    elif summary["kill"] is not None:
        lines.append("  no complete recovery in the event log (see the audit below)")
    for record in summary["recoveries"]:
        lines.append("  audit: " + _audit_line(record))
    return "\n".join(lines)


def _audit_line(record: dict[str, Any]) -> str:
    failed = ", ".join(str(r) for r in record.get("failed_ranks", []))
    if record.get("route") == "restart":
        return (
            f"{record.get('reason') or f'rank {failed} failed'}: every worker restarted from "
            f"{record.get('checkpoint') or 'the start'} ({record.get('steps_lost')} completed "
            f"step(s) lost), bit_exact={record.get('bit_exact')}"
        )
    lost = sum(record.get("rows_lost_updates", {}).values())
    undone = ", ".join(
        f"rank {u['rank']} step {u['step']} {'exact' if u['exact'] else 'INEXACT'}"
        for u in record.get("undone", [])
    )
    return (
        f"rank {failed} failed, agreed step {record['agreed_step']}, undone: "
        f"{undone or 'none'}, dense state from {record['dense_source']}, table shards from "
        f"{record['embedding_source']} ({lost} rows lost updates), "
        f"bit_exact={record['bit_exact']}"
    )
