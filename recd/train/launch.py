"""Multi-process training: launch ``recd train`` under torchrun, and join its process group.

``recd train --nproc N`` (N > 1) re-runs itself as N workers::

    python -m torch.distributed.run --standalone --nproc_per_node N -m recd train ARGS...

with the same arguments. Each worker sees torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``), so it does not launch again
(:func:`in_torchrun`) and instead joins the process group with :func:`init_distributed`:
``gloo`` on CPU, ``nccl`` on GPU (one GPU per local rank).

Signals: torchrun's agent forwards SIGTERM/SIGINT to its workers (not SIGUSR1); signal the
workers themselves (their pids, or the process group) for anything else.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import torch

from recd.errors import ConfigError

__all__ = [
    "DistContext",
    "Nodes",
    "destroy_distributed",
    "in_torchrun",
    "init_distributed",
    "launch_torchrun",
    "torchrun_command",
]

log = logging.getLogger(__name__)

_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True, slots=True)
class DistContext:
    """This process's place in a multi-process job."""

    rank: int
    """Global rank in [0, world_size)."""
    world_size: int
    """Number of trainer processes."""
    local_rank: int
    """Rank on this machine (selects the GPU)."""
    backend: str
    """``gloo`` (CPU) or ``nccl`` (GPU)."""
    device: torch.device
    """Where this rank computes."""
    store: Any = None
    """The job's rendezvous store (torchrun's or recd's launcher's), unprefixed."""
    attempt: int = 0
    """Restarts of the whole worker group before this one (torchrun's restart count)."""
    generation: int = 0
    """Survivor-recovery generation this process joined first (0 unless a replacement)."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes files and shows progress."""
        return self.rank == 0


def in_torchrun() -> bool:
    """Whether this process is a torchrun worker (its environment names a rank and a world)."""
    return all(name in os.environ for name in _TORCHRUN_ENV)


@dataclass(frozen=True, slots=True)
class Nodes:
    """Where this machine stands in a job over several machines (torchrun's static
    rendezvous: every node is started with the same ``nnodes`` and endpoint and its own
    ``node_rank``; node 0's endpoint hosts the rendezvous)."""

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    """``HOST:PORT`` of node 0, reachable from every node (required when ``nnodes > 1``)."""

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise ConfigError(f"--nnodes: expected an integer >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(
                f"--node-rank: expected an integer in [0, {self.nnodes}), got {self.node_rank}"
            )
        if self.nnodes > 1:
            host, _, port = (self.rdzv_endpoint or "").rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(
                    f"--rdzv-endpoint: expected HOST:PORT of node 0 with --nnodes "
                    f"{self.nnodes}, got {self.rdzv_endpoint!r}"
                )

    @property
    def multi(self) -> bool:
        return self.nnodes > 1


def torchrun_command(
    nproc: int, recd_args: list[str], *, max_restarts: int = 0, nodes: Nodes | None = None
) -> list[str]:
    """The command that runs ``recd RECD_ARGS`` as ``nproc`` workers on this machine (of
    ``nodes.nnodes`` machines; default: this one only).

    ``max_restarts``: torchrun restarts the whole worker group this many times when a worker
    fails (the elastic baseline: every worker resumes from the newest checkpoint); one machine
    only (a static rendezvous over several machines cannot restart).
    """
    nodes = nodes or Nodes()
    if nproc < 1:
        raise ConfigError(f"--nproc: expected an integer >= 1, got {nproc}")
    if max_restarts < 0:
        raise ConfigError(f"--max-restarts: expected an integer >= 0, got {max_restarts}")
    if nodes.multi and max_restarts:
        raise ConfigError(
            "--max-restarts with --nnodes > 1: restarts need an elastic (c10d) rendezvous, "
            "which recd does not set up; restart the job with --resume instead"
        )
    where = (
        [
            "--nnodes",
            str(nodes.nnodes),
            "--node-rank",
            str(nodes.node_rank),
            "--rdzv-backend",
            "static",
            "--rdzv-endpoint",
            str(nodes.rdzv_endpoint),
        ]
        if nodes.multi
        else ["--standalone"]
    )
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *where,
        "--nproc_per_node",
        str(nproc),
        "--max-restarts",
        str(max_restarts),
        "-m",
        "recd",
        *recd_args,
    ]


def launch_torchrun(
    nproc: int,
    recd_args: list[str],
    *,
    timeout_s: float | None = None,
    max_restarts: int = 0,
    nodes: Nodes | None = None,
) -> int:
    """Run ``recd RECD_ARGS`` under torchrun with ``nproc`` workers; return its exit code.

    The workers inherit this process's stdout/stderr. ``timeout_s``: kill the job after that
    long (exit code 124).
    """
    command = torchrun_command(nproc, recd_args, max_restarts=max_restarts, nodes=nodes)
    log.info("launching %d workers: %s", nproc, " ".join(command))
    try:
        return subprocess.run(command, check=False, timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        log.error("torchrun job timed out after %s s", timeout_s)
        return 124


def init_distributed(device: str = "auto") -> DistContext:
    """Join the torchrun job's process group (``env://``): nccl on GPU, gloo on CPU.

    ``device``: ``cpu``, ``cuda`` or ``auto`` (cuda when available). With cuda each local
    rank takes GPU ``LOCAL_RANK``.
    """
    import torch.distributed as dist

    if not in_torchrun():
        missing = [n for n in _TORCHRUN_ENV if n not in os.environ]
        raise ConfigError(
            f"distributed training: not a torchrun worker (no {', '.join(missing)} in the "
            "environment); start it with `recd train --nproc N`"
        )
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        if torch.cuda.device_count() <= local_rank:
            raise ConfigError(
                f"train.device: cuda, but local rank {local_rank} has no GPU "
                f"({torch.cuda.device_count()} visible)"
            )
        target = torch.device("cuda", local_rank)
        torch.cuda.set_device(target)
        backend = "nccl"
    else:
        target = torch.device("cpu")
        backend = "gloo"
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    generation = int(os.environ.get("RECD_RECOVERY_GENERATION", "0"))
    base = None
    if not dist.is_initialized():
        # After an elastic restart the rendezvous store still holds the previous attempt's
        # keys, and a plain env:// init under gloo never connects: give every attempt its own
        # key prefix (the same symptom as pytorch/pytorch#167288 with NCCL); survivor
        # recovery adds a generation per replacement (recd.recovery.rejoin).
        from torch.distributed.rendezvous import rendezvous

        base, _, _ = next(rendezvous("env://", rank=rank, world_size=world_size))
        prefix = f"recd/attempt_{attempt}"
        timeout = None
        if os.environ.get("RECD_RECOVERY") == "survivor":
            prefix += f"/gen_{generation}/pg"
            import datetime

            timeout = datetime.timedelta(seconds=120)  # the backstop of a silent peer
        store = dist.PrefixStore(prefix, base)
        dist.init_process_group(
            backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
    return DistContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        backend=backend,
        device=target,
        store=base,
        attempt=attempt,
        generation=generation,
    )


def destroy_distributed() -> None:
    """Leave the process group (no-op when none was joined)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
