"""``recd train``: train a DLRM / RM1-like model on a clustered table (one or N processes)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from recd.cli.fields import add_field_option, check_field_options
from recd.train.config import RunSection

if TYPE_CHECKING:
    from recd.train.config import TrainConfig

SHUTDOWN_TIMEOUT_S = 600
"""Seconds torchrun's agent waits for workers it signalled before it SIGKILLs them."""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "train",
        help="train a DLRM / RM1-like model on a table's partitions; eval loss / NE / AUC",
        description=(
            "Read the training partitions with the readers (KJT + IKJTs), train with Adam, "
            "evaluate loss, normalized entropy and AUC on the held-out partitions, and write "
            "RUN_DIR/metrics.jsonl (samples/s, peak memory), RUN_DIR/loss.png and "
            "RUN_DIR/train.json. With --nproc N > 1 the job runs as N torchrun workers "
            "(gloo on CPU, nccl on GPU). Checkpoints (RUN_DIR/step_NNNNNN.bin with .loss.json, "
            ".samples.json, .state.json) every [checkpoint] checkpoint_every steps, at the end, "
            "and on signals: SIGTERM = checkpoint and exit 0, SIGUSR1 = checkpoint and continue "
            "(send them to this process, also with --nproc). One trainer per run directory: a "
            "second one on a live run exits 2 naming the live one's pid, having touched nothing."
        ),
    )
    parser.add_argument(
        "--config",
        type=Path,
        required=True,
        help="train TOML, e.g. runs/small/train.toml (what recd run wrote)",
    )
    add_run_overrides(parser, run_dir=True)
    parser.add_argument(
        "--nnodes",
        type=int,
        default=1,
        metavar="N",
        help="machines in the job: start `recd train` on each with the same --nnodes, --nproc "
        "and --rdzv-endpoint and its own --node-rank (a shared run directory)",
    )
    parser.add_argument(
        "--node-rank", type=int, default=0, metavar="R", help="this machine's rank, 0..N-1"
    )
    parser.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="node 0's address and a free port on it, reachable from every node",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help=(
            "with --nproc N > 1: torchrun restarts the worker group up to N times when a worker "
            "dies; the restarted workers resume from the newest valid checkpoint"
        ),
    )
    parser.add_argument(
        "--recovery",
        choices=["restart", "survivor", "elastic"],
        default="restart",
        help=(
            "with --nproc N > 1, what happens when a worker dies: restart = torchrun "
            "(--max-restarts: every worker restarts from the newest checkpoint); survivor = "
            "the other workers keep their state and a replacement joins them at their step "
            "(recd's launcher, one machine; falls back to the restart when it cannot, "
            "--max-restarts times); elastic = recd's launcher restarting every worker from "
            "the newest checkpoint (torchrun's policy, the baseline survivor is measured "
            "against)"
        ),
    )
    parser.add_argument(
        "--no-spare",
        action="store_true",
        help="with --recovery survivor: no warm spare process (a replacement starts cold)",
    )
    parser.add_argument(
        "--peer-copy",
        action="store_true",
        help=(
            "with --recovery survivor: every rank keeps an in-memory copy of the next lower "
            "rank's table shards, updated from the rows each step touches, so a dead rank's "
            "shards come back exactly instead of from the newest checkpoint (memory: one more "
            "copy of the sharded tables with their Adam state; time: the touched rows sent "
            "to one peer per step)"
        ),
    )
    parser.add_argument(
        "--undo",
        choices=["copy", "inverse"],
        help=(
            "with --recovery survivor (default copy), how a survivor ahead by one update takes it back: copy "
            "= keep the values each step reads or copies anyway (no work per step; 12 bytes "
            "per updated element held until the next step); inverse = SwIFT's algebraic "
            "inverse with exact corrections (4-6 bytes per updated element, but an inverse "
            "pass every step)"
        ),
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help=(
            "continue from the newest valid checkpoint of the run directory (weights, Adam "
            "state, step, reader position, RNG: bit-exact); a fresh start when it has none. A "
            "checkpoint holding NaN or infinity is skipped like a corrupt one (the previous "
            "valid one is used)"
        ),
    )
    add_field_option(parser, "--accept-nonfinite", RunSection, "accept_nonfinite")
    parser.set_defaults(func=run_train)


def add_run_overrides(parser: argparse.ArgumentParser, *, run_dir: bool) -> None:
    """``--steps``, ``--seed``, ``--nproc`` (and ``--run-dir``): overrides of the training
    config's ``[train]`` fields (``recd train``, ``recd pivot``)."""
    add_field_option(parser, "--steps", RunSection, "steps", override="[train] steps", metavar="N")
    if run_dir:
        add_field_option(
            parser,
            "--run-dir",
            RunSection,
            "run_dir",
            override="[train] run_dir (and the checkpoint directory, [checkpoint] dir)",
            metavar="DIR",
        )
    add_field_option(
        parser, "--seed", RunSection, "seed", override="[train] seed and [reader] seed", metavar="S"
    )
    add_field_option(
        parser, "--nproc", RunSection, "world_size", override="[train] world_size", metavar="N"
    )


def run_train(args: argparse.Namespace) -> int:
    """The ``recd train`` handler (also what ``recd pivot`` runs after its preparation)."""
    from recd.train.config import load_train_config

    check_field_options(args)
    config = load_train_config(args.config)  # a bad config fails before torch is imported
    # Heavy imports (torch, torchrec) only here: `recd --help` stays fast.
    from recd.errors import ConfigError, RecoveryError
    from recd.progress import progress_enabled
    from recd.recovery.rejoin import EXIT_FALLBACK
    from recd.train.launch import Nodes, in_torchrun, launch_torchrun
    from recd.train.results import format_summary
    from recd.train.run import run_training
    from recd.train.signals import forward_signals_to_workers

    if args.steps is not None:
        config.train.steps = args.steps
    if args.run_dir is not None:
        config.train.run_dir = args.run_dir.resolve()
        config.checkpoint.dir = None  # the checkpoints follow the run directory
    if args.seed is not None:
        config.train.seed = args.seed
        config.reader.seed = args.seed
    if getattr(args, "accept_nonfinite", False):
        config.train.accept_nonfinite = True
    nproc = config.train.world_size if args.nproc is None else args.nproc
    nodes = Nodes(
        nnodes=getattr(args, "nnodes", 1),
        node_rank=getattr(args, "node_rank", 0),
        rdzv_endpoint=getattr(args, "rdzv_endpoint", None),
    )
    recovery = getattr(args, "recovery", "restart")
    survivor_only = {
        "--no-spare": getattr(args, "no_spare", False),
        "--peer-copy": getattr(args, "peer_copy", False),
        "--undo": getattr(args, "undo", None) is not None,
    }
    given = [flag for flag, on in survivor_only.items() if on]
    if given and recovery != "survivor":
        raise ConfigError(f"{', '.join(given)}: only with --recovery survivor")
    if recovery in ("survivor", "elastic") and not in_torchrun():
        if nproc < 2 or nodes.multi:
            raise ConfigError(
                f"--recovery {recovery}: needs --nproc N > 1 on one machine (--nnodes 1)"
            )
        from recd.recovery.agent import AgentConfig, run_agent

        with _launcher_owns(config, True):
            return run_agent(
                AgentConfig(
                    nproc=nproc,
                    recd_args=_worker_args(args),
                    checkpoint_dir=Path(config.checkpoint_dir).resolve(),
                    max_restarts=getattr(args, "max_restarts", 0),
                    spare=not getattr(args, "no_spare", False),
                    survivor=recovery == "survivor",
                    undo=getattr(args, "undo", None) or "copy",
                    peer_copy=getattr(args, "peer_copy", False),
                    steps=config.train.steps,
                )
            )
    if in_torchrun():
        config.train.world_size = int(os.environ["WORLD_SIZE"])
    elif nproc > 1 or nodes.multi:
        # SIGTERM / SIGUSR1 to this launcher reach the workers (recd.train.signals); torchrun's
        # agent gives workers it shuts down this long to finish their checkpoint.
        os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_TIMEOUT_S))
        # The launcher owns the run directory for the whole job, before any worker exists
        # (node 0's: it hosts rank 0, the one that writes); its workers find it the owner.
        with _launcher_owns(config, nodes.node_rank == 0), forward_signals_to_workers():
            return launch_torchrun(
                nproc,
                _worker_args(args),
                max_restarts=getattr(args, "max_restarts", 0),
                nodes=nodes,
            )
    else:
        config.train.world_size = 1
    resume = bool(getattr(args, "resume", False))
    try:
        result = run_training(config, show_progress=progress_enabled(), resume=resume)
    except RecoveryError as exc:
        if not in_torchrun():
            raise
        # the launcher restarts the group (or stops the job when it has no restarts left)
        print(f"recd train: rank {os.environ['RANK']}: {exc}", file=sys.stderr)
        return EXIT_FALLBACK
    if not in_torchrun() or os.environ["RANK"] == "0":
        print(format_summary(result))
    return 0


@contextlib.contextmanager
def _launcher_owns(config: TrainConfig, owns: bool) -> Iterator[None]:
    """Hold the run directory's lock (when ``owns``) and name this process its owner in the
    workers' environment (``RECD_RUN_DIR_OWNER``) while the job runs."""
    from recd.checkpoint.lock import OWNER_ENV, owner_token
    from recd.train.run import owning_run_directory

    if not owns:
        yield
        return
    before = os.environ.get(OWNER_ENV)
    with owning_run_directory(config):
        os.environ[OWNER_ENV] = owner_token()
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(OWNER_ENV, None)
            else:
                os.environ[OWNER_ENV] = before


def _worker_args(args: argparse.Namespace) -> list[str]:
    """The command of each torchrun worker: the same options with absolute paths, minus
    ``--nproc`` (a worker takes its world from torchrun's environment; torchrun's own parser
    would also take ``--nproc`` for an abbreviation of its ``--nproc-per-node``)."""
    out = ["train", "--config", str(args.config.resolve())]
    if args.steps is not None:
        out += ["--steps", str(args.steps)]
    if args.run_dir is not None:
        out += ["--run-dir", str(args.run_dir.resolve())]
    if args.seed is not None:
        out += ["--seed", str(args.seed)]
    if getattr(args, "accept_nonfinite", False):
        out.append("--accept-nonfinite")
    # Restarted workers must pick up the newest checkpoint (a fresh start when there is none).
    if getattr(args, "resume", False) or getattr(args, "max_restarts", 0) > 0:
        out.append("--resume")
    return out
