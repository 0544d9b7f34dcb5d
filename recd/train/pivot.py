"""``recd pivot``: continue a run under a new config from one of its checkpoints.

The data-policy sidecars (``.samples.json``, ``.state.json``) go to ``archive/<timestamp>/``
with every checkpoint newer than the pivot's (the abandoned branch, which a later resume must
never pick), ``.loss.json`` is kept with a ``branch`` record at the pivot step, and the next
``recd train --resume`` starts from the checkpoint with a fresh data policy.

A pivot from a delta (``step_NNNNNN.delta``) materialises it first: the state its chain
restores is written as a full ``step_NNNNNN.bin`` beside it (with its checksum sidecar,
byte-identical to the full checkpoint the run would have written at that step) and the delta
is removed, so the new branch starts from a self-contained file and retention may later
delete the old chain.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recd.checkpoint.atomic import (
    checkpoint_file,
    checkpoint_path,
    checkpoint_step,
    clean_stray_temp_files,
    move_checkpoint,
    newest_valid_checkpoint,
    read_layout_or_none,
    remove_checkpoint,
    write_checkpoint,
)
from recd.checkpoint.chain import is_delta, read_any
from recd.checkpoint.checksum import verify_checksum
from recd.checkpoint.format import (
    Checkpoint,
    ParamLayout,
    check_checkpoint_finite,
    check_finite,
    validate_checkpoint,
)
from recd.checkpoint.lock import lock_run_directory
from recd.checkpoint.sidecars import LossLog, archive_policy_sidecars
from recd.durable import fsync_directory
from recd.errors import CheckpointError

__all__ = ["PivotResult", "prepare_pivot"]

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class PivotResult:
    """What :func:`prepare_pivot` did."""

    run_dir: Path
    checkpoint: Path
    """The checkpoint training restarts from (a full file: a delta was materialised)."""
    step: int
    archive: Path
    """``archive/<timestamp>/``: the old ``.samples.json``, ``.state.json`` and checkpoints."""
    moved_checkpoints: list[Path]
    """Checkpoints newer than ``step`` moved into the archive (the abandoned branch)."""


def prepare_pivot(
    run_dir: str | os.PathLike[str],
    *,
    from_checkpoint: str | os.PathLike[str] | int | None = None,
    note: dict[str, Any] | None = None,
    layout: ParamLayout | None = None,
    accept_nonfinite: bool = False,
) -> PivotResult:
    """Archive the policy sidecars, keep ``.loss.json``, make ``from_checkpoint`` the newest.

    ``from_checkpoint``: a checkpoint of ``run_dir`` (a path to a ``step_NNNNNN.bin`` or
    ``step_NNNNNN.delta``, or a step); default the newest valid one. A delta is materialised
    into a full file (module docstring). The run must not be training (the run directory's
    lock is taken first, so a live trainer makes this fail before anything moves). ``note``
    is stored in the ``branch`` record of ``.loss.json`` (e.g. the new config). ``layout``: the
    new config's model, checked against the checkpoint before anything moves, like its
    checksum (a mismatch is always refused; a delta: every link's) and its values (a NaN or an
    infinity is refused unless ``accept_nonfinite``).
    """
    directory = Path(run_dir)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such run directory")
    layout = layout or read_layout_or_none(directory)
    with lock_run_directory(directory), LossLog(directory) as losses:
        if from_checkpoint is None:
            source = newest_valid_checkpoint(directory, layout)
            if source is None:
                raise CheckpointError(f"{directory}: no checkpoint to pivot from")
        elif isinstance(from_checkpoint, int):
            source = checkpoint_file(directory, from_checkpoint) or checkpoint_path(
                directory, from_checkpoint
            )
        else:
            source = Path(from_checkpoint)
        if source.resolve().parent != directory.resolve():
            raise CheckpointError(
                f"{source}: a pivot restarts from a checkpoint of {directory}; to branch from "
                "another run's checkpoint use `recd fork CKPT NEWDIR`"
            )
        chained: Checkpoint | None = None
        if is_delta(source):  # every link's CRC and the base's sidecar checked
            chained = read_any(source, layout, verify=True)
            step = chained.step
            if not accept_nonfinite:
                regions = (chained.weights, chained.adam_m, chained.adam_v)
                check_finite(source, regions, layout=layout)
        else:
            step = validate_checkpoint(source, layout).step
            verify_checksum(source)  # a flipped bit is never accepted, non-finite values may be
            if not accept_nonfinite:
                check_checkpoint_finite(source, layout)
        clean_stray_temp_files(directory)
        restart = source
        if chained is not None:  # the full file first, then the delta goes: never neither
            restart = write_checkpoint(
                checkpoint_path(directory, step),
                step,
                chained.weights,
                chained.adam_m,
                chained.adam_v,
                layout=layout,
            )
            remove_checkpoint(source)
            log.info("pivot: %s materialised as %s", source.name, restart.name)
        archive = archive_policy_sidecars(directory)
        # every checkpoint file past the pivot, full or delta (a delta a full file of its step
        # shadows included): none may be picked by a later resume
        newer = sorted(
            (p for p in directory.iterdir() if (checkpoint_step(p) or -1) > step and p.is_file()),
            key=lambda p: (checkpoint_step(p) or 0, p.name),
        )
        for path in newer:
            move_checkpoint(path, archive)  # with its checksum
        if newer:
            fsync_directory(archive)
            fsync_directory(directory)
        losses.begin_branch(
            step,
            reason="pivot",
            checkpoint=restart.name,
            archive=str(archive.relative_to(directory)),
            **({"materialized_from": source.name} if chained is not None else {}),
            **(note or {}),
        )
    log.info(
        "pivot: %s archived in %s (%d newer checkpoints with them); .loss.json branches at step %d",
        ".samples.json/.state.json",
        archive,
        len(newer),
        step,
    )
    return PivotResult(
        run_dir=directory,
        checkpoint=directory / restart.name,
        step=step,
        archive=archive,
        moved_checkpoints=[archive / p.name for p in newer],
    )
