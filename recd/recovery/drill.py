"""A recovery drill: one ``recd train --nproc W`` job with a worker killed, and its records.

The drill writes a small training config (a DLRM whose tables are sharded row-wise, on a
clustered table: one given, or the tiny profile's, generated), runs ``recd train --nproc W
--recovery survivor`` (or ``--recovery elastic``, every worker restarted from the newest
checkpoint: the baseline) as a child process with ``RECD_TEST_KILL`` set, so that rank R
SIGKILLs itself in step K at a chosen point of the step, and reads back what the trainer
recorded: the audit trail (``.recovery.json``: agreed step, undone updates and whether each
was exact, rows that lost updates, ``bit_exact``) and the event log, split into recovery
phases by :func:`recd.recovery.audit.recovery_timeline`. Nothing here recovers anything:
``recd recover`` and ``benchmarks/recovery.py`` drive the trainer's own recovery through it.

Layout of the drill's directory: ``train.toml``, ``train.log`` (the job's output),
``train/`` (the run: checkpoints, ``.recovery.json``, ``recovery/events.jsonl``) and, when
the table is generated, ``table/`` (``raw/``, ``shards/``, ``table/``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from recd.errors import ConfigError
from recd.recovery.audit import read_events, read_recovery_records, recovery_timeline
from recd.recovery.env import KILL_ENV, KILL_PHASES

__all__ = [
    "KILL_POINTS",
    "ROUTES",
    "Drill",
    "DrillReport",
    "generate_table",
    "run_drill",
]

ROUTES = ("survivor", "restart")
"""``survivor``: ``--recovery survivor``; ``restart``: ``--recovery elastic`` (the same
launcher restarting every worker from the newest checkpoint)."""
KILL_POINTS = tuple(p for p in KILL_PHASES if p != "recovery")
"""Points of a step a drill's worker can die at (:data:`recd.recovery.env.KILL_PHASES`)."""
Route = Literal["survivor", "restart"]


@dataclass(kw_only=True, slots=True)
class Drill:
    """One drill: the job, the route and the injected failure."""

    run_dir: Path
    """The drill's directory (see the module's docstring)."""
    table: Path | None = None
    """A clustered table to train on; None: generate ``profile``'s into ``run_dir/table``."""
    profile: str = "tiny"
    """The generated table's profile (``recd.profiles``)."""
    sessions: int = 1000
    """Sessions of the generated table."""
    route: Route = "survivor"
    world_size: int = 2
    """Worker processes (``--nproc``)."""
    steps: int = 10
    checkpoint_every: int = 4
    """Checkpoint cadence (written on the training thread, so which checkpoint a recovery
    finds does not depend on a background writer's timing)."""
    rows: int = 1000
    """Rows per embedding table at most (``model.max_rows``: larger id spaces are hashed)."""
    dim: int = 8
    """Embedding width."""
    batch_size: int = 128
    """Global batch, split evenly over the workers."""
    seed: int = 0
    """Weights and reader order (``recd train --seed``)."""
    kill_rank: int = 1
    kill_step: int = 7
    """The step the worker dies in (0: no failure)."""
    kill_point: str = "optimizer"
    """Where in the step (:data:`KILL_POINTS`): ``optimizer`` and ``after_update`` leave the
    survivors with an update to take back."""
    peer_copy: bool = False
    """Survivor route: the dead rank's shards from a survivor's in-memory copy (exact)."""
    max_restarts: int = 1
    """Elastic restarts allowed (the restart route's one, or a survivor recovery's fallback)."""
    timeout_s: float = 300.0
    """The job is killed after this long."""
    extra_env: dict[str, str] = field(default_factory=dict)

    def check(self, name: Callable[[str], str] = str) -> None:
        """Raise :class:`ConfigError` for a drill that cannot run as asked; ``name`` turns a
        field's name into the caller's (``recd recover``'s options)."""
        for key in ("steps", "checkpoint_every", "world_size", "rows", "dim", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{name(key)} must be >= 1, got {getattr(self, key)}")
        if self.route not in ROUTES:
            raise ConfigError(f"{name('route')} must be one of {ROUTES}, got {self.route!r}")
        if self.world_size < 2:
            raise ConfigError(
                f"{name('world_size')} must be >= 2 (a survivor is needed), got {self.world_size}"
            )
        if not 0 <= self.kill_step <= self.steps:
            raise ConfigError(
                f"{name('kill_step')} must be in [0, {name('steps')}={self.steps}], "
                f"got {self.kill_step}"
            )
        if not 0 <= self.kill_rank < self.world_size:
            raise ConfigError(
                f"{name('kill_rank')} must be in [0, {self.world_size - 1}], got {self.kill_rank}"
            )
        if self.kill_point not in KILL_POINTS:
            raise ConfigError(
                f"{name('kill_point')} must be one of {KILL_POINTS}, got {self.kill_point!r}"
            )
        if self.batch_size % self.world_size:
            raise ConfigError(
                f"{name('batch_size')} {self.batch_size} is not divisible by "
                f"{name('world_size')} {self.world_size}"
            )
        if self.peer_copy and self.route != "survivor":
            raise ConfigError(f"{name('peer_copy')}: only on the survivor route")

    @property
    def train_dir(self) -> Path:
        """The training run's directory (checkpoints and the trainer's records)."""
        return self.run_dir / "train"

    @property
    def kill(self) -> str | None:
        """The ``RECD_TEST_KILL`` value (None: no failure)."""
        if self.kill_step == 0:
            return None
        return f"0:{self.kill_rank}:{self.kill_step}:{self.kill_point}"

    def options(self) -> list[str]:
        """``recd train``'s options for the route."""
        out = ["--recovery", "survivor" if self.route == "survivor" else "elastic"]
        out += ["--max-restarts", str(self.max_restarts)]
        return out + (["--peer-copy"] if self.peer_copy else [])

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["run_dir"] = str(self.run_dir)
        out["table"] = None if self.table is None else str(self.table)
        return out


@dataclass(kw_only=True, slots=True)
class DrillReport:
    """What a drill's job did, from the trainer's own records."""

    drill: Drill
    returncode: int
    """``recd train``'s exit code."""
    wall_s: float
    """The job's wall time, launcher start-up included."""
    failures: int
    """Worker deaths the launcher handled (its ``detect_launcher`` events)."""
    timeline: dict[str, Any] | None
    """:func:`recd.recovery.audit.recovery_timeline` of the kill (None: no failure, or the
    recovery did not complete)."""
    recoveries: list[dict[str, Any]]
    """The audit trail, ``.recovery.json``."""
    events: list[dict[str, Any]]
    """The event log, ``recovery/events.jsonl``."""
    result: dict[str, Any] | None
    """``train.json``'s result of the last attempt (None: the job did not finish)."""

    @property
    def log_path(self) -> Path:
        return self.drill.run_dir / "train.log"

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the job's output."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.drill.run_dir),
            "train_dir": str(self.drill.train_dir),
            "mode": self.drill.route,
            "steps": self.drill.steps,
            "world_size": self.drill.world_size,
            "kill": self.drill.kill,
            "returncode": self.returncode,
            "failures": self.failures,
            "wall_s": self.wall_s,
            "timeline": self.timeline,
            "recoveries": self.recoveries,
        }


def generate_table(root: Path, *, profile: str = "tiny", sessions: int = 1000) -> Path:
    """``profile``'s logs (``sessions`` sessions), sharded by session and clustered by the
    local ETL into ``root/table``; returns that table."""
    from recd.etl.config import EtlConfig
    from recd.etl.local import run_etl
    from recd.logs.generate import generate_logs
    from recd.logs.shard import shard_logs
    from recd.schema import load_catalogue

    generate_logs(
        load_catalogue(profile), root / "raw", seed=0, num_sessions=sessions, show_progress=False
    )
    shard_logs(root / "raw", root / "shards", key="session", num_shards=2, show_progress=False)
    run_etl(
        EtlConfig(
            shard_dir=root / "shards",
            table_dir=root / "table",
            row_group_rows=256,
            show_progress=False,
        )
    )
    return root / "table"


CONFIG = """[reader]
table = "{table}"
batch_size = {batch_size}
shuffle = "session"
num_epochs = 50

[model]
kind = "dlrm"
embedding_dim = {dim}
max_rows = {rows}
hash_ids = true

[optim]
lr = 0.01

[train]
steps = {steps}
log_every = {steps}
eval_every = 0
seed = {seed}
plot = false
run_dir = "{run_dir}"
sharding = "row_wise"

[checkpoint]
checkpoint_every = {checkpoint_every}
background = false
"""


def write_config(drill: Drill, table: Path) -> Path:
    """The drill's ``train.toml``."""
    path = drill.run_dir / "train.toml"
    path.write_text(
        CONFIG.format(
            table=Path(table).resolve(),
            batch_size=drill.batch_size // drill.world_size,
            dim=drill.dim,
            rows=drill.rows,
            steps=drill.steps,
            seed=drill.seed,
            run_dir=drill.train_dir.resolve(),
            checkpoint_every=drill.checkpoint_every,
        )
    )
    return path


def _env(drill: Drill) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(KILL_ENV, None)
    if drill.kill is not None:
        env[KILL_ENV] = drill.kill
    source = str(Path(__file__).resolve().parents[2])  # recd importable from a checkout too
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["RECD_PROGRESS"] = "0"
    return env | drill.extra_env


def run_drill(drill: Drill) -> DrillReport:
    """Run the drill's job to its end and read its records (raises :class:`ConfigError` for
    a drill that cannot run; a job that fails is reported by its exit code)."""
    drill.check()
    drill.run_dir.mkdir(parents=True, exist_ok=True)
    table = drill.table
    if table is None:
        table = generate_table(
            drill.run_dir / "table", profile=drill.profile, sessions=drill.sessions
        )
    config = write_config(drill, table)
    command = [sys.executable, "-m", "recd", "train", "--config", str(config)]
    command += ["--nproc", str(drill.world_size), *drill.options()]
    began = time.perf_counter()
    with (drill.run_dir / "train.log").open("wb") as log:
        # its own session: on a timeout the launcher, its workers and the spare go together
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=_env(drill), start_new_session=True
        )
        try:
            code = proc.wait(timeout=drill.timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -int(signal.SIGKILL)
            log.write(f"\nrecd recover: the job exceeded {drill.timeout_s} s\n".encode())
    wall = time.perf_counter() - began
    events = read_events(drill.train_dir)
    train_json = drill.train_dir / "train.json"
    result = (
        json.loads(train_json.read_text())["result"] if code == 0 and train_json.exists() else None
    )
    return DrillReport(
        drill=drill,
        returncode=code,
        wall_s=wall,
        failures=sum(e["event"] == "detect_launcher" for e in events),
        timeline=recovery_timeline(events),
        recoveries=read_recovery_records(drill.train_dir),
        events=events,
        result=result,
    )
