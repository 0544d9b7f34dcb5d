"""Retention: keep the newest K checkpoints plus every Mth, delete the rest, off the hot path.

"Every Mth" is decided **by step**: a checkpoint is kept forever when
``step % (keep_every * checkpoint_every) == 0`` (with the defaults K=3, M=10, cadence 100:
steps 0, 1000, 2000, ... plus the newest three). Counting files instead ("every Mth file")
would make the kept set shift whenever an extra checkpoint appears (SIGUSR1 writes one at any
step) or an old one is removed; by step, a file's fate never changes once it is older than the
newest K, and two runs with the same cadence keep the same steps.

Safety rules, whatever the policy says:
- the newest *valid* checkpoint is never deleted (if the newest K files are all corrupt, the
  last good one survives);
- only final ``step_NNNNNN.bin`` names are considered: temp files and sidecars are never
  touched, except a deleted checkpoint's checksum (``step_NNNNNN.bin.crc32``), which goes
  with it (``recd.checkpoint.atomic.remove_checkpoint``: the checkpoint first, then its
  sidecar);
- files that appear while retention runs (a commit racing it) are not in its listing and are
  kept.

The ``.state.json`` entries of the deleted checkpoints (reader position and RNG, keyed by
step) are dropped right after the files (``recd.checkpoint.sidecars.drop_state_entries``), so
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

from recd.checkpoint.atomic import list_checkpoints, remove_checkpoint
from recd.checkpoint.format import ParamLayout, parse_checkpoint_step, validate_checkpoint
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
    """The checkpoints of ``paths`` the policy deletes (pure: touches nothing).

    ``paths`` are checkpoint files (any order); ``protect`` are never selected.
    """
    by_step = sorted((parse_checkpoint_step(p.name), p) for p in paths)
    if any(step is None for step, _ in by_step):
        raise ValueError("select_deletions: every path must be named step_NNNNNN.bin")
    newest = {p for _, p in by_step[-policy.keep_last :]}
    return [
        p
        for step, p in by_step
        if p not in newest and p not in protect and not policy.keeps_forever(int(step or 0))
    ]


def _newest_valid(paths: Sequence[Path], layout: ParamLayout | None) -> Path | None:
    for path in reversed(paths):
        try:
            validate_checkpoint(path, layout)
        except CheckpointCorruptError:
            continue
        return path
    return None


def apply_retention(
    run_dir: str | os.PathLike[str],
    policy: RetentionPolicy,
    *,
    layout: ParamLayout | None = None,
) -> list[Path]:
    """Delete the checkpoints of ``run_dir`` the policy does not keep, and their
    ``.state.json`` entries; returns the deleted paths.

    The newest checkpoint that validates (against ``layout`` when given) is always kept;
    "validates" means size and header here, not the checksum: reading files back after every
    write would double the writer's I/O, and the newest file is the one just written from
    memory. Run it from the run directory's one writer (the ``.state.json`` update is
    read-modify-write).
    """
    paths = list_checkpoints(run_dir)
    newest_valid = _newest_valid(paths, layout)
    protect = frozenset({newest_valid}) if newest_valid is not None else frozenset()
    deleted = []
    for path in select_deletions(paths, policy, protect=protect):
        if not remove_checkpoint(path):  # with its checksum sidecar
            continue
        deleted.append(path)
        log.debug("retention: deleted %s", path)
    if deleted:
        drop_state_entries(run_dir, (parse_checkpoint_step(p.name) or 0 for p in deleted))
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
