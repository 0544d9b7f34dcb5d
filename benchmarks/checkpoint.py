"""Checkpoint benchmark: what checkpointing costs a training run, and what resuming costs.

    python benchmarks/checkpoint.py            # DLRM, ~10M parameters (~121 MB files), cadence 100
    python benchmarks/checkpoint.py --quick    # tiny model and table, cadence 20 (CI size)
    python benchmarks/checkpoint.py --large    # 4 tables x 1M rows: delta bytes (item 5)
    python benchmarks/checkpoint.py --quick --large

Data: synthetic logs of the ``small`` profile (``--quick``: ``tiny``) through the real
generate -> session shards -> clustering ETL; ``--work-dir`` keeps the table for the next run.
Model: the plain DLRM (``kind = "dlrm"``) of that catalogue with embedding width 32 and up to
100,000 rows per table (about 10.1M parameters; a checkpoint is ``8 + 12 n`` bytes), Adam,
batch 256, one intra-op thread (``--threads``).

1. **Stall, in one run.** Four trainers of the same config and seed (same weights, same
   batches) live in one process and take turns. In each segment one plays *off* (no
   checkpoint), one *checkpoint* (the real :class:`recd.train.checkpointing.Checkpointer`'s
   periodic save of a full file: sample audit + reader state on the training thread; the
   snapshot copy on the writer thread, copy-on-write by rows for the embedding tables; then
   sidecars, ``O_DIRECT`` temp file, fsync, rename, retention in the background), one *raw*
   (a raw ``O_DIRECT`` write + fsync of the same bytes on a background thread at the same
   step: what any writer of these bytes costs here) and one *delta* (what a Checkpointer with
   ``[checkpoint] full_every = F``, ``--full-every``, default 4, writes at that step: its
   checkpoints cycle full, delta, delta, delta, full, ... one per segment, the deltas holding
   the embedding rows updated in the last 100 steps and every dense tensor, the training
   thread only swapping the row logs at the step, the writer thread merging them and
   gathering the rows, copy-on-write; see ``delta_schedule``). Which trainer plays which role is drawn per
   segment (``segment_roles``): objects of one config differ slightly in speed,
   persistently, and a fixed role per object made that a bias of the stall. The delta role
   therefore moves between objects: every trainer's Checkpointer has ``full_every = F`` (so
   every optimizer logs the rows it updates, and restarts the log at each segment's first
   step whatever its role: the cost is the same in every role and cancels from the stalls),
   the rig hands each delta-role save its chain (``Checkpointer._chain``), and moves the
   role's file into one directory after each segment (a rename, untimed), where its chain
   is whole; at the end the newest delta is restored through its chain and compared with
   the full checkpoint of the same step (``chain_check``, 0 difference expected). Every trainer
   appends the loss history at every step, as ``recd train`` does; its cost is reported
   apart (``off_hook_fraction``). Segment i (i >= 1) is steps ``100 i`` to ``100 i + 99``:
   the checkpoint is taken right after its first step. It runs in 4 rounds of 25 steps (``--rounds``); in each round
   the four trainers run their 25 steps back to back in an order drawn at random for that
   round (``--orders-seed``; the orders are in the JSON), so no trainer keeps a favourable
   slot and the machine's drift over a second or two falls on all four alike. A trainer
   waits for its own background write at the end of each of its rounds, and that wait is
   counted in its time: no write ever runs during another trainer's round. Segment i of
   the four trainers covers the same steps on the same batches: a paired comparison.
   Segment 0 (steps 1 to 99, no checkpoint) is a declared warm-up, recorded but not counted;
   every timed segment counts. The trainers are driven by the training loop's own body
   (batch, ``train_step``, step hooks) with one reader iterator each, and after they are
   built ``gc.freeze()`` keeps the collector from walking the set-up's objects (a pause that
   would land on whichever trainer is running; the collector still runs).
   ``stall_fraction = sum(checkpoint segments) / sum(off segments) - 1``: the extra wall time
   of training with a checkpoint every 100 steps, relative to training without (CheckFreq's
   "overhead"), the background write's competition for cores, memory and the virtual disk
   included; with a 95% interval over the paired segments (Student t on the linearised
   ratio, see ``INTERVAL_METHOD``; a bootstrap over segments beside it). The headline is its
   upper end, ``stall_fraction_upper95``: the target is met only if that is <= 0.02. The
   same for the raw write (``raw_write_stall_fraction``, a reference: the floor any writer
   of these bytes has here), checkpointing against the raw write
   (``checkpoint_vs_raw_write``: what recd adds beyond writing the bytes), and
   ``blocked_fraction``: the training thread's own checkpoint time (audit, reader state,
   waiting for the dense part of the snapshot copy or for a previous write) over the
   training time, a lower bound of the stall; ``train_thread_cpu_excess``: the training
   thread's extra CPU time. Noise: a segment's wall time varies between segments even for
   identical work on a shared machine, so the interval narrows only with more segments
   (``--blocks``, default 240). The delta role the same way: ``delta_stall_fraction`` over
   all its segments (a full file every F-th), its interval and ``delta_stall_fraction_upper95``
   (target <= 0.01, met by the upper end); ``delta_only_stall_fraction`` over the segments
   whose checkpoint was a delta (the cost of a delta alone) and
   ``delta_role_full_stall_fraction`` over its full ones; ``delta_vs_checkpoint`` (paired:
   delta role / full checkpoint - 1); the training-thread time of a delta
   (``delta_blocked_s_median``) and its copy on the writer thread (``delta_fill_s_median``,
   of which the row logs' merge ``delta_merge_s_median``).
2. **Write bandwidth.** ``write_bw_vs_raw`` = bytes / time the writer spent on the checkpoint
   file (temp file, sequential writes, fsync, rename, fsync dir) during training, over bytes /
   time of the raw background writes of the same bytes during training (same directory, same
   priority). Also both idle (interleaved, ``--raw-reps`` each, after one settling write).
3. **Resume.** A fresh interpreter (``recd`` imported from scratch) resumes from the newest
   checkpoint and trains one step; times: start-up (interpreter, imports, building reader,
   model and optimizer), read (validate + read the file into memory), load (copy into the
   model and Adam, reader position, RNG), first step.
4. **Bytes, full vs delta** (``stall.bytes``): the delta role's files: mean delta bytes /
   full bytes (``delta_bytes_ratio``, target <= 1/3) and the touched fraction (rows a delta
   holds, i.e. rows Adam updated in its 100 steps, over all embedding rows; per table and
   overall, ``touched_fraction``).
5. **Large tables** (``--large``, its own files checkpoint_large.*): 4 tables x 1M rows x 16
   (64M parameters, 768 MB full files), ids bounded-Zipf (exponent 1.1) from a catalogue the
   benchmark writes (``LARGE_CATALOGUE``); one trainer with ``full_every = F`` checkpointing
   every 100 steps, 16 checkpoints, every file kept: bytes full vs delta (target <= 1/10),
   the touched fraction, the training thread's time per delta vs per full checkpoint, the
   writer thread's copy of a delta, the next checkpoint's wait for a full / a delta write, and a chain check.
   The stall rig is not run at this size (4 x 1.5 GB of state and a 768 MB full + raw write
   per segment): bytes and training-thread times instead (``large.stall`` says so).
6. **Row logging** (``stall.row_log``; ``large.row_log``): the time inside the optimizer's
   touched-row logging on the training thread (``LazyAdam._log_rows`` at every step and
   table, the log's restart at every checkpoint: a swap), timed in the step by wrapping them on the instance, over the *off*
   segments' wall time (the step time), with the stall's paired interval over segments
   (``row_log_fraction``, target <= 0.005).

Writes benchmarks/results/checkpoint.json and checkpoint.md (``--quick``: checkpoint_quick.*;
``--large``: checkpoint_large.*). Targets (measured, not asserted): stall_fraction_upper95 <=
0.02, write_bw_vs_raw >= 0.7, delta_stall_fraction_upper95 <= 0.01, delta_bytes_ratio <= 1/3
(--large: <= 1/10), row_log_fraction <= 0.005.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(ROOT))

TARGET_STALL = 0.02
TARGET_BW = 0.7
TARGET_DELTA_STALL = 0.01
TARGET_DELTA_BYTES = 1 / 3
TARGET_LARGE_DELTA_BYTES = 1 / 10
TARGET_ROW_LOG = 0.005
FULL_EVERY = 4
"""``--full-every``: the delta trainer's ``[checkpoint] full_every``."""


@dataclass(frozen=True)
class Size:
    profile: str
    sessions: int | None
    embedding_dim: int
    max_rows: int
    every: int
    blocks: int
    rounds: int


FULL = Size(
    profile="small",
    sessions=None,
    embedding_dim=32,
    max_rows=100_000,
    every=100,
    blocks=240,
    rounds=4,
)
"""240 segments: ~4 x 0.9 s of training each (9 ms steps), ~15 min of the ~19 min run."""
QUICK = Size(
    profile="tiny", sessions=600, embedding_dim=8, max_rows=1000, every=20, blocks=3, rounds=2
)
BATCH_SIZE = 256

CONFIG = """
[reader]
table = "{table}"
batch_size = {batch_size}
shuffle = "session"
num_epochs = 1000

[model]
kind = "dlrm"
embedding_dim = {embedding_dim}
max_rows = {max_rows}

[optim]
lr = 0.001

[train]
steps = {steps}
log_every = 1000000
eval_every = 0
seed = 0
run_dir = "{run_dir}"
num_threads = {threads}
plot = false

[checkpoint]
checkpoint_every = {checkpoint_every}
full_every = {full_every}
keep_last = {keep_last}
keep_every = 0
"""


def build_table(size: Size, work: Path) -> Path:
    """The clustered table of ``size.profile`` (reused when ``work`` already has it)."""
    from recd.etl.config import EtlConfig
    from recd.etl.local import run_etl
    from recd.logs.generate import generate_logs
    from recd.logs.shard import shard_logs
    from recd.schema import load_catalogue

    table = work / f"table-{Path(size.profile).stem}-{size.sessions}"
    if (table / "_recd_bench_done").exists():
        return table
    raw, shards = work / "raw", work / "shards"
    generate_logs(
        load_catalogue(size.profile),
        raw,
        seed=1,
        num_sessions=size.sessions,
        show_progress=False,
        overwrite=True,
    )
    shard_logs(raw, shards, key="session", num_shards=4, show_progress=False)
    run_etl(EtlConfig(shard_dir=shards, table_dir=table, show_progress=False))
    (table / "_recd_bench_done").touch()
    return table


def write_config(
    path: Path,
    table: Path,
    run_dir: Path,
    size: Size,
    steps: int,
    threads: int,
    *,
    full_every: int = 1,
    checkpoint_every: int = 1_000_000_000,
    keep_last: int = 2,
) -> Path:
    path.write_text(
        CONFIG.format(
            table=table,
            run_dir=run_dir,
            embedding_dim=size.embedding_dim,
            max_rows=size.max_rows,
            batch_size=BATCH_SIZE,
            steps=steps,
            threads=threads,
            full_every=full_every,
            checkpoint_every=checkpoint_every,
            keep_last=keep_last,
        )
    )
    return path


# ---------------------------------------------------------------------------- 1. stall
KINDS = ("off", "checkpoint", "raw", "delta")
"""The four roles: no checkpoints; a full checkpoint every ``every`` steps (the real
Checkpointer); a raw background write of the same number of bytes every ``every`` steps; a
checkpoint every ``every`` steps with ``full_every = F`` (full, then ``F - 1`` deltas)."""


def delta_schedule(segments: int, every: int, full_every: int) -> list[tuple[int, int, int] | None]:
    """What the *delta* role checkpoints at the first step of each of ``segments`` segments,
    as a Checkpointer with ``full_every`` checkpointing every ``every`` steps would: None for
    a full file (timed segments 1, 1 + F, 1 + 2F, ...) else the chain it extends, ``(base,
    parent, deltas since the base)`` (``Checkpointer._chain``). Segment 0 (the warm-up)
    takes no checkpoint: None."""
    if full_every < 2:
        raise ValueError(f"full_every must be >= 2 for a delta role, got {full_every}")
    out: list[tuple[int, int, int] | None] = [None]
    for segment in range(1, segments):
        position = (segment - 1) % full_every
        if position == 0:
            out.append(None)
        else:
            out.append(((segment - position) * every, (segment - 1) * every, position - 1))
    return out


class RowLogTimer:
    """Times the optimizer's touched-row logging on the training thread of one trainer:
    every call of ``LazyAdam._log_rows`` (a reference to the step's rows kept, once per table
    per step) and the restart of the log at each checkpoint (``LazyAdam.detach_row_logs``, in
    every role: it swaps in an empty log; a save's writer thread merges or drops the old
    one), by wrapping them on the instance. The timer's own two
    ``perf_counter`` calls fall inside what it measures (an overestimate of ~0.1 us per
    call). The merge of a delta's logged rows runs on the writer thread (:class:`FillTimer`)."""

    def __init__(self, optimizer: Any) -> None:
        self.log_s = 0.0
        self.log_calls = 0
        self.restart_s = 0.0
        self.restarts: list[float] = []
        lazy = optimizer.embeddings
        if lazy is None or not hasattr(lazy, "_log_rows"):
            raise RuntimeError("RowLogTimer: the optimizer has no LazyAdam row log")
        log_rows, reset, detach = lazy._log_rows, lazy.reset_logged_rows, lazy.detach_row_logs

        def timed_log(p: Any, rows: Any) -> None:
            began = time.perf_counter()
            log_rows(p, rows)
            self.log_s += time.perf_counter() - began
            self.log_calls += 1

        def timed(restart: Any) -> Any:
            def run() -> Any:
                began = time.perf_counter()
                out = restart()
                took = time.perf_counter() - began
                self.restart_s += took
                self.restarts.append(took)
                return out

            return run

        lazy._log_rows = timed_log
        lazy.reset_logged_rows = timed(reset)
        lazy.detach_row_logs = timed(detach)


class FillTimer:
    """Times a delta's copy on the writer thread (``Checkpointer._fill`` wrapped on the
    instance: the dense copy, the merge of the detached row logs, the gather of the updated
    rows, the copy-on-write patches); ``fills`` holds per delta its seconds and the merge's
    and the gather's parts (:class:`recd.train.snapshot.DeltaFill`'s own timers)."""

    def __init__(self, checkpointer: Any) -> None:
        self.fills: list[dict[str, float]] = []
        self.fill_s = 0.0
        self.merge_s = 0.0
        fill = checkpointer._fill

        def timed_fill(snapshot: Any, *args: Any) -> None:
            began = time.perf_counter()
            fill(snapshot, *args)
            took = time.perf_counter() - began
            delta = snapshot.delta
            if delta is not None and delta.fill is not None:
                plan = delta.fill
                self.fills.append({"s": took, "merge_s": plan.merge_s, "gather_s": plan.gather_s})
                self.fill_s += took
                self.merge_s += plan.merge_s

        checkpointer._fill = timed_fill


class RawWriter:
    """A raw sequential ``O_DIRECT`` write + fsync of ``size_bytes`` on a background thread
    (niced like the checkpoint writer), on request: what any writer of these bytes costs on
    this disk and these cores."""

    def __init__(self, directory: Path, image: Any, size_bytes: int) -> None:
        self.directory = directory
        self.size_bytes = size_bytes
        self.image = image
        self.seconds: list[float] = []
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._run, name="raw-writer")
        self._thread.start()

    def _run(self) -> None:
        from recd.train.checkpointing import _lower_thread_priority

        _lower_thread_priority()
        self.seconds += raw_write_s(self.directory, self.image, self.size_bytes, 1, direct=True)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class RoleHook:
    """Trainer ``index``'s step hook after its Checkpointer: at the first step of segment i
    (step ``i * every``) it does what the trainer's role in segment i asks for: a real full
    checkpoint (``Checkpointer.save``, as at a periodic step), a raw write, or the *delta*
    role's checkpoint of that segment (``chains[i]``: full, or a delta extending the role's
    chain); *off* and *raw* restart the row log there (``detach_row_logs``, the swap a save
    makes, the old logs dropped after the segment, untimed, as a save drops them on its
    writer thread), so in every trainer the log holds the rows of the last ``every`` steps, which
    the delta role's next delta writes, whichever trainer plays it."""

    def __init__(
        self,
        roles: list[list[str]],
        chains: list[tuple[int, int, int] | None],
        index: int,
        every: int,
        checkpointer: Any,
        raw: RawWriter,
    ) -> None:
        self.roles, self.chains, self.index, self.every = roles, chains, index, every
        self.checkpointer, self.raw = checkpointer, raw
        self.spent: list[Any] = []
        """Row logs swapped out by *off* and *raw* (a save hands its own to the writer
        thread, which drops them there): dropped between segments."""

    def after_step(self, trainer: Any, step: int, loss: float) -> None:
        if step % self.every:
            return
        segment = step // self.every
        role = self.roles[segment][self.index]
        if role in ("checkpoint", "delta"):
            # The chain the save extends (None: a full file). The rig sets it per save: the
            # delta role moves between trainer objects, so no one Checkpointer's own chain
            # is the role's.
            self.checkpointer._chain = self.chains[segment] if role == "delta" else None
            self.checkpointer.save(trainer, reason="periodic")
        else:  # swapped out as a save does; dropped after the segment, untimed
            self.spent.append(trainer.optimizer.detach_row_logs())
            if role == "raw":
                self.raw.start()


class Stepper:
    """Drives one trainer a round at a time: the training loop's body (next batch,
    ``train_step``, the step hooks), with one reader iterator kept across rounds
    (``Trainer.train`` would rebuild it and write the run's outputs at every call).
    ``hook_s``: the time spent in the step hooks so far."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.batches = iter(trainer.loader)
        self.hook_s = 0.0

    def run_to(self, end_step: int) -> None:
        trainer = self.trainer
        while trainer.step < end_step:
            batch = next(self.batches).to(trainer.device)
            loss, _ = trainer.train_step(batch)
            trainer.step += 1
            began = time.perf_counter()
            for hook in trainer.hooks:
                hook.after_step(trainer, trainer.step, loss)
            self.hook_s += time.perf_counter() - began


def segment_orders(segments: int, rounds: int, seed: int) -> list[list[list[str]]]:
    """The order of the four trainers in each round of each of ``segments`` segments, each
    drawn independently and uniformly from the 24 permutations (``random.Random(seed)``): no
    trainer holds a fixed slot, so a slot's advantage (a warmer cache, the load drifting
    within a round) falls on each trainer alike, and on average cancels."""
    rng = random.Random(seed)
    return [[rng.sample(KINDS, len(KINDS)) for _ in range(rounds)] for _ in range(segments)]


def segment_roles(segments: int, seed: int) -> list[list[str]]:
    """The role of trainers 0 to 3 in each of ``segments`` segments: a permutation of
    :data:`KINDS` drawn independently and uniformly per segment (``random.Random`` seeded
    with ``"roles:<seed>"``). Trainer objects of the same config still differ a little
    in speed (where their tensors landed in memory; persistent within a run); a fixed role per object would add that to the stall as a bias no number of
    segments averages away. Drawn per segment, it falls on every role alike."""
    rng = random.Random(f"roles:{seed}")
    return [rng.sample(KINDS, len(KINDS)) for _ in range(segments)]


def round_ends(segment: int, every: int, rounds: int) -> list[int]:
    """The last step of each round of ``segment``. Segment i >= 1 holds steps ``i * every``
    (whose checkpoint is taken right after it) to ``(i + 1) * every - 1``, cut into
    ``rounds`` rounds of ``every / rounds`` steps; segment 0 (steps 1 to ``every - 1``, no
    checkpoint) is the warm-up."""
    length = every // rounds
    return [segment * every + (k + 1) * length - 1 for k in range(rounds)]


@dataclass
class StallRig:
    """The four trainers of the stall measurement (index 0 to 3), each with its own
    Checkpointer (loss history every step, touched rows logged, checkpoints when its role
    asks), raw writer and row-log timer; ``roles[segment][index]`` is trainer ``index``'s
    role in that segment, ``chains[segment]`` what the delta role writes there. The delta
    role's files are moved into ``delta_dir`` after each segment (``delta_files``)."""

    trainers: list[Any]
    checkpointers: list[Any]
    raws: list[RawWriter]
    roles: list[list[str]]
    chains: list[tuple[int, int, int] | None]
    delta_dir: Path
    every: int
    steppers: list[Stepper] = field(default_factory=list)
    row_logs: list[RowLogTimer] = field(default_factory=list)
    fills: list[FillTimer] = field(default_factory=list)
    role_hooks: list[RoleHook] = field(default_factory=list)
    delta_files: list[dict[str, Any]] = field(default_factory=list)

    @property
    def checkpoint_bytes(self) -> int:
        return self.raws[0].size_bytes

    def close(self) -> None:
        for checkpointer in self.checkpointers:
            checkpointer.close(raise_errors=False)
        for trainer in self.trainers:
            trainer.close()


def build_rig(
    config_path: Path,
    every: int,
    roles: list[list[str]],
    chains: list[tuple[int, int, int] | None],
    full_every: int,
) -> StallRig:
    """Four trainers of the same config and seed (same weights, same batches), each with its
    own run directory (``<run_dir>-t0`` ...) and a real Checkpointer with ``full_every`` (so
    its optimizer logs the rows it updates: every trainer, since any may play *delta* next),
    whose own cadence is switched off: the :class:`RoleHook` checkpoints, writes raw or does
    nothing at the first step of each segment, as ``roles`` says. Every trainer keeps the
    loss history at every step, *off* included (``recd train`` always does)."""
    import shutil

    import numpy as np

    from recd.train.checkpointing import Checkpointer
    from recd.train.config import load_train_config
    from recd.train.loop import Trainer

    base = load_train_config(config_path).train.run_dir
    delta_dir = base.parent / f"{base.name}-delta"
    shutil.rmtree(delta_dir, ignore_errors=True)
    delta_dir.mkdir(parents=True)
    rig = StallRig(
        trainers=[],
        checkpointers=[],
        raws=[],
        roles=roles,
        chains=chains,
        delta_dir=delta_dir,
        every=every,
    )
    image = None
    for index in range(len(KINDS)):
        config = load_train_config(config_path)
        config.train.run_dir = config.train.run_dir.parent / f"{config.train.run_dir.name}-t{index}"
        shutil.rmtree(config.train.run_dir, ignore_errors=True)
        config.checkpoint.checkpoint_every = np.iinfo(np.int64).max  # the RoleHook decides
        config.checkpoint.full_every = full_every
        trainer = Trainer(config, show_progress=False)
        checkpointer = Checkpointer(config)
        checkpointer.attach(trainer)
        if not hasattr(checkpointer, "_chain") or not checkpointer._logging_rows:
            raise RuntimeError("the Checkpointer does not log rows / keep a chain: no deltas")
        size_bytes = 8 + 12 * checkpointer.layout.n_params
        image = random_image(size_bytes) if image is None else image
        raw = RawWriter(config.train.run_dir, image, size_bytes)
        role_hook = RoleHook(roles, chains, index, every, checkpointer, raw)
        trainer.hooks += [checkpointer, role_hook]
        rig.role_hooks.append(role_hook)
        rig.trainers.append(trainer)
        rig.checkpointers.append(checkpointer)
        rig.raws.append(raw)
        rig.steppers.append(Stepper(trainer))
        rig.row_logs.append(RowLogTimer(trainer.optimizer))
        rig.fills.append(FillTimer(checkpointer))
    return rig


def run_round(rig: StallRig, index: int, end_step: int) -> dict[str, float]:
    """Train trainer ``index`` up to ``end_step`` and wait for its background write (a write
    still running at the round's end belongs to this round, and is counted: no trainer's
    write ever runs during another trainer's round)."""
    stepper, checkpointer = rig.steppers[index], rig.checkpointers[index]
    row_log = rig.row_logs[index]
    began = time.perf_counter()
    cpu_began = time.thread_time()
    blocked_began = checkpointer.stats.blocked_s
    hook_began = stepper.hook_s
    log_began, restart_began = row_log.log_s, row_log.restart_s
    fill_began, merge_began = rig.fills[index].fill_s, rig.fills[index].merge_s
    stepper.run_to(end_step)
    checkpointer.wait()
    rig.raws[index].wait()
    return {
        "wall_s": time.perf_counter() - began,
        "train_thread_cpu_s": time.thread_time() - cpu_began,
        "blocked_s": checkpointer.stats.blocked_s - blocked_began,
        "hook_s": stepper.hook_s - hook_began,
        "row_log_s": row_log.log_s - log_began,
        "row_log_restart_s": row_log.restart_s - restart_began,
        "fill_s": rig.fills[index].fill_s - fill_began,
        "merge_s": rig.fills[index].merge_s - merge_began,
    }


def run_segments(rig: StallRig, size: Size, orders: list[list[list[str]]]) -> list[dict[str, Any]]:
    """Every segment, round by round, the four trainers of a round back to back in
    ``orders[segment][round]``; one record per trainer and segment (its rounds summed).
    Segment 0 is the warm-up, recorded with ``warmup: true``. After each segment (untimed)
    the delta role's new file moves to ``rig.delta_dir`` (:func:`collect_delta_file`)."""
    records: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i, segment_order in enumerate(orders):
        ends = round_ends(i, size.every, size.rounds)
        keys = (
            "wall_s",
            "train_thread_cpu_s",
            "blocked_s",
            "hook_s",
            "row_log_s",
            "row_log_restart_s",
            "fill_s",
            "merge_s",
        )
        totals = {k: dict.fromkeys(keys, 0.0) for k in KINDS}
        rounds: dict[str, list[float]] = {k: [] for k in KINDS}
        roles = rig.roles[i]
        began_s = time.perf_counter() - t0
        for end, order in zip(ends, segment_order, strict=True):
            for kind in order:
                timing = run_round(rig, roles.index(kind), end)
                rounds[kind].append(timing["wall_s"])
                for key, value in timing.items():
                    totals[kind][key] += value
        for kind in KINDS:
            record = {
                "segment": i,
                "kind": kind,
                "trainer": roles.index(kind),
                "warmup": i == 0,
                "steps": [max(1, i * size.every), ends[-1]],
                "began_s": began_s,
                "round_wall_s": rounds[kind],
                "positions": [order.index(kind) for order in segment_order],
                **totals[kind],
            }
            if kind == "delta" and i > 0:
                record["checkpoint_kind"] = "full" if rig.chains[i] is None else "delta"
            records.append(record)
        if i > 0:
            collect_delta_file(rig, i)
            for hook in rig.role_hooks:
                hook.spent.clear()
    return records


def collect_delta_file(rig: StallRig, segment: int) -> None:
    """Move the file the delta role wrote at ``segment`` (and a full file's checksum sidecar)
    from its trainer's run directory into ``rig.delta_dir``, where the role's chain lives
    whole (a full file drops the previous chain); record its size and, for a delta, the rows
    of each table it holds. A rename: no bytes move, and it happens between segments."""
    index = rig.roles[segment].index("delta")
    checkpointer = rig.checkpointers[index]
    step = segment * rig.every
    name = checkpointer.last_saved_name
    expected = "full" if rig.chains[segment] is None else "delta"
    kind = "delta" if name is not None and name.endswith(".delta") else "full"
    if checkpointer.last_saved_step != step or kind != expected:
        raise RuntimeError(
            f"segment {segment}: the delta role wrote {name} at {checkpointer.last_saved_step}, "
            f"expected a {expected} checkpoint at step {step}"
        )
    assert name is not None
    if kind == "full":
        for old in rig.delta_dir.iterdir():
            old.unlink()
    source = checkpointer.run_dir / name
    target = rig.delta_dir / name
    os.replace(source, target)
    sidecar = source.with_name(name + ".crc32")
    if sidecar.exists():
        os.replace(sidecar, rig.delta_dir / sidecar.name)
    record: dict[str, Any] = {
        "segment": segment,
        "step": step,
        "kind": kind,
        "trainer": index,
        "bytes": target.stat().st_size,
    }
    if kind == "delta":
        record.update(delta_rows(target, checkpointer.layout, rig.trainers[index].optimizer))
    rig.delta_files.append(record)


def delta_rows(path: Path, layout: Any, optimizer: Any) -> dict[str, Any]:
    """What a delta file holds: each embedding table's rows (``table_rows``: name -> rows
    in the delta, every table listed), and the dense elements."""
    from recd.checkpoint.delta import read_delta

    delta = read_delta(path, verify=False)
    by_start = {layout.offset_of(name): name for name in layout.names}
    tables = list(optimizer.embedding_names)
    rows = dict.fromkeys(tables, 0)
    dense = 0
    for block in delta.blocks:
        name = by_start[block.start]
        if name in rows:
            rows[name] = len(block.rows)
        else:
            dense += block.n_elems
    return {"table_rows": rows, "dense_elements": dense}


def table_sizes(layout: Any, optimizer: Any) -> dict[str, int]:
    """Rows of each embedding table (layout order)."""
    return {name: int(layout.spec(name).shape[0]) for name in optimizer.embedding_names}


def delta_bytes_figures(
    files: list[dict[str, Any]], full_bytes: int, tables: dict[str, int]
) -> dict[str, Any]:
    """Bytes per checkpoint, full vs delta, and the touched fraction (rows a delta holds /
    the table's rows: the rows updated in the interval it covers), per table and overall
    (all tables' rows together), averaged over the deltas."""
    deltas = [f for f in files if f["kind"] == "delta"]
    fulls = [f for f in files if f["kind"] == "full"]
    if not deltas:
        return {"deltas": 0}
    sizes = [f["bytes"] for f in deltas]
    all_rows = sum(tables.values())
    per_table = {
        name: statistics.fmean(f["table_rows"][name] / rows for f in deltas)
        for name, rows in tables.items()
    }
    overall = [sum(f["table_rows"].values()) / all_rows for f in deltas]
    return {
        "deltas": len(deltas),
        "fulls": len(fulls),
        "full_bytes": full_bytes,
        "full_file_bytes": [f["bytes"] for f in fulls],
        "delta_bytes": sizes,
        "delta_bytes_mean": statistics.fmean(sizes),
        "delta_bytes_ratio": statistics.fmean(sizes) / full_bytes,
        "delta_bytes_ratio_max": max(sizes) / full_bytes,
        "delta_dense_elements": deltas[0]["dense_elements"],
        "table_rows": tables,
        "touched_fraction": statistics.fmean(overall),
        "touched_fraction_range": [min(overall), max(overall)],
        "touched_fraction_per_table": per_table,
    }


def max_abs_diff(a: Any, b: Any) -> float:
    """The largest difference between two checkpoints' weights, m and v."""
    import numpy as np

    return max(
        float(np.max(np.abs(np.asarray(getattr(a, r)) - np.asarray(getattr(b, r)))))
        for r in ("weights", "adam_m", "adam_v")
    )


def check_delta_chain(rig: StallRig) -> dict[str, Any]:
    """The delta role's newest checkpoint restored through its chain (``read_any``) against
    the checkpoint role's full file of the same step (same seed, same batches: the same
    state), element by element: a delta that missed a touched row shows here."""

    from recd.checkpoint import read_checkpoint
    from recd.checkpoint.chain import chain_paths, read_any

    newest = rig.delta_files[-1]
    step, segment = newest["step"], newest["segment"]
    layout = rig.checkpointers[0].layout
    name = next(p.name for p in rig.delta_dir.iterdir() if p.name.startswith(f"step_{step:06d}."))
    path = rig.delta_dir / name
    chained = read_any(path, layout)
    full_dir = rig.checkpointers[rig.roles[segment].index("checkpoint")].run_dir
    full = read_checkpoint(full_dir / f"step_{step:06d}.bin", layout)
    diff = max_abs_diff(chained, full)
    return {
        "step": step,
        "kind": newest["kind"],
        "links": [p.name for p in chain_paths(path)],
        "max_abs_diff": diff,
    }


def measure_stall(
    config_path: Path, size: Size, orders_seed: int, full_every: int
) -> dict[str, Any]:
    """Four identical trainers (same seed: same weights, same batches) take turns, one
    round of ``every / rounds`` steps at a time, in an order drawn at random per round; in
    each segment of ``every`` steps one trainer checkpoints, one writes raw bytes and one
    takes the delta role's checkpoint (full or delta), right after the segment's first step
    (which trainer plays which role is drawn per segment), and a trainer waits for its own
    write at the end of each of its rounds. Segment i of every trainer trains on the same
    batches, interleaved with the others' a round at a time: a paired comparison."""
    orders = segment_orders(size.blocks + 1, size.rounds, orders_seed)
    roles = segment_roles(size.blocks + 1, orders_seed)
    chains = delta_schedule(size.blocks + 1, size.every, full_every)
    rig = build_rig(config_path, size.every, roles, chains, full_every)
    gc.collect()
    gc.freeze()  # the collector skips the set-up's objects (a full pass over them: ~0.2 s)
    load_before = os.getloadavg()
    try:
        records = run_segments(rig, size, orders)
        for checkpointer in rig.checkpointers:
            checkpointer.close()
    finally:
        rig.close()
    chain_check = check_delta_chain(rig)
    stats = [c.stats for c in rig.checkpointers]
    timed = [r for r in records if not r["warmup"]]
    last = roles[-1].index("checkpoint")  # the trainer that wrote the newest full checkpoint
    by_role: dict[str, dict[str, list[float]]] = {
        role: {"write_s": [], "file_write_s": [], "write_cpu_s": []}
        for role in ("checkpoint", "delta-full", "delta")
    }
    per_trainer = {"checkpoint": [0] * len(KINDS), "delta": [0] * len(KINDS)}
    for t, st in enumerate(stats):
        for j, step in enumerate(st.steps):
            role = roles[step // size.every][t]
            per_trainer[role][t] += 1
            if role == "delta":
                role = "delta" if chains[step // size.every] is not None else "delta-full"
            for key in ("write_s", "file_write_s", "write_cpu_s"):
                by_role[role][key].append(getattr(st, key)[j])
    delta_role_bytes = sum(f["bytes"] for f in rig.delta_files)
    tables = table_sizes(rig.checkpointers[0].layout, rig.trainers[0].optimizer)
    return {
        "n_params": rig.checkpointers[0].layout.n_params,
        "checkpoint_bytes": rig.checkpoint_bytes,
        "every_steps": size.every,
        "full_every": full_every,
        "rows_in_table": rig.trainers[0].loader.plan.num_rows,
        "orders_seed": orders_seed,
        "orders": orders,
        "roles": roles,
        "delta_schedule": chains,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "segments": timed,
        "warmup_segments": [r for r in records if r["warmup"]],
        **summarise_stall(timed, size.every),
        **summarise_delta(timed, size.every),
        "row_log": summarise_row_log(timed, rig.row_logs, size.every),
        "wait_s_total": sum(st.wait_s for st in stats),
        "guard_wait_s_total": sum(st.guard_wait_s for st in stats),
        "checkpoints": sum(per_trainer["checkpoint"]),
        "checkpoints_per_trainer": per_trainer["checkpoint"],
        "write_s": by_role["checkpoint"]["write_s"],
        "file_write_s": by_role["checkpoint"]["file_write_s"],
        "write_cpu_s": by_role["checkpoint"]["write_cpu_s"],
        "raw_in_training_write_s": [x for raw in rig.raws for x in raw.seconds],
        "bytes_written": sum(st.bytes_written for st in stats) - delta_role_bytes,
        "delta_role": {
            "checkpoints_per_trainer": per_trainer["delta"],
            "deltas_written": sum(st.deltas for st in stats),
            "files": rig.delta_files,
            "write_s": {
                "delta": by_role["delta"]["write_s"],
                "full": by_role["delta-full"]["write_s"],
            },
            "file_write_s": {
                "delta": by_role["delta"]["file_write_s"],
                "full": by_role["delta-full"]["file_write_s"],
            },
            "write_cpu_s": {
                "delta": by_role["delta"]["write_cpu_s"],
                "full": by_role["delta-full"]["write_cpu_s"],
            },
            "bytes_written": delta_role_bytes,
            "chain_check": chain_check,
        },
        "bytes": delta_bytes_figures(rig.delta_files, rig.checkpoint_bytes, tables),
        "run_dir": str(rig.checkpointers[last].run_dir),
    }


def summarise_stall(segments: list[dict[str, Any]], every: int) -> dict[str, Any]:
    """The stall figures from the timed segments (all of them: none is dropped or trimmed)."""
    wall = {k: [r["wall_s"] for r in segments if r["kind"] == k] for k in KINDS}
    cpu = {k: [r["train_thread_cpu_s"] for r in segments if r["kind"] == k] for k in KINDS}
    blocked = [r["blocked_s"] for r in segments if r["kind"] == "checkpoint"]
    per_segment = [(b - a) / a for a, b in zip(wall["off"], wall["checkpoint"], strict=True)]
    stall = paired_ratio_interval(wall["off"], wall["checkpoint"])
    raw = paired_ratio_interval(wall["off"], wall["raw"])
    beyond_raw = paired_ratio_interval(wall["raw"], wall["checkpoint"])
    off_total = sum(wall["off"])
    return {
        "step_s": off_total / (len(wall["off"]) * every),
        "stall_fraction": stall["point"],
        "stall_fraction_ci95": stall["ci95"],
        "stall_fraction_upper95": stall["ci95"][1],
        "stall_fraction_se": stall["se"],
        "stall_fraction_bootstrap_ci95": stall["bootstrap_ci95"],
        "stall_interval": stall,
        "stall_fraction_per_segment": per_segment,
        "stall_fraction_median": statistics.median(per_segment),
        "stall_fraction_by_order": stall_by_order(segments),
        "stall_fraction_by_round": stall_by_round(segments, "checkpoint"),
        "raw_write_stall_fraction_by_round": stall_by_round(segments, "raw"),
        "raw_write_stall_fraction": raw["point"],
        "raw_write_stall_fraction_ci95": raw["ci95"],
        "raw_write_interval": raw,
        "checkpoint_ms_per_checkpoint": 1e3
        * statistics.fmean(b - a for a, b in zip(wall["off"], wall["checkpoint"], strict=True)),
        "raw_write_ms_per_checkpoint": 1e3
        * statistics.fmean(b - a for a, b in zip(wall["off"], wall["raw"], strict=True)),
        "checkpoint_vs_raw_write": beyond_raw["point"],
        "checkpoint_vs_raw_write_ci95": beyond_raw["ci95"],
        "train_thread_cpu_excess": sum(cpu["checkpoint"]) / sum(cpu["off"]) - 1.0,
        "blocked_fraction": sum(blocked) / off_total,
        "blocked_s_median": statistics.median(blocked),
        "off_hook_fraction": sum(r["hook_s"] for r in segments if r["kind"] == "off") / off_total,
    }


def summarise_delta(segments: list[dict[str, Any]], every: int) -> dict[str, Any]:
    """The delta role's figures, the same way as the full checkpoint's: its stall over all
    its checkpoints (``delta_stall_fraction``: a full one every ``F`` segments, deltas
    between), over the segments whose checkpoint was a delta only
    (``delta_only_stall_fraction``) and a full one only, and against the full checkpoint
    role (paired: ``delta_vs_checkpoint`` = delta role / checkpoint role - 1)."""
    by_segment: dict[int, dict[str, dict[str, Any]]] = {}
    for r in segments:
        by_segment.setdefault(r["segment"], {})[r["kind"]] = r
    runs = [by_segment[i] for i in sorted(by_segment)]

    def walls(kind: str, which: str | None = None) -> list[float]:
        return [
            r[kind]["wall_s"]
            for r in runs
            if which is None or r["delta"]["checkpoint_kind"] == which
        ]

    def interval(off: list[float], treated: list[float]) -> dict[str, Any] | None:
        return paired_ratio_interval(off, treated) if len(off) >= 2 else None

    allc = paired_ratio_interval(walls("off"), walls("delta"))
    only = interval(walls("off", "delta"), walls("delta", "delta"))
    fulls = interval(walls("off", "full"), walls("delta", "full"))
    vs_full = paired_ratio_interval(walls("checkpoint"), walls("delta"))
    only_vs_full = interval(walls("checkpoint", "delta"), walls("delta", "delta"))
    blocked = {
        which: [r["delta"]["blocked_s"] for r in runs if r["delta"]["checkpoint_kind"] == which]
        for which in ("delta", "full")
    }
    fills = [r["delta"]["fill_s"] for r in runs if r["delta"]["checkpoint_kind"] == "delta"]
    merges = [r["delta"]["merge_s"] for r in runs if r["delta"]["checkpoint_kind"] == "delta"]
    cpu_off = sum(r["off"]["train_thread_cpu_s"] for r in runs)
    off_total = sum(walls("off"))

    def ms_per(kind: str, which: str | None) -> float | None:
        off, treated = walls("off", which), walls(kind, which)
        pairs = zip(off, treated, strict=True)
        return 1e3 * statistics.fmean(b - a for a, b in pairs) if off else None

    return {
        "delta_stall_fraction": allc["point"],
        "delta_stall_fraction_ci95": allc["ci95"],
        "delta_stall_fraction_upper95": allc["ci95"][1],
        "delta_stall_fraction_bootstrap_ci95": allc["bootstrap_ci95"],
        "delta_stall_interval": allc,
        "delta_stall_fraction_by_round": stall_by_round(segments, "delta"),
        "delta_only_segments": len(walls("off", "delta")),
        "delta_only_stall_fraction": only["point"] if only else None,
        "delta_only_stall_fraction_ci95": only["ci95"] if only else None,
        "delta_only_stall_fraction_upper95": only["ci95"][1] if only else None,
        "delta_only_stall_interval": only,
        "delta_role_full_segments": len(walls("off", "full")),
        "delta_role_full_stall_fraction": fulls["point"] if fulls else None,
        "delta_role_full_stall_fraction_ci95": fulls["ci95"] if fulls else None,
        "delta_vs_checkpoint": vs_full["point"],
        "delta_vs_checkpoint_ci95": vs_full["ci95"],
        "delta_only_vs_checkpoint": only_vs_full["point"] if only_vs_full else None,
        "delta_only_vs_checkpoint_ci95": only_vs_full["ci95"] if only_vs_full else None,
        "delta_ms_per_checkpoint": ms_per("delta", None),
        "delta_only_ms_per_checkpoint": ms_per("delta", "delta"),
        "delta_blocked_s_median": statistics.median(blocked["delta"]) if blocked["delta"] else None,
        "delta_fill_s_median": statistics.median(fills) if fills else None,
        "delta_merge_s_median": statistics.median(merges) if merges else None,
        "delta_role_full_blocked_s_median": (
            statistics.median(blocked["full"]) if blocked["full"] else None
        ),
        "delta_blocked_fraction": sum(blocked["delta"] + blocked["full"]) / off_total,
        "delta_train_thread_cpu_excess": sum(r["delta"]["train_thread_cpu_s"] for r in runs)
        / cpu_off
        - 1.0,
    }


def summarise_row_log(
    segments: list[dict[str, Any]], timers: list[RowLogTimer], every: int
) -> dict[str, Any]:
    """What logging the touched rows costs: the time inside the logging calls (timed in the
    step, :class:`RowLogTimer`) over the *off* segments' wall time (training without
    checkpoints: the step time), per-step marks plus the per-checkpoint restart of the log
    (``detach_row_logs``, which *off* also does at each segment's first step), with the
    paired interval over segments (treated = off + its logging time)."""
    off = [r for r in segments if r["kind"] == "off"]
    wall = [r["wall_s"] for r in off]
    logged = [r["row_log_s"] + r["row_log_restart_s"] for r in off]
    total = paired_ratio_interval(wall, [w + x for w, x in zip(wall, logged, strict=True)])
    marks = paired_ratio_interval(
        wall, [w + r["row_log_s"] for w, r in zip(wall, off, strict=True)]
    )
    steps = len(off) * every
    per_segment = [x / w for x, w in zip(logged, wall, strict=True)]
    everywhere = sum(r["row_log_s"] + r["row_log_restart_s"] for r in segments)
    deltas = [r for r in segments if r.get("checkpoint_kind") == "delta"]
    return {
        "method": "time inside LazyAdam._log_rows (every step, every table) and "
        "detach_row_logs (once per segment), wrapped with perf_counter on the instance, in "
        "the off role's timed segments, over those segments' wall time; interval: "
        + "paired ratio, as the stall (treated_i = off_i + logging_i). The merge of the "
        "logged rows runs on the writer thread at each delta (merge_us_per_delta): its cost "
        "to training is inside the delta stall",
        "row_log_fraction": total["point"],
        "row_log_fraction_ci95": total["ci95"],
        "row_log_fraction_upper95": total["ci95"][1],
        "row_log_fraction_per_segment_range": [min(per_segment), max(per_segment)],
        "row_log_fraction_median": statistics.median(per_segment),
        "marks_only_fraction": marks["point"],
        "marks_only_fraction_ci95": marks["ci95"],
        "us_per_step": 1e6 * sum(r["row_log_s"] for r in off) / steps,
        "restart_us_per_checkpoint": 1e6 * sum(r["row_log_restart_s"] for r in off) / len(off),
        "merge_us_per_delta": (
            1e6 * sum(r["merge_s"] for r in deltas) / len(deltas) if deltas else None
        ),
        "step_s": sum(wall) / steps,
        "all_roles_fraction": everywhere / sum(r["wall_s"] for r in segments),
        "log_calls_total": sum(t.log_calls for t in timers),
        "target": TARGET_ROW_LOG,
        "target_met": total["ci95"][1] <= TARGET_ROW_LOG,
    }


def stall_by_round(segments: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """``kind``'s extra time over *off* split into the segment's first round, which holds the
    checkpoint (or raw write; it is waited for at that round's end), and the other rounds
    (where any lasting effect of the write would show), each over the off segments' whole
    time, with the same paired interval as the headline (which is their sum)."""
    by_segment: dict[int, dict[str, dict[str, Any]]] = {}
    for r in segments:
        by_segment.setdefault(r["segment"], {})[r["kind"]] = r
    runs = [by_segment[i] for i in sorted(by_segment)]
    off = [sum(r["off"]["round_wall_s"]) for r in runs]
    out = {}
    for name, rounds in (("first_round", slice(0, 1)), ("other_rounds", slice(1, None))):
        diffs = [
            sum(r[kind]["round_wall_s"][rounds]) - sum(r["off"]["round_wall_s"][rounds])
            for r in runs
        ]
        interval = paired_ratio_interval(off, [a + d for a, d in zip(off, diffs, strict=True)])
        out[name] = {"point": interval["point"], "ci95": interval["ci95"]}
    return out


def stall_by_order(segments: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The stall over the rounds where the checkpointing trainer ran before / after *off* (a
    check that the slot does not decide the result; both halves stay in the headline)."""
    by_segment: dict[int, dict[str, dict[str, Any]]] = {}
    for r in segments:
        by_segment.setdefault(r["segment"], {})[r["kind"]] = r
    sums: dict[str, list[float]] = {"before": [0.0, 0.0, 0], "after": [0.0, 0.0, 0]}
    for runs in by_segment.values():
        off, ckpt = runs["off"], runs["checkpoint"]
        for k, (off_s, ckpt_s) in enumerate(
            zip(off["round_wall_s"], ckpt["round_wall_s"], strict=True)
        ):
            key = "before" if ckpt["positions"][k] < off["positions"][k] else "after"
            sums[key][0] += off_s
            sums[key][1] += ckpt_s
            sums[key][2] += 1
    return {
        f"checkpoint_{key}_off": {
            "rounds": int(n),
            "stall": ckpt_s / off_s - 1.0 if n else math.nan,
        }
        for key, (off_s, ckpt_s, n) in sums.items()
    }


# ---------------------------------------------------------------------------- statistics
INTERVAL_METHOD = (
    "paired per segment: ratio R = sum(treated) / sum(off) - 1 = mean(d) / mean(off) with "
    "d_i = treated_i - off_i; 95% Student-t interval (n - 1 degrees of freedom) on the "
    "linearised ratio (delta method): standard error = stdev(d_i - R * off_i) / sqrt(n) / "
    "mean(off), which is stdev(d_i) / sqrt(n) / mean(off) when R = 0; every segment counted. "
    "Cross-check: percentile bootstrap over segments (ratio of sums)"
)
BOOTSTRAP_RESAMPLES = 10_000


def paired_ratio_interval(
    off_s: list[float], treated_s: list[float], *, seed: int = 0
) -> dict[str, Any]:
    """``treated / off - 1`` over paired segments, with a 95% t-interval (delta method) and a
    percentile-bootstrap cross-check; see :data:`INTERVAL_METHOD`. Needs >= 2 segments."""
    import numpy as np

    n = len(off_s)
    if n < 2 or len(treated_s) != n:
        raise ValueError(f"paired_ratio_interval: need >= 2 paired segments, got {n}")
    off, treated = np.asarray(off_s), np.asarray(treated_s)
    diffs = treated - off
    ratio = float(diffs.mean() / off.mean())
    se = float(np.std(diffs - ratio * off, ddof=1) / math.sqrt(n) / off.mean())
    t = t_quantile(0.975, n - 1)
    picks = np.random.default_rng(seed).integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
    boot = diffs[picks].sum(axis=1) / off[picks].sum(axis=1)
    return {
        "method": INTERVAL_METHOD,
        "segments": n,
        "point": ratio,
        "se": se,
        "t_975": t,
        "ci95": [ratio - t * se, ratio + t * se],
        "bootstrap_ci95": [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))],
        "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
    }


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom, by
    bisection on its exact distribution function (scipy is not a dependency)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile: need 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    mass = 2 * p - 1  # P(|T| <= t)
    lo, hi = 0.0, 1.0
    while t_central_mass(hi, df) < mass:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_central_mass(mid, df) < mass else (lo, mid)
    return (lo + hi) / 2


def t_central_mass(t: float, df: int) -> float:
    """``P(|T| <= t)`` for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 0:  # sin(theta) * (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ... + cos^(df-2))
        term = total = 1.0
        for k in range(2, df - 1, 2):
            term *= (k - 1) / k * c2
            total += term
        return math.sin(theta) * total
    if df == 1:
        return 2 / math.pi * theta
    term = total = math.cos(theta)  # cos + 2/3 cos^3 + 2*4/(3*5) cos^5 + ... + cos^(df-2)
    for k in range(3, df - 1, 2):
        term *= (k - 1) / k * c2
        total += term
    return 2 / math.pi * (theta + math.sin(theta) * total)


def random_image(size_bytes: int) -> Any:
    """``size_bytes`` random bytes in a page-aligned buffer padded to whole pages (what an
    ``O_DIRECT`` write needs)."""
    import numpy as np

    from recd.train.checkpointing import IMAGE_ALIGN

    padded = -(-size_bytes // IMAGE_ALIGN) * IMAGE_ALIGN
    raw = np.random.default_rng(0).integers(0, 255, padded + IMAGE_ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % IMAGE_ALIGN
    return raw[start : start + padded]


def raw_write_s(
    directory: Path, image: Any, size_bytes: int, reps: int, *, direct: bool
) -> list[float]:
    """Seconds to write ``size_bytes`` of ``image`` sequentially (64 MiB per call) and fsync,
    ``reps`` times: buffered, or ``O_DIRECT`` (the checkpoint writer's way, without its temp
    name, rename and directory fsync)."""
    from recd.durable import fsync_file
    from recd.train.checkpointing import _write_image

    out = []
    for rep in range(reps):
        path = directory / f"raw-{threading.get_native_id()}-{rep}.bin"
        began = time.perf_counter()
        if direct:
            _write_image(path, image, size_bytes)
            fsync_file(path)
        else:
            view = image.data.cast("B")[:size_bytes]
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                done = 0
                while done < size_bytes:
                    done += os.write(fd, view[done : done + (64 << 20)])
                os.fsync(fd)
            finally:
                os.close(fd)
        out.append(time.perf_counter() - began)
        path.unlink()
    return out


def idle_checkpoint_write_s(directory: Path, source: Path, reps: int) -> list[float]:
    """The checkpoint writer (file image, ``O_DIRECT``, commit) on a real checkpoint's bytes,
    while training is not running."""
    import numpy as np

    from recd.checkpoint import ParamLayout, ParamSpec, read_checkpoint
    from recd.train.checkpointing import _FileImage

    ckpt = read_checkpoint(source)
    image = _FileImage(ParamLayout(specs=(ParamSpec("all", (ckpt.n_params,)),)), pin=False)
    image.image[: image.size_bytes] = np.fromfile(source, dtype=np.uint8)
    target_dir = directory / "idle"
    target_dir.mkdir(exist_ok=True)
    out = []
    for _ in range(reps):
        target = target_dir / source.name
        began = time.perf_counter()
        image.write(target)
        out.append(time.perf_counter() - began)
        target.unlink()
    return out


# ---------------------------------------------------------------------------- 3. resume
def resume_probe(config_path: Path) -> dict[str, Any]:
    """In this (fresh) process: resume from the newest checkpoint, train one step."""
    t0 = time.perf_counter()
    from recd.train.checkpointing import Checkpointer
    from recd.train.config import load_train_config
    from recd.train.loop import Trainer

    imported = time.perf_counter()
    config = load_train_config(config_path)
    trainer = Trainer(config, show_progress=False)
    built = time.perf_counter()
    checkpointer = Checkpointer(config)
    try:
        info = checkpointer.attach(trainer, resume=True)
        attached = time.perf_counter()
        config.train.steps = trainer.step + 1
        first = time.perf_counter()
        trainer.train()
        first_step = time.perf_counter() - first
    finally:
        checkpointer.close(raise_errors=False)
        trainer.close()
    return {
        "from_step": info.step,
        "imports_s": imported - t0,
        "build_s": built - imported,
        "read_s": info.read_s,
        "load_s": info.load_s,
        "attach_other_s": attached - built - info.read_s - info.load_s,
        "first_step_s": first_step,
    }


def measure_resume(config_path: Path, *, fresh_process: bool) -> dict[str, Any]:
    if not fresh_process:
        probe = resume_probe(config_path)
        probe["interpreter_s"] = 0.0
        probe["fresh_process"] = False
    else:
        began = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, "--resume-probe", str(config_path)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "RECD_PROGRESS": "0"},
        )
        total = time.perf_counter() - began
        probe = json.loads(proc.stdout.strip().splitlines()[-1])
        inside = probe["imports_s"] + probe["build_s"] + probe["read_s"] + probe["load_s"]
        inside += probe["attach_other_s"] + probe["first_step_s"]
        probe["interpreter_s"] = max(0.0, total - inside)
        probe["fresh_process"] = True
    probe["startup_s"] = probe["interpreter_s"] + probe["imports_s"] + probe["build_s"]
    return probe


# ---------------------------------------------------------------------------- 4. large tables
LARGE = Size(
    profile="large",
    sessions=40_000,
    embedding_dim=16,
    max_rows=1_000_000,
    every=100,
    blocks=16,
    rounds=1,
)
"""--large: 4 tables x 1M rows x 16 (64M parameters, 768 MB checkpoints); 16 checkpoints at
cadence 100 (4 full, 12 deltas with full_every 4), ~480k rows of table (read once)."""
LARGE_QUICK = Size(
    profile="large", sessions=2000, embedding_dim=4, max_rows=20_000, every=20, blocks=8, rounds=1
)

LARGE_CATALOGUE = """# large: benchmarks/checkpoint.py --large. Four sparse features of {cardinality} ids each,
# drawn bounded-Zipf (exponent 1.1, the generator's default) and scattered over the id space;
# with model.max_rows = {cardinality} every table has {cardinality} rows.
name = "large"
labels = ["label"]

[sessions]
num_sessions = {sessions}
mean_samples = 12.0
max_samples = 500
servers = 8
duration_s = 7200
mean_gap_s = 20.0

[[dense]]
name = "user_age_days"
unchanged_prob = 1.0
scale = 300.0

[[dense]]
name = "item_price"
repeat = 4
scale = 20.0

[[sparse]]
name = "user_interests"
kind = "static"
mean_length = 4
unchanged_prob = 1.0
cardinality = {cardinality}

[[sparse]]
name = "user_click_history"
kind = "history"
mean_length = 10
max_length = 16
unchanged_prob = 0.8
cardinality = {cardinality}

[[sparse]]
name = "item_id"
kind = "item"
mean_length = 1
cardinality = {cardinality}

[[sparse]]
name = "item_tags"
kind = "item"
mean_length = 3
cardinality = {cardinality}
"""


class SaveProbe:
    """A step hook placed *before* the Checkpointer: at each checkpoint step it records the
    Checkpointer's cumulative training-thread counters just before the save, so that what
    one checkpoint costs the training thread (its own snapshot work and the copy-on-write
    waits of the steps after it; not the wait for the previous write) is the difference to
    the next record."""

    def __init__(self, checkpointer: Any, every: int) -> None:
        self.checkpointer, self.every = checkpointer, every
        self.marks: list[dict[str, float]] = []

    def mark(self, step: int) -> None:
        st = self.checkpointer.stats
        self.marks.append(
            {
                "step": step,
                "t": time.perf_counter(),
                "blocked_s": st.blocked_s,
                "wait_s": st.wait_s,
                "guard_wait_s": st.guard_wait_s,
            }
        )

    def after_step(self, trainer: Any, step: int, loss: float) -> None:
        if step % self.every == 0:
            self.mark(step)


def large_catalogue(size: Size, work: Path) -> Path:
    path = work / "large.toml"
    path.write_text(LARGE_CATALOGUE.format(cardinality=size.max_rows, sessions=size.sessions))
    return path


def measure_large(size: Size, work: Path, threads: int, full_every: int) -> dict[str, Any]:
    """One trainer with ``full_every`` and a checkpoint every ``size.every`` steps (the real
    Checkpointer's cadence, background writes, every file kept), ``size.blocks`` checkpoints;
    then a full checkpoint at the last delta's step to check the chain against. Bytes of
    each file, the rows each delta holds, the training thread's time per checkpoint (the
    delta's gather; the full file's snapshot), the row logging's time."""
    import shutil

    from recd.checkpoint import read_checkpoint
    from recd.checkpoint.chain import chain_paths, read_any, step_of_name
    from recd.train.checkpointing import Checkpointer
    from recd.train.config import load_train_config
    from recd.train.loop import Trainer

    catalogue = large_catalogue(size, work)
    table = build_table(Size(**{**size.__dict__, "profile": str(catalogue)}), work)
    run_dir = work / "large-run"
    shutil.rmtree(run_dir, ignore_errors=True)
    last = size.blocks * size.every
    config_path = write_config(
        work / "large-train.toml",
        table,
        run_dir,
        size,
        last + 1,  # the last checkpoint is before the run's end: a delta, not the final full
        threads,
        full_every=full_every,
        checkpoint_every=size.every,
        keep_last=1_000_000,  # every file stays, to be measured
    )
    config = load_train_config(config_path)
    trainer = Trainer(config, show_progress=False)
    checkpointer = Checkpointer(config)
    checkpointer.attach(trainer)
    probe = SaveProbe(checkpointer, size.every)
    trainer.hooks += [probe, checkpointer]
    row_log = RowLogTimer(trainer.optimizer)
    optimizer = trainer.optimizer
    fills = FillTimer(checkpointer).fills
    stepper = Stepper(trainer)
    layout = checkpointer.layout
    tables = table_sizes(layout, optimizer)
    rows_in_table = trainer.loader.plan.num_rows
    gc.collect()
    gc.freeze()
    try:
        began = time.perf_counter()
        stepper.run_to(last)
        checkpointer.wait()
        loop_s = time.perf_counter() - began
        probe.mark(last)  # closes the last interval (its own counters only)
        hooks_s = stepper.hook_s
        logged = {"log_s": row_log.log_s, "restart_s": row_log.restart_s}
        restarts = list(row_log.restarts)
        kinds = ["delta" if s.endswith(".delta") else "full" for s in names_by_step(run_dir)]
        checkpointer._chain = None
        checkpointer.save(trainer, reason="requested")  # the same step, full: the reference
        checkpointer.close()
    finally:
        checkpointer.close(raise_errors=False)
        trainer.close()
    gc.unfreeze()
    files = []
    for path in sorted(run_dir.glob("step_*"), key=lambda p: step_of_name(p.name) or 0):
        step = step_of_name(path.name)
        if step is None or (path.suffix == ".bin" and step == last):
            continue  # a sidecar, or the reference
        record = {"step": step, "kind": "delta" if path.suffix == ".delta" else "full"}
        record["bytes"] = path.stat().st_size
        if record["kind"] == "delta":
            record.update(delta_rows(path, layout, optimizer))
        files.append(record)
    delta_path = run_dir / f"step_{last:06d}.delta"
    if delta_path.exists():
        chained = read_any(delta_path, layout)
        full = read_checkpoint(run_dir / f"step_{last:06d}.bin", layout)
        diff = max_abs_diff(chained, full)
        chain_check: dict[str, Any] = {
            "step": last,
            "links": [p.name for p in chain_paths(delta_path)],
            "max_abs_diff": diff,
        }
        del chained, full
    else:
        chain_check = {"step": last, "links": None, "max_abs_diff": None}
    marks = probe.marks
    per_checkpoint: list[dict[str, Any]] = []
    waits = [b["wait_s"] - a["wait_s"] for a, b in itertools.pairwise(marks)]
    for k, (a, b) in enumerate(itertools.pairwise(marks)):
        blocked = b["blocked_s"] - a["blocked_s"]
        wait = b["wait_s"] - a["wait_s"]
        per_checkpoint.append(
            {
                "step": a["step"],
                "kind": kinds[k],
                # the last one is followed by no interval of training
                "interval_wall_s": b["t"] - a["t"] if k < len(marks) - 2 else None,
                "train_thread_s": blocked - wait,
                "guard_wait_s": b["guard_wait_s"] - a["guard_wait_s"],
                "wait_for_previous_write_s": wait,
                # the next checkpoint's wait for this one's write (backpressure)
                "next_waited_s": waits[k + 1] if k + 1 < len(waits) else None,
            }
        )
    fill_s = [f["s"] for f in fills]
    merge_s = [f["merge_s"] for f in fills]

    def med(kind: str, key: str) -> float | None:
        values = [c[key] for c in per_checkpoint if c["kind"] == kind and c[key] is not None]
        return statistics.median(values) if values else None

    steps = last
    full_mb = (8 + 12 * layout.n_params) / 1e6
    bytes_figures = delta_bytes_figures(files, 8 + 12 * layout.n_params, tables)
    return {
        "n_params": layout.n_params,
        "tables": tables,
        "embedding_dim": size.embedding_dim,
        "every_steps": size.every,
        "full_every": full_every,
        "checkpoints": len(per_checkpoint),
        "rows_in_table": rows_in_table,
        "rows_read": steps * BATCH_SIZE,
        "loop_s": loop_s,
        "step_s": loop_s / steps,
        "bytes": bytes_figures,
        "delta_bytes_ratio": bytes_figures.get("delta_bytes_ratio"),
        "touched_fraction": bytes_figures.get("touched_fraction"),
        "delta_bytes_target_met": (bytes_figures.get("delta_bytes_ratio") or math.inf)
        <= TARGET_LARGE_DELTA_BYTES,
        "train_thread": {
            "log_restart_s_median": statistics.median(restarts) if restarts else None,
            "delta_checkpoint_s_median": med("delta", "train_thread_s"),
            "full_checkpoint_s_median": med("full", "train_thread_s"),
            "full_guard_wait_s_median": med("full", "guard_wait_s"),
            "next_checkpoint_waited_s": {
                kind: [
                    c["next_waited_s"]
                    for c in per_checkpoint
                    if c["kind"] == kind and c["next_waited_s"] is not None
                ]
                for kind in ("full", "delta")
            },
        },
        "writer_thread": {
            "delta_fill_s": fill_s,
            "delta_fill_s_median": statistics.median(fill_s) if fill_s else None,
            "delta_merge_s_median": statistics.median(merge_s) if merge_s else None,
        },
        "interval_wall_s_median": {
            "after_full": med("full", "interval_wall_s"),
            "after_delta": med("delta", "interval_wall_s"),
        },
        "per_checkpoint": per_checkpoint,
        "files": files,
        "chain_check": chain_check,
        "row_log": {
            "method": "time inside LazyAdam._log_rows (every step, every table) and the log's "
            "restart (detach_row_logs, once per checkpoint), wrapped with "
            "perf_counter on the instance, over the training loop's wall time (checkpoints "
            "included); the merge of a delta's rows runs on the writer thread "
            "(writer_thread.delta_merge_s_median)",
            "row_log_fraction": (logged["log_s"] + logged["restart_s"]) / loop_s,
            "marks_only_fraction": logged["log_s"] / loop_s,
            "us_per_step": 1e6 * logged["log_s"] / steps,
            "restart_us_per_checkpoint": 1e6 * logged["restart_s"] / max(1, len(per_checkpoint)),
            "hooks_fraction": hooks_s / loop_s,
            "target": TARGET_ROW_LOG,
        },
        "stall": f"not measured: --large runs one trainer (the four-trainer rig would hold 4 x "
        f"{2 * full_mb:,.0f} MB of model, Adam and file image and write a {full_mb:,.0f} MB "
        "full file and as many raw bytes every segment); reported instead: bytes, the "
        "training thread's time per checkpoint (train_thread) and the wall time of the "
        "intervals after a full / a delta",
    }


def names_by_step(run_dir: Path) -> list[str]:
    """The checkpoint file names of ``run_dir``, by step (full and delta)."""
    from recd.checkpoint.atomic import list_checkpoints

    return [p.name for p in list_checkpoints(run_dir)]


def run_large(args: argparse.Namespace, work: Path, command: str) -> dict[str, Any]:
    load_before = os.getloadavg()
    size = LARGE_QUICK if args.quick else LARGE
    if args.blocks is not None:
        size = Size(**{**size.__dict__, "blocks": args.blocks})
    began = time.perf_counter()
    large = measure_large(size, work, args.threads, args.full_every)
    load_after = os.getloadavg()
    return {
        "size": size.__dict__,
        "threads": args.threads,
        "protocol": {
            "model": f"DLRM, {len(large['tables'])} tables x {size.max_rows:,} rows x "
            f"{size.embedding_dim}, Adam (lazy on the tables), batch {BATCH_SIZE}",
            "ids": "bounded Zipf, exponent 1.1 (the generator's default), scattered over the "
            "id space; catalogue written by the benchmark (LARGE_CATALOGUE)",
            "run": f"one trainer, [checkpoint] checkpoint_every = {size.every}, full_every = "
            f"{args.full_every}, background writes, every file kept; {size.blocks} "
            "checkpoints, then a full checkpoint at the last one's step (the reference for "
            "the chain check, not counted)",
            "train_thread": "per checkpoint: the Checkpointer's blocked time from its save "
            "to the next save (its own snapshot work: audit, reader state, the delta's "
            "row-log swap and dense copy plan or the full file's copy plan, and the "
            "copy-on-write waits of the steps after it) minus its wait for the previous write "
            "(listed apart); the delta's copy on the writer thread (merge of the row logs, "
            "gather of the rows) timed apart (writer_thread)",
            "touched_fraction": "rows a delta holds / the table's rows: the rows Adam "
            f"updated in the {size.every} steps it covers",
            "stall": large["stall"],
            "command": command,
        },
        "large": large,
        "delta_bytes_ratio": large["delta_bytes_ratio"],
        "touched_fraction": large["touched_fraction"],
        "delta_bytes_target_met": large["delta_bytes_target_met"],
        "targets": {
            "delta_bytes_ratio": TARGET_LARGE_DELTA_BYTES,
            "row_log_fraction": TARGET_ROW_LOG,
        },
        "wall_s": time.perf_counter() - began,
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_before": load_before,
            "load_avg": load_after,
        },
    }


def markdown_large(r: dict[str, Any]) -> str:
    g = r["large"]
    b, tt, wt, rl = g["bytes"], g["train_thread"], g["writer_thread"], g["row_log"]
    per_table = ", ".join(
        f"{name.split('.')[-2] if '.' in name else name} {frac:.4f}"
        for name, frac in b["touched_fraction_per_table"].items()
    )

    def ms(x: float | None) -> str:
        return "n/a" if x is None else f"{x * 1e3:.1f} ms"

    waits = tt["next_checkpoint_waited_s"]
    verdict = "met" if r["delta_bytes_target_met"] else "not met"
    chain = g["chain_check"]
    lines = [
        "| measure | value |",
        "|---|---|",
        f"| model | DLRM, {g['n_params']:,} parameters: {len(g['tables'])} tables x "
        f"{max(g['tables'].values()):,} rows x {g['embedding_dim']}; full checkpoint "
        f"{b['full_bytes'] / 1e6:,.1f} MB |",
        f"| run | {g['checkpoints']} checkpoints every {g['every_steps']} steps, full_every "
        f"{g['full_every']} ({b['fulls']} full, {b['deltas']} deltas); step "
        f"{g['step_s'] * 1e3:.1f} ms; {g['rows_read']:,} rows read of a "
        f"{g['rows_in_table'] or 0:,}-row table |",
        f"| **delta bytes / full bytes** (target <= {TARGET_LARGE_DELTA_BYTES:.2f}) | "
        f"**{b['delta_bytes_ratio']:.4f}** ({verdict}); mean delta "
        f"{b['delta_bytes_mean'] / 1e6:,.2f} MB, largest {b['delta_bytes_ratio_max']:.4f} |",
        f"| touched fraction per interval (rows updated / all rows) | overall "
        f"{b['touched_fraction']:.4f} (range {b['touched_fraction_range'][0]:.4f} .. "
        f"{b['touched_fraction_range'][1]:.4f}); per table: {per_table} |",
        f"| training thread per checkpoint: delta / full (snapshot incl. copy-on-write "
        f"waits) | {ms(tt['delta_checkpoint_s_median'])} / "
        f"{ms(tt['full_checkpoint_s_median'])} |",
        f"| writer thread per delta: its copy (of which the row logs' merge) | "
        f"{ms(wt['delta_fill_s_median'])} ({ms(wt['delta_merge_s_median'])}) |",
        f"| the next checkpoint's wait for this one's write (median): full / delta | "
        f"{ms(statistics.median(waits['full']) if waits['full'] else None)} / "
        f"{ms(statistics.median(waits['delta']) if waits['delta'] else None)} |",
        f"| interval wall time after a full / a delta (median, {g['every_steps']} steps) | "
        f"{g['interval_wall_s_median']['after_full']:.2f} s / "
        f"{g['interval_wall_s_median']['after_delta']:.2f} s |",
        f"| row logging / training time (target <= {TARGET_ROW_LOG}) | "
        f"{rl['row_log_fraction']:.5f} ({rl['us_per_step']:.1f} us per step + "
        f"{rl['restart_us_per_checkpoint']:.0f} us per checkpoint; the merge: writer thread) |",
        f"| chain check: step {chain['step']} restored through "
        f"{len(chain['links'] or [])} files vs a full file | max abs diff "
        f"{chain['max_abs_diff']} |",
        f"| stall | {g['stall']} |",
        f"| machine | {r['machine']['cpus']} CPUs, load average "
        f"{r['machine']['load_avg_before'][0]:.1f} before, "
        f"{r['machine']['load_avg'][0]:.1f} after; {r['wall_s']:.0f} s |",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- report
def run(args: argparse.Namespace, work: Path, command: str) -> dict[str, Any]:
    load_before = os.getloadavg()
    size = QUICK if args.quick else FULL
    if args.blocks is not None:
        size = Size(**{**size.__dict__, "blocks": args.blocks})
    if args.rounds is not None:
        if args.rounds < 1 or size.every % args.rounds:
            raise SystemExit(f"--rounds must divide the cadence ({size.every} steps)")
        size = Size(**{**size.__dict__, "rounds": args.rounds})
    table = build_table(size, work)
    run_dir = work / "run"
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)
    steps = size.every * (size.blocks + 1)
    config = write_config(work / "bench.toml", table, run_dir, size, steps, args.threads)
    stall = measure_stall(config, size, args.orders_seed, args.full_every)
    run_dir = Path(stall["run_dir"])  # the checkpointing trainer's
    write, write_bw_vs_raw = measure_write(stall, run_dir, args.raw_reps)
    config = write_config(work / "resume.toml", table, run_dir, size, steps, args.threads)
    resume = measure_resume(config, fresh_process=not args.quick)
    load_after = os.getloadavg()
    return {
        "size": size.__dict__,
        "threads": args.threads,
        "protocol": protocol(stall, size, args, command, (load_before, load_after)),
        "stall": stall,
        "stall_fraction_upper95": stall["stall_fraction_upper95"],
        "stall_fraction": stall["stall_fraction"],
        "stall_fraction_ci95": stall["stall_fraction_ci95"],
        "stall_target_met": stall["stall_fraction_upper95"] <= TARGET_STALL,
        "raw_write_stall_fraction": stall["raw_write_stall_fraction"],
        "raw_write_stall_fraction_ci95": stall["raw_write_stall_fraction_ci95"],
        "blocked_fraction": stall["blocked_fraction"],
        "full_every": args.full_every,
        "delta_stall_fraction_upper95": stall["delta_stall_fraction_upper95"],
        "delta_stall_fraction": stall["delta_stall_fraction"],
        "delta_stall_fraction_ci95": stall["delta_stall_fraction_ci95"],
        "delta_stall_target_met": stall["delta_stall_fraction_upper95"] <= TARGET_DELTA_STALL,
        "delta_only_stall_fraction": stall["delta_only_stall_fraction"],
        "delta_only_stall_fraction_ci95": stall["delta_only_stall_fraction_ci95"],
        "delta_only_stall_fraction_upper95": stall["delta_only_stall_fraction_upper95"],
        "delta_vs_checkpoint": stall["delta_vs_checkpoint"],
        "delta_vs_checkpoint_ci95": stall["delta_vs_checkpoint_ci95"],
        "delta_bytes_ratio": stall["bytes"].get("delta_bytes_ratio"),
        "delta_bytes_target_met": (stall["bytes"].get("delta_bytes_ratio") or math.inf)
        <= TARGET_DELTA_BYTES,
        "touched_fraction": stall["bytes"].get("touched_fraction"),
        "row_log_fraction": stall["row_log"]["row_log_fraction"],
        "row_log_fraction_ci95": stall["row_log"]["row_log_fraction_ci95"],
        "row_log_target_met": stall["row_log"]["target_met"],
        "write": write,
        "write_bw_vs_raw": write_bw_vs_raw,
        "resume": resume,
        "targets": {
            "stall_fraction_upper95": TARGET_STALL,
            "write_bw_vs_raw": TARGET_BW,
            "delta_stall_fraction_upper95": TARGET_DELTA_STALL,
            "delta_bytes_ratio": TARGET_DELTA_BYTES,
            "row_log_fraction_upper95": TARGET_ROW_LOG,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_before": load_before,
            "load_avg": load_after,
        },
    }


def protocol(
    stall: dict[str, Any],
    size: Size,
    args: argparse.Namespace,
    command: str,
    load: tuple[tuple[float, float, float], tuple[float, float, float]],
) -> dict[str, Any]:
    """How the stall figures were taken, recorded beside them (docs/benchmarks.md)."""
    steps_per_trainer = size.every - 1 + size.blocks * size.every
    return {
        "segments": size.blocks,
        "steps_per_segment": size.every,
        "checkpoint_every_steps": size.every,
        "checkpoints_per_segment": 1,
        "checkpoint_after_step_of_segment": 1,
        "rounds_per_segment": size.rounds,
        "steps_per_round": size.every // size.rounds,
        "warmup_segment_steps": size.every - 1,
        "gc": "gc.collect() + gc.freeze() after building the trainers (the collector still "
        "runs in the timed rounds; it no longer walks the ~350k objects of the set-up)",
        "driver": "the training loop's body (next batch, train_step, step hooks) per round, "
        "one reader iterator per trainer; a trainer waits for its own background write at "
        "the end of each of its rounds (counted in its time)",
        "trainers": list(KINDS),
        "roles": "four trainer objects of the same config and seed; each segment's roles "
        "(off, checkpoint, raw, delta) assigned to them by a permutation drawn uniformly per "
        "segment (random.Random('roles:<orders_seed>')), so no object keeps a role; every "
        "trainer appends its loss history (.loss.json) at every step, off included, as recd "
        "train does (its per-step cost: off_hook_fraction)",
        "full_every": args.full_every,
        "delta_role": f"a checkpoint at the segment's first step as a Checkpointer with "
        f"full_every = {args.full_every} checkpointing every {size.every} steps writes it: "
        f"timed segments 1, 1 + {args.full_every}, ... a full file, the {args.full_every - 1} "
        "between a delta (the rows updated in the segment's last "
        f"{size.every} steps + every dense tensor) extending the chain; the role moves "
        "between trainer objects, so the rig hands each save its chain (Checkpointer._chain: "
        "None for a full file) and moves the role's file into one directory after each "
        "segment (a rename, untimed), where its chain is whole. delta_stall_fraction: all "
        "the role's segments (fulls included); delta_only_stall_fraction: the segments whose "
        "checkpoint was a delta; delta_role_full_stall_fraction: those whose was full",
        "row_logging": "every trainer's optimizer logs the rows it updates at every step "
        "(Checkpointer with full_every > 1: any trainer may play delta next), off, checkpoint "
        "and raw included, and restarts its log at each segment's first step (a save does it "
        "itself; off and raw swap it out with detach_row_logs as a save does, and the old logs "
        "are dropped after the segment, untimed, as a save drops them on its writer thread), "
        "so the log holds the last segment's rows "
        "and its cost is the same in every role (it cancels from the stalls; measured apart: "
        "row_log)",
        "row_log_method": stall["row_log"]["method"],
        "batch_size": BATCH_SIZE,
        "rows_read_per_trainer": steps_per_trainer * BATCH_SIZE,
        "rows_in_table": stall["rows_in_table"],
        "threads": args.threads,
        "order": "each round's (off, checkpoint, raw, delta) order drawn independently and "
        "uniformly from the 24 permutations: random.Random(orders_seed).sample per round",
        "orders_seed": stall["orders_seed"],
        "interval": INTERVAL_METHOD,
        "dropped_segments": size.blocks - len({r["segment"] for r in stall["segments"]}),
        "load_avg_before": load[0],
        "load_avg_after": load[1],
        "load_avg_stall_before": stall["load_avg_before"],
        "load_avg_stall_after": stall["load_avg_after"],
        "command": command,
    }


def measure_write(
    stall: dict[str, Any], run_dir: Path, raw_reps: int
) -> tuple[dict[str, Any], float]:
    """Write bandwidth of the checkpoint file during training and idle, against raw writes of
    the same bytes; and ``write_bw_vs_raw`` (both during training)."""
    from recd.checkpoint import newest_valid_checkpoint

    size_bytes = stall["checkpoint_bytes"]
    newest = newest_valid_checkpoint(run_dir)
    assert newest is not None
    image = random_image(size_bytes)
    raw_write_s(run_dir, image, size_bytes, 1, direct=False)  # settle what training left dirty
    time.sleep(1.0)
    raw: list[float] = []
    raw_direct: list[float] = []
    idle: list[float] = []
    for _ in range(raw_reps):  # interleaved: all three see the same disk weather
        raw += raw_write_s(run_dir, image, size_bytes, 1, direct=False)
        raw_direct += raw_write_s(run_dir, image, size_bytes, 1, direct=True)
        idle += idle_checkpoint_write_s(run_dir, newest, 1)
    raw_bw = size_bytes / min(statistics.median(raw), statistics.median(raw_direct))
    idle_bw = size_bytes / statistics.median(idle)
    train_bw = size_bytes / statistics.median(stall["file_write_s"])
    raw_train_bw = size_bytes / statistics.median(stall["raw_in_training_write_s"])
    write = {
        "raw_idle_write_s": raw,
        "raw_direct_idle_write_s": raw_direct,
        "checkpoint_idle_write_s": idle,
        "raw_idle_MBps": raw_bw / 1e6,
        "checkpoint_idle_MBps": idle_bw / 1e6,
        "raw_in_training_MBps": raw_train_bw / 1e6,
        "checkpoint_in_training_MBps": train_bw / 1e6,
        "idle_vs_raw": idle_bw / raw_bw,
        "in_training_vs_raw_idle": train_bw / raw_bw,
    }
    return write, train_bw / raw_train_bw


def fmt_interval(ci: list[float]) -> str:
    return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def markdown(r: dict[str, Any]) -> str:
    s, w, res, p = r["stall"], r["write"], r["resume"], r["protocol"]
    mb = s["checkpoint_bytes"] / 1e6
    per_segment = s["stall_fraction_per_segment"]
    upper = r["stall_fraction_upper95"]
    verdict = "met" if r["stall_target_met"] else "not met"
    if r["stall_fraction_ci95"][0] <= 0.0 <= upper:
        verdict += "; interval contains 0: indistinguishable from no stall"
    lines = [
        "| measure | value |",
        "|---|---|",
        f"| model | DLRM, {s['n_params']:,} parameters; checkpoint {mb:,.1f} MB |",
        f"| training step (no checkpoint) | {s['step_s'] * 1e3:.1f} ms |",
        f"| protocol | {p['segments']} segments of {p['steps_per_segment']} steps x 4 trainers "
        f"(no checkpoint / checkpoint / raw write / delta with full_every {p['full_every']}), "
        f"one checkpoint per segment (cadence "
        f"{p['checkpoint_every_steps']}), each segment in {p['rounds_per_segment']} rounds of "
        f"{p['steps_per_round']} steps, the trainers' order random per round and their roles "
        f"random per segment (seed {p['orders_seed']}); batch {p['batch_size']}, {p['threads']} thread(s); no segment "
        "dropped |",
        f"| **stall_fraction_upper95** (target <= {TARGET_STALL}, met by the upper end) | "
        f"**{upper:+.4f}** ({verdict}) |",
        f"| stall_fraction: point estimate, 95% interval (paired t over segments) | "
        f"{r['stall_fraction']:+.4f} {fmt_interval(r['stall_fraction_ci95'])}; bootstrap "
        f"{fmt_interval(s['stall_fraction_bootstrap_ci95'])} |",
        f"| same, split: the round that holds the checkpoint / the other 3 rounds | "
        f"{s['stall_fraction_by_round']['first_round']['point']:+.4f} "
        f"{fmt_interval(s['stall_fraction_by_round']['first_round']['ci95'])} / "
        f"{s['stall_fraction_by_round']['other_rounds']['point']:+.4f} "
        f"{fmt_interval(s['stall_fraction_by_round']['other_rounds']['ci95'])} |",
        f"| stall per segment | median {s['stall_fraction_median']:+.4f}, range "
        f"{min(per_segment):+.3f} .. {max(per_segment):+.3f} |",
        f"| same, for a raw background write of the same bytes (reference) | "
        f"{r['raw_write_stall_fraction']:+.4f} {fmt_interval(r['raw_write_stall_fraction_ci95'])} |",
        f"| training time lost per checkpoint / per raw write of the same bytes (mean) | "
        f"{s['checkpoint_ms_per_checkpoint']:+.1f} ms / {s['raw_write_ms_per_checkpoint']:+.1f} "
        "ms |",
        f"| checkpointing vs the raw write (paired: what recd adds beyond writing the bytes) | "
        f"{s['checkpoint_vs_raw_write']:+.4f} {fmt_interval(s['checkpoint_vs_raw_write_ci95'])} |",
        f"| lower bound: training-thread time per checkpoint (audit, state, snapshot waits) | "
        f"{s['blocked_s_median'] * 1e3:.1f} ms; blocked_fraction (all of it / training time) "
        f"{r['blocked_fraction']:.4f} |",
        f"| per-step hooks without checkpoints (loss history, signal poll) / training time | "
        f"{s['off_hook_fraction']:.4f} (in every trainer, off included) |",
        f"| training-thread CPU time, with checkpoints vs without | "
        f"{s['train_thread_cpu_excess']:+.4f} |",
        *delta_rows_markdown(r),
        f"| background write per checkpoint (sidecars + file + retention) | "
        f"{statistics.median(s['write_s']):.3f} s wall, "
        f"{statistics.median(s['write_cpu_s']):.3f} s CPU |",
        f"| during training: checkpoint file write / raw write of the same bytes | "
        f"{w['checkpoint_in_training_MBps']:,.0f} / {w['raw_in_training_MBps']:,.0f} MB/s |",
        f"| **write_bw_vs_raw** (target >= {TARGET_BW}) | **{r['write_bw_vs_raw']:.2f}** |",
        f"| idle: checkpoint file write / raw write | {w['checkpoint_idle_MBps']:,.0f} / "
        f"{w['raw_idle_MBps']:,.0f} MB/s ({w['idle_vs_raw']:.2f}x) |",
        f"| resume from step {res['from_step']}: start-up "
        f"({'fresh interpreter + imports + ' if res['fresh_process'] else ''}build) | "
        f"{res['startup_s']:.2f} s |",
        f"| resume: read (validate + read file) | {res['read_s']:.3f} s |",
        f"| resume: load (model, Adam, reader, RNG) | {res['load_s']:.3f} s |",
        f"| resume: first step | {res['first_step_s']:.3f} s |",
        f"| machine | {r['machine']['cpus']} CPUs, load average "
        f"{r['machine']['load_avg_before'][0]:.1f} before, "
        f"{r['machine']['load_avg'][0]:.1f} after |",
    ]
    return "\n".join(lines) + "\n"


def delta_rows_markdown(r: dict[str, Any]) -> list[str]:
    """The delta role's rows of the table (full_every = F; its files, bytes, row log)."""
    s, b, rl = r["stall"], r["stall"]["bytes"], r["stall"]["row_log"]
    f = r["full_every"]
    upper = r["delta_stall_fraction_upper95"]
    verdict = "met" if r["delta_stall_target_met"] else "not met"
    if r["delta_stall_fraction_ci95"][0] <= 0.0 <= upper:
        verdict += "; interval contains 0"

    def point_ci(point: float | None, ci: list[float] | None) -> str:
        return (
            "n/a (< 2 segments)"
            if point is None or ci is None
            else (f"{point:+.4f} {fmt_interval(ci)}")
        )

    def ms(x: float | None) -> str:
        return "n/a" if x is None else f"{x * 1e3:.1f} ms"

    def signed_ms(x: float | None) -> str:
        return "n/a" if x is None else f"{x:+.1f} ms"

    per_table = ", ".join(
        f"{name.split('.')[-2] if '.' in name else name} {frac:.3f}"
        for name, frac in b.get("touched_fraction_per_table", {}).items()
    )
    bytes_verdict = "met" if r["delta_bytes_target_met"] else "not met"
    chain = s["delta_role"]["chain_check"]
    return [
        f"| **delta_stall_fraction_upper95** (full_every {f}: 1 full + {f - 1} deltas per {f} "
        f"checkpoints; target <= {TARGET_DELTA_STALL}, met by the upper end) | **{upper:+.4f}** "
        f"({verdict}) |",
        f"| delta_stall_fraction: all its checkpoints / its deltas only "
        f"({s['delta_only_segments']} segments) / its full ones only "
        f"({s['delta_role_full_segments']}) | {point_ci(r['delta_stall_fraction'], r['delta_stall_fraction_ci95'])}"
        f" / {point_ci(s['delta_only_stall_fraction'], s['delta_only_stall_fraction_ci95'])} / "
        f"{point_ci(s['delta_role_full_stall_fraction'], s['delta_role_full_stall_fraction_ci95'])} |",
        f"| delta role vs the full checkpoint (paired: delta / full - 1): all / deltas only | "
        f"{point_ci(s['delta_vs_checkpoint'], s['delta_vs_checkpoint_ci95'])} / "
        f"{point_ci(s['delta_only_vs_checkpoint'], s['delta_only_vs_checkpoint_ci95'])} |",
        f"| training time lost per delta-role checkpoint: all / deltas only (mean) | "
        f"{signed_ms(s['delta_ms_per_checkpoint'])} / "
        f"{signed_ms(s['delta_only_ms_per_checkpoint'])} |",
        f"| training-thread time per delta-role checkpoint: a delta / a full one (median) | "
        f"{ms(s['delta_blocked_s_median'])} / {ms(s['delta_role_full_blocked_s_median'])} |",
        f"| writer-thread copy of a delta (of which the row logs' merge; median) | "
        f"{ms(s['delta_fill_s_median'])} ({ms(s['delta_merge_s_median'])}) |",
        f"| **delta bytes / full bytes** (mean over {b.get('deltas', 0)} deltas; target <= "
        f"{TARGET_DELTA_BYTES:.2f}) | **{(r['delta_bytes_ratio'] or math.nan):.4f}** "
        f"({bytes_verdict}); {b.get('delta_bytes_mean', math.nan) / 1e6:,.2f} MB vs "
        f"{b.get('full_bytes', math.nan) / 1e6:,.2f} MB |",
        f"| touched fraction per {s['every_steps']}-step interval (rows updated / all rows) | "
        f"overall {(r['touched_fraction'] or math.nan):.4f}; per table: {per_table} |",
        f"| chain check: step {chain['step']} ({chain['kind']}) restored through "
        f"{len(chain['links'])} files vs the full checkpoint of that step | max abs diff "
        f"{chain['max_abs_diff']} |",
        f"| **row logging / step time** (target <= {TARGET_ROW_LOG}; timed in the step, off "
        f"segments) | **{rl['row_log_fraction']:.5f}** {fmt_interval(rl['row_log_fraction_ci95'])}; "
        f"{rl['us_per_step']:.1f} us per step + {rl['restart_us_per_checkpoint']:.0f} us per "
        f"checkpoint (the merge of a delta's rows, on the writer thread: "
        f"{(rl['merge_us_per_delta'] or math.nan):.0f} us); per segment {rl['row_log_fraction_per_segment_range'][0]:.5f} .. "
        f"{rl['row_log_fraction_per_segment_range'][1]:.5f} |",
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    parser.add_argument("--blocks", type=int, help="timed segments per trainer")
    parser.add_argument(
        "--rounds", type=int, help="rounds per segment (the trainers take turns each round)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--raw-reps", type=int, default=5, help="repetitions of the raw write")
    parser.add_argument(
        "--orders-seed", type=int, default=0, help="seed of the per-segment trainer orders"
    )
    parser.add_argument(
        "--full-every",
        type=int,
        default=FULL_EVERY,
        help="the delta role's [checkpoint] full_every (>= 2)",
    )
    parser.add_argument(
        "--large",
        action="store_true",
        help="the large-table case only (bytes, touched fraction, training-thread times)",
    )
    parser.add_argument("--work-dir", type=Path, help="keep the table here between runs")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--resume-probe", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.full_every < 2:
        raise SystemExit("--full-every must be >= 2 (1: no deltas to measure)")
    if args.resume_probe is not None:
        print(json.dumps(resume_probe(args.resume_probe)))
        return 0
    command = "python benchmarks/checkpoint.py " + " ".join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="recd-ckpt-bench-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = (run_large if args.large else run)(args, work, command.strip())
    result["command"] = command.strip()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "checkpoint_large" if args.large else "checkpoint"
    stem += "_quick" if args.quick else ""
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    table = (markdown_large if args.large else markdown)(result)
    (args.out / f"{stem}.md").write_text(f"Command: `{result['command']}`\n\n{table}")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
