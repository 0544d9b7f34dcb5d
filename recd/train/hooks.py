"""The typed seams between the :class:`recd.train.loop.Trainer` and its collaborators.

The Trainer calls a :class:`StepHook` after every step, its :class:`CheckpointHook` (the
:class:`recd.train.checkpointing.Checkpointer`) for waits and rejoins, and its
:class:`RecoveryHook` (:class:`recd.recovery.rejoin.SurvivorRecovery`) around every update;
survivor recovery in turn sees the Trainer as a :class:`TrainerView`. Protocols only, so that
neither side imports the other.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from torch import nn

from recd.checkpoint.format import ParamLayout
from recd.reader import ResumableLoader
from recd.train.config import TrainConfig
from recd.train.launch import DistContext

__all__ = ["CheckpointHook", "RecoveryHook", "RecoveryOutcome", "StepHook", "TrainerView"]

TrainerT = TypeVar("TrainerT", contravariant=True)
"""The trainer a hook is handed (:class:`recd.train.loop.Trainer`, or a view of it)."""


class StepHook(Protocol[TrainerT]):
    """Called after every optimizer step, at the step boundary (after logging and eval).

    A hook may also define ``after_train(trainer)``, called once when the loop ends (on every
    rank, at the same step), before the summary files are written.
    """

    def after_step(self, trainer: TrainerT, step: int, loss: float) -> None:
        """``step``: steps completed; ``loss``: that step's training loss (all ranks' mean)."""


class CheckpointHook(StepHook[TrainerT], Protocol[TrainerT]):
    """The run's checkpointer, as the Trainer and survivor recovery call it."""

    @property
    def layout(self) -> ParamLayout:
        """The checkpoint's parameter layout (raises CheckpointError before it is known)."""

    def wait(self) -> None:
        """Block until the write in flight is done; raise CheckpointError if it failed."""

    def rejoin(self, trainer: TrainerT) -> None:
        """A survivor's part of a rejoin, in the new process group."""

    def abandon_write(self) -> None:
        """After a peer died: let the write in flight finish or fail, without raising."""

    def note_recovery(self, at_step: int, **info: Any) -> None:
        """Record a survivor recovery at ``at_step`` in the run's loss history."""


class RecoveryOutcome(Protocol):
    """Where a survivor recovery left the job (:class:`recd.recovery.rejoin.RecoveryPlan`)."""

    @property
    def generation(self) -> int:
        """The process group generation joined."""

    @property
    def agreed_step(self) -> int:
        """The step every rank continues from."""

    @property
    def total(self) -> int:
        """The step the job trains to."""


class RecoveryHook(Protocol):
    """Survivor recovery of one worker, as the Trainer calls it around each step."""

    undo: Any
    """The record that takes this rank's last update back (None: none held)."""

    @property
    def undo_method(self) -> str:
        """How an update is taken back (:data:`recd.recovery.undo.UndoMethod`)."""

    def maybe_kill(self, phase: str) -> None:
        """Fault injection: kill this process at ``phase`` of the step, when told to."""

    def after_update(self) -> None:
        """The update is applied (the touched rows go to their peer copy, if kept)."""

    def step_completed(self) -> None:
        """The step's collectives have all completed on this rank."""

    def after_step(self, step: int) -> None:
        """``step`` is completed and counted."""

    def survive(self, error: BaseException, *, detected_at: float) -> RecoveryOutcome:
        """A peer died during the step: agree, undo, rejoin; where the job continues."""


class TrainerView(Protocol):
    """What survivor recovery (:mod:`recd.recovery.rejoin`) uses of the Trainer."""

    step: int
    """Optimizer steps completed."""
    planned_total: int | None
    """The step this run trains to."""
    reader_offset: int
    """Reader position minus step."""

    @property
    def config(self) -> TrainConfig: ...

    @property
    def dist(self) -> DistContext | None: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def optimizer(self) -> Any:
        """The optimizer (:class:`recd.optim.ModelAdam`, or
        :class:`recd.optim.sharded_adam.ShardedAdam` with several processes)."""

    @property
    def train_model(self) -> nn.Module: ...

    @property
    def loader(self) -> ResumableLoader: ...

    @property
    def checkpointer(self) -> CheckpointHook[Any] | None: ...

    @property
    def table_snapshot(self) -> int | None: ...

    def newest_checkpoint_step(self) -> int | None:
        """The step of the newest valid checkpoint on disk (None: none)."""

    def leave_group(self) -> None:
        """Leave the (broken) process group."""

    def join_group(self, store: Any) -> None:
        """Join the next generation's process group."""

    def rebuild_parallel(self) -> None:
        """Build the sharded model and its optimizer again in the new process group."""

    def rejoin_hooks(self) -> None:
        """The checkpointer's part of a rejoin."""

    def restart_reader(self, step: int) -> None:
        """Continue reading at the batch of step ``step + 1``."""

    def read_snapshot(self, snapshot: int | None) -> None:
        """Read ``snapshot`` of the table from now on."""

    def rows_touched(
        self, first: int, last: int, offset: int, shard_rows: dict[str, list[int]]
    ) -> dict[str, list[int]]:
        """Rows of each table block that the global batches of steps ``first .. last``
        looked up."""
