"""The environment variables of survivor recovery: how ``recd train --recovery survivor``'s
launcher (:mod:`recd.recovery.agent`) tells a worker, a warm spare and a replacement what they
are. Names only, no imports: a warm spare reads them before it has imported torch
(:mod:`recd.recovery.spare`).
"""

from __future__ import annotations

__all__ = [
    "GENERATION_ENV",
    "KILL_ENV",
    "KILL_PHASES",
    "MODE_ENV",
    "PEER_COPY_ENV",
    "ROLE_ENV",
    "SPARE_ENV",
    "SPARE_IDLE_ENV",
    "UNDO_ENV",
    "store_key",
]

MODE_ENV = "RECD_RECOVERY"
"""``survivor`` in the workers of ``recd train --recovery survivor``."""
UNDO_ENV = "RECD_RECOVERY_UNDO"
"""How a survivor takes back an update: ``copy`` (default) or ``inverse``
(:data:`recd.recovery.undo.UndoMethod`)."""
PEER_COPY_ENV = "RECD_RECOVERY_PEER_COPY"
"""``1``: every rank keeps a copy of its ring predecessor's table shards
(:mod:`recd.recovery.peer_copy`), so a dead rank's shards come back exactly."""
ROLE_ENV = "RECD_RECOVERY_ROLE"
"""``worker`` (started with the job or by a restart), ``replacement`` or ``spare``."""
GENERATION_ENV = "RECD_RECOVERY_GENERATION"
"""The process group generation a worker joins first (0, then +1 per survivor recovery)."""
SPARE_ENV = "RECD_SPARE_ID"
"""A warm spare's id (its assignment's key in the store)."""
SPARE_IDLE_ENV = "RECD_SPARE_IDLE"
"""``1``: the spare imports at idle CPU priority (every spare after the first: it must not
slow the training it will only be needed for at the next failure)."""
KILL_ENV = "RECD_TEST_KILL"
"""Fault injection for tests and the benchmark: ``GEN:RANK:STEP:PHASE[,...]``: the worker
started in generation GEN as rank RANK SIGKILLs itself in step STEP at PHASE (``forward``,
``lookup``, ``backward``, ``optimizer``, ``after_update``, ``recovery``), in the first
attempt only (not after an elastic restart)."""
KILL_PHASES = ("forward", "lookup", "backward", "optimizer", "after_update", "recovery")
"""Where in a step :data:`KILL_ENV` can kill: in the forward before the input all-to-all,
inside the sharded lookup, in the backward, inside the optimizer step (between the dense and
the table updates), after the update before the loss all-reduce, or as a survivor starts
recovering from another rank's death."""


def store_key(attempt: int, generation: int, name: str) -> str:
    """A key of the launcher's store for one generation of one attempt (failure notices,
    first-step counters, process-group prefixes): launcher and workers build it alike."""
    return f"recd/attempt_{attempt}/gen_{generation}/{name}"
