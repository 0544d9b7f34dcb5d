"""``recd pivot``: continue a run under a new config from one of its checkpoints.

::

    recd pivot RUN_DIR --config NEW.toml [--from CKPT|STEP] [--steps N] [--nproc N] [--no-train]

The pivot sequence (run directory: docs/checkpoints.md):

1. ``kill -USR1 <trainer>`` (checkpoint at the end of the step in flight, training goes on)
   or ``kill -TERM <trainer>`` (checkpoint, then exit 0);
2. stop the trainer (and whatever feeds it);
3. ``recd pivot RUN_DIR --config NEW.toml`` archives ``.samples.json`` and ``.state.json``
   (and any checkpoint newer than the pivot's: the abandoned branch) into
   ``RUN_DIR/archive/<UTC timestamp>/``, keeps ``.loss.json`` (a ``branch`` record at the
   pivot step: the entries after it stay in the file but leave the canonical history), and
4. trains under NEW.toml from the checkpoint: full weights, Adam m and v, and step, with a
   fresh data policy (the new reader starts at the beginning of its partitions), writing into
   RUN_DIR. ``--no-train`` stops after step 3; start it later with
   ``recd train --config NEW.toml --run-dir RUN_DIR --resume``.

The new config must build the same model (same parameter layout): that is checked before
anything moves. A live trainer holds ``.loss.json``'s lock, so pivoting a running job fails
before anything moves.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from recd.cli.fields import check_field_options
from recd.cli.train import add_run_overrides


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "pivot",
        help="archive a run's policy sidecars and continue it under a new config from a checkpoint",
        description=(
            "Archive RUN_DIR/.samples.json and .state.json (with any checkpoint newer than the "
            "pivot's) into RUN_DIR/archive/<timestamp>/, keep .loss.json (a branch record at "
            "the pivot step), then train under --config from the checkpoint (weights, Adam "
            "state, step) with a fresh data policy, into RUN_DIR."
        ),
    )
    parser.add_argument("run_dir", type=Path, help="the run directory (stopped)")
    parser.add_argument("--config", type=Path, required=True, help="the new training TOML")
    parser.add_argument(
        "--from",
        dest="from_checkpoint",
        metavar="CKPT",
        help="a step_NNNNNN.bin or step_NNNNNN.delta of RUN_DIR (a delta is materialised into "
        "a full file), or its step (default: the newest valid one)",
    )
    add_run_overrides(parser, run_dir=False)
    parser.add_argument(
        "--no-train",
        action="store_true",
        help="only archive and branch; resume later with `recd train --resume`",
    )
    parser.set_defaults(func=run_pivot)


def run_pivot(args: argparse.Namespace) -> int:
    from recd.cli.train import run_train
    from recd.optim.sharded_adam import logical_layout
    from recd.train.build import model_config_of
    from recd.train.config import load_train_config
    from recd.train.pivot import prepare_pivot

    check_field_options(args)
    run_dir = args.run_dir.resolve()
    layout = logical_layout(model_config_of(load_train_config(args.config)))
    source: str | int | None = args.from_checkpoint
    if isinstance(source, str) and source.isdigit():
        source = int(source)
    elif isinstance(source, str) and not Path(source).is_absolute() and "/" not in source:
        source = str(run_dir / source)
    result = prepare_pivot(
        run_dir,
        from_checkpoint=source,
        note={"config": str(args.config.resolve())},
        layout=layout,
    )
    moved = f" and {len(result.moved_checkpoints)} newer checkpoint(s)"
    print(
        f"pivot at step {result.step:,} ({result.checkpoint.name}): archived .samples.json, "
        f".state.json{moved if result.moved_checkpoints else ''} in {result.archive}; "
        ".loss.json kept (branch record appended)"
    )
    if args.no_train:
        print(
            f"resume with: recd train --config {args.config} --run-dir {run_dir} --resume",
        )
        return 0
    train_args = argparse.Namespace(
        config=args.config,
        steps=args.steps,
        run_dir=run_dir,
        seed=args.seed,
        nproc=args.nproc,
        resume=True,
    )
    return run_train(train_args)
