"""``recd pivot``: continue a run under a new config from one of its checkpoints.

The data-policy sidecars (``.samples.json``, ``.state.json``) go to ``archive/<timestamp>/``
with every checkpoint newer than the pivot's (the abandoned branch, which a later resume must
never pick), ``.loss.json`` is kept with a ``branch`` record at the pivot step, and the next
``recd train --resume`` starts from the checkpoint with a fresh data policy.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recd.checkpoint.atomic import (
    checkpoint_path,
    clean_stray_temp_files,
    list_checkpoints,
    move_checkpoint,
    newest_valid_checkpoint,
    read_layout_or_none,
)
from recd.checkpoint.checksum import verify_checksum
from recd.checkpoint.format import (
    ParamLayout,
    check_checkpoint_finite,
    parse_checkpoint_step,
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
    """The checkpoint training restarts from."""
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

    ``from_checkpoint``: a ``step_NNNNNN.bin`` of ``run_dir`` (a path or a step); default the
    newest valid one. The run must not be training (the run directory's lock is taken first,
    so a live trainer makes this fail before anything moves). ``note`` is stored in the
    ``branch`` record of ``.loss.json`` (e.g. the new config). ``layout``: the new config's
    model, checked against the checkpoint before anything moves, like its checksum (a
    mismatch is always refused) and its values (a NaN or an infinity is refused unless
    ``accept_nonfinite``).
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
            source = checkpoint_path(directory, from_checkpoint)
        else:
            source = Path(from_checkpoint)
        if source.resolve().parent != directory.resolve():
            raise CheckpointError(
                f"{source}: a pivot restarts from a checkpoint of {directory}; to branch from "
                "another run's checkpoint use `recd fork CKPT NEWDIR`"
            )
        header = validate_checkpoint(source, layout)
        verify_checksum(source)  # a flipped bit is never accepted, non-finite values may be
        if not accept_nonfinite:
            check_checkpoint_finite(source, layout)
        clean_stray_temp_files(directory)
        archive = archive_policy_sidecars(directory)
        newer = [
            p
            for p in list_checkpoints(directory)
            if (parse_checkpoint_step(p.name) or 0) > header.step
        ]
        for path in newer:
            move_checkpoint(path, archive)  # with its checksum
        if newer:
            fsync_directory(archive)
            fsync_directory(directory)
        losses.begin_branch(
            header.step,
            reason="pivot",
            checkpoint=source.name,
            archive=str(archive.relative_to(directory)),
            **(note or {}),
        )
    log.info(
        "pivot: %s archived in %s (%d newer checkpoints with them); .loss.json branches at step %d",
        ".samples.json/.state.json",
        archive,
        len(newer),
        header.step,
    )
    return PivotResult(
        run_dir=directory,
        checkpoint=directory / source.name,
        step=header.step,
        archive=archive,
        moved_checkpoints=[archive / p.name for p in newer],
    )
