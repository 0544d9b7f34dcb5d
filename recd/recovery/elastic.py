"""The elastic baseline: ``recd train`` under torchrun with restarts, one worker SIGKILLed.

torchrun's elastic agent (``--max-restarts N``) watches its workers; when one dies it stops
the others, re-runs the rendezvous and starts a whole new worker group, and ``recd train
--resume`` makes every new worker load the newest valid checkpoint and replay the steps
since. :func:`run_elastic` drives this for real::

    python -m torch.distributed.run --standalone --nproc_per_node N --max-restarts R \\
        -m recd train --config CONFIG --resume

waits until rank 0's ``metrics.jsonl`` shows step ``kill_after_step`` (the config must log
every step: ``[train] log_every = 1``), sends SIGKILL to the worker whose environment says
``RANK=kill_rank``, and waits for the job to finish. Every line of torchrun's output (the
workers' too) and every new ``metrics.jsonl`` line is timestamped on arrival, and the
processes are polled for their pids, so the recovery splits into (:class:`ElasticTimeline`):

- ``detection``: the kill until the agent reports the worker group failed;
- ``restart``: until the new worker processes exist (the agent stops the survivors and
  re-runs its rendezvous);
- ``startup``: until rank 0 logged ``resumed from`` / ``resume:`` (interpreter
  start, imports, process group rendezvous, model and DMP build, checkpoint load: the trainer
  logs no finer mark);
- ``first_step``: until the first step after the resume was logged;
- ``replay``: until the step logged last before the kill was logged again (lost work);
- ``total``: the kill until then.

``lost_steps`` is the last step logged before the kill minus the checkpoint step resumed from.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from recd.checkpoint.atomic import list_checkpoints
from recd.errors import RecoveryError
from recd.train.launch import torchrun_command

__all__ = ["ElasticReport", "ElasticTimeline", "elastic_command", "run_elastic"]

_FAILED = re.compile(r"Worker group FAILED|worker group failed|failed \(exitcode", re.I)
_RESUMED = re.compile(r"resumed from .*\(step (\d+)\)|resume: no checkpoint")


def elastic_command(
    config: Path, *, nproc: int = 2, max_restarts: int = 1, recd_args: list[str] | None = None
) -> list[str]:
    """torchrun running ``recd train --config CONFIG --resume`` with restarts."""
    recd = ["train", "--config", str(config), "--resume", *(recd_args or [])]
    return torchrun_command(nproc, recd, max_restarts=max_restarts)


@dataclass(kw_only=True, slots=True)
class ElasticTimeline:
    """Phases of the recovery in seconds (module docstring)."""

    killed_at_step: int
    """The last step rank 0 logged before the kill."""
    resumed_at_step: int
    """The checkpoint step the new group resumed from."""
    lost_steps: int
    detection: float
    restart: float
    startup: float
    first_step: float
    replay: float
    total: float

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(kw_only=True, slots=True)
class ElasticReport:
    """What :func:`run_elastic` saw."""

    returncode: int
    timeline: ElasticTimeline | None
    """None when no restart was observed."""
    lines: list[tuple[float, str]] = field(default_factory=list)
    """torchrun's (and the workers') output, timestamped."""
    metrics: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    """Rank 0's ``metrics.jsonl`` records, timestamped on arrival."""
    restarts: int = 0
    """Worker groups started after the first."""


class _Watch:
    """Timestamps torchrun's output lines, ``metrics.jsonl`` lines and worker pids."""

    def __init__(self, proc: subprocess.Popen[str], metrics: Path) -> None:
        self.proc = proc
        self.metrics_path = metrics
        self.lines: list[tuple[float, str]] = []
        self.metrics: list[tuple[float, dict[str, Any]]] = []
        self.workers: dict[int, tuple[float, int | None]] = {}
        """pid -> (first seen, rank)."""
        self._offset = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._read_output, daemon=True),
            threading.Thread(target=self._poll, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read_output(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def _read_metrics(self, now: float) -> None:
        """Append the complete metrics lines written since the last read."""
        if not self.metrics_path.exists():
            return
        if self.metrics_path.stat().st_size < self._offset:
            # A fresh start (no checkpoint to resume from) truncates the file: read it anew.
            self._offset = 0
        with self.metrics_path.open() as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self._offset += len(complete.encode())
        for line in complete.splitlines():
            if line.strip():
                self.metrics.append((now, json.loads(line)))

    def _poll(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            self._read_metrics(now)
            try:
                children = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                children = []
            for child in children:
                seen, rank = self.workers.get(child.pid, (now, None))
                if rank is not None:
                    continue
                # A child caught between fork and exec still shows torchrun's environment
                # (no RANK): keep asking until its own environment appears.
                try:
                    env = child.environ()
                except (psutil.Error, OSError):
                    env = {}
                self.workers[child.pid] = (seen, int(env["RANK"]) if "RANK" in env else None)
            time.sleep(0.01)

    def last_step(self) -> int:
        steps = [r["step"] for _, r in self.metrics if r.get("kind") == "train"]
        return max(steps, default=0)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        # Lines written after the last poll (the final steps of a short replay) count too.
        self._read_metrics(time.time())


def run_elastic(
    config: Path,
    run_dir: Path,
    *,
    kill_after_step: int,
    kill_rank: int = 1,
    nproc: int = 2,
    max_restarts: int = 1,
    timeout_s: float = 300.0,
    env: dict[str, str] | None = None,
    after_a_checkpoint: bool = False,
) -> ElasticReport:
    """Run the job under torchrun, SIGKILL rank ``kill_rank`` once rank 0 logged step
    ``kill_after_step``, wait for the end; ``run_dir`` is the config's ``[train] run_dir``
    (where its checkpoints go too).

    ``after_a_checkpoint``: also wait until a checkpoint file is committed, so the group
    resumes from one rather than from step 0 (a background write may still be running at
    ``kill_after_step`` on a loaded machine)."""
    command = elastic_command(config, nproc=nproc, max_restarts=max_restarts)
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    watch = _Watch(proc, run_dir / "metrics.jsonl")
    deadline = time.monotonic() + timeout_s
    killed: tuple[float, int, int] | None = None  # (time, pid, last step)
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise RecoveryError(f"{run_dir}: the torchrun job did not end in {timeout_s} s")
            ready = not after_a_checkpoint or bool(list_checkpoints(run_dir))
            if killed is None and ready and watch.last_step() >= kill_after_step:
                victims = [p for p, (_, r) in watch.workers.items() if r == kill_rank]
                live = [p for p in victims if psutil.pid_exists(p)]
                if live:
                    step = watch.last_step()
                    os.kill(live[-1], signal.SIGKILL)
                    killed = (time.time(), live[-1], step)
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        watch.close()
    resumes = sum(1 for _, line in watch.lines if _RESUMED.search(line))  # rank 0's
    report = ElasticReport(
        returncode=proc.returncode,
        timeline=None,
        lines=watch.lines,
        metrics=watch.metrics,
        restarts=max(0, resumes - 1),
    )
    if killed is not None:
        report.timeline = _timeline(watch, killed, nproc)
    return report


def _timeline(watch: _Watch, killed: tuple[float, int, int], nproc: int) -> ElasticTimeline | None:
    t0, _victim, step = killed
    failed = [t for t, line in watch.lines if t >= t0 and _FAILED.search(line)]
    new_workers = [
        seen for pid, (seen, rank) in watch.workers.items() if seen > t0 and rank is not None
    ]
    resumed = [
        (t, m) for t, line in watch.lines if t >= t0 and (m := _RESUMED.search(line)) is not None
    ]
    if not failed or len(new_workers) < nproc or not resumed:
        return None
    detect = failed[0]
    started = sorted(new_workers)[nproc - 1]
    loaded = resumed[0][0]  # rank 0 logs the resume
    resumed_at = int(resumed[0][1].group(1) or 0)
    # lines of the old group (it runs on until it notices) come before the resume
    after = [(t, r) for t, r in watch.metrics if t > loaded and r.get("kind") == "train"]
    first = next((t for t, r in after if r["step"] == resumed_at + 1), None)
    back = next((t for t, r in after if r["step"] >= max(step, resumed_at + 1)), None)
    if first is None or back is None:
        return None
    return ElasticTimeline(
        killed_at_step=step,
        resumed_at_step=resumed_at,
        lost_steps=step - resumed_at,
        detection=detect - t0,
        restart=started - detect,
        startup=loaded - started,
        first_step=first - loaded,
        replay=back - first,
        total=back - t0,
    )
