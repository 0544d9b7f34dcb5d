"""Retention: keep the newest K checkpoints plus every Mth, delete the rest, off the hot path.

"Every Mth" is decided **by step**: a checkpoint is kept forever when
``step % (keep_every * checkpoint_every) == 0`` (with the defaults K=3, M=10, cadence 100:
steps 0, 1000, 2000, ... plus the newest three). Counting files instead ("every Mth file")
would make the kept set shift whenever an extra checkpoint appears (SIGUSR1 writes one at any
step) or an old one is removed; by step, a file's fate never changes once it is older than the
newest K, and two runs with the same cadence keep the same steps.

The policy applies over every checkpoint, full (``step_NNNNNN.bin``) and delta
(``step_NNNNNN.delta``) alike; then every file a kept checkpoint's chain needs is kept too
(its base and every link before it, ``recd.checkpoint.chain.chain_paths``), so a kept delta
always restores. Fulls at 0 and 40, deltas at 10, 20, 30 (onto 0) and 50, 60 (onto 40) with
``keep_last = 2``: 50 and 60 are kept by the policy, 40 as their base; 0 to 30 go (unless
``keep_every`` keeps one of them, and with it its chain).

Safety rules, whatever the policy says:
- the newest *valid* checkpoint (a delta: its whole chain valid) is never deleted, nor any
  file of its chain (if the newest K files are all corrupt, the last good one survives);
- a chain that cannot be resolved (a link unreadable) keeps every checkpoint from its base
  (as far as its header names one) up to it: nothing a kept delta might need is deleted;
- files are deleted newest first, so a crash part-way never leaves a delta whose chain lost a
  link while the delta survived;
- only final ``step_NNNNNN.bin`` / ``step_NNNNNN.delta`` names are considered: temp files and
  sidecars are never touched, except a deleted checkpoint's checksum
  (``step_NNNNNN.bin.crc32``), which goes with it (``recd.checkpoint.atomic.remove_checkpoint``:
  the checkpoint first, then its sidecar). A delta shadowed by a full file of the same step
  (only the full one is listed) goes with that full file, and keeps it when a kept chain runs
  through the delta, so every step deleted has no file left;
- files that appear while retention runs (a commit racing it) are not in its listing and are
  kept.

The ``.state.json`` entries of the deleted checkpoints (reader position and RNG, keyed by
step; a step whose full file or delta is still there keeps its entry) are dropped right after
the files (``recd.checkpoint.sidecars.drop_state_entries``), so
the document never describes checkpoints that are gone. Only the deleted steps are dropped:
the entry of a checkpoint whose write is still in flight is never touched.

Deletion is cheap but does filesystem work; call ``apply_retention`` after a commit from the
checkpoint writer's background thread, or use ``apply_retention_in_background``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from recd.checkpoint.atomic import checkpoint_step, list_checkpoints, remove_checkpoint
from recd.checkpoint.chain import chain_paths, is_delta, validate_any
from recd.checkpoint.delta import delta_filename, read_delta_header
from recd.checkpoint.format import ParamLayout
from recd.checkpoint.sidecars import drop_state_entries
from recd.errors import CheckpointCorruptError, SidecarError

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class RetentionPolicy:
    """Which checkpoints survive."""

    keep_last: int = 3
    """K: the newest K checkpoints (by step) are always kept. At least 1."""
    keep_every: int = 10
    """M: also keep, forever, every checkpoint whose step is a multiple of
    ``keep_every * checkpoint_every``. 0 disables it."""
    checkpoint_every: int = 100
    """The run's checkpoint cadence in steps (sets the unit of ``keep_every``)."""

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError(f"RetentionPolicy.keep_last must be >= 1, got {self.keep_last}")
        if self.keep_every < 0:
            raise ValueError(f"RetentionPolicy.keep_every must be >= 0, got {self.keep_every}")
        if self.checkpoint_every < 1:
            raise ValueError(
                f"RetentionPolicy.checkpoint_every must be >= 1, got {self.checkpoint_every}"
            )

    @property
    def keep_every_steps(self) -> int:
        """Steps between permanently kept checkpoints (0 = none)."""
        return self.keep_every * self.checkpoint_every

    def keeps_forever(self, step: int) -> bool:
        return self.keep_every_steps > 0 and step % self.keep_every_steps == 0


def select_deletions(
    paths: Sequence[Path], policy: RetentionPolicy, *, protect: frozenset[Path] = frozenset()
) -> list[Path]:
    """The checkpoints of ``paths`` the policy deletes, by step ascending (pure: touches
    nothing, reads no file; the chain closure is ``apply_retention``'s).

    ``paths`` are checkpoint files, full or delta (any order); ``protect`` are never selected.
    """
    steps = [checkpoint_step(p) for p in paths]
    if any(step is None for step in steps):
        raise ValueError(
            "select_deletions: every path must be named step_NNNNNN.bin or step_NNNNNN.delta"
        )
    by_step = sorted((int(step or 0), p) for step, p in zip(steps, paths, strict=True))
    newest = {p for _, p in by_step[-policy.keep_last :]}
    return [
        p
        for step, p in by_step
        if p not in newest and p not in protect and not policy.keeps_forever(step)
    ]


def _newest_valid(paths: Sequence[Path], layout: ParamLayout | None) -> Path | None:
    for path in reversed(paths):
        try:
            validate_any(path, layout)  # a delta: its whole chain (sizes, headers, links)
        except CheckpointCorruptError:
            continue
        return path
    return None


def _needed_by(path: Path, checkpoints: Sequence[Path]) -> set[Path]:
    """The files ``path`` needs to restore: its chain, or, when the chain cannot be resolved
    (a link missing or unreadable), every checkpoint from the base its header names (step 0
    when even that is unreadable) up to it."""
    if not is_delta(path):
        return {path}
    try:
        return set(chain_paths(path))
    except CheckpointCorruptError:
        pass
    try:
        base = read_delta_header(path).base
    except CheckpointCorruptError:
        base = 0
    step = checkpoint_step(path)
    assert step is not None
    return {path} | {p for p in checkpoints if base <= (checkpoint_step(p) or 0) <= step}


def apply_retention(
    run_dir: str | os.PathLike[str],
    policy: RetentionPolicy,
    *,
    layout: ParamLayout | None = None,
) -> list[Path]:
    """Delete the checkpoints of ``run_dir`` the policy does not keep and no kept chain needs,
    and their ``.state.json`` entries; returns the deleted files by step ascending (no file of
    their steps is left). They are deleted newest first (a delta before the links it needs).

    The newest checkpoint that validates (against ``layout`` when given), and its chain, are
    always kept; "validates" means size and header here (a delta: every link's, and the
    links agree), not the checksum: reading files back after every write would double the
    writer's I/O, and the newest file is the one just written from memory. Run it from the
    run directory's one writer (the ``.state.json`` update is read-modify-write).
    """
    directory = Path(run_dir)
    paths = list_checkpoints(directory)
    newest_valid = _newest_valid(paths, layout)
    protect = frozenset({newest_valid}) if newest_valid is not None else frozenset()
    doomed = select_deletions(paths, policy, protect=protect)
    needed: set[Path] = set()
    for path in set(paths) - set(doomed):
        needed |= _needed_by(path, paths)
    victims: list[Path] = []
    for path in doomed:
        # a full file may shadow a delta of the same step (only the full one is listed): the
        # two go together, or neither when a kept chain runs through the delta
        shadowed = directory / delta_filename(checkpoint_step(path) or 0)
        group = [path, shadowed] if not is_delta(path) and shadowed.exists() else [path]
        if not needed.intersection(group):
            victims.extend(group)
    deleted = []
    for path in sorted(victims, key=lambda p: (checkpoint_step(p) or 0, is_delta(p)), reverse=True):
        if not remove_checkpoint(path):  # with its checksum sidecar
            continue
        deleted.append(path)
        log.debug("retention: deleted %s", path)
    deleted.reverse()
    if deleted:
        drop_state_entries(run_dir, sorted({checkpoint_step(p) or 0 for p in deleted}))
    return deleted


def apply_retention_in_background(
    run_dir: str | os.PathLike[str],
    policy: RetentionPolicy,
    *,
    layout: ParamLayout | None = None,
) -> threading.Thread:
    """Run ``apply_retention`` in a new (non-daemon) thread; errors are logged, not raised."""

    def run() -> None:
        try:
            apply_retention(run_dir, policy, layout=layout)
        except (OSError, SidecarError) as exc:
            log.warning("retention in %s failed: %s", run_dir, exc)

    thread = threading.Thread(target=run, name="recd-ckpt-retention")
    thread.start()
    return thread
