"""Survivor-based recovery of a hybrid-parallel DLRM job (SwIFT's replication-based recovery).

When a rank dies in the middle of a step, the job does not go back to its last checkpoint:

1. **Detect.** The survivors' next collective (DDP's all-reduce, torchrec's all-to-all) fails
   as soon as the dead peer's sockets close (gloo), and the launcher (:func:`run_job`, the
   elastic agent's role) sees the process exit and writes ``failure_gen<G>.json`` naming it.
2. **Agree.** Every rank records ``completed step k`` (``progress/rank<R>``, an atomic
   rename) right after its optimizer step. The last step completed by everyone is the
   minimum over all ranks, the dead one included; a survivor is at most one step ahead of it
   (a step's update starts only after that step's gradient all-reduce, which needed every
   rank: see :mod:`recd.recovery.undo`).
3. **Undo.** A survivor ahead of the agreed step takes its last step back with its
   :class:`~recd.recovery.undo.UndoRecord` (``ShardedAdam.step(capture=True)`` returns it:
   dense layers *and* its own table shards, bit-exactly): every survivor is then at the
   agreed step, and no snapshot was ever taken.
4. **Provide the dense state.** The dense layers (and their Adam m, v, step) are replicated
   under DDP, so the lowest surviving rank writes them (``recovery/dense_gen<G>.npz``, a few
   hundred kB for a DLRM's MLPs) for the replacement: no checkpoint is read for them.
5. **Rejoin.** Survivors leave the broken process group and join generation G+1 (a new
   FileStore rendezvous) with the replacement, which the launcher forks from a warm process
   (imports done: the pre-started spare of an elastic pool). Survivors keep their own table
   shards in memory (re-sharded identically: same plan, same world size).
6. **Partial recovery of the dead rank's tables.** Its embedding shard is not replicated, so
   it comes from the newest valid checkpoint (Maeng et al., MLSys'21): rows updated after that
   checkpoint lose those updates (weights, m and v go back to the checkpoint's values, the
   step counter stays at the agreed step). This is *not* bit-exact unless the checkpoint is
   at the agreed step. Every recovery is recorded in the run's audit trail
   (``.recovery.json``, one JSON object per line): generation, failed rank, agreed step,
   undone steps and whether each undo was exact, the checkpoint used, the rows of each table
   whose updates were lost (recomputed from the batches of the lost steps), and ``bit_exact``.

The baseline, ``mode="restart"``, is what torchrun's elastic agent does on the same job: on a
worker's death it stops every worker and starts a whole new group that loads the newest
checkpoint and replays the steps since (bit-exact, but every rank loses them).

The job (:class:`SurvivorJob`) is a real 2+-process CPU job: torchrec's DMP shards the tables
row-wise over gloo, :class:`recd.train.sharding.ShardedAdam` updates them, batches are a
deterministic function of (seed, step, rank) so a never-failed run is the reference. Workers
log timestamped events (``events.jsonl``) from which :func:`recovery_timeline` splits the
recovery into detection, restart, rendezvous, load, first step and replay.

Run ``recd recover RUN_DIR`` (or ``python -m recd.recovery.survivor RUN_DIR --kill-step 7``)
for one job.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from recd.durable import replacing, write_bytes_atomic
from recd.errors import RecoveryError
from recd.recovery.undo import UndoRecord, UndoResult, undo_step

__all__ = [
    "RECOVERY_FILE",
    "JobReport",
    "SurvivorJob",
    "append_recovery_record",
    "make_batch",
    "read_dense_dump",
    "read_events",
    "read_recovery_records",
    "recovery_timeline",
    "run_job",
    "touched_rows",
]

RECOVERY_FILE = ".recovery.json"
"""The run's recovery audit trail: one JSON object per recovery (JSON Lines)."""
EVENTS_FILE = "events.jsonl"

Mode = Literal["survivor", "restart"]
KillPoint = Literal["after_backward", "after_step"]


# ----------------------------------------------------------------------------- the job


@dataclass(kw_only=True, slots=True)
class SurvivorJob:
    """A small hybrid-parallel DLRM job on CPU, with an optional injected failure."""

    run_dir: Path
    """Checkpoints, progress files, events, the audit trail and dumps go here."""
    world_size: int = 2
    """Worker processes (gloo)."""
    steps: int = 10
    """Optimizer steps of the whole job."""
    checkpoint_every: int = 4
    """Full checkpoint (``step_NNNNNN.bin``, all ranks' state) every this many steps."""
    tables: int = 4
    """Embedding tables (row-wise sharded)."""
    rows: int = 1000
    """Rows per table."""
    dim: int = 8
    """Embedding width."""
    dense_features: int = 4
    """Dense input features."""
    hidden: int = 32
    """Width of the MLPs' hidden layers."""
    batch_size: int = 128
    """Global batch (split evenly over the ranks)."""
    ids_per_row: int = 3
    """Ids per row and table (pooled)."""
    seed: int = 0
    """Weights and batches."""
    lr: float = 0.01
    """Adam learning rate."""
    mode: Mode = "survivor"
    """``survivor``: the recovery above; ``restart``: everyone restarts from the checkpoint."""
    kill_rank: int | None = None
    """Rank that SIGKILLs itself (None: no failure)."""
    kill_step: int = 0
    """The step in which it dies."""
    kill_point: KillPoint = "after_backward"
    """``after_backward``: its gradients were all-reduced, its update never ran;
    ``after_step``: its update ran but it died before recording the step."""
    dump_dense_at: list[int] = field(default_factory=list)
    """Steps at which every rank dumps its dense state (``dumps/``), also right after a
    recovery at the agreed step."""
    step_delay_s: float = 0.0
    """Extra sleep per step (a stand-in for a longer step when benchmarking)."""
    timeout_s: float = 120.0
    """The whole job is killed after this long (:class:`RecoveryError`)."""
    collective_timeout_s: float = 30.0
    """gloo's timeout: the backstop when a dead peer is not noticed by its sockets."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["run_dir"] = str(self.run_dir)
        return d


def model_config_of(job: SurvivorJob) -> Any:
    """The job's :class:`models.ModelConfig`."""
    from recd.models.dlrm import ModelConfig

    return ModelConfig(
        dense_in_features=job.dense_features,
        num_embeddings={f"t{i}": job.rows for i in range(job.tables)},
        embedding_dim=job.dim,
        bottom_mlp=[job.hidden, job.dim],
        top_mlp=[job.hidden, 1],
    )


def _local_rows(job: SurvivorJob) -> int:
    if job.batch_size % job.world_size:
        raise RecoveryError(
            f"batch_size {job.batch_size} is not divisible by world_size {job.world_size}"
        )
    return job.batch_size // job.world_size


def _batch_ids(job: SurvivorJob, step: int, rank: int) -> tuple[np.random.Generator, np.ndarray]:
    """The rng after drawing the ids, and the ids (tables x local rows x ids_per_row)."""
    rng = np.random.default_rng([job.seed, step, rank])
    n = _local_rows(job)
    skewed = (rng.zipf(1.2, (job.tables, n, job.ids_per_row)) - 1) % job.rows
    return rng, skewed.astype(np.int64)


def make_batch(job: SurvivorJob, step: int, rank: int) -> tuple[torch.Tensor, Any, torch.Tensor]:
    """(dense B x N, KJT, labels B x 1) of ``rank``'s part of step ``step``'s global batch."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    rng, ids = _batch_ids(job, step, rank)
    n = _local_rows(job)
    dense = torch.from_numpy(rng.standard_normal((n, job.dense_features)).astype(np.float32))
    labels = torch.from_numpy((rng.random((n, 1)) < 0.3).astype(np.float32))
    lengths = torch.full((job.tables * n,), job.ids_per_row, dtype=torch.int64)
    kjt = KeyedJaggedTensor(
        keys=[f"t{i}" for i in range(job.tables)],
        values=torch.from_numpy(ids.reshape(-1)),
        lengths=lengths,
    )
    return dense, kjt, labels


def touched_rows(job: SurvivorJob, first: int, last: int, table: int) -> np.ndarray:
    """Sorted unique rows of table ``table`` looked up by the global batches of steps
    ``first .. last`` (inclusive): the rows whose updates those steps made."""
    if last < first:
        return np.zeros(0, np.int64)
    parts = [
        _batch_ids(job, s, r)[1][table].reshape(-1)
        for s in range(first, last + 1)
        for r in range(job.world_size)
    ]
    return np.unique(np.concatenate(parts))


# ----------------------------------------------------------------------------- files


def _write_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode(), durable=False)  # coordinates live processes


def _progress_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "progress" / f"rank{rank}"


def _read_progress(run_dir: Path, rank: int) -> int:
    path = _progress_path(run_dir, rank)
    return int(path.read_text()) if path.exists() else 0


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


class _Events:
    """``events.jsonl``: timestamped events of every process (one short O_APPEND write each)."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.path = run_dir / EVENTS_FILE
        self.rank = rank

    def __call__(self, event: str, **fields: Any) -> None:
        record = {"t": time.time(), "rank": self.rank, "pid": os.getpid(), "event": event}
        record.update(fields)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """Every event of the job, in time order."""
    path = Path(run_dir) / EVENTS_FILE
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(events, key=lambda e: e["t"])


def _dense_arrays(opt: Any) -> dict[str, np.ndarray]:
    """``w:<name>``, ``m:<name>``, ``v:<name>`` of every dense parameter (copies)."""
    out: dict[str, np.ndarray] = {}
    for shard in opt.local_shards(copy=True):
        if shard.name in opt.dense.params:
            for key, t in (("w", shard.weights), ("m", shard.adam_m), ("v", shard.adam_v)):
                out[f"{key}:{shard.name}"] = t.numpy().reshape(-1)
    return out


def _write_npz(path: Path, arrays: dict[str, np.ndarray], step: int) -> None:
    payload: dict[str, Any] = {"step": np.array(step), **arrays}
    with replacing(path, suffix=".npz", durable=False) as tmp:
        np.savez(tmp, **payload)


def read_dense_dump(path: Path) -> tuple[int, dict[str, np.ndarray]]:
    """(step, arrays) of a dense dump or a survivor's dense state file."""
    with np.load(path) as data:
        return int(data["step"]), {k: data[k] for k in data.files if k != "step"}


def _dump_dense(job: SurvivorJob, opt: Any, rank: int, gen: int, step: int, tag: str) -> None:
    out = job.run_dir / "dumps"
    out.mkdir(exist_ok=True)
    _write_npz(out / f"step{step:06d}_gen{gen}_rank{rank}_{tag}.npz", _dense_arrays(opt), step)


def _local_flat(opt: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Full-size logical arrays holding every block this rank has (others zero)."""
    n = opt.layout.n_params
    regions = [np.zeros(n, np.float32) for _ in range(3)]
    for shard in opt.local_shards(copy=True):
        base = opt.layout.offset_of(shard.name)
        for region, t in zip(regions, (shard.weights, shard.adam_m, shard.adam_v), strict=True):
            flat = t.numpy().reshape(-1)
            at = 0
            for a, b in shard.element_ranges():
                region[base + a : base + b] = flat[at : at + b - a]
                at += b - a
    return regions[0], regions[1], regions[2]


# ----------------------------------------------------------------------------- the worker


class _PeerLostError(Exception):
    """A collective failed: a peer is gone (or the group is broken)."""


@dataclass(kw_only=True, slots=True)
class _Start:
    """How a worker (re)enters a generation."""

    role: Literal["fresh", "resume", "survivor", "replacement"]
    own: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    """A survivor's own state (full-size arrays, its blocks filled)."""
    step: int = 0


def _join(job: SurvivorJob, rank: int, gen: int) -> None:
    import torch.distributed as dist

    store = dist.FileStore(str(job.run_dir / "rdzv" / f"gen{gen}"), job.world_size)
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=job.world_size,
        timeout=datetime.timedelta(seconds=job.collective_timeout_s),
    )


def _leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        with contextlib.suppress(Exception):  # a broken group may refuse a clean shutdown
            dist.destroy_process_group()


def _build(job: SurvivorJob) -> tuple[Any, Any]:
    from torchrec.distributed import collective_utils

    from recd.optim import AdamConfig
    from recd.train.sharding import build_sharded_training

    # DMP's first construction in a process broadcasts a flag over the group and caches it
    # process-wide; a survivor rebuilding DMP in a new group must take part in that broadcast
    # with the fresh replacement, or their collectives go out of step.
    collective_utils._INITIALIZED = False
    return build_sharded_training(
        model_config_of(job), AdamConfig(lr=job.lr), plan="row_wise", seed=job.seed
    )


def _write_checkpoint(job: SurvivorJob, opt: Any, rank: int, step: int) -> None:
    from recd.checkpoint import checkpoint_path, write_checkpoint

    state = opt.gather_flat()  # a collective: every rank
    if rank == 0:
        path = checkpoint_path(job.run_dir, step)
        write_checkpoint(path, step, state.weights, state.adam_m, state.adam_v)


def _newest_checkpoint(job: SurvivorJob) -> Any:
    from recd.checkpoint import newest_valid_checkpoint, read_checkpoint

    path = newest_valid_checkpoint(job.run_dir)
    return None if path is None else read_checkpoint(path)


def _wait_for(path: Path, deadline: float, what: str) -> None:
    while not path.exists():
        if time.monotonic() > deadline:
            raise RecoveryError(f"{path}: no {what} within the deadline")
        time.sleep(0.005)


def _load(job: SurvivorJob, opt: Any, rank: int, gen: int, start: _Start, ev: _Events) -> int:
    """Put the state of ``start`` into a freshly built optimizer; returns the step."""
    if start.role == "fresh":
        return 0
    if start.role == "survivor":
        assert start.own is not None
        opt.load_flat(
            step=start.step, weights=start.own[0], adam_m=start.own[1], adam_v=start.own[2]
        )
        return start.step
    ckpt = _newest_checkpoint(job)
    if start.role == "resume":
        if ckpt is None:
            return 0
        opt.load_flat(step=ckpt.step, weights=ckpt.weights, adam_m=ckpt.adam_m, adam_v=ckpt.adam_v)
        return int(ckpt.step)
    # replacement: dense state from a survivor, own table shards from the checkpoint
    plan = json.loads((job.run_dir / "recovery" / f"gen{gen}.json").read_text())
    agreed = int(plan["agreed_step"])
    step, dense = read_dense_dump(Path(plan["dense_file"]))
    if step != agreed:
        raise RecoveryError(f"{plan['dense_file']}: dense state of step {step}, agreed {agreed}")
    n = opt.layout.n_params
    if ckpt is None:  # no checkpoint yet: the tables restart from the seed's initial weights
        zeros = np.zeros(n, np.float32)
        opt.load_flat(step=agreed, weights=_local_flat(opt)[0], adam_m=zeros, adam_v=zeros)
        ckpt_step, source = 0, "initial weights (no checkpoint yet)"
    else:  # the checkpoint's memmaps: load_flat reads only this rank's table blocks
        opt.load_flat(step=agreed, weights=ckpt.weights, adam_m=ckpt.adam_m, adam_v=ckpt.adam_v)
        ckpt_step, source = int(ckpt.step), str(ckpt.path.name)
    names = opt.dense.names
    opt.load_dense(
        step=agreed,
        weights={name: dense[f"w:{name}"] for name in names},
        adam_m={name: dense[f"m:{name}"] for name in names},
        adam_v={name: dense[f"v:{name}"] for name in names},
    )
    lost: dict[str, int] = {}
    for table in opt.tables:
        index = int(table.name.split(".")[-2][1:])  # ...embedding_bags.t<i>.weight
        rows = touched_rows(job, ckpt_step + 1, agreed, index)
        lo, hi = table.rows
        lost[table.name] = int(((rows >= lo) & (rows < hi)).sum())
    rows_lost = sum(lost.values())
    append_recovery_record(
        job.run_dir,
        {
            "event": "survivor_recovery",
            "time": time.time(),
            "generation": gen,
            "failed_rank": rank,
            "agreed_step": agreed,
            "survivors": plan["survivors"],
            "undone": plan["undone"],
            "dense_source": f"rank {plan['dense_rank']} (survivor, no checkpoint read)",
            "embedding_source": source,
            "embedding_checkpoint_step": ckpt_step,
            "shard_rows": {t.name: [t.rows[0], t.rows[1]] for t in opt.tables},
            "rows_lost_updates": lost,
            "bit_exact": rows_lost == 0 and all(u["exact"] for u in plan["undone"]),
        },
    )
    ev("audit", gen=gen, rows_lost=rows_lost)
    return agreed


def _train_steps(
    job: SurvivorJob, dmp: Any, opt: Any, rank: int, gen: int, step: int, ev: _Events
) -> tuple[int, UndoRecord | None]:
    """Train from ``step`` to ``job.steps``; raises _PeerLostError(step, record) on failure."""
    from recd.models.dlrm import bce_loss

    record: UndoRecord | None = None
    while step < job.steps:
        s = step + 1
        try:
            dense, kjt, labels = make_batch(job, s, rank)
            dmp.train()
            opt.zero_grad()
            loss = bce_loss(dmp(dense, kjt), labels)
            loss.backward()
            dies = rank == job.kill_rank and s == job.kill_step and gen == 0
            if dies and job.kill_point == "after_backward":
                ev("kill", step=s, point=job.kill_point)
                os.kill(os.getpid(), signal.SIGKILL)
            record = opt.step(capture=True)
            if dies:  # after_step: updated, but the step is never recorded
                ev("kill", step=s, point=job.kill_point)
                os.kill(os.getpid(), signal.SIGKILL)
            _write_atomic(_progress_path(job.run_dir, rank), str(s))
            step = s
            ev("step", gen=gen, step=s)
            if s in job.dump_dense_at:
                _dump_dense(job, opt, rank, gen, s, "step")
            if job.step_delay_s:
                time.sleep(job.step_delay_s)
            if s % job.checkpoint_every == 0 or s == job.steps:
                _write_checkpoint(job, opt, rank, s)
                ev("checkpoint", gen=gen, step=s)
        except RuntimeError as error:
            ev("detect", gen=gen, step=step, error=str(error).splitlines()[0][:200])
            raise _PeerLostError(step, record) from error
    return step, record


def _survive(
    job: SurvivorJob, opt: Any, rank: int, gen: int, step: int, record: UndoRecord | None
) -> _Start:
    """Agree on the step, undo past it, provide the dense state; returns how to rejoin."""
    deadline = time.monotonic() + job.collective_timeout_s
    failure = job.run_dir / "recovery" / f"failure_gen{gen}.json"
    _wait_for(failure, deadline, "failure notice from the launcher")
    dead = json.loads(failure.read_text())["failed_ranks"]
    survivors = [r for r in range(job.world_size) if r not in dead]
    agreed = min(_read_progress(job.run_dir, r) for r in range(job.world_size))
    undone: list[dict[str, Any]] = []
    if step > agreed:
        if step - agreed > 1 or record is None or record.step != step:
            raise RecoveryError(
                f"{job.run_dir}: rank {rank} is at step {step}, the agreed step is {agreed}: "
                "more than the one step an undo record covers"
            )
        result: UndoResult = undo_step(record)
        undone.append({"rank": rank, "step": step, "exact": result.exact})
        step = agreed
        _write_atomic(_progress_path(job.run_dir, rank), str(agreed))
    ev = _Events(job.run_dir, rank)
    ev("agreed", gen=gen, step=agreed, undone=len(undone))
    out = job.run_dir / "recovery"
    _write_atomic(out / f"survivor_gen{gen}_rank{rank}.json", json.dumps(undone))
    if rank == min(survivors):
        for r in survivors:  # every survivor's undo result goes into the plan
            _wait_for(out / f"survivor_gen{gen}_rank{r}.json", deadline, f"rank {r}'s agreement")
        undone_all = [
            u
            for r in survivors
            for u in json.loads((out / f"survivor_gen{gen}_rank{r}.json").read_text())
        ]
        dense_file = out / f"dense_gen{gen + 1}.npz"
        _write_npz(dense_file, _dense_arrays(opt), agreed)
        plan = {
            "agreed_step": agreed,
            "dense_file": str(dense_file),
            "dense_rank": rank,
            "survivors": survivors,
            "failed_ranks": dead,
            "undone": undone_all,
        }
        _write_atomic(out / f"gen{gen + 1}.json", json.dumps(plan))
        ev("dense_written", gen=gen, step=agreed)
    return _Start(role="survivor", own=_local_flat(opt), step=agreed)


def _worker(job: SurvivorJob, rank: int, gen: int, role: str) -> None:
    """One worker process: train, and in ``survivor`` mode survive peers' deaths."""
    torch.set_num_threads(1)
    ev = _Events(job.run_dir, rank)
    ev("start", gen=gen, role=role)
    start = _Start(role=role)  # type: ignore[arg-type]
    while True:
        if start.role == "replacement":  # the plan names the agreed step and the dense file
            _wait_for(
                job.run_dir / "recovery" / f"gen{gen}.json",
                time.monotonic() + job.collective_timeout_s,
                "recovery plan",
            )
        _join(job, rank, gen)
        dmp, opt = _build(job)
        ev("rendezvous", gen=gen)
        step = _load(job, opt, rank, gen, start, ev)
        ev("loaded", gen=gen, step=step, role=start.role)
        if start.role in ("survivor", "replacement") and step in job.dump_dense_at:
            _dump_dense(job, opt, rank, gen, step, start.role)
        try:
            _train_steps(job, dmp, opt, rank, gen, step, ev)
            ev("done", gen=gen, step=job.steps)
            opt.close()
            _leave()
            return
        except _PeerLostError as lost:
            step, record = lost.args
            if job.mode != "survivor":
                ev("exit", gen=gen, step=step)  # the launcher restarts everyone
                os._exit(3)
            start = _survive(job, opt, rank, gen, step, record)
            opt.close()
            del dmp, opt
            _leave()
            gen += 1


def _worker_entry(job: SurvivorJob, rank: int, gen: int, role: str) -> None:
    try:
        _worker(job, rank, gen, role)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


# ----------------------------------------------------------------------------- the launcher


@dataclass(kw_only=True, slots=True)
class JobReport:
    """What :func:`run_job` saw."""

    job: SurvivorJob
    events: list[dict[str, Any]]
    """Every process's timestamped events."""
    recoveries: list[dict[str, Any]]
    """The audit trail (``.recovery.json``)."""
    failures: int
    """Worker deaths the launcher handled."""
    wall_s: float

    def timeline(self) -> dict[str, float] | None:
        """:func:`recovery_timeline` of the first failure (None: no failure)."""
        return recovery_timeline(self.events)


def run_job(job: SurvivorJob) -> JobReport:
    """Run the job in ``world_size`` forked worker processes, handling one failure.

    The launcher plays torchrun's elastic agent: it watches the workers; when one dies it
    writes the failure notice, and either forks a replacement for the dead rank
    (``survivor``) or stops every worker and forks a whole new group that resumes from the
    newest checkpoint (``restart``). Raises :class:`RecoveryError` when a worker fails in
    another way or the job exceeds ``job.timeout_s``.
    """
    run_dir = job.run_dir
    for sub in ("progress", "rdzv", "recovery"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    _warm_imports()
    ctx = mp.get_context("fork")
    ev = _Events(run_dir, -1)
    began = time.monotonic()
    deadline = began + job.timeout_s
    gen = 0
    procs: dict[int, Any] = {}

    def fork(rank: int, role: str) -> None:
        p = ctx.Process(target=_worker_entry, args=(job, rank, gen, role), daemon=False)
        p.start()
        procs[rank] = p

    failures = 0
    try:
        for r in range(job.world_size):
            fork(r, "fresh")
        while procs:
            if time.monotonic() > deadline:
                raise RecoveryError(f"{run_dir}: the job did not finish in {job.timeout_s} s")
            from multiprocessing.connection import wait

            wait([p.sentinel for p in procs.values()], timeout=0.05)
            for rank, p in list(procs.items()):
                if p.exitcode is None:
                    continue
                del procs[rank]
                if p.exitcode == 0:
                    continue
                if p.exitcode == -signal.SIGKILL and failures == 0 and rank == job.kill_rank:
                    failures += 1
                    ev("detect_launcher", gen=gen, failed_rank=rank)
                    notice = {"failed_ranks": [rank], "generation": gen}
                    _write_atomic(
                        run_dir / "recovery" / f"failure_gen{gen}.json", json.dumps(notice)
                    )
                    if job.mode == "survivor":
                        gen += 1
                        fork(rank, "replacement")
                        ev("spawn", gen=gen, rank=rank)
                    else:
                        _stop_all(procs)
                        gen += 1
                        for r in range(job.world_size):
                            fork(r, "resume")
                        ev("spawn", gen=gen, ranks=job.world_size)
                    continue
                if job.mode == "restart" and p.exitcode == 3:
                    continue  # a survivor leaving for the restart
                raise RecoveryError(
                    f"{run_dir}: rank {rank} (generation {gen}) failed with exit code {p.exitcode}"
                )
    finally:
        _stop_all(procs)
    return JobReport(
        job=job,
        events=read_events(run_dir),
        recoveries=read_recovery_records(run_dir),
        failures=failures,
        wall_s=time.monotonic() - began,
    )


def _warm_imports() -> None:
    """Import torchrec, the model and the sharding code in the launcher, so forked workers
    (and replacements) start warm, as a pre-started spare of an elastic pool would."""
    import recd.checkpoint
    import recd.models.dlrm
    import recd.train.sharding  # noqa: F401


def _stop_all(procs: dict[int, Any]) -> None:
    """SIGTERM, then SIGKILL after 2 s (torchrun's agent does the same)."""
    for p in procs.values():
        if p.exitcode is None:
            p.terminate()
    for p in procs.values():
        p.join(2.0)
        if p.exitcode is None:
            p.kill()
            p.join()
    procs.clear()


# ----------------------------------------------------------------------------- measurement


def recovery_timeline(events: list[dict[str, Any]]) -> dict[str, float] | None:
    """Split the first failure's recovery into phases (seconds), from the events.

    - ``detection``: the kill until the launcher saw the process die (survivors' own
      detection, their first failed collective, is ``survivor_detection``);
    - ``restart``: until the new processes started (fork: milliseconds; torchrun: a fresh
      interpreter each);
    - ``rendezvous``: until every rank of the new generation joined its group and rebuilt DMP;
    - ``load``: until every rank loaded its state (undo + dense from a survivor + the dead
      rank's shard from the checkpoint, or the full checkpoint);
    - ``first_step``: until the first step after recovery completed on every rank;
    - ``replay``: until the step that was in flight at the failure completed again (the lost
      work: ``lost_steps`` steps);
    - ``total``: the kill until then: the recovery time.
    """
    kill = next((e for e in events if e["event"] == "kill"), None)
    if kill is None:
        return None
    t0, failed_step = kill["t"], int(kill["step"])
    after = [e for e in events if e["t"] >= t0]
    detect = next(e["t"] for e in after if e["event"] == "detect_launcher")
    own = [e["t"] for e in after if e["event"] == "detect"]
    new_gen = next(e["gen"] for e in after if e["event"] == "spawn")
    gen_events = [e for e in after if e.get("gen") == new_gen and e["rank"] >= 0]
    ranks = sorted({e["rank"] for e in gen_events})

    def last(name: str, pred: Callable[[dict[str, Any]], bool] = lambda e: True) -> float:
        times = [
            min(e["t"] for e in gen_events if e["event"] == name and e["rank"] == r and pred(e))
            for r in ranks
        ]
        return max(times)

    starts = [e["t"] for e in after if e["event"] in ("start", "agreed")]
    restart = max(starts) if starts else detect
    rendezvous = last("rendezvous")
    loaded_events = [e for e in gen_events if e["event"] == "loaded"]
    loaded = last("loaded")
    resumed_at = min(int(e["step"]) for e in loaded_events)
    first = last("step", lambda e: int(e["step"]) == resumed_at + 1)
    back = last("step", lambda e: int(e["step"]) == failed_step)
    return {
        "failed_step": failed_step,
        "resumed_at_step": resumed_at,
        "lost_steps": failed_step - resumed_at,
        "survivor_detection": (min(own) - t0) if own else math.nan,
        "detection": detect - t0,
        "restart": max(restart - detect, 0.0),
        "rendezvous": rendezvous - max(restart, detect),
        "load": loaded - rendezvous,
        "first_step": first - loaded,
        "replay": back - first,
        "total": back - t0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--mode", choices=["survivor", "restart"], default="survivor")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=4)
    parser.add_argument("--kill-step", type=int, default=7)
    parser.add_argument("--kill-rank", type=int, default=1)
    args = parser.parse_args(argv)
    job = SurvivorJob(
        run_dir=args.run_dir,
        mode=args.mode,
        steps=args.steps,
        checkpoint_every=args.checkpoint_every,
        kill_rank=args.kill_rank if args.kill_step > 0 else None,
        kill_step=args.kill_step,
    )
    report = run_job(job)
    print(json.dumps({"timeline": report.timeline(), "recoveries": report.recoveries}, indent=1))
    print(f"wall {report.wall_s:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
