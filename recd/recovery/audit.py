"""What a run records about its recoveries: the audit trail, the event log, the timeline.

Two files, for two readers:

- ``RUN_DIR/.recovery.json`` (:data:`RECOVERY_FILE`), the **audit trail**: one JSON object per
  recovery (JSON Lines), written once by one process (the launcher for an elastic restart, the
  replacement for a survivor recovery) and fsynced. What a user or a tool reads to know what a
  recovery did and lost: the route, the failed ranks, the step continued from, the updates
  undone, where the dead rank's shards came from, the rows that lost updates, ``bit_exact``.
- ``RUN_DIR/recovery/events.jsonl`` (:data:`EVENTS_FILE`), the **event log**: timestamped
  events of every process (launcher, workers, replacement: kill, detect, agreed, rendezvous,
  loaded, step, ...), one short ``O_APPEND`` write each, not synced: processes write it while
  they may be SIGKILLed, in the middle of the recovery it times, so it must cost nothing;
  :func:`recovery_timeline` splits a recovery into phases from it.

Kept apart because they differ in durability and in who reads them: one file would fsync
every event (slowing the recovery it measures) or leave the audit unsynced, and every reader
of the audit would have to skip the timing events.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = [
    "EVENTS_FILE",
    "RECOVERY_FILE",
    "TIMELINE_PHASES",
    "append_event",
    "append_recovery_record",
    "read_events",
    "read_recovery_records",
    "recovery_timeline",
]

RECOVERY_FILE = ".recovery.json"
"""The run's recovery audit trail: one JSON object per recovery (JSON Lines)."""
EVENTS_FILE = "recovery/events.jsonl"
"""Timestamped events of every process of the run (JSON Lines, unsynced)."""

TIMELINE_PHASES = ("detection", "restart", "rendezvous", "load", "first_step", "replay", "total")
"""The phases :func:`recovery_timeline` reports, in order (seconds)."""


def append_recovery_record(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one recovery to ``RUN_DIR/.recovery.json`` (flushed and fsynced)."""
    with (Path(run_dir) / RECOVERY_FILE).open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_recovery_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every recovery recorded in ``RUN_DIR/.recovery.json`` (empty: none)."""
    path = Path(run_dir) / RECOVERY_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_event(run_dir: Path, event: str, **fields: Any) -> None:
    """One timestamped line in ``RUN_DIR/recovery/events.jsonl`` (one O_APPEND write)."""
    path = Path(run_dir) / EVENTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"t": time.time(), "pid": os.getpid(), "event": event, **fields}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """Every recovery event of the run, in time order."""
    path = Path(run_dir) / EVENTS_FILE
    if not path.exists():
        return []
    events = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return sorted(events, key=lambda e: e["t"])


def recovery_timeline(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Split the run's first injected failure (its ``kill`` event) into phases, in seconds.

    - ``detection``: the kill until the launcher saw the process die (``survivor_detection``:
      until a survivor's collective failed; survivor route only);
    - ``restart``: until the replacement was started (the warm spare assigned, or a new
      process) and the survivors agreed and undid; elastic route: until every worker was
      stopped and a new group started;
    - ``rendezvous``: until every rank of the new generation joined its process group;
    - ``load``: until every rank held its state (the survivors their own, the replacement the
      plan, the dense state and its shards);
    - ``first_step``: until the first step after the recovery completed on every rank
      (elastic route: from the new group's start, so it holds the interpreters' start-up,
      the rendezvous and the checkpoint load, which its workers do not log apart:
      ``rendezvous`` and ``load`` are None);
    - ``replay``: until the step in flight at the failure completed again (survivor route: 0,
      that step is the first one);
    - ``total``: the kill until then.

    With ``failed_step`` (the kill's step), ``resumed_at_step`` (the step everyone continued
    from) and ``lost_steps`` (their difference: the steps done again, the one in flight
    included). None when the events hold no kill or not the whole recovery.
    """
    kill = next((e for e in events if e["event"] == "kill"), None)
    if kill is None:
        return None
    t0, failed = kill["t"], int(kill["step"])
    after = [e for e in events if e["t"] >= t0]
    launcher = next((e for e in after if e["event"] == "detect_launcher"), None)
    spawn = next(
        (e for e in after if e["event"] == "spawn" and ("replaced" in e or e.get("attempt"))), None
    )
    if launcher is None or spawn is None:
        return None
    survivor = "replaced" in spawn
    phases = (_survivor_phases if survivor else _restart_phases)(
        after, spawn, t0, launcher["t"], failed
    )
    if phases is None:
        return None
    back = phases.pop("back")
    return {
        "route": "survivor" if survivor else "restart",
        "failed_step": failed,
        "failed_phase": kill.get("phase"),
        "resumed_at_step": phases.pop("resumed_at_step"),
        "lost_steps": phases.pop("lost_steps"),
        "survivor_detection": phases.pop("survivor_detection"),
        "detection": launcher["t"] - t0,
        **phases,
        "total": back - t0,
    }


def _first_per_rank(events: list[dict[str, Any]]) -> dict[int, float]:
    """The earliest time of each rank's events (already in time order)."""
    out: dict[int, float] = {}
    for e in events:
        out.setdefault(int(e["rank"]), e["t"])
    return out


def _slowest(times: dict[int, float]) -> float:
    """The slowest rank's time."""
    return max(times.values())


def _survivor_phases(
    after: list[dict[str, Any]], spawn: dict[str, Any], t0: float, detected: float, failed: int
) -> dict[str, Any] | None:
    gen = int(spawn["gen"])

    def of(name: str, g: int) -> list[dict[str, Any]]:
        return [e for e in after if e["event"] == name and e.get("gen") == g and e["rank"] >= 0]

    loaded = of("loaded", gen)
    rendezvous = of("rendezvous", gen)
    if not loaded or not rendezvous:
        return None
    resumed = min(int(e["step"]) for e in loaded)
    steps = of("step", gen)
    first = _first_per_rank([e for e in steps if int(e["step"]) == resumed + 1])
    back = _first_per_rank([e for e in steps if int(e["step"]) == failed])
    if not first or not back:
        return None
    own = [e["t"] for e in of("detect", gen - 1)]
    started = max([spawn["t"], *(e["t"] for e in of("agreed", gen - 1))])
    joined = _slowest(_first_per_rank(rendezvous))
    held = _slowest(_first_per_rank(loaded))
    first_t = _slowest(first)
    back_t = _slowest(back)
    return {
        "resumed_at_step": resumed,
        "lost_steps": failed - resumed,
        "survivor_detection": (min(own) - t0) if own else None,
        "restart": max(started - detected, 0.0),
        "rendezvous": max(joined - max(started, detected), 0.0),
        "load": held - joined,
        "first_step": first_t - held,
        "replay": back_t - first_t,
        "back": back_t,
    }


def _restart_phases(
    after: list[dict[str, Any]], spawn: dict[str, Any], t0: float, detected: float, failed: int
) -> dict[str, Any] | None:
    attempt = int(spawn["attempt"])
    steps = [e for e in after if e["event"] == "step" and e.get("attempt") == attempt]
    if not steps:
        return None
    resumed = min(int(e["step"]) for e in steps) - 1
    first = _first_per_rank([e for e in steps if int(e["step"]) == resumed + 1])
    back = _first_per_rank([e for e in steps if int(e["step"]) == failed])
    if not back:
        return None
    first_t = _slowest(first)
    back_t = _slowest(back)
    return {
        "resumed_at_step": resumed,
        "lost_steps": failed - resumed,
        "survivor_detection": None,
        "restart": spawn["t"] - detected,
        "rendezvous": None,
        "load": None,
        "first_step": first_t - spawn["t"],
        "replay": back_t - first_t,
        "back": back_t,
    }
