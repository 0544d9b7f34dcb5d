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
- :mod:`recd.recovery.rejoin`: survivor recovery inside ``recd train --recovery survivor``
  (the workers' side: agree, undo, rejoin, the dense state from a survivor, the dead shard
  from a peer copy or the checkpoint); :mod:`recd.recovery.agent`: its launcher (a warm
  spare, :mod:`recd.recovery.spare`); :mod:`recd.recovery.env`: the environment it sets;
  :mod:`recd.recovery.peer_copy`: in-memory copies of a neighbour's table shards;
- :mod:`recd.recovery.audit`: the run's audit trail (``.recovery.json``), its event log and
  the recovery timeline split from it;
- :mod:`recd.recovery.drill`: one ``recd train`` job with a worker killed, and what its
  records say (``recd recover``, ``benchmarks/recovery.py``);
- :mod:`recd.recovery.elastic`: the torchrun ``--max-restarts`` baseline, driven and timed.
"""

import importlib
from typing import Any

_HOME = {
    "Correction": "bits",
    "Inexactness": "bits",
    "measure_inexactness": "bits",
    "ulp_distance": "bits",
    "RECOVERY_FILE": "audit",
    "read_events": "audit",
    "read_recovery_records": "audit",
    "recovery_timeline": "audit",
    "CounterUndo": "undo",
    "StepCapture": "undo",
    "UndoLog": "undo",
    "UndoRecord": "undo",
    "UndoResult": "undo",
    "step_with_undo": "undo",
    "undo_step": "undo",
    "update_rows_with_undo": "undo",
}
"""Where each public name lives: imported on first use, so that a light submodule
(:mod:`recd.recovery.env`, read by a warm spare before it has torch) does not pull in torch."""


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'recd.recovery' has no attribute {name!r}")
    return getattr(importlib.import_module(f"recd.recovery.{_HOME[name]}"), name)


__all__ = [
    "RECOVERY_FILE",
    "Correction",
    "CounterUndo",
    "Inexactness",
    "StepCapture",
    "UndoLog",
    "UndoRecord",
    "UndoResult",
    "measure_inexactness",
    "read_events",
    "read_recovery_records",
    "recovery_timeline",
    "step_with_undo",
    "ulp_distance",
    "undo_step",
    "update_rows_with_undo",
]
