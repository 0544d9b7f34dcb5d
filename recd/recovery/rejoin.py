"""Survivor recovery inside ``recd train --nproc N --recovery survivor``: the workers' side.

The launcher (:mod:`recd.recovery.agent`) starts the workers, watches them and, when one dies,
publishes a failure notice in its store and starts a replacement for the dead rank. The
survivors do not stop:

1. **Detect.** Every collective of a step (the input and output all-to-alls of the sharded
   lookups, the gradient all-to-all and DDP's all-reduce in the backward, the loss all-reduce
   after the update) fails on the survivors once the dead peer's sockets close (gloo).
   :meth:`Trainer.train` catches that failure when it comes out of the step (forward,
   backward, update, loss all-reduce) and calls :meth:`SurvivorRecovery.survive`. A failure
   anywhere else (a checkpoint write, an evaluation, the signal agreement) is not recovered
   here: the worker exits with :data:`EXIT_FALLBACK` and the launcher restarts the whole group
   from the newest checkpoint (the elastic restart).
2. **Agree.** Each survivor reports, through the launcher's store, the last step it
   completed (update applied *and* loss all-reduced) and how many updates it applied. A step
   completes only when every rank reached its loss all-reduce, so the survivors normally agree
   on one step ``k``; those that applied the update of step ``k + 1`` (the peer died during
   or after its own update, before the loss all-reduce) are one step ahead. Survivors that do
   not agree (possible with 3+ ranks when a collective completes on some ranks only) fall back
   to the elastic restart.
3. **Undo.** A survivor ahead takes its update back with the record the step kept
   (``ShardedAdam.step(capture=True)``, :mod:`recd.recovery.undo`: bit-exact). By default
   (``--undo copy``) the record keeps the pre-update values the step had at hand anyway (the
   dense layers' copy, the table rows the lazy update gathered): no work per step, the
   memory of one step's updated elements; ``--undo inverse`` keeps SwIFT's smaller record
   (m and corrections) at the price of an inverse pass every step.
4. **Rejoin.** Survivors leave the broken process group and join the next generation's
   (same store, a new key prefix) with the replacement; everyone builds the sharded model
   again with the same plan (torchrec's DMP is bound to its process group), the survivors
   put their own state back (their table shards, dense layers, Adam state) and re-position
   their readers at step ``k``.
5. **Transfer.** The lowest surviving rank broadcasts the plan (agreed step, planned steps,
   reader offset, RNG state, newest checkpoint) and the dense layers with their Adam m, v.
   The replacement loads its own table shard from the newest checkpoint (partial recovery:
   rows updated after it lose those updates; their number per table and the rows themselves
   go into the audit trail, computed on a background thread by re-reading the lost steps'
   batches of every rank) and continues at step ``k + 1`` with everyone.

Every recovery is one JSON line in ``CHECKPOINT_DIR/.recovery.json`` (route, generation,
failed rank, agreed step, undone steps and whether each undo was exact, the checkpoint the
dead shard came from, rows that lost updates, ``bit_exact``) and an ``{"event": "recovery"}``
record in ``.loss.json`` at the agreed step. Timestamped events of every process go to
``CHECKPOINT_DIR/recovery/events.jsonl`` (both files: :mod:`recd.recovery.audit`, whose
:func:`~recd.recovery.audit.recovery_timeline` splits the recovery time from the events).

Why by hand: torchrun's elastic agent (and torchelastic's ``LocalElasticAgent`` under it)
restarts *every* worker when one fails; there is no API to replace one worker while the
others keep their state, which is the point of survivor recovery. torchft (replica groups
with a lighthouse) recovers data-parallel replicas, not a sharded model's lost shard.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from recd.errors import RecoveryError
from recd.recovery.audit import append_event, append_recovery_record, read_recovery_records
from recd.recovery.env import (
    KILL_ENV,
    KILL_PHASES,
    MODE_ENV,
    PEER_COPY_ENV,
    ROLE_ENV,
    UNDO_ENV,
    store_key,
)
from recd.recovery.peer_copy import PeerCopy
from recd.recovery.undo import UNDO_METHODS, UndoMethod

if TYPE_CHECKING:
    from recd.checkpoint.format import Checkpoint, ParamLayout
    from recd.train.hooks import TrainerView

__all__ = [
    "EXIT_FALLBACK",
    "KILL_ENV",
    "MODE_ENV",
    "PEER_COPY_ENV",
    "ROLE_ENV",
    "UNDO_ENV",
    "FirstStepNotice",
    "RecoveryPlan",
    "SurvivorRecovery",
    "read_checkpoint_of_step",
    "recovery_mode",
]

log = logging.getLogger(__name__)

EXIT_FALLBACK = 75
"""A worker's exit code when survivor recovery is impossible: the launcher restarts everyone."""

PHASES = KILL_PHASES
_TIMEOUT = datetime.timedelta(seconds=60)


def recovery_mode() -> str | None:
    """``survivor`` when this worker runs under the survivor-recovery launcher, else None."""
    return os.environ.get(MODE_ENV) or None


@dataclass(kw_only=True, slots=True)
class RecoveryPlan:
    """What the lowest surviving rank tells everyone after the agreement."""

    generation: int
    """The generation being joined."""
    failed_ranks: list[int]
    survivors: list[int]
    agreed_step: int
    """The step every rank continues from (completed by every survivor)."""
    step_in_flight: int
    """The step that was running when the peer died (redone by everyone)."""
    undone: list[dict[str, Any]]
    """One entry per survivor that took its update of ``agreed_step + 1`` back."""
    total: int
    """The step the job trains to (its planned steps)."""
    reader_offset: int
    """Reader position minus step (batches handed out before step 0 of this run segment)."""
    rng: str
    """``torch.get_rng_state()`` of the lowest survivor, base64 (the same on every rank)."""
    checkpoint_step: int | None
    """The newest checkpoint written and committed (None: none yet)."""
    detected_at: float
    """When the first survivor caught the failure (epoch seconds)."""
    snapshot: int | None = None
    """The Iceberg snapshot the survivors read (None: not an Iceberg table)."""
    shard_keepers: dict[str, int] | None = None
    """With peer copies: failed rank (as a string, JSON's keys) -> the survivor whose copy of
    its shards is at ``agreed_step`` (its source); a failed rank missing here loads its
    shards from the newest checkpoint. None: no peer copies."""


@dataclass(slots=True)
class _Kill:
    generation: int
    rank: int
    step: int
    phase: str


def _parse_kills(text: str) -> list[_Kill]:
    kills = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        parts = item.split(":")
        if len(parts) != 4 or parts[3] not in PHASES:
            raise RecoveryError(
                f"{KILL_ENV}: expected GEN:RANK:STEP:PHASE with PHASE one of {PHASES}, got {item!r}"
            )
        kills.append(_Kill(int(parts[0]), int(parts[1]), int(parts[2]), parts[3]))
    return kills


@dataclass(slots=True)
class _Progress:
    completed: int
    applied: int
    peer_step: int | None = None
    """The step this rank's copy of its ward's shards is at (None: no peer copy)."""


class FirstStepNotice:
    """A :class:`recd.train.hooks.StepHook` for workers under recd's launcher without survivor
    recovery (``--recovery elastic``): tells the launcher that this worker completed its first
    step, as :class:`SurvivorRecovery` does in survivor mode (the launcher's sign that the
    group has started: its ``started`` event), and logs a ``step`` event for it. After an
    elastic restart it also logs every replayed step up to the one that was in flight at the
    failure (the restart's audit record names it), so that the event log shows when the lost
    work was done again."""

    def __init__(self, store: Any, *, attempt: int, generation: int) -> None:
        self.store = store
        self.key = store_key(attempt, generation, "first_step")
        self.attempt = attempt
        self.generation = generation
        self._due = True
        self._replay_until: int | None = None

    def after_step(self, trainer: TrainerView, step: int, loss: float) -> None:
        run_dir = Path(trainer.config.checkpoint_dir)
        if self._due:
            self._due = False
            self.store.add(self.key, 1)
            if self.attempt > 0:
                self._replay_until = _in_flight_at_restart(run_dir)
        elif self._replay_until is None or step > self._replay_until:
            return
        append_event(
            run_dir,
            "step",
            rank=trainer.rank,
            attempt=self.attempt,
            gen=self.generation,
            step=step,
        )


def _in_flight_at_restart(run_dir: Path) -> int | None:
    """The step that was in flight when the newest elastic restart's failure happened."""
    restarts = [r for r in read_recovery_records(run_dir) if r.get("route") == "restart"]
    if not restarts or restarts[-1].get("last_completed_step") is None:
        return None
    return int(restarts[-1]["last_completed_step"]) + 1


class SurvivorRecovery:
    """Survivor recovery of one worker of ``recd train --recovery survivor``.

    Made by :func:`recd.train.run.run_training` for every worker; the trainer keeps
    :attr:`undo` (the record of its last update) and calls :meth:`survive` when a step's
    collective fails; a replacement calls :meth:`join` before training.
    """

    def __init__(self, trainer: TrainerView, *, store: Any, generation: int, attempt: int) -> None:
        if trainer.dist is None:
            raise RecoveryError("survivor recovery needs a multi-process job (--nproc N > 1)")
        self.trainer = trainer
        self.store = store
        """The launcher's store (unprefixed by generation)."""
        self.generation = generation
        self.start_generation = generation
        self.attempt = attempt
        self.run_dir = Path(trainer.config.checkpoint_dir)
        self.undo: Any = None
        """The undo record of this rank's last update (``ShardedAdam.step(capture=True)``)."""
        method = os.environ.get(UNDO_ENV, "copy")
        if method not in UNDO_METHODS:
            raise RecoveryError(f"{UNDO_ENV}={method!r}: expected one of {UNDO_METHODS}")
        self.undo_method: UndoMethod = method
        """How :attr:`undo` records are made (``copy``: no work per step)."""
        self.peer: PeerCopy | None = None
        """The copy of the ring predecessor's table shards (``--peer-copy``), or None."""
        if os.environ.get(PEER_COPY_ENV) == "1":
            fused = [t.name for t in trainer.optimizer.tables if t.fused]
            if fused:
                raise RecoveryError(f"--peer-copy: tables {fused} use fbgemm's fused update")
            trainer.optimizer.keep_rows_after = True
            self.peer = PeerCopy(trainer.optimizer)
        self.recoveries = 0
        self._dense_kept: torch.Tensor | None = None
        self._first_step_due = True  # announced in every generation, the first one too
        self._audit_thread: threading.Thread | None = None
        self._kills = [
            k
            for k in _parse_kills(os.environ.get(KILL_ENV, ""))
            if attempt == 0 and k.generation == generation and k.rank == trainer.rank
        ]
        self._hooks: list[Any] = []
        self._install_kills()

    # ------------------------------------------------------------------ fault injection
    def _kill_now(self, phase: str, step: int) -> None:
        append_event(self.run_dir, "kill", rank=self.trainer.rank, step=step, phase=phase)
        os.kill(os.getpid(), signal.SIGKILL)

    def maybe_kill(self, phase: str) -> None:
        """SIGKILL this process if a test asked for it here (``RECD_TEST_KILL``)."""
        step = self.trainer.step + 1
        for k in self._kills:
            if k.phase == phase and k.step == step:
                self._kill_now(phase, step)

    def _install_kills(self) -> None:
        trainer = self.trainer
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        phases = {k.phase for k in self._kills}
        if "forward" in phases:
            self._hooks.append(
                trainer.train_model.register_forward_pre_hook(
                    lambda m, a: self.maybe_kill("forward") if m.training else None
                )
            )
        if "backward" in phases:

            def on_output(module: Any, args: Any, out: torch.Tensor) -> None:
                if module.training and out.requires_grad:
                    out.register_hook(lambda g: self.maybe_kill("backward"))

            self._hooks.append(trainer.train_model.register_forward_hook(on_output))
        if "lookup" in phases:
            kernels = {id(t.kernel): t.kernel for t in trainer.optimizer.tables}
            for kernel in kernels.values():
                self._hooks.append(
                    kernel.register_forward_pre_hook(
                        lambda m, a: self.maybe_kill("lookup") if m.training else None
                    )
                )
        if "optimizer" in phases:
            trainer.optimizer.mid_step_hook = lambda: self.maybe_kill("optimizer")

    # ------------------------------------------------------------------ every step
    def start(self) -> None:
        """Before the first step of a worker that is not a replacement (every rank at once):
        seed the peer copies."""
        self._seed_peer(self.trainer.step)

    def _seed_peer(self, step: int) -> None:
        """Seed the ring of peer copies at ``step`` (a collective), timed in the events."""
        if self.peer is None:
            return
        began = time.perf_counter()
        self.peer.seed(step)
        append_event(
            self.run_dir,
            "peer_seed",
            rank=self.trainer.rank,
            gen=self.generation,
            step=step,
            bytes=self.peer.nbytes,
            seconds=time.perf_counter() - began,
        )

    def after_update(self) -> None:
        """After this rank's update, before the step's loss all-reduce: send the touched rows
        to the keeper of this rank's shards (a failed send is a peer failure)."""
        if self.peer is not None:
            self.peer.send_step()

    def step_completed(self) -> None:
        """The step's loss all-reduce completed on every rank: commit the ward's rows."""
        if self.peer is not None:
            self.peer.commit()

    # ------------------------------------------------------------------ survivors
    def _key(self, generation: int, name: str) -> str:
        return store_key(self.attempt, generation, name)

    def survive(self, error: BaseException, *, detected_at: float) -> RecoveryPlan:
        """After a failed collective in step ``trainer.step + 1``: agree, undo, rejoin,
        transfer. Returns the plan; the trainer continues at ``plan.agreed_step``. Raises
        :class:`RecoveryError` when survivor recovery is impossible (the caller exits with
        :data:`EXIT_FALLBACK`)."""
        trainer = self.trainer
        gen = self.generation
        append_event(self.run_dir, "detect", rank=trainer.rank, gen=gen, step=trainer.step)
        self.maybe_kill("recovery")
        if trainer.checkpointer is not None:
            trainer.checkpointer.abandon_write()  # a write in flight fails or completes
        failure = self._wait_json(self._key(gen, "failure"), "the launcher's failure notice")
        failed = [int(r) for r in failure["failed_ranks"]]
        survivors = [r for r in range(trainer.world_size) if r not in failed]
        if self.peer is not None:
            self.peer.drop_pending()  # rows of the step that did not complete
        mine = _Progress(
            completed=trainer.step,
            applied=int(trainer.optimizer.step_count),
            peer_step=None if self.peer is None else self.peer.step,
        )
        self.store.set(self._key(gen, f"report/{trainer.rank}"), json.dumps(asdict(mine)))
        reports = {
            r: _Progress(**self._wait_json(self._key(gen, f"report/{r}"), f"rank {r}'s report"))
            for r in survivors
        }
        completed = {p.completed for p in reports.values()}
        if len(completed) != 1:
            raise RecoveryError(
                f"survivors completed different steps {sorted(completed)}: no common step"
            )
        agreed = completed.pop()
        undone: list[dict[str, Any]] = []
        if mine.applied == agreed + 1:
            record = self.undo
            if record is None or record.step != mine.applied:
                raise RecoveryError(
                    f"rank {trainer.rank}: applied step {mine.applied} but holds no undo record"
                )
            began = time.perf_counter()
            result = record.undo()
            undone.append(
                {
                    "rank": trainer.rank,
                    "step": agreed + 1,
                    "exact": result.exact,
                    "seconds": time.perf_counter() - began,
                }
            )
        elif mine.applied != agreed:
            raise RecoveryError(
                f"rank {trainer.rank}: {mine.applied} updates applied, agreed step {agreed}"
            )
        self.undo = None
        self.store.set(self._key(gen, f"undone/{trainer.rank}"), json.dumps(undone))
        append_event(self.run_dir, "agreed", rank=trainer.rank, gen=gen, step=agreed)
        plan: RecoveryPlan | None = None
        if trainer.rank == min(survivors):
            every = [
                u
                for r in survivors
                for u in self._wait_json(self._key(gen, f"undone/{r}"), f"rank {r}'s undo")
            ]
            plan = RecoveryPlan(
                generation=gen + 1,
                failed_ranks=failed,
                survivors=survivors,
                agreed_step=agreed,
                step_in_flight=agreed + 1,
                undone=every,
                total=_planned(trainer),
                reader_offset=trainer.reader_offset,
                rng=_encode(torch.get_rng_state()),
                checkpoint_step=trainer.newest_checkpoint_step(),
                detected_at=detected_at,
                snapshot=trainer.table_snapshot,
                shard_keepers=None if self.peer is None else _keepers(failed, reports, agreed),
            )
        own = trainer.optimizer.local_shards(copy=True)
        trainer.leave_group()
        self.generation = gen + 1
        trainer.join_group(self._join_store(self.generation))
        append_event(self.run_dir, "rendezvous", rank=trainer.rank, gen=self.generation)
        rng = torch.get_rng_state()
        trainer.rebuild_parallel()
        torch.set_rng_state(rng)
        trainer.optimizer.load_local(own, step=agreed)
        del own
        trainer.rejoin_hooks()
        plan = self._exchange(plan)
        if self.peer is not None:
            self.peer.rebind(trainer.optimizer)
            for failed_rank, keeper in (plan.shard_keepers or {}).items():
                if keeper == trainer.rank:
                    self.peer.send_ward(int(failed_rank))
            self._seed_peer(agreed)
        trainer.restart_reader(agreed)
        self._install_kills()
        self.recoveries += 1
        self._first_step_due = True
        append_event(self.run_dir, "loaded", rank=trainer.rank, gen=self.generation, step=agreed)
        return plan

    def _join_store(self, generation: int) -> Any:
        return torch.distributed.PrefixStore(store_key(self.attempt, generation, "pg"), self.store)

    def _wait_json(self, key: str, what: str) -> Any:
        try:
            self.store.wait([key], _TIMEOUT)
        except Exception as exc:  # a timeout, or the launcher is gone
            raise RecoveryError(f"survivor recovery: no {what} ({key}): {exc}") from exc
        return json.loads(self.store.get(key))

    # ------------------------------------------------------------------ everyone
    def _exchange(self, plan: RecoveryPlan | None) -> RecoveryPlan:
        """The plan and the dense state from the lowest surviving rank (collectives: every
        rank of the new generation, survivors and replacement, calls this once)."""
        import torch.distributed as dist

        trainer = self.trainer
        box: list[Any] = [None if plan is None else asdict(plan)]
        src = _plan_source(self.store, self._key(self.generation, "source"), plan, trainer.rank)
        dist.broadcast_object_list(box, src=src)
        agreed = RecoveryPlan(**box[0])
        opt = trainer.optimizer
        flat = _dense_flat(opt)
        dist.broadcast(flat, src=src)
        _load_dense_flat(opt, flat, step=agreed.agreed_step)
        self._dense_kept = flat
        if trainer.checkpointer is not None:
            trainer.checkpointer.note_recovery(
                agreed.agreed_step,
                route="survivor",
                generation=agreed.generation,
                failed_ranks=agreed.failed_ranks,
            )
        return agreed

    # ------------------------------------------------------------------ replacement
    def join(self) -> RecoveryPlan:
        """The replacement's side of :meth:`survive`, after its trainer and checkpointer
        were built in the new generation: receive the plan and the dense state, load its own
        table shard from the newest checkpoint, take the agreed step and reader position."""
        trainer = self.trainer
        append_event(self.run_dir, "rendezvous", rank=trainer.rank, gen=self.generation)
        began = time.perf_counter()
        opt = trainer.optimizer
        ckpt_step = None
        source = "initial weights (no checkpoint yet)"
        plan = self._exchange(None)
        keeper = (plan.shard_keepers or {}).get(str(trainer.rank))
        if keeper is not None:  # the shards as they were at the agreed step, from a peer
            assert self.peer is not None
            self.peer.receive_own(keeper)
            source = f"peer copy on rank {keeper} (step {plan.agreed_step})"
        # the checkpoint's blocks hold the dense layers too: the survivor's go over them
        elif plan.checkpoint_step is not None:
            ckpt = read_checkpoint_of_step(self.run_dir, plan.checkpoint_step, opt.layout)
            opt.load_flat(
                step=plan.agreed_step, weights=ckpt.weights, adam_m=ckpt.adam_m, adam_v=ckpt.adam_v
            )
            ckpt_step, source = int(ckpt.step), ckpt.path.name
        else:  # the tables restart from the seed's initial weights, zero moments
            zeros = [np.zeros(opt.layout.n_params, np.float32) for _ in range(2)]
            own = _local_weights(opt)
            opt.load_flat(step=plan.agreed_step, weights=own, adam_m=zeros[0], adam_v=zeros[1])
        assert self._dense_kept is not None
        _load_dense_flat(opt, self._dense_kept, step=plan.agreed_step)
        self._dense_kept = None
        self._seed_peer(plan.agreed_step)
        load_s = time.perf_counter() - began
        trainer.step = plan.agreed_step
        trainer.planned_total = plan.total
        trainer.reader_offset = plan.reader_offset
        trainer.loader.seek(plan.agreed_step + plan.reader_offset)
        torch.set_rng_state(_decode(plan.rng))
        append_event(
            self.run_dir, "loaded", rank=trainer.rank, gen=self.generation, step=plan.agreed_step
        )
        if plan.snapshot != trainer.table_snapshot:
            trainer.read_snapshot(plan.snapshot)
        self._start_audit(plan, ckpt_step, source, load_s, from_peer=keeper is not None)
        self._first_step_due = True
        return plan

    def after_step(self, step: int) -> None:
        """Called after every completed step: the first one after a recovery is announced
        (the launcher's sign that the recovery is over; an event for the timeline)."""
        if not self._first_step_due:
            return
        self._first_step_due = False
        append_event(self.run_dir, "step", rank=self.trainer.rank, gen=self.generation, step=step)
        self.store.add(self._key(self.generation, "first_step"), 1)

    # ------------------------------------------------------------------ the audit
    def _start_audit(
        self,
        plan: RecoveryPlan,
        ckpt_step: int | None,
        source: str,
        load_s: float,
        *,
        from_peer: bool = False,
    ) -> None:
        trainer = self.trainer
        shard_rows = {t.name: [t.rows[0], t.rows[1]] for t in trainer.optimizer.tables}
        first = (ckpt_step or 0) + 1
        last = plan.agreed_step

        def run() -> None:
            lost: dict[str, list[int]] = (
                {name: [] for name in shard_rows}
                if from_peer  # the shards are those of the agreed step: nothing lost
                else trainer.rows_touched(first, last, plan.reader_offset, shard_rows)
            )
            rows_lost = sum(len(r) for r in lost.values())
            record = {
                "event": "survivor_recovery",
                "route": "survivor",
                "time": time.time(),
                "generation": plan.generation,
                "failed_ranks": plan.failed_ranks,
                "survivors": plan.survivors,
                "agreed_step": plan.agreed_step,
                "step_in_flight": plan.step_in_flight,
                "steps_lost": 0,
                "steps_redone": 1,
                "undone": plan.undone,
                "dense_source": f"rank {min(plan.survivors)} (survivor, no checkpoint read)",
                "embedding_source": source,
                "embedding_checkpoint_step": ckpt_step,
                "shard_rows": shard_rows,
                "rows_lost_updates": {k: len(v) for k, v in lost.items()},
                "lost_rows": {k: v for k, v in lost.items() if v},
                "replacement_load_s": load_s,
                "bit_exact": rows_lost == 0 and all(u["exact"] for u in plan.undone),
            }
            append_recovery_record(self.run_dir, record)
            append_event(self.run_dir, "audit", rank=trainer.rank, rows_lost=rows_lost)

        self._audit_thread = threading.Thread(target=run, name="recd-recovery-audit")
        self._audit_thread.start()

    def close(self) -> None:
        """Wait for the audit of the last recovery (written before the job ends)."""
        if self._audit_thread is not None:
            self._audit_thread.join()
            self._audit_thread = None
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


# ----------------------------------------------------------------------------- helpers


def read_checkpoint_of_step(
    run_dir: str | os.PathLike[str], step: int, layout: ParamLayout | None
) -> Checkpoint:
    """The checkpoint of ``step`` in ``run_dir`` (a ``recd.checkpoint.format.Checkpoint``),
    where the replacement finds its own table shards: the full file memory-mapped (each rank
    copies its own blocks), or a delta through its chain (the base and every delta applied in
    memory, every link's CRC and the base's sidecar checked). ``CheckpointCorruptError``
    naming the file when the step has none or its chain is broken."""
    from recd.checkpoint.atomic import checkpoint_file, checkpoint_path
    from recd.checkpoint.chain import read_any

    path = checkpoint_file(run_dir, step) or checkpoint_path(run_dir, step)
    return read_any(path, layout, verify=True)


def _planned(trainer: TrainerView) -> int:
    """The step the job trains to (set when training started, before any step could fail)."""
    if trainer.planned_total is None:
        raise RecoveryError("a step failed before the trainer planned its steps")
    return trainer.planned_total


def _plan_source(store: Any, key: str, plan: RecoveryPlan | None, rank: int) -> int:
    """The rank that broadcasts the plan: the one holding it announces itself in the store."""
    if plan is not None:
        store.set(key, str(rank))
    store.wait([key], _TIMEOUT)
    return int(store.get(key))


def _replicated_tables(opt: Any) -> list[torch.Tensor]:
    """Weights, m and v of every data-parallel table (every rank holds the whole table)."""
    out = []
    for i, table in enumerate(opt.tables):
        if table.replicated and not table.fused:
            m, v = opt._table_moments(i)
            out += [table.weight, m, v]
    return out


def _dense_flat(opt: Any) -> torch.Tensor:
    """Every dense parameter's weights, Adam m and v, then every data-parallel table's, flat
    (float32): the state every rank holds whole."""
    m = opt.dense.moments("adam_m")
    v = opt.dense.moments("adam_v")
    parts = []
    for name in opt.dense.names:
        parts += [
            opt.dense.params[name].detach().reshape(-1),
            m[name].reshape(-1),
            v[name].reshape(-1),
        ]
    parts += [t.detach().reshape(-1) for t in _replicated_tables(opt)]
    return torch.cat([p.to("cpu", torch.float32) for p in parts])


def _load_dense_flat(opt: Any, flat: torch.Tensor, *, step: int) -> None:
    weights: dict[str, np.ndarray] = {}
    adam_m: dict[str, np.ndarray] = {}
    adam_v: dict[str, np.ndarray] = {}
    at = 0
    for name in opt.dense.names:
        n = opt.dense.params[name].numel()
        for target in (weights, adam_m, adam_v):
            target[name] = flat[at : at + n].numpy()
            at += n
    with torch.no_grad():
        for t in _replicated_tables(opt):
            t.copy_(flat[at : at + t.numel()].view(t.shape).to(t.device))
            at += t.numel()
    opt.load_dense(step=step, weights=weights, adam_m=adam_m, adam_v=adam_v)


def _keepers(failed: list[int], reports: dict[int, _Progress], agreed: int) -> dict[str, int]:
    """Failed rank -> the survivor after it in the ring, where that one's copy of its shards
    is at the agreed step (else the failed rank's shards come from the checkpoint)."""
    world = len(reports) + len(failed)
    out = {}
    for rank in failed:
        keeper = (rank + 1) % world
        report = reports.get(keeper)
        if report is not None and report.peer_step == agreed:
            out[str(rank)] = keeper
    return out


def _local_weights(opt: Any) -> np.ndarray:
    """A full-size logical weight array holding this rank's live blocks (others zero)."""
    out = np.zeros(opt.layout.n_params, np.float32)
    for shard in opt.local_shards(copy=True):
        base = opt.layout.offset_of(shard.name)
        flat = shard.weights.numpy().reshape(-1)
        at = 0
        for a, b in shard.element_ranges():
            out[base + a : base + b] = flat[at : at + b - a]
            at += b - a
    return out


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode()


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
