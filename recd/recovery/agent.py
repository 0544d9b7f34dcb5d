"""The launcher of ``recd train --nproc N --recovery survivor``: workers, a warm spare, failures.

torchrun's elastic agent handles a worker's death by stopping every worker and starting the
whole group again (``--max-restarts``); it cannot replace one worker while the others keep
training, which survivor recovery needs (:mod:`recd.recovery.rejoin`). This launcher does
the agent's job for one machine, torchrun-compatibly: each worker is ``python -m recd train
ARGS`` with torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT`` of a ``TCPStore`` this process hosts,
``TORCHELASTIC_USE_AGENT_STORE``, ``TORCHELASTIC_RESTART_COUNT``), so a worker cannot tell
the two launchers apart, and it watches them:

- a worker **killed by a signal** (SIGKILL, OOM killer, a crash) while no recovery is under
  way: publish the failure notice (``recd/attempt_A/gen_G/failure`` in the store) and start a
  replacement for its rank in generation G+1: the **warm spare** (a process started with the
  job that imports torch, torchrec, recd and pyiceberg during the workers' start-up and waits
  for an assignment, :mod:`recd.recovery.spare`) or, without a warm one, a fresh interpreter.
  The survivors agree, undo and hand over the state; the recovery is over when every rank of
  G+1 completed a step. Only then is the next spare started, importing at idle CPU priority,
  so that it takes no CPU time from the recovery or from training;
- a worker that **exits with another code**, or any death **during a recovery**: the
  elastic restart, as torchrun does it: every worker is stopped and a new group (attempt A+1)
  resumes from the newest valid checkpoint, up to ``--max-restarts`` times; exit code 2 (bad
  input: every rank would fail the same way) ends the job at once;
- every worker exited 0: the job is done.

SIGTERM and SIGUSR1 sent to this process go to the workers (checkpoint and stop; checkpoint
and continue). Every restart is recorded in the run's audit trail (``.recovery.json``, route
``restart``, with the steps lost) and in ``.loss.json`` (an ``{"event": "recovery"}`` record);
survivor recoveries are recorded by the replacement. Timestamped events go to
``CHECKPOINT_DIR/recovery/events.jsonl``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from recd.recovery.audit import append_event, append_recovery_record
from recd.recovery.env import (
    GENERATION_ENV,
    MODE_ENV,
    PEER_COPY_ENV,
    ROLE_ENV,
    SPARE_ENV,
    SPARE_IDLE_ENV,
    UNDO_ENV,
    store_key,
)
from recd.recovery.rejoin import EXIT_FALLBACK

__all__ = ["AgentConfig", "run_agent"]

log = logging.getLogger(__name__)

_POLL_S = 0.02


@dataclass(kw_only=True, slots=True)
class AgentConfig:
    nproc: int
    """Worker processes."""
    recd_args: list[str]
    """Each worker's ``recd`` arguments (``train --config ... --resume``)."""
    checkpoint_dir: Path
    """Where the audit trail and the events go (the run's checkpoint directory)."""
    max_restarts: int = 0
    """Elastic restarts of the whole group when survivor recovery is impossible."""
    spare: bool = True
    """Keep one warm spare process for the next replacement."""
    survivor: bool = True
    """False: every failure restarts the whole group from the newest checkpoint (torchrun's
    policy, from this launcher: the like-for-like baseline of survivor recovery)."""
    undo: str = "copy"
    """How a survivor takes back an update (``copy`` or ``inverse``: recd.recovery.undo)."""
    peer_copy: bool = False
    """Every rank keeps a copy of its ring predecessor's table shards (exact recovery)."""
    steps: int | None = None
    """The job's ``train.steps``: a worker that dies once every step is done (while the
    others write the last checkpoint and exit) is not replaced by a survivor recovery, which
    would wait for peers that are gone; the restart finds the steps done."""


@dataclass(slots=True)
class _Job:
    attempt: int = 0
    generation: int = 0
    recovering: int | None = None
    """The generation being recovered into (None: no recovery under way)."""
    attempt_started: bool = False
    """Every rank of the current attempt completed a step: a survivor recovery needs
    survivors that are training, not still starting up."""
    restarts: int = 0
    spares: int = 0


def run_agent(config: AgentConfig) -> int:
    """Run the job; returns its exit code (0: every worker finished)."""
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=300),
    )
    agent = _Agent(config, store)
    with agent.forwarding_signals():
        try:
            return agent.run()
        finally:
            agent.stop_all(include_spare=True)


class _Agent:
    def __init__(self, config: AgentConfig, store: Any) -> None:
        self.config = config
        self.store = store
        self.port = store.port
        self.job = _Job()
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.done: set[int] = set()
        self.spare: tuple[int, subprocess.Popen[bytes]] | None = None
        self.spare_idle = False
        """Whether the spare imports at idle priority (every spare but the job's first)."""
        self.events = Path(config.checkpoint_dir)

    # ------------------------------------------------------------------ processes
    def _env(self, rank: int | None, role: str) -> dict[str, str]:
        n = self.config.nproc
        env = dict(os.environ)
        env.update(
            {
                "WORLD_SIZE": str(n),
                "LOCAL_WORLD_SIZE": str(n),
                "GROUP_RANK": "0",
                "ROLE_WORLD_SIZE": str(n),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(self.port),
                "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCHELASTIC_RESTART_COUNT": str(self.job.attempt),
                "TORCHELASTIC_MAX_RESTARTS": str(self.config.max_restarts),
                "TORCHELASTIC_RUN_ID": "recd",
                MODE_ENV: "survivor" if self.config.survivor else "elastic",
                UNDO_ENV: self.config.undo,
                PEER_COPY_ENV: "1" if self.config.peer_copy else "0",
                GENERATION_ENV: str(self.job.generation),
                ROLE_ENV: role,
            }
        )
        if rank is None:
            for name in ("RANK", "LOCAL_RANK", "ROLE_RANK"):
                env.pop(name, None)
        else:
            env.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "ROLE_RANK": str(rank)})
        return env

    def _spawn(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "recd", *self.config.recd_args], env=env)

    def start_group(self) -> None:
        for rank in range(self.config.nproc):
            self.workers[rank] = self._spawn(self._env(rank, "worker"))
        append_event(
            self.events, "spawn", rank=-1, ranks=self.config.nproc, attempt=self.job.attempt
        )

    def start_spare(self, *, idle: bool = False) -> None:
        if not (self.config.spare and self.config.survivor):
            return
        self.job.spares += 1
        env = self._env(None, "spare")
        env[SPARE_ENV] = str(self.job.spares)
        if idle:
            env[SPARE_IDLE_ENV] = "1"
        self.spare = (self.job.spares, self._spawn(env))
        self.spare_idle = idle
        append_event(self.events, "spare", rank=-1, spare=self.job.spares, idle=idle)

    def _take_spare(self) -> tuple[tuple[int, subprocess.Popen[bytes]] | None, str]:
        """The spare (id, process) to use as a replacement (None: start a fresh process) and
        how the replacement starts."""
        spare, self.spare = self.spare, None
        if spare is None or spare[1].poll() is not None:
            return None, "new process"
        key = f"recd/spare/{spare[0]}"
        warm = self.store.check([f"{key}/warm"])
        if self.spare_idle and not warm:  # still importing at idle priority: slower than new
            spare[1].kill()
            spare[1].wait()
            lowered = self.store.check([f"{key}/lowered"])
            return None, "new process (the idle spare " + (
                "kept a thread at idle priority)" if lowered else "was still importing)"
            )
        return spare, "warm spare" if warm else "spare (still importing)"

    def replace(self, rank: int) -> None:
        """Start the replacement of ``rank`` in the current generation (the spare if warm)."""
        spare, how = self._take_spare()
        if spare is not None:
            assignment = {
                "rank": rank,
                "generation": self.job.generation,
                "attempt": self.job.attempt,
            }
            self.store.set(f"recd/spare/{spare[0]}", json.dumps(assignment))
            self.workers[rank] = spare[1]
        else:
            self.workers[rank] = self._spawn(self._env(rank, "replacement"))
        append_event(self.events, "spawn", rank=-1, replaced=rank, gen=self.job.generation, how=how)

    def stop_all(self, *, include_spare: bool = False) -> None:
        """SIGKILL every worker (and its reader processes); the spare too if asked."""
        import psutil

        procs = list(self.workers.values())
        if include_spare and self.spare is not None:
            procs.append(self.spare[1])
            self.spare = None
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(psutil.Error):
                    for child in psutil.Process(p.pid).children(recursive=True):
                        child.kill()
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
        for p in procs:
            p.wait()
        self.workers.clear()

    # ------------------------------------------------------------------ the loop
    def _key(self, name: str) -> str:
        return store_key(self.job.attempt, self.job.generation, name)

    def run(self) -> int:
        self.start_group()
        self.start_spare()  # with the group: warm by the time training starts (recd.recovery.spare)
        n = self.config.nproc
        started = False
        while True:
            time.sleep(_POLL_S)
            job = self.job
            first_steps = 0 if job.attempt_started else self.store.add(self._key("first_step"), 0)
            if not job.attempt_started and job.generation == 0 and first_steps >= n:
                job.attempt_started = True  # every rank of this attempt completed a step
                if not started:
                    started = True
                    append_event(self.events, "started", rank=-1, attempt=job.attempt)
            if self.spare is None and started and job.recovering is None:
                self.start_spare(idle=True)  # the spare was used (or died): the next one
            if job.recovering is not None:
                key = self._key("first_step")
                if self.store.add(key, 0) >= n:
                    append_event(self.events, "recovered", rank=-1, gen=job.recovering)
                    job.recovering = None
            exited = [(rank, p.poll()) for rank, p in self.workers.items()]
            # a death by signal first: the others' exits follow from it
            for rank, code in sorted(
                ((r, c) for r, c in exited if c is not None), key=lambda x: (x[1] >= 0, x[0])
            ):
                del self.workers[rank]
                if code == 0:
                    self.done.add(rank)
                    continue
                outcome = self._on_failure(rank, code)
                if outcome is not None:
                    return outcome
                break  # the worker set changed
            if not self.workers and len(self.done) == n:
                return 0

    def _on_failure(self, rank: int, code: int) -> int | None:
        """Handle ``rank``'s exit with ``code``; returns the job's exit code when it ends."""
        job = self.job
        killed = code < 0
        what = f"signal {signal.Signals(-code).name}" if killed else f"exit code {code}"
        append_event(
            self.events, "detect_launcher", rank=-1, failed_rank=rank, code=code, gen=job.generation
        )
        if code == 2 and job.recovering is None:
            log.error("rank %d failed with exit code 2 (bad input): the job stops", rank)
            return 2
        survivable = job.attempt_started and not self._all_steps_done()
        if killed and job.recovering is None and not self.done and self.config.survivor:
            if not survivable:
                log.warning(
                    "rank %d died (%s) %s: restarting instead of a survivor recovery",
                    rank,
                    what,
                    "before its group's first step"
                    if not job.attempt_started
                    else "after the last step",
                )
                return self._restart(rank, code, f"rank {rank} failed ({what})")
            log.warning(
                "rank %d died (%s): survivor recovery (generation %d)",
                rank,
                what,
                job.generation + 1,
            )
            notice = {"failed_ranks": [rank], "generation": job.generation, "code": code}
            self.store.set(self._key("failure"), json.dumps(notice))
            job.generation += 1
            job.recovering = job.generation
            self.replace(rank)
            return None
        reason = (
            f"rank {rank} died ({what}) during a recovery"
            if job.recovering is not None
            else f"rank {rank} failed ({what})"
            + (": survivor recovery impossible" if code == EXIT_FALLBACK else "")
        )
        return self._restart(rank, code, reason)

    def _restart(self, rank: int, code: int, reason: str) -> int | None:
        """Restart every worker from the newest checkpoint (or stop: no restarts left)."""
        job = self.job
        if job.restarts >= self.config.max_restarts:
            log.error(
                "%s; no restarts left (--max-restarts %d): the job stops",
                reason,
                self.config.max_restarts,
            )
            return code if code > 0 else 1
        log.warning("%s: restarting every worker from the newest checkpoint", reason)
        self.stop_all()
        self._record_restart(rank, code, reason)
        job.restarts += 1
        job.attempt += 1
        job.generation = 0
        job.recovering = None
        job.attempt_started = False
        self.done.clear()
        self.start_group()
        return None

    def _all_steps_done(self) -> bool:
        """Every step of the job is in ``.loss.json`` (the workers are finishing up)."""
        if self.config.steps is None:
            return False
        from recd.checkpoint.sidecars import read_loss_history

        try:
            history = read_loss_history(self.config.checkpoint_dir)
        except Exception:  # an unreadable history: not a reason to change routes
            return False
        return int(max(history.steps, default=0)) >= self.config.steps

    def _record_restart(self, rank: int, code: int, reason: str) -> None:
        """The elastic restart in the audit trail and in ``.loss.json``."""
        from recd.checkpoint import checkpoint_step, newest_valid_checkpoint
        from recd.checkpoint.sidecars import LossLog, read_loss_history

        run_dir = self.config.checkpoint_dir
        newest = newest_valid_checkpoint(run_dir)  # full or delta (its whole chain valid)
        ckpt_step = None if newest is None else checkpoint_step(newest)
        history = read_loss_history(run_dir)
        last = int(max(history.steps, default=0))
        lost = last - (ckpt_step or 0)
        record = {
            "event": "elastic_restart",
            "route": "restart",
            "time": time.time(),
            "attempt": self.job.attempt + 1,
            "failed_ranks": [rank],
            "exit_code": code,
            "reason": reason,
            "checkpoint": None if newest is None else newest.name,
            "checkpoint_step": ckpt_step,
            "last_completed_step": last,
            "steps_lost": lost,
            "bit_exact": True,
        }
        append_recovery_record(run_dir, record)
        if (run_dir / ".loss.json").exists():
            with contextlib.closing(LossLog(run_dir)) as losses:
                losses.write_event(
                    "recovery",
                    at_step=ckpt_step or 0,
                    route="restart",
                    attempt=self.job.attempt + 1,
                    steps_lost=lost,
                )
        append_event(
            self.events,
            "restart",
            rank=-1,
            attempt=self.job.attempt + 1,
            checkpoint_step=ckpt_step,
            steps_lost=lost,
        )

    # ------------------------------------------------------------------ signals
    @contextlib.contextmanager
    def forwarding_signals(self) -> Iterator[None]:
        def forward(signum: int, frame: FrameType | None) -> None:
            for p in list(self.workers.values()):
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signum)
            log.info("forwarded %s to %d worker(s)", signal.Signals(signum).name, len(self.workers))

        sigs = (signal.SIGTERM, signal.SIGUSR1)
        previous = {sig: signal.signal(sig, forward) for sig in sigs}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
