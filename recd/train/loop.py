"""The training job: read the clustered table, train a DLRM / RM1-like model, evaluate, report.

Read top to bottom, :meth:`Trainer.train` is the whole job::

    for step in 1 .. steps:                     (fewer if the reader runs out of batches)
        batch  = next(reader)                   Batch: dense B x N, labels B x T, KJT + IKJTs
        logits = model(batch.dense, batch.sparse)                               B x T
        loss   = bce(logits, batch.labels); loss.backward(); adam.step()
        every log_every steps:  metrics.jsonl line (loss, samples/s, peak memory), progress
        every eval_every steps: loss / NE / AUC on the held-out partitions
        hook.after_step(trainer, step, loss)    (user hooks, then the Checkpointer)
    hook.after_train(trainer)                   (the final checkpoint)
    loss.png, train.json

Reader, model and optimizer come from :mod:`recd.train.build` (one process, or tables sharded
by torchrec over ``train.world_size`` ranks, each reading its share of the units); results and
output files are :mod:`recd.train.results`; the hooks it calls, :mod:`recd.train.hooks`.

Determinism: ``train.seed`` seeds torch before the model is built and (unless ``reader.seed``
is given) the reader's shuffle, and nothing afterwards draws random numbers, so a config and
seed give bit-identical losses on the same machine and thread count. A non-finite loss stops
training with :class:`TrainingDivergedError` naming the checkpoint to continue from
(``train.accept_nonfinite`` trains on).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from recd.errors import ConfigError, RecoveryError, TrainingDivergedError
from recd.models import DLRM, bce_loss
from recd.optim import ModelAdam
from recd.progress import progress_bar
from recd.reader import ResumableLoader
from recd.reader.config import Shuffle
from recd.recovery.failures import is_peer_failure
from recd.tensors.batch import Batch
from recd.train.build import build_model_config, parallelize, prepare_reader, resolve_device
from recd.train.config import TrainConfig
from recd.train.hooks import CheckpointHook, RecoveryHook, StepHook
from recd.train.launch import DistContext
from recd.train.metrics import (
    bce_from_logits,
    normalized_entropy,
    peak_cuda_bytes,
    peak_rss_bytes,
    roc_auc,
)
from recd.train.results import (
    METRICS_FILE,
    EvalResult,
    MetricsWindow,
    MetricsWriter,
    TrainResult,
    write_outputs,
)
from recd.train.state import TrainState

__all__ = ["Trainer"]

log = logging.getLogger(__name__)


class Trainer:
    """Builds the reader, the model and Adam from a :class:`TrainConfig`, then trains.

    Args:
        config: the job.
        dist: this process's place in a multi-process job (None: one process).
        hooks: run after every step (checkpointing, signal handling).
        show_progress: progress display on rank 0 (tqdm on stderr).
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        dist: DistContext | None = None,
        hooks: Sequence[StepHook[Trainer]] = (),
        show_progress: bool = True,
    ) -> None:
        self.config = config
        self.dist = dist
        self.world_size = 1 if dist is None else dist.world_size
        self.rank = 0 if dist is None else dist.rank
        self.is_main = self.rank == 0
        self.hooks = list(hooks)
        self.show_progress = show_progress and self.is_main
        self.device = resolve_device(config.train.device, dist)
        if config.train.num_threads is not None:
            torch.set_num_threads(config.train.num_threads)
        self.step = 0
        """Optimizer steps completed."""
        self._stop_reason: str | None = None
        self._batches: Iterator[Batch] | None = None
        self.recovery: RecoveryHook | None = None
        """Survivor recovery (:class:`recd.recovery.rejoin.SurvivorRecovery`), or None."""
        self.checkpointer: CheckpointHook[Trainer] | None = None
        """The run's :class:`recd.train.checkpointing.Checkpointer`, when it has one."""
        self.planned_total: int | None = None
        """The step this run trains to (set when :meth:`train` starts, or by a recovery)."""
        self.reader_offset = 0
        """Reader position minus step (constant through a run segment)."""

        self.catalogue, self.reader_config = prepare_reader(config, self.rank, self.world_size)
        if self.rank == 0 and self.reader_config.shuffle == Shuffle.NONE:
            log.warning(
                "reader.shuffle = 'none': training batches follow the table's order (time, "
                "or sessions); shuffle = 'rows' (plain KJT jobs) or 'session' (dedup groups) "
                "mixes them (docs/accuracy.md)"
            )
        self.loader = ResumableLoader(self.reader_config)
        if dist is not None and self.world_size > 1:
            # Every rank reads the snapshot rank 0 planned on (an ETL run may commit between
            # two ranks' plans).
            agreed: list[int | None] = [self.table_snapshot]
            torch.distributed.broadcast_object_list(agreed, src=0)
            if agreed[0] != self.table_snapshot:
                self.reader_config = dataclasses.replace(self.reader_config, snapshot=agreed[0])
                self.loader = ResumableLoader(self.reader_config)
        self.eval_loader: ResumableLoader | None = None
        self._eval_start: dict[str, Any] | None = None
        if config.eval is not None:
            eval_config = dataclasses.replace(
                config.eval_reader(),
                preprocessing=self.reader_config.preprocessing,
                # the same table, read as the training reads it (a held-out table of its own:
                # its current snapshot)
                snapshot=self.table_snapshot if config.eval.table is None else None,
            )
            self.eval_loader = ResumableLoader(eval_config)
            self._eval_start = self.eval_loader.state_dict()

        torch.manual_seed(config.train.seed)  # the same seed builds the same weights
        self.model_config = build_model_config(config, self.catalogue)
        self.model = DLRM(self.model_config, device=self.device)
        """The logical model; with several processes ``train_model`` (DMP) shards its tables
        in place."""
        self.train_model, self.eval_model, self.optimizer = parallelize(self.model, config, dist)

    # ------------------------------------------------------------------ the loop
    def train(self) -> TrainResult:
        """Train from ``self.step`` to ``train.steps`` (see the module docstring)."""
        cfg = self.config.train
        began = time.perf_counter()
        first_step = self.step
        total = self._planned_steps() if self.planned_total is None else self.planned_total
        self.planned_total = total
        self.reader_offset = self.loader.position - self.step
        run_dir = cfg.run_dir
        if first_step > 0 and first_step >= cfg.steps:
            log.info(
                "already at step %d (train.steps = %d): nothing to train", first_step, cfg.steps
            )
            return TrainResult(
                first_step=first_step,
                steps=first_step,
                losses=[],
                evals=[],
                samples=0,
                train_s=0.0,
                wall_s=time.perf_counter() - began,
                peak_rss_bytes=peak_rss_bytes(),
                peak_cuda_bytes=peak_cuda_bytes(self.device),
                world_size=self.world_size,
                run_dir=run_dir,
                already_done=True,
                table_snapshot=self.table_snapshot,
            )
        writer = MetricsWriter(run_dir / METRICS_FILE, fresh=first_step == 0, enabled=self.is_main)
        if self.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
        losses: list[float] = []
        evals: list[EvalResult] = []
        samples = 0
        train_s = 0.0
        window = MetricsWindow()
        self._batches = iter(self.loader)
        bar = (
            progress_bar(desc="train", total=total, unit="step")
            if self.show_progress
            else tqdm(disable=True)
        )
        with bar:
            bar.update(first_step)
            while self.step < total and self._stop_reason is None:
                t0, cpu0 = time.perf_counter(), time.process_time()
                try:
                    batch = next(self._batches).to(self.device)
                    loss, rows = self.train_step(batch)
                except Exception as error:
                    if self.recovery is None or not is_peer_failure(error):
                        raise
                    self._survive(error)  # back at an agreed step, in a new process group
                    total = self.planned_total
                    bar.n = self.step
                    continue
                if not (math.isfinite(loss) or cfg.accept_nonfinite):
                    raise self._diverged(self.step + 1, loss)  # the same on every rank
                dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                self.step += 1
                if self.recovery is not None:
                    self.recovery.after_step(self.step)
                losses.append(loss)
                samples += rows
                train_s += dt
                window.add(loss, rows, dt, cpu)
                bar.update(1)
                if self.step % cfg.log_every == 0 or self.step == total:
                    record = self._log_record(window)
                    writer.write(record)
                    bar.set_postfix(
                        loss=f"{record['loss']:.4f}", sps=f"{record['samples_per_s']:.0f}"
                    )
                    window = MetricsWindow()
                if self._eval_due(total):
                    evals.append(self._evaluate_and_record(writer))
                for hook in self.hooks:
                    hook.after_step(self, self.step, loss)
        if self.step < cfg.steps and self._stop_reason is None:
            self._stop_reason = f"the reader ran out of batches after step {self.step}"
        for hook in self.hooks:
            after_train = getattr(hook, "after_train", None)  # optional (final checkpoint)
            if after_train is not None:
                after_train(self)
        result = TrainResult(
            first_step=first_step,
            steps=self.step,
            losses=losses,
            evals=evals,
            samples=samples,
            train_s=train_s,
            wall_s=time.perf_counter() - began,
            peak_rss_bytes=peak_rss_bytes(),
            peak_cuda_bytes=peak_cuda_bytes(self.device),
            world_size=self.world_size,
            run_dir=run_dir,
            stop_reason=self._stop_reason,
            table_snapshot=self.table_snapshot,
        )
        if self.is_main:
            write_outputs(self.config, result)
        return result

    def train_step(self, batch: Batch) -> tuple[float, int]:
        """Forward, backward and Adam on one batch; returns (loss, rows) over all ranks."""
        self.train_model.train()
        logits = self.train_model(batch.dense, batch.sparse)  # B x T
        loss = bce_loss(logits, batch.labels)
        self.optimizer.zero_grad()
        loss.backward()
        if self.recovery is None:
            self.optimizer.step()
        else:  # survivor recovery: the update can be taken back (recd.recovery.undo)
            self.recovery.undo = None
            self.recovery.undo = self.optimizer.step(capture=True, undo=self.recovery.undo_method)
            self.recovery.maybe_kill("after_update")
            self.recovery.after_update()  # the touched rows to their peer copy, if kept
        if self.dist is None:
            return loss.item(), batch.batch_size
        import torch.distributed as tdist

        rows = float(batch.batch_size)
        totals = torch.tensor([loss.item() * rows, rows], dtype=torch.float64, device=self.device)
        tdist.all_reduce(totals)
        if self.recovery is not None:
            self.recovery.step_completed()
        return float(totals[0] / totals[1]), int(totals[1])

    @torch.no_grad()
    def evaluate(self) -> EvalResult:
        """Loss, NE and AUC on the held-out partitions (at most ``eval.max_batches``)."""
        if self.eval_loader is None or self._eval_start is None or self.config.eval is None:
            raise ConfigError("eval: this config has no [eval] table")
        began = time.perf_counter()
        self.eval_loader.load_state_dict(self._eval_start)  # always the same batches
        self.eval_model.eval()
        logits, labels = [], []
        batches = itertools.islice(self.eval_loader, self.config.eval.max_batches)
        for batch in batches:
            batch = batch.to(self.device)
            logits.append(self.eval_model(batch.dense, batch.sparse).float().cpu())  # B x T
            labels.append(batch.labels.cpu())
        if not logits:
            raise ConfigError(f"eval: no rows in the held-out range of {self.config.reader.table}")
        x = torch.cat(logits).double().numpy()  # N x T
        y = torch.cat(labels).double().numpy()  # N x T
        tasks = range(y.shape[1])
        finite = self._check_finite_predictions(x)
        return EvalResult(
            step=self.step,
            loss=bce_from_logits(x, y),
            ne=float(np.mean([normalized_entropy(x[:, t], y[:, t]) for t in tasks])),
            auc=float(np.mean([roc_auc(x[:, t], y[:, t]) for t in tasks])) if finite else math.nan,
            rows=int(y.shape[0]),
            base_rate=float(y.mean()),
            seconds=time.perf_counter() - began,
        )

    def request_stop(self, reason: str) -> None:
        """Stop after the step in flight (called by hooks, e.g. on SIGTERM)."""
        self._stop_reason = reason

    def close(self) -> None:
        """Stop the reader's worker processes and release the optimizer's hooks."""
        close = getattr(self._batches, "close", None)  # a generator: closing it ends workers
        if close is not None:
            close()
        self._batches = None
        close_optimizer = getattr(self.optimizer, "close", None)  # ShardedAdam's hooks
        if close_optimizer is not None:
            close_optimizer()

    # ------------------------------------------------------------------ helpers of the loop
    def _planned_steps(self) -> int:
        """``train.steps``, or fewer if some rank's reader has fewer batches left."""
        left = self.loader.batches_left  # a finished reader trains no more (no new pass)
        if self.dist is not None:
            import torch.distributed as tdist

            t = torch.tensor([left], dtype=torch.int64, device=self.device)
            tdist.all_reduce(t, op=tdist.ReduceOp.MIN)
            left = int(t.item())
        planned = min(self.config.train.steps, self.step + left)
        if planned < self.config.train.steps:
            log.warning(
                "train.steps = %d but the reader has %d batches left (per rank) after step %d: "
                "training stops at step %d (raise reader.num_epochs for more)",
                self.config.train.steps,
                left,
                self.step,
                planned,
            )
        return planned

    def _eval_due(self, total: int) -> bool:
        if self.eval_loader is None:
            return False
        every = self.config.train.eval_every
        return self.step == total or (every > 0 and self.step % every == 0)

    def _evaluate_and_record(self, writer: MetricsWriter) -> EvalResult:
        result = self.evaluate()
        writer.write({"kind": "eval", **result.to_dict()})
        log.info(
            "step %d: held-out loss %.4f NE %.4f AUC %.4f (%d rows)",
            *(self.step, result.loss, result.ne, result.auc, result.rows),
        )
        return result

    def _log_record(self, window: MetricsWindow) -> dict[str, Any]:
        record: dict[str, Any] = {
            "kind": "train",
            "step": self.step,
            "loss": window.mean_loss,
            "loss_last": window.last_loss,
            "samples_per_s": window.samples_per_s,
            "samples_per_cpu_s": window.samples_per_cpu_s,
            "peak_rss_bytes": peak_rss_bytes(),
        }
        cuda = peak_cuda_bytes(self.device)
        if cuda is not None:
            record["peak_cuda_bytes"] = cuda
        return record

    # ------------------------------------------------------------------ non-finite values
    def _check_finite_predictions(self, logits: np.ndarray) -> bool:
        """Whether the held-out ``logits`` (N x T) are all finite; when not, raise
        :class:`TrainingDivergedError` (or warn, with ``train.accept_nonfinite``)."""
        finite = np.isfinite(logits)
        if finite.all():
            return True
        assert self.config.eval is not None
        message = (
            f"evaluation at step {self.step} (run {self.config.train.run_dir}, held-out "
            f"{self.config.reader.table} from {self.config.eval.start}): "
            f"{logits.size - int(finite.sum()):,} of {logits.size:,} predictions are NaN or "
            "infinite: the model's weights are no longer finite (training diverged; a resumed "
            "checkpoint or an earlier step made them so)"
        )
        if not self.config.train.accept_nonfinite:
            raise TrainingDivergedError(
                f"{message}; pass --accept-nonfinite to evaluate it regardless (AUC NaN)"
            )
        log.warning("%s; AUC reported as NaN (train.accept_nonfinite)", message)
        return False

    def _diverged(self, step: int, loss: float) -> TrainingDivergedError:
        """The error of a non-finite training loss at ``step``: it names the checkpoint to
        continue from, the newest whose weights and Adam state are all finite (a checkpoint
        written after the update that spoilt the weights is not; its loss was still finite)."""
        lower = "a lower learning rate (optim.lr, optim.embedding_lr)"
        resume = f"start again with {lower}"
        if self.config.checkpoint.enabled:
            resume = self._continue_from(lower)
        return TrainingDivergedError(
            f"step {step}: the training loss is {loss} (not finite): training diverged and "
            f"stopped before recording or checkpointing this step (run "
            f"{self.config.train.run_dir}); {resume}, or pass --accept-nonfinite to train on "
            "regardless"
        )

    def _continue_from(self, lower: str) -> str:
        """Which checkpoint a diverged run continues from, and how (see :meth:`_diverged`)."""
        from recd.checkpoint import list_checkpoints
        from recd.checkpoint.chain import check_finite_any
        from recd.errors import CheckpointCorruptError, CheckpointError, CheckpointNonFiniteError

        run_dir = self.config.checkpoint_dir
        failed = ""
        layout = None
        if self.checkpointer is not None:
            try:  # the write in flight: committed (or failed) before the scan
                self.checkpointer.wait()
            except CheckpointError as exc:
                failed = f" (the checkpoint write in flight failed: {exc})"
            try:
                layout = self.checkpointer.layout
            except CheckpointError:
                layout = None
        skipped: list[str] = []
        for path in reversed(list_checkpoints(run_dir)):
            try:
                header = check_finite_any(path, layout)
            except CheckpointNonFiniteError:
                skipped.append(f"{path.name} (non-finite values)")
                continue
            except CheckpointCorruptError:
                skipped.append(f"{path.name} (not valid)")
                continue
            newer = f"; a resume skips the newer {', '.join(skipped)}" if skipped else ""
            return (
                f"continue from {path} (step {header.step}: the newest checkpoint whose weights "
                f"and Adam state are all finite{newer}){failed} with {lower}: recd pivot "
                f"{run_dir} --config NEW.toml --from {header.step}"
            )
        if skipped:
            return (
                f"no checkpoint in {run_dir} can be continued from ({', '.join(skipped)})"
                f"{failed}: start a new run with {lower}"
            )
        return f"no checkpoint was written in {run_dir}{failed}: start again with {lower}"

    # ------------------------------------------------------------------ state (checkpoints)
    def capture_state(self) -> TrainState:
        """A copy of the resumable state at the current step boundary.

        Several processes: a collective (every rank must call it); it gathers the whole
        logical model on every rank, which suits tests and small models. A checkpoint writer
        writes each rank's ``optimizer.local_shards()`` instead.
        """
        if isinstance(self.optimizer, ModelAdam):
            params = self.optimizer.export_state()
        else:
            params = self.optimizer.gather_flat()
        return TrainState(
            step=self.step,
            params=params,
            reader=self.loader.state_dict(),
            rng=torch.get_rng_state(),
        )

    def restore_state(self, state: TrainState) -> None:
        """Continue from ``state`` (captured by a trainer of the same config; any world size
        for the parameters, the same one for the reader position)."""
        if state.params.step != state.step:
            raise ConfigError(
                f"train state: optimizer step {state.params.step} != trainer step {state.step}"
            )
        self.optimizer.load_state(state.params)
        self.read_snapshot(state.reader.get("snapshot"))
        self.loader.load_state_dict(state.reader)
        torch.set_rng_state(state.rng)
        self.step = state.step

    @property
    def table_snapshot(self) -> int | None:
        """The Iceberg snapshot of the training table this run reads (None: a Hive-layout
        table). A resume reads the snapshot the checkpoint's reader state names."""
        return self.loader.plan.config.snapshot

    def read_snapshot(self, snapshot: int | None) -> None:
        """Read ``snapshot`` of the table (training and held-out readers) from now on: the one
        a checkpoint's reader position belongs to, even if later ETL runs have landed."""
        if snapshot is None or snapshot == self.table_snapshot:
            return
        if self.is_main:
            log.info(
                "resume: reading snapshot %d of %s, as before (the table's current snapshot is %s)",
                snapshot,
                self.reader_config.table,
                self.table_snapshot,
            )
        self.reader_config = dataclasses.replace(self.reader_config, snapshot=snapshot)
        self.loader = ResumableLoader(self.reader_config)
        if self.eval_loader is not None:
            eval_config = dataclasses.replace(self.eval_loader.config, snapshot=snapshot)
            self.eval_loader = ResumableLoader(eval_config)
            self._eval_start = self.eval_loader.state_dict()

    def read_audit_batch(self) -> Batch:
        """The fixed batch of the sample audits (``.samples.json``), on this rank's device.

        The first held-out batch when ``[eval]`` is given (every rank reads the same one),
        else the first batch of the training partitions in table order as one process reads
        them (also the same on every rank). Reading it moves no training position.
        """
        if self.eval_loader is not None and self._eval_start is not None:
            loader = self.eval_loader
            loader.load_state_dict(self._eval_start)
        else:
            config = dataclasses.replace(
                self.reader_config,
                rank=0,
                world_size=1,
                num_workers=0,
                streams=1,
                shuffle=Shuffle.NONE,
                num_epochs=1,
            )
            loader = ResumableLoader(config)
        batches = iter(loader)
        try:
            batch = next(batches)
        except StopIteration:
            raise ConfigError(
                f"checkpoint audit: no rows to audit in {self.config.reader.table}"
            ) from None
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
        if self._eval_start is not None and loader is self.eval_loader:
            loader.load_state_dict(self._eval_start)
        return batch.to(self.device)

    # ------------------------------------------------------------------ survivor recovery
    def _survive(self, error: BaseException) -> None:
        """A peer died during the step: survivor recovery (:mod:`recd.recovery.rejoin`; it
        sees this trainer as a :class:`recd.train.hooks.TrainerView`)."""
        assert self.recovery is not None
        detected = time.time()
        log.warning(
            "rank %d: step %d failed (%s): survivor recovery",
            self.rank,
            self.step + 1,
            str(error).splitlines()[0][:200],
        )
        try:
            plan = self.recovery.survive(error, detected_at=detected)
        except Exception as exc:
            raise RecoveryError(
                f"rank {self.rank}: survivor recovery after step {self.step} failed ({exc}); "
                "the launcher restarts the job from the newest checkpoint"
            ) from exc
        self.step = plan.agreed_step
        self.planned_total = plan.total
        log.warning(
            "rank %d: recovered at step %d (generation %d)", self.rank, self.step, plan.generation
        )

    def newest_checkpoint_step(self) -> int | None:
        """The step of the newest valid checkpoint on disk (None: none; a checkpoint whose
        write a dead rank never committed is not one)."""
        if self.checkpointer is None:
            return None
        from recd.checkpoint import checkpoint_step, newest_valid_checkpoint

        path = newest_valid_checkpoint(self.config.checkpoint_dir, self.checkpointer.layout)
        return None if path is None else checkpoint_step(path)  # full or delta: its name's step

    def leave_group(self) -> None:
        """Leave the (broken) process group; the sharded model goes with it."""
        import torch.distributed as tdist

        close = getattr(self._batches, "close", None)
        if close is not None:
            close()
        self._batches = None
        self.optimizer.close()
        if tdist.is_initialized():
            try:
                tdist.destroy_process_group()
            except Exception as exc:  # a broken group may refuse a clean shutdown
                log.info("leaving the broken process group: %s", exc)

    def join_group(self, store: Any) -> None:
        """Join the next generation's process group (same rank and world size)."""
        import datetime

        import torch.distributed as tdist

        assert self.dist is not None
        tdist.init_process_group(
            backend=self.dist.backend,
            store=store,
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=120),
        )

    def rebuild_parallel(self) -> None:
        """Build the sharded model and its optimizer again in the new process group, with
        the same collectives as a new rank's :meth:`__init__` (the snapshot broadcast, DMP).
        The weights are placeholders until the caller loads the state."""
        import torch.distributed as tdist
        from torchrec.distributed import collective_utils

        agreed: list[int | None] = [self.table_snapshot]
        tdist.broadcast_object_list(agreed, src=0)
        # DMP broadcasts a flag on its first construction in a process and caches it: take
        # part in that broadcast again, with the new rank
        collective_utils._INITIALIZED = False
        torch.manual_seed(self.config.train.seed)
        self.model = DLRM(self.model_config, device=self.device)
        self.train_model, self.eval_model, self.optimizer = parallelize(
            self.model, self.config, self.dist
        )

    def rejoin_hooks(self) -> None:
        """The checkpointer's part of a rejoin (its process group, its agreement)."""
        if self.checkpointer is not None:
            self.checkpointer.rejoin(self)

    def restart_reader(self, step: int) -> None:
        """Continue reading at the batch of step ``step + 1``."""
        self.loader.seek(step + self.reader_offset)
        self._batches = iter(self.loader)

    def rows_touched(
        self, first: int, last: int, offset: int, shard_rows: dict[str, list[int]]
    ) -> dict[str, list[int]]:
        """Rows of each table block in ``shard_rows`` (name -> [start, end)) that the global
        batches of steps ``first .. last`` looked up (every rank's batches, read again)."""
        out: dict[str, set[int]] = {name: set() for name in shard_rows}
        if last < first:
            return {name: [] for name in shard_rows}
        for rank in range(self.world_size):
            _, config = prepare_reader(self.config, rank, self.world_size)
            config = dataclasses.replace(config, snapshot=self.table_snapshot)
            loader = ResumableLoader(config)
            loader.seek(first - 1 + offset)
            for batch in itertools.islice(iter(loader), last - first + 1):
                for name, rows in self.model.touched_rows(batch.sparse).items():
                    if name in shard_rows:
                        lo, hi = shard_rows[name]
                        ids = rows[(rows >= lo) & (rows < hi)]
                        out[name].update(int(i) for i in ids.tolist())
        return {name: sorted(rows) for name, rows in out.items()}
