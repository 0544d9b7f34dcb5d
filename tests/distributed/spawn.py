"""Run a function in N real processes joined by a gloo process group, with a hard deadline.

``run_workers(fn, world_size=2, timeout_s=120, args=...)`` starts ``world_size`` processes,
each joins a gloo group on a free localhost port and calls ``fn(rank, world_size, *args)``;
the return values come back to the caller (pickled through files, so a large result can never
block a pipe). If any worker fails, its traceback is raised in the caller; if the deadline
passes, every worker is killed and :class:`WorkerTimeout` is raised: a hung collective can
never stall the test suite.

Workers are forked (no re-import of torch/torchrec: seconds on a busy 2-core machine), so
``fn`` may be any function, including one defined in a test module.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["WorkerFailed", "WorkerTimeout", "free_port", "run_workers"]


class WorkerFailed(RuntimeError):
    """A worker raised or died; the message holds its traceback or exit code."""


class WorkerTimeout(RuntimeError):
    """The workers did not finish within the deadline (they were killed)."""


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    timeout_s: float,
    args: Sequence[Any],
    out_dir: str,
) -> None:
    import torch
    import torch.distributed as dist

    out = Path(out_dir)
    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        try:
            result = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        (out / f"{rank}.tmp").write_bytes(pickle.dumps(result))
        os.replace(out / f"{rank}.tmp", out / f"{rank}.pkl")
    except BaseException:
        (out / f"{rank}.err").write_text(traceback.format_exc())
        os._exit(1)
    os._exit(0)  # skip atexit handlers inherited from the forked parent (pytest's)


def run_workers(
    fn: Callable[..., Any],
    *,
    world_size: int = 2,
    timeout_s: float = 120.0,
    args: Sequence[Any] = (),
) -> list[Any]:
    """``[fn(rank, world_size, *args) for each rank]``, each run in its own process."""
    ctx = mp.get_context("fork")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="recd-workers-") as out_dir:
        procs = [
            ctx.Process(
                target=_entry,
                args=(fn, rank, world_size, port, timeout_s, tuple(args), out_dir),
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        try:
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
                if p.exitcode is not None and p.exitcode != 0:
                    break  # one failed: the others may wait forever in a collective
        finally:
            alive = [p for p in procs if p.is_alive()]
            for p in alive:
                p.kill()
            for p in alive:
                p.join(10)
        errors = []
        for rank, p in enumerate(procs):
            err = Path(out_dir, f"{rank}.err")
            if err.exists():
                errors.append(f"rank {rank} failed:\n{err.read_text()}")
            elif p.exitcode not in (0, None) and p not in alive:
                errors.append(f"rank {rank} exited with code {p.exitcode}")
        if errors:
            raise WorkerFailed("\n".join(errors))
        if alive:
            raise WorkerTimeout(
                f"ranks {[procs.index(p) for p in alive]} still running after {timeout_s} s "
                "(killed)"
            )
        return [pickle.loads(Path(out_dir, f"{r}.pkl").read_bytes()) for r in range(world_size)]
