"""Checkpoint benchmark: what checkpointing costs a training run, and what resuming costs.

    python benchmarks/checkpoint.py            # DLRM, ~10M parameters (~121 MB files), cadence 100
    python benchmarks/checkpoint.py --quick    # tiny model and table, cadence 20 (CI size)

Data: synthetic logs of the ``small`` profile (``--quick``: ``tiny``) through the real
generate -> session shards -> clustering ETL; ``--work-dir`` keeps the table for the next run.
Model: the plain DLRM (``kind = "dlrm"``) of that catalogue with embedding width 32 and up to
100,000 rows per table (about 10.1M parameters; a checkpoint is ``8 + 12 n`` bytes), Adam,
batch 256, one intra-op thread (``--threads``).

1. **Stall, in one run.** Three trainers of the same config and seed (same weights, same
   batches) live in one process and take turns. In each segment one plays *off* (no
   checkpoint), one *checkpoint* (the real :class:`recd.train.checkpointing.Checkpointer`'s
   periodic save: sample audit + reader state on the training thread; the snapshot copy on
   the writer thread, copy-on-write by rows for the embedding tables; then sidecars,
   ``O_DIRECT`` temp file, fsync, rename, retention in the background) and one *raw* (a raw
   ``O_DIRECT`` write + fsync of the same bytes on a background thread at the same step: what
   any writer of these bytes costs here). Which trainer plays which role is drawn per
   segment (``segment_roles``): three objects of one config differ slightly in speed,
   persistently, and a fixed role per object made that a bias of the stall. Every trainer
   appends the loss history at every step, as ``recd train`` does; its cost is reported
   apart (``off_hook_fraction``). Segment i (i >= 1) is steps ``100 i`` to ``100 i + 99``:
   the checkpoint is taken right after its first step. It runs in 4 rounds of 25 steps (``--rounds``); in each round
   the three trainers run their 25 steps back to back in an order drawn at random for that
   round (``--orders-seed``; the orders are in the JSON), so no trainer keeps a favourable
   slot and the machine's drift over a second or two falls on all three alike. A trainer
   waits for its own background write at the end of each of its rounds, and that wait is
   counted in its time: no write ever runs during another trainer's round. Segment i of
   the three trainers covers the same steps on the same batches: a paired comparison.
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
   (``--blocks``, default 240).
2. **Write bandwidth.** ``write_bw_vs_raw`` = bytes / time the writer spent on the checkpoint
   file (temp file, sequential writes, fsync, rename, fsync dir) during training, over bytes /
   time of the raw background writes of the same bytes during training (same directory, same
   priority). Also both idle (interleaved, ``--raw-reps`` each, after one settling write).
3. **Resume.** A fresh interpreter (``recd`` imported from scratch) resumes from the newest
   checkpoint and trains one step; times: start-up (interpreter, imports, building reader,
   model and optimizer), read (validate + read the file into memory), load (copy into the
   model and Adam, reader position, RNG), first step.

Writes benchmarks/results/checkpoint.json and checkpoint.md (``--quick``: checkpoint_quick.*).
Targets (measured, not asserted): stall_fraction_upper95 <= 0.02, write_bw_vs_raw >= 0.7.
"""

from __future__ import annotations

import argparse
import gc
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
"""240 segments: ~3 x 0.9 s of training each (9 ms steps), ~11 min of the ~13 min run."""
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
checkpoint_every = 1000000000
keep_last = 2
keep_every = 0
"""


def build_table(size: Size, work: Path) -> Path:
    """The clustered table of ``size.profile`` (reused when ``work`` already has it)."""
    from recd.etl.config import EtlConfig
    from recd.etl.local import run_etl
    from recd.logs.generate import generate_logs
    from recd.logs.shard import shard_logs
    from recd.schema import load_catalogue

    table = work / f"table-{size.profile}-{size.sessions}"
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
    path: Path, table: Path, run_dir: Path, size: Size, steps: int, threads: int
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
        )
    )
    return path


# ---------------------------------------------------------------------------- 1. stall
KINDS = ("off", "checkpoint", "raw")
"""The three trainers: no checkpoints; checkpoints every ``every`` steps (the real
Checkpointer); a raw background write of the same number of bytes every ``every`` steps."""


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
    (step ``i * every``) it starts what the trainer's role in segment i asks for, a real
    checkpoint (``Checkpointer.save``, as at a periodic step) or a raw write; nothing for
    *off*."""

    def __init__(
        self, roles: list[list[str]], index: int, every: int, checkpointer: Any, raw: RawWriter
    ) -> None:
        self.roles, self.index, self.every = roles, index, every
        self.checkpointer, self.raw = checkpointer, raw

    def after_step(self, trainer: Any, step: int, loss: float) -> None:
        if step % self.every:
            return
        role = self.roles[step // self.every][self.index]
        if role == "checkpoint":
            self.checkpointer.save(trainer, reason="periodic")
        elif role == "raw":
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
    """The order of the three trainers in each round of each of ``segments`` segments, each
    drawn independently and uniformly from the 6 permutations (``random.Random(seed)``): no
    trainer holds a fixed slot, so a slot's advantage (a warmer cache, the load drifting
    within a round) falls on each trainer alike, and on average cancels."""
    rng = random.Random(seed)
    return [[rng.sample(KINDS, len(KINDS)) for _ in range(rounds)] for _ in range(segments)]


def segment_roles(segments: int, seed: int) -> list[list[str]]:
    """The role of trainers 0, 1 and 2 in each of ``segments`` segments: a permutation of
    :data:`KINDS` drawn independently and uniformly per segment (``random.Random`` seeded
    with ``"roles:<seed>"``). Three trainer objects of the same config still differ a little
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
    """The three trainers of the stall measurement (index 0, 1, 2), each with its own
    Checkpointer (loss history every step, checkpoints when its role asks) and raw writer;
    ``roles[segment][index]`` is trainer ``index``'s role in that segment."""

    trainers: list[Any]
    checkpointers: list[Any]
    raws: list[RawWriter]
    roles: list[list[str]]
    steppers: list[Stepper] = field(default_factory=list)

    @property
    def checkpoint_bytes(self) -> int:
        return self.raws[0].size_bytes

    def close(self) -> None:
        for checkpointer in self.checkpointers:
            checkpointer.close(raise_errors=False)
        for trainer in self.trainers:
            trainer.close()


def build_rig(config_path: Path, every: int, roles: list[list[str]]) -> StallRig:
    """Three trainers of the same config and seed (same weights, same batches), each with its
    own run directory (``<run_dir>-t0`` ...) and a real Checkpointer, whose own cadence is
    switched off: the :class:`RoleHook` checkpoints, writes raw or does nothing at the first
    step of each segment, as ``roles`` says. Every trainer keeps the loss history at every
    step, *off* included (``recd train`` always does)."""
    import shutil

    import numpy as np

    from recd.train.checkpointing import Checkpointer
    from recd.train.config import load_train_config
    from recd.train.loop import Trainer

    rig = StallRig(trainers=[], checkpointers=[], raws=[], roles=roles)
    image = None
    for index in range(len(KINDS)):
        config = load_train_config(config_path)
        config.train.run_dir = config.train.run_dir.parent / f"{config.train.run_dir.name}-t{index}"
        shutil.rmtree(config.train.run_dir, ignore_errors=True)
        config.checkpoint.checkpoint_every = np.iinfo(np.int64).max  # the RoleHook decides
        trainer = Trainer(config, show_progress=False)
        checkpointer = Checkpointer(config)
        checkpointer.attach(trainer)
        size_bytes = 8 + 12 * checkpointer.layout.n_params
        image = random_image(size_bytes) if image is None else image
        raw = RawWriter(config.train.run_dir, image, size_bytes)
        trainer.hooks += [checkpointer, RoleHook(roles, index, every, checkpointer, raw)]
        rig.trainers.append(trainer)
        rig.checkpointers.append(checkpointer)
        rig.raws.append(raw)
        rig.steppers.append(Stepper(trainer))
    return rig


def run_round(rig: StallRig, index: int, end_step: int) -> dict[str, float]:
    """Train trainer ``index`` up to ``end_step`` and wait for its background write (a write
    still running at the round's end belongs to this round, and is counted: no trainer's
    write ever runs during another trainer's round)."""
    stepper, checkpointer = rig.steppers[index], rig.checkpointers[index]
    began = time.perf_counter()
    cpu_began = time.thread_time()
    blocked_began = checkpointer.stats.blocked_s
    hook_began = stepper.hook_s
    stepper.run_to(end_step)
    checkpointer.wait()
    rig.raws[index].wait()
    return {
        "wall_s": time.perf_counter() - began,
        "train_thread_cpu_s": time.thread_time() - cpu_began,
        "blocked_s": checkpointer.stats.blocked_s - blocked_began,
        "hook_s": stepper.hook_s - hook_began,
    }


def run_segments(rig: StallRig, size: Size, orders: list[list[list[str]]]) -> list[dict[str, Any]]:
    """Every segment, round by round, the three trainers of a round back to back in
    ``orders[segment][round]``; one record per trainer and segment (its rounds summed).
    Segment 0 is the warm-up, recorded with ``warmup: true``."""
    records: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i, segment_order in enumerate(orders):
        ends = round_ends(i, size.every, size.rounds)
        keys = ("wall_s", "train_thread_cpu_s", "blocked_s", "hook_s")
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
            records.append(
                {
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
            )
    return records


def measure_stall(config_path: Path, size: Size, orders_seed: int) -> dict[str, Any]:
    """Three identical trainers (same seed: same weights, same batches) take turns, one
    round of ``every / rounds`` steps at a time, in an order drawn at random per round; in
    each segment of ``every`` steps one trainer checkpoints and one writes raw bytes, right
    after the segment's first step (which trainer plays which role is drawn per segment), and
    a trainer waits for its own write at the end of each of its rounds. Segment i of every
    trainer trains on the same batches, interleaved with the others' a round at a time: a
    paired comparison."""
    orders = segment_orders(size.blocks + 1, size.rounds, orders_seed)
    roles = segment_roles(size.blocks + 1, orders_seed)
    rig = build_rig(config_path, size.every, roles)
    gc.collect()
    gc.freeze()  # the collector skips the set-up's objects (a full pass over them: ~0.2 s)
    load_before = os.getloadavg()
    try:
        records = run_segments(rig, size, orders)
        for checkpointer in rig.checkpointers:
            checkpointer.close()
    finally:
        rig.close()
    stats = [c.stats for c in rig.checkpointers]
    timed = [r for r in records if not r["warmup"]]
    last = roles[-1].index("checkpoint")  # the trainer that wrote the newest checkpoint
    return {
        "n_params": rig.checkpointers[0].layout.n_params,
        "checkpoint_bytes": rig.checkpoint_bytes,
        "every_steps": size.every,
        "rows_in_table": rig.trainers[0].loader.plan.num_rows,
        "orders_seed": orders_seed,
        "orders": orders,
        "roles": roles,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "segments": timed,
        "warmup_segments": [r for r in records if r["warmup"]],
        **summarise_stall(timed, size.every),
        "wait_s_total": sum(st.wait_s for st in stats),
        "guard_wait_s_total": sum(st.guard_wait_s for st in stats),
        "checkpoints": sum(st.checkpoints for st in stats),
        "checkpoints_per_trainer": [st.checkpoints for st in stats],
        "write_s": [x for st in stats for x in st.write_s],
        "file_write_s": [x for st in stats for x in st.file_write_s],
        "write_cpu_s": [x for st in stats for x in st.write_cpu_s],
        "raw_in_training_write_s": [x for raw in rig.raws for x in raw.seconds],
        "bytes_written": sum(st.bytes_written for st in stats),
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
    stall = measure_stall(config, size, args.orders_seed)
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
        "write": write,
        "write_bw_vs_raw": write_bw_vs_raw,
        "resume": resume,
        "targets": {"stall_fraction_upper95": TARGET_STALL, "write_bw_vs_raw": TARGET_BW},
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
        "roles": "three trainer objects of the same config and seed; each segment's roles "
        "(off, checkpoint, raw) assigned to them by a permutation drawn uniformly per segment "
        "(random.Random('roles:<orders_seed>')), so no object keeps a role; every trainer "
        "appends its loss history (.loss.json) at every step, off included, as recd train "
        "does (its per-step cost: off_hook_fraction)",
        "batch_size": BATCH_SIZE,
        "rows_read_per_trainer": steps_per_trainer * BATCH_SIZE,
        "rows_in_table": stall["rows_in_table"],
        "threads": args.threads,
        "order": "each round's (off, checkpoint, raw) order drawn independently and "
        "uniformly from the 6 permutations: random.Random(orders_seed).sample per round",
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
        f"| protocol | {p['segments']} segments of {p['steps_per_segment']} steps x 3 trainers "
        f"(no checkpoint / checkpoint / raw write), one checkpoint per segment (cadence "
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
    parser.add_argument("--work-dir", type=Path, help="keep the table here between runs")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--resume-probe", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.resume_probe is not None:
        print(json.dumps(resume_probe(args.resume_probe)))
        return 0
    command = "python benchmarks/checkpoint.py " + " ".join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="recd-ckpt-bench-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = run(args, work, command.strip())
    result["command"] = command.strip()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "checkpoint_quick" if args.quick else "checkpoint"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    table = markdown(result)
    (args.out / f"{stem}.md").write_text(f"Command: `{result['command']}`\n\n{table}")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
