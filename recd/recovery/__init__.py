"""Failure recovery (SwIFT: survivors keep their state, a replacement rank loads it).

- :mod:`recd.recovery.undo`: update-undo: :func:`step_with_undo` / :class:`UndoLog` capture
  an optimizer step, :func:`undo_step` takes it back bit-exactly (Adam, AdamW, LazyAdam rows,
  SGD with momentum, ModelAdam), without a per-step snapshot;
- :mod:`recd.recovery.entries`: per updated parameter / table rows, what a record keeps and
  how it is taken back;
- :mod:`recd.recovery.inverse`: the inverse algebra of each update;
- :mod:`recd.recovery.bits`: ulp distances, checksums and the sparse corrections that make
  the float inverse exact;
- :mod:`recd.recovery.measure`: the pure inverse's error and the record's memory on a real
  DLRM (``python -m recd.recovery.measure``);
- :mod:`recd.recovery.survivor`: survivor-based recovery of a hybrid-parallel DLRM job
  (agree, undo, dense state from a survivor, the dead shard from the checkpoint, audit trail);
- :mod:`recd.recovery.elastic`: the torchrun ``--max-restarts`` baseline, driven and timed.
"""

from recd.recovery.bits import Correction, Inexactness, measure_inexactness, ulp_distance
from recd.recovery.survivor import (
    RECOVERY_FILE,
    SurvivorJob,
    read_recovery_records,
    run_job,
)
from recd.recovery.undo import (
    CounterUndo,
    StepCapture,
    UndoLog,
    UndoRecord,
    UndoResult,
    step_with_undo,
    undo_step,
    update_rows_with_undo,
)

__all__ = [
    "RECOVERY_FILE",
    "Correction",
    "CounterUndo",
    "Inexactness",
    "StepCapture",
    "SurvivorJob",
    "UndoLog",
    "UndoRecord",
    "UndoResult",
    "measure_inexactness",
    "read_recovery_records",
    "run_job",
    "step_with_undo",
    "ulp_distance",
    "undo_step",
    "update_rows_with_undo",
]
