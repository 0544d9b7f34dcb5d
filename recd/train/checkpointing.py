"""Checkpointing a training run: :class:`Checkpointer`, the trainer's step hook for its run
directory (``[checkpoint]``).

After every step it records the loss (``.loss.json``) and, on cadence, SIGUSR1 or SIGTERM
(agreed by every rank), takes a checkpoint: a snapshot at the step boundary, then the file and
its sidecars written on a background thread, so training goes on while the bytes are written
(CheckFreq-style: one write in flight). ``attach(trainer, resume=True)`` restores the newest
valid checkpoint bit-exactly. The run directory, the write order that keeps a crash harmless,
``.state.json``, resume and the distributed save: docs/checkpoints.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from recd.checkpoint.atomic import (
    LAYOUT_FILE,
    checkpoint_path,
    clean_stray_temp_files,
    commit,
    list_checkpoints,
    newest_valid_checkpoint,
    read_layout_or_none,
    write_layout,
)
from recd.checkpoint.chain import check_finite_any, is_delta, read_any, step_of_name
from recd.checkpoint.checksum import Checksum, verify_checksum
from recd.checkpoint.delta import Block, delta_filename, write_delta_payload
from recd.checkpoint.format import (
    HEADER_BYTES,
    CheckpointNonFiniteError,
    ParamLayout,
    check_finite,
    checkpoint_size_bytes,
    pack_header,
    preallocate,
    validate_checkpoint,
)
from recd.checkpoint.lock import RunDirectoryLock, lock_run_directory
from recd.checkpoint.retention import RetentionPolicy, apply_retention
from recd.checkpoint.sidecars import (
    STATE_FILE,
    LossLog,
    append_sample_audit,
    read_loss_history,
)
from recd.checkpoint.state_file import (
    StateFile,
    decode_rng,
    encode_rng,
    read_step_state,
    step_entry,
)
from recd.durable import fsync_file, temp_path_for
from recd.errors import CheckpointCorruptError, CheckpointError, ConfigError
from recd.optim import FlatState, ModelAdam
from recd.optim.model_adam import DeltaPart
from recd.train.config import TrainConfig
from recd.train.history import json_safe
from recd.train.metrics import bce_from_logits, roc_auc
from recd.train.signals import SignalFlags, StepSignals, agree
from recd.train.snapshot import (
    DeltaFill,
    FillPieces,
    RowPatches,
    SnapshotFill,
    TableViews,
    cut_pieces,
)
from recd.train.state import TrainState

if TYPE_CHECKING:
    from recd.optim.sharded_adam import ParamShard, ShardedAdam
    from recd.tensors.batch import Batch
    from recd.train.loop import Trainer

__all__ = [
    "CheckpointStats",
    "Checkpointer",
    "ResumeInfo",
    "read_checkpoint_flat",
]

log = logging.getLogger(__name__)

AUDIT_PREDICTIONS = 8
"""Rows of the audit batch whose predicted probabilities are stored in each audit."""
WRITER_TIMEOUT = datetime.timedelta(minutes=30)
"""Deadline of the writer threads' barriers (a rank whose write failed must not hang the rest
forever)."""


# ----------------------------------------------------------------------------- results


@dataclass(kw_only=True, slots=True)
class ResumeInfo:
    """Where a run resumed from, and what it cost."""

    path: Path | None
    """The checkpoint (None: no checkpoint, a fresh start)."""
    step: int
    """Optimizer steps completed at the checkpoint."""
    fresh_policy: bool
    """No reader/RNG state for the step (after a pivot or fork): the reader starts over."""
    read_s: float = 0.0
    """Choose the file: validate it, check its values are finite and (one process) read its
    regions into memory; with the files skipped before it."""
    load_s: float = 0.0
    """Copy them into the model and optimizer, restore reader position and RNG."""


@dataclass(kw_only=True, slots=True)
class CheckpointStats:
    """Measured cost of this run's checkpoints (rank 0's view)."""

    checkpoints: int = 0
    """Checkpoints written (committed) by this run."""
    steps: list[int] = field(default_factory=list)
    """Their steps."""
    blocked_s: float = 0.0
    """Training-thread time spent on checkpoints: waiting for the previous write, snapshot,
    audit, gathering reader states (and the whole write when ``background = false``)."""
    wait_s: float = 0.0
    """Part of ``blocked_s`` spent waiting for the previous write (backpressure)."""
    guard_wait_s: float = 0.0
    """Part of ``blocked_s`` the next step's ``optimizer.step()`` waited for the snapshot
    copy (helping with it: see ``pieces_copied_by_training``)."""
    pieces_copied_by_training: int = 0
    """Pieces of the dense parameters' snapshot copies (``FILL_PIECE_ELEMENTS`` each) the
    training thread copied itself while its ``step()`` waited for them."""
    rows_saved_by_training: int = 0
    """Embedding rows the steps that ran during a snapshot copy handed over to it (saved
    before updating them: copy-on-write, :mod:`recd.train.snapshot`)."""
    write_s: list[float] = field(default_factory=list)
    """Per checkpoint: the background job (sidecars, file, commit, retention)."""
    file_write_s: list[float] = field(default_factory=list)
    """Per checkpoint: writing ``step_NNNNNN.bin`` (temp file, fsync, rename, fsync dir)."""
    write_cpu_s: list[float] = field(default_factory=list)
    """Per checkpoint: CPU time of the writer thread (user + system)."""
    bytes_written: int = 0
    """Bytes of checkpoint files committed."""
    deltas: int = 0
    """Of ``checkpoints``, how many were deltas (``step_NNNNNN.delta``)."""
    resume: ResumeInfo | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.resume is not None and self.resume.path is not None:
            out["resume"]["path"] = str(self.resume.path)
        return out


# ----------------------------------------------------------------------------- reading


def read_checkpoint_flat(
    path: str | os.PathLike[str], layout: ParamLayout | None = None, *, verify: bool = True
) -> FlatState:
    """Validate ``path`` and read its three regions into memory (one sequential read).

    ``verify``: check the bytes read against the checksum sidecar, when the file has one
    (``CheckpointChecksumError`` on a mismatch; no second read of the file).
    """
    if is_delta(path):  # a chain: its base and deltas, each checked
        ckpt = read_any(path, layout, verify=verify)
        return FlatState(
            step=ckpt.step, weights=ckpt.weights, adam_m=ckpt.adam_m, adam_v=ckpt.adam_v
        )
    header = validate_checkpoint(path, layout)
    n = header.n_params
    data = np.empty(3 * n, dtype=np.float32)
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
        view = data.data.cast("B")
        done = 0
        while done < view.nbytes:
            got = f.readinto(view[done:])
            if not got:
                raise CheckpointError(f"{path}: file shrank while it was being read")
            done += got
    weights, adam_m, adam_v = data[:n], data[n : 2 * n], data[2 * n :]
    if verify:
        verify_checksum(path, data=(head, weights, adam_m, adam_v))
    return FlatState(step=header.step, weights=weights, adam_m=adam_m, adam_v=adam_v)


# ----------------------------------------------------------------------------- snapshots


IMAGE_ALIGN = 4096
"""Alignment (bytes) of the file image buffer and of its direct writes."""
WRITE_CHUNK_BYTES = 64 << 20
"""Bytes per write call of the file image (a multiple of IMAGE_ALIGN)."""


class _FileImage:
    """The whole ``step_NNNNNN.bin`` in one page-aligned buffer, reused by every snapshot.

    ``[header | weights | adam_m | adam_v | zero padding to IMAGE_ALIGN]``: the snapshot
    copies the tensors straight into their place in the file (one copy), and the writer
    sends the buffer to the disk with ``O_DIRECT`` (DMA from this buffer: no second copy into
    the page cache, no page cache evicted for 8 + 12 n bytes of dirty pages that would have to
    be written back later) in aligned chunks, then truncates the padding away. Pinned memory
    when training on a GPU (non-blocking device-to-host copies).
    """

    def __init__(self, layout: ParamLayout, *, pin: bool) -> None:
        self.layout = layout
        self.pin = pin
        n = layout.n_params
        self.size_bytes = checkpoint_size_bytes(n)
        padded = -(-self.size_bytes // IMAGE_ALIGN) * IMAGE_ALIGN
        if pin:
            raw = torch.empty(padded + IMAGE_ALIGN, dtype=torch.uint8, pin_memory=True).numpy()
        else:
            raw = np.empty(padded + IMAGE_ALIGN, dtype=np.uint8)
        start = -raw.ctypes.data % IMAGE_ALIGN
        self.image = raw[start : start + padded]
        """uint8 [padded]: the file's bytes, page aligned."""
        self.image[:] = 0  # fault every page in now (a first snapshot would pay it)
        self.regions = self.image[HEADER_BYTES : self.size_bytes].view("<f4").reshape(3, n)
        """float32 [3, n]: weights, adam_m, adam_v (views into ``image``)."""
        self.tensor = torch.from_numpy(self.regions)

    @torch.no_grad()
    def plan_fill(self, optimizer: ModelAdam, step: int) -> SnapshotFill | None:
        """Write the header and return the copy of weights, m and v as a
        :class:`recd.train.snapshot.SnapshotFill` (dense pieces first, then the embedding
        tables with their row patches); on a GPU (pinned image, non-blocking device-to-host
        copies) copy everything here and return None."""
        self.image[:HEADER_BYTES] = np.frombuffer(
            pack_header(step, self.layout.n_params), dtype=np.uint8
        )
        moments_m = optimizer.moments("adam_m")
        moments_v = optimizer.moments("adam_v")
        tables = set(optimizer.embedding_names)
        dense: list[tuple[torch.Tensor, torch.Tensor]] = []
        bulk: list[tuple[torch.Tensor, torch.Tensor]] = []
        views: dict[int, TableViews] = {}
        on_gpu = False
        for spec, offset in zip(self.layout.specs, self.layout.offsets, strict=True):
            param = optimizer.params[spec.name]
            on_gpu |= param.is_cuda
            sources = (param, moments_m[spec.name], moments_v[spec.name])
            targets = [self.tensor[row, offset : offset + spec.numel] for row in range(3)]
            for target, source in zip(targets, sources, strict=True):
                (bulk if spec.name in tables else dense).extend(
                    cut_pieces(target, source.detach().reshape(-1))
                )
            if spec.name in tables:
                w, m, v = (target.view(param.shape) for target in targets)
                views[id(param)] = (w, m, v)
        if on_gpu:
            for target, source in dense + bulk:
                target.copy_(source, non_blocking=self.pin)
            torch.cuda.synchronize()
            return None
        return SnapshotFill(
            dense=FillPieces(dense), tables=FillPieces(bulk), patches=RowPatches(views)
        )

    def write(self, final: Path) -> Path:
        """Write the image to a temp file beside ``final`` and commit it with its checksum
        (atomic, durable). The image must be complete: the checksum is taken from it here."""
        checksum = Checksum.of_image(self.image[: self.size_bytes])
        tmp = temp_path_for(final)
        try:
            _write_image(tmp, self.image, self.size_bytes)
            return commit(tmp, final, checksum=checksum)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def _write_image(path: Path, image: np.ndarray, size_bytes: int) -> None:
    """``image`` (page-aligned, padded) to ``path``, truncated to ``size_bytes``.

    ``O_DIRECT`` where the filesystem takes it (ext4, xfs); plain buffered writes otherwise
    (tmpfs refuses ``O_DIRECT``) or for whatever is left after a short, unaligned write.
    """
    view = image.data.cast("B")
    direct = getattr(os, "O_DIRECT", 0)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        fd = os.open(path, flags | direct, 0o644)
    except OSError:
        fd, direct = os.open(path, flags, 0o644), 0
    try:
        done = 0
        while done < view.nbytes:
            try:
                done += os.pwrite(fd, view[done : done + WRITE_CHUNK_BYTES], done)
            except OSError:
                if not direct or done % IMAGE_ALIGN:
                    raise
                os.close(fd)  # the filesystem refused the direct write: buffered from here
                fd, direct = os.open(path, os.O_WRONLY, 0o644), 0
                continue
            if direct and done % IMAGE_ALIGN:
                os.close(fd)
                fd, direct = os.open(path, os.O_WRONLY, 0o644), 0
        os.ftruncate(fd, size_bytes)
    finally:
        os.close(fd)


@dataclass(kw_only=True, slots=True)
class _DeltaImage:
    """A delta checkpoint's content: this rank's blocks."""

    parent: int
    base: int
    parts: list[DeltaPart] = field(default_factory=list)
    """Blocks with their weights, m and v (copies): gathered on the training thread (several
    processes, a GPU), or by ``fill`` once it has run."""
    fill: DeltaFill | None = None
    """One process on the CPU: the copy the writer thread makes (copy-on-write,
    :class:`recd.train.snapshot.DeltaFill`)."""

    def blocks(self) -> list[DeltaPart]:
        """The blocks (after the fill, if any)."""
        return self.parts if self.fill is None else self.fill.parts()

    @staticmethod
    def combine(parts: list[DeltaPart]) -> tuple[list[Block], list[list[np.ndarray]]]:
        """The blocks and the three payload regions of a delta file (each a list of the
        blocks' values, written one after the other)."""
        blocks = [block for block, _ in parts]
        payload = [[values[r] for _, values in parts] for r in range(3)]
        return blocks, payload


@dataclass(kw_only=True, slots=True)
class _Snapshot:
    """Everything the writer thread needs for one checkpoint (no live tensors)."""

    step: int
    reason: str
    flat: _FileImage | None = None
    """One process: the file image (header, weights, m, v)."""
    delta: _DeltaImage | None = None
    """One process, a delta checkpoint: the rows changed since the parent (instead of
    ``flat``)."""
    shards: list[ParamShard] | None = None
    """Several: this rank's blocks (CPU copies)."""
    state_entry: dict[str, Any] | None = None
    """Rank 0: the ``.state.json`` entry of this step."""
    audit: dict[str, Any] | None = None
    """Rank 0: the sample audit of this step (None: no audit at this step)."""
    spent_logs: Any = None
    """A full checkpoint's row logs, swapped out at the boundary: the writer thread drops
    them (freeing one tensor per table and logged step costs ~1 us each)."""


WRITER_NICE = 10
"""Niceness added to the writer thread: the CPU work of a write (copying the buffers into the
page cache, the sidecars' JSON) yields to the training thread on a busy machine."""


def _lower_thread_priority() -> None:
    """Lower this thread's CPU priority (Linux: niceness is per thread); best effort."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICE)
    except (AttributeError, OSError):
        pass


class _BackgroundWriter:
    """One write in flight: ``submit`` waits for the previous job, then starts the next."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, job: Callable[[], None], name: str) -> None:
        self.wait()

        def run() -> None:
            _lower_thread_priority()
            try:
                job()
            except BaseException as exc:  # re-raised on the training thread by wait()
                self._error = exc

        self._thread = threading.Thread(target=run, name=f"recd-ckpt-{name}", daemon=False)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Block until the write in flight is done; raise CheckpointError if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"checkpoint write failed: {error}") from error


# ----------------------------------------------------------------------------- the hook


class Checkpointer:
    """The checkpoint :class:`~recd.train.hooks.StepHook` (the protocol: docs/checkpoints.md).

    Usage (what :func:`recd.train.run.run_training` does)::

        checkpointer = Checkpointer(config, signals=flags)
        checkpointer.attach(trainer, resume=True)       # every rank; restores the state
        trainer.hooks.append(checkpointer)
        trainer.train()
        checkpointer.close()                            # waits for the write in flight

    Args:
        config: the job (``[checkpoint]``: cadence, retention, run directory).
        signals: the installed SIGTERM/SIGUSR1 flags (None: no signal handling).
    """

    def __init__(self, config: TrainConfig, *, signals: SignalFlags | None = None) -> None:
        self.config = config
        self.section = config.checkpoint
        self.run_dir = config.checkpoint_dir
        self.signals = signals
        self.policy = RetentionPolicy(
            keep_last=self.section.keep_last,
            keep_every=self.section.keep_every,
            checkpoint_every=self.section.checkpoint_every,
        )
        self.stats = CheckpointStats()
        self.last_saved_step: int | None = None
        """Step of the newest checkpoint this run has submitted (or resumed from)."""
        self._writer = _BackgroundWriter()
        self._losses: LossLog | None = None
        self._trainer: Trainer | None = None
        self._layout: ParamLayout | None = None
        self._buffers: _FileImage | None = None
        self._snapshot_fill: SnapshotFill | None = None
        """The snapshot copy in flight (set by the writer thread once planned)."""
        self._audit_batch: Batch | None = None
        self._state = StateFile(self.run_dir)
        self._pg: Any = None
        self._job_tag = str(os.getpid())
        self._guarded: tuple[Any, bool, Any] | None = None
        self._dir_lock: RunDirectoryLock | None = None
        self._closed = False
        self._logging_rows = False
        """The optimizer logs the rows it updates (``full_every > 1``)."""
        self._chain: tuple[int, int, int] | None = None
        """(base, parent, deltas since the base) of the newest checkpoint this process
        wrote; None until its first full checkpoint (deltas need one to apply onto)."""
        self.last_saved_name: str | None = None
        """File name of the newest checkpoint this run has submitted."""

    # ------------------------------------------------------------------ set-up
    @property
    def layout(self) -> ParamLayout:
        """The checkpoint's parameter layout (after :meth:`attach`)."""
        if self._layout is None:
            raise CheckpointError("Checkpointer.layout: call attach(trainer) first")
        return self._layout

    @property
    def is_main(self) -> bool:
        return self._trainer is None or self._trainer.is_main

    def attach(
        self, trainer: Trainer, *, resume: bool = False, joining: bool = False
    ) -> ResumeInfo:
        """Prepare the run directory and, with ``resume``, restore the newest checkpoint.

        Every rank must call it (collectives). Without ``resume`` a run directory that
        already holds checkpoints or loss entries is refused (``ConfigError``). ``joining``:
        a replacement rank joining survivors (:mod:`recd.recovery.rejoin`): nothing is
        restored (the survivors hand over the state), the other ranks run :meth:`rejoin`.
        """
        from recd.optim.sharded_adam import logical_layout

        self._trainer = trainer
        self._layout = logical_layout(trainer.model_config)
        optimizer = trainer.optimizer
        if isinstance(optimizer, ModelAdam) and optimizer.names != self._layout.names:
            raise ConfigError(
                "checkpoint: the optimizer's parameters differ from the model's parameter "
                "order (a parameter without requires_grad?)"
            )
        if trainer.dist is not None:
            import torch.distributed as dist

            self._pg = dist.new_group(backend="gloo", timeout=WRITER_TIMEOUT)
        self._job_tag = self._broadcast(self._job_tag)  # one temp file name for all ranks
        self._prepare_directory(resume or joining)
        info = (
            self._resume(trainer)
            if resume and not joining
            else ResumeInfo(path=None, step=0, fresh_policy=True)
        )
        self.stats.resume = info
        self.last_saved_step = info.step if info.path is not None else None
        if self.is_main:
            self._losses = LossLog(self.run_dir, on_mismatch=self.section.on_replay_mismatch)
        if self.section.sample_every:
            self._audit_batch = trainer.read_audit_batch()
        if isinstance(optimizer, ModelAdam):  # allocated and faulted in now, not at step k
            self._buffers = _FileImage(self._layout, pin=trainer.device.type == "cuda")
        self._logging_rows = False
        if self.section.full_every > 1:
            self._logging_rows = optimizer.log_rows()  # the rows each delta holds
            if not self._logging_rows and self.is_main:
                log.warning(
                    "checkpoint.full_every = %d: fbgemm's fused ADAM updates tables inside "
                    "the backward, where the updated rows cannot be seen: full checkpoints only",
                    self.section.full_every,
                )
        signals = self._poll_signals(trainer)
        if signals.stop:
            trainer.request_stop("SIGTERM before the first step: nothing new to checkpoint")
        return info

    def rejoin(self, trainer: Trainer) -> None:
        """A survivor's side of a replacement's :meth:`attach` (``joining``), in the new
        process group: the writer's group, the temp-file tag, the set-up barrier and the
        signal agreement (the same collectives, in the same order)."""
        import torch.distributed as dist

        self._trainer = trainer
        self._pg = dist.new_group(backend="gloo", timeout=WRITER_TIMEOUT)
        self._job_tag = self._broadcast(self._job_tag)
        self._chain = None  # the replacement's rows were not logged: the next one is full
        if self._logging_rows:
            trainer.optimizer.log_rows()
        if self.is_main:  # no writer runs now: an abandoned write's temp file goes
            clean_stray_temp_files(self.run_dir)
        self._barrier_main()
        signals = self._poll_signals(trainer)
        if signals.stop:
            trainer.request_stop("SIGTERM during a recovery: nothing new to checkpoint")

    def note_recovery(self, at_step: int, **info: Any) -> None:
        """Rank 0: an ``{"event": "recovery"}`` record in ``.loss.json`` (the audit trail's
        entry is in ``.recovery.json``)."""
        if self._losses is not None:
            self._losses.write_event("recovery", at_step=at_step, **info)

    def abandon_write(self) -> None:
        """After a peer died: wait for the write in flight, which fails at its next barrier
        (the peer is gone) unless it got past them; a failed write was never committed (the
        newest valid checkpoint is the previous one), so its error is logged, not raised."""
        try:
            self._writer.wait()
        except CheckpointError as exc:
            log.warning(
                "a checkpoint write was abandoned: a peer died during it (%s)",
                str(exc).splitlines()[0][:200],
            )

    def busy(self) -> bool:
        """Whether a checkpoint write is in flight."""
        return self._writer.busy

    def _prepare_directory(self, resume: bool) -> None:
        """Rank 0: own the directory (its lock, before anything else), refuse to clobber a
        run, clean stray temp files, write ``_layout.json``. The other ranks wait for it."""
        assert self._layout is not None and self._trainer is not None
        if self.is_main:
            self._dir_lock = lock_run_directory(self.run_dir)  # held by run_training already
            existing = list_checkpoints(self.run_dir)
            history = read_loss_history(self.run_dir)
            if not resume and (existing or len(history.steps)):
                what = (
                    f"checkpoints up to {existing[-1].name}"
                    if existing
                    else f"a loss history of {len(history.steps)} steps"
                )
                raise ConfigError(
                    f"{self.run_dir} already holds {what}: pass --resume to continue this run, "
                    "use `recd pivot` to continue it under a new config, or choose another "
                    "run directory (--run-dir)"
                )
            clean_stray_temp_files(self.run_dir)
            saved = read_layout_or_none(self.run_dir)
            if saved is not None and saved != self._layout and existing:
                raise ConfigError(
                    f"{self.run_dir / LAYOUT_FILE}: the checkpoints of this run hold another "
                    f"model ({saved.n_params:,} parameters in {len(saved)} tensors; this config "
                    f"builds {self._layout.n_params:,} in {len(self._layout)}): fork a new run "
                    "directory instead"
                )
            if saved != self._layout:
                write_layout(self.run_dir, self._layout)
            self._state.load()
        self._barrier_main()

    def _barrier_main(self) -> None:
        trainer = self._trainer
        if trainer is not None and trainer.dist is not None:
            import torch.distributed as dist

            dist.barrier()

    def _broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (identity with one process)."""
        trainer = self._trainer
        if trainer is None or trainer.dist is None:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # ------------------------------------------------------------------ resume
    def _choose_checkpoint(self, trainer: Trainer) -> tuple[Path | None, FlatState | None]:
        """Rank 0: the newest checkpoint that validates, matches its checksum and holds only
        finite values (unless ``train.accept_nonfinite``), falling back past the others like
        past a truncated file (one warning line each); one process: with its content, read
        once, here (the checksum is checked on the bytes read)."""
        layout = self._layout
        accept = self.config.train.accept_nonfinite
        loaded: dict[Path, FlatState] = {}
        nonfinite: list[str] = []

        def check(path: Path) -> None:
            try:
                if trainer.dist is None:
                    params = read_checkpoint_flat(path, layout)
                    if not accept:
                        regions = (params.weights, params.adam_m, params.adam_v)
                        check_finite(path, regions, layout=layout)
                    loaded[path] = params
                elif not accept:
                    check_finite_any(path, layout)
            except CheckpointNonFiniteError:
                nonfinite.append(path.name)
                raise

        try:
            path = newest_valid_checkpoint(
                self.run_dir, layout, check=check, verify=trainer.dist is not None
            )
        except CheckpointCorruptError as exc:
            if not nonfinite:
                raise
            raise CheckpointCorruptError(
                f"{exc}; no checkpoint with finite weights and Adam state is left to resume "
                f"from (pass --accept-nonfinite to resume from {nonfinite[0]} regardless)"
            ) from exc
        return path, None if path is None else loaded.get(path)

    def _resume(self, trainer: Trainer) -> ResumeInfo:
        assert self._layout is not None
        began = time.perf_counter()
        chosen = None
        params: FlatState | None = None
        if self.is_main:
            path, params = self._choose_checkpoint(trainer)
            chosen = None if path is None else str(path)
        chosen = self._broadcast(chosen)
        if chosen is None:
            if self.is_main:
                log.info("resume: no checkpoint in %s, starting from step 0", self.run_dir)
            return ResumeInfo(path=None, step=0, fresh_policy=True)
        path = Path(chosen)
        if trainer.dist is None:
            assert params is not None  # read by _choose_checkpoint
        else:
            mapped = read_any(path, self._layout)  # a full file: each rank reads its blocks
            params = FlatState(
                step=mapped.step, weights=mapped.weights, adam_m=mapped.adam_m, adam_v=mapped.adam_v
            )
        step = params.step
        entry = read_step_state(self.run_dir, step)
        read_s = time.perf_counter() - began
        began = time.perf_counter()
        if entry is None:
            trainer.optimizer.load_state(params)
            trainer.step = step
            if self.is_main:  # recorded with the next state write: a later fallback to it
                self._state.mark_fresh(step)
                log.warning(
                    "resume: %s has no reader/RNG state for step %d (fresh data policy after a "
                    "pivot or fork): weights, Adam state and step restored, the reader starts "
                    "at the beginning of its partitions",
                    self.run_dir / STATE_FILE,
                    step,
                )
        else:
            self._restore_with_entry(trainer, params, entry)
        load_s = time.perf_counter() - began
        if self.is_main:
            log.info("resumed from %s (step %d)", path, step)
        return ResumeInfo(
            path=path, step=step, fresh_policy=entry is None, read_s=read_s, load_s=load_s
        )

    def _restore_with_entry(
        self, trainer: Trainer, params: FlatState, entry: dict[str, Any]
    ) -> None:
        saved_world = int(entry.get("world_size", 1))
        if saved_world != trainer.world_size:
            raise ConfigError(
                f"{self.run_dir / STATE_FILE}: checkpoint step {params.step} was written by "
                f"{saved_world} process(es), this job has {trainer.world_size}: the model loads "
                "on any world size, but the reader positions are per rank; resume with the same "
                "--nproc, or `recd pivot` to restart the data policy from this checkpoint"
            )
        trainer.restore_state(
            TrainState(
                step=params.step,
                params=params,
                reader=entry["readers"][trainer.rank],
                rng=decode_rng(entry["rng"][trainer.rank]),
            )
        )

    # ------------------------------------------------------------------ every step
    def _poll_signals(self, trainer: Trainer) -> StepSignals:
        if self.signals is None:
            signals = StepSignals()
            return agree(signals, device=trainer.device) if trainer.dist is not None else signals
        if trainer.dist is not None:
            return self.signals.take_agreed(device=trainer.device)
        return self.signals.take()

    def after_step(self, trainer: Trainer, step: int, loss: float) -> None:
        """Record the loss; checkpoint on cadence or signal (``.loss.json`` first)."""
        if self._losses is not None:
            self._losses.append(step, loss)
        signals = self._poll_signals(trainer)
        periodic = step % self.section.checkpoint_every == 0
        if not (periodic or signals.save):
            return
        reason = "SIGTERM" if signals.stop else "SIGUSR1" if signals.save and not periodic else ""
        self.save(trainer, reason=reason or "periodic")
        if signals.stop:
            self.wait()  # the checkpoint is on disk before the process exits
            name = self.last_saved_name
            trainer.request_stop(f"SIGTERM: stopped after step {step}, checkpoint {name} written")

    def after_train(self, trainer: Trainer) -> None:
        """The final checkpoint, unless the last step was just saved."""
        if trainer.step > 0 and trainer.step != self.last_saved_step:
            self.save(trainer, reason="end of training")

    # ------------------------------------------------------------------ one checkpoint
    def save(self, trainer: Trainer, *, reason: str = "requested") -> None:
        """Snapshot now, write in the background (every rank, at the same step).

        One process, ``background = true``: the copy of weights, m and v into the file image
        runs on the writer thread too, overlapping the next steps (:mod:`recd.train.snapshot`).
        """
        began = time.perf_counter()
        self.wait()  # backpressure: one write in flight, and the image is free again
        waited = time.perf_counter() - began
        snapshot = self._snapshot(trainer, reason)
        self.last_saved_step = snapshot.step
        self.last_saved_name = (
            delta_filename(snapshot.step)
            if snapshot.delta is not None
            else checkpoint_path(self.run_dir, snapshot.step).name
        )
        if not self.section.background:
            self._fill(snapshot, trainer, None, None)
            self._write(snapshot)
        else:
            planned = filled = None
            self._snapshot_fill = None
            if snapshot.flat is not None or (snapshot.delta and snapshot.delta.fill):
                planned, filled = threading.Event(), threading.Event()
                self._guard_parameters(trainer, planned, filled)

            def job() -> None:
                snapshot.spent_logs = None  # dropped here, not on the training thread
                self._fill(snapshot, trainer, planned, filled)
                self._write(snapshot)

            self._writer.submit(job, name=f"step{snapshot.step}")
        self.stats.blocked_s += time.perf_counter() - began
        self.stats.wait_s += waited

    def _fill(
        self,
        snapshot: _Snapshot,
        trainer: Trainer,
        planned: threading.Event | None,
        filled: threading.Event | None,
    ) -> None:
        """Copy the model and Adam state into the file image (or a delta's blocks);
        ``planned`` is set once the guarded ``step()`` can take its share
        (:mod:`recd.train.snapshot`), ``filled`` once the copy holds the whole state of the
        snapshot's step."""
        try:
            fill: SnapshotFill | None = None
            if snapshot.delta is not None:
                fill = snapshot.delta.fill  # planned on the training thread
            elif snapshot.flat is not None:
                assert isinstance(trainer.optimizer, ModelAdam)
                fill = snapshot.flat.plan_fill(trainer.optimizer, snapshot.step)
            self._snapshot_fill = fill
            if planned is not None:
                planned.set()
            if fill is not None:
                fill.run()
                self.stats.pieces_copied_by_training += fill.dense.copied_by_back
                self.stats.rows_saved_by_training += fill.patches.rows_saved
        finally:
            for event in (planned, filled):
                if event is not None:
                    event.set()

    def _guard_parameters(
        self, trainer: Trainer, planned: threading.Event, filled: threading.Event
    ) -> None:
        """Until the snapshot copy is over, the optimizer's ``step`` goes through
        :meth:`recd.train.snapshot.SnapshotFill.guard_step`: it waits (helping) for the dense
        parameters' copy, and hands the embedding rows it updates over to the tables' copy."""
        self._unguard()  # two saves at one boundary: the previous copy is complete (wait())
        optimizer = trainer.optimizer
        assert isinstance(optimizer, ModelAdam), "only ModelAdam snapshots in the background"
        original = optimizer.step
        stats = self.stats

        def guarded(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            planned.wait()
            fill = self._snapshot_fill
            if fill is None:  # copied whole (GPU), or the plan failed (the writer reports it)
                filled.wait()
            if fill is None or fill.patches.closed:
                self._unguard()
                waited = time.perf_counter() - began
                stats.blocked_s += waited
                stats.guard_wait_s += waited
                return original(*args, **kwargs)

            def step(*a: Any, **k: Any) -> Any:
                waited = time.perf_counter() - began
                stats.blocked_s += waited
                stats.guard_wait_s += waited
                return original(*a, **k)

            return fill.guard_step(step, *args, **kwargs)

        self._guarded = (optimizer, "step" in vars(optimizer), original)
        optimizer.step = guarded  # type: ignore[method-assign]

    def _unguard(self) -> None:
        if self._guarded is None:
            return
        optimizer, had_attribute, original = self._guarded
        if had_attribute:
            optimizer.step = original
        else:
            del optimizer.step  # back to the class's method
        self._guarded = None

    def _snapshot(self, trainer: Trainer, reason: str) -> _Snapshot:
        """What must be taken on the training thread at the boundary (see :meth:`save`)."""
        assert self._layout is not None
        step = trainer.step
        optimizer = trainer.optimizer
        if optimizer.step_count != step:
            raise CheckpointError(
                f"checkpoint: optimizer step counter {optimizer.step_count} != trainer step {step}"
            )
        snapshot = _Snapshot(step=step, reason=reason)
        if self._delta_due(reason, step):
            assert self._chain is not None
            base, parent, deltas = self._chain
            snapshot.delta = _DeltaImage(parent=parent, base=base)
            if isinstance(optimizer, ModelAdam) and trainer.device.type == "cpu":
                snapshot.delta.fill = DeltaFill.plan(optimizer, self._layout)
            else:
                snapshot.delta.parts = optimizer.delta_blocks(self._layout)
            self._chain = (base, step, deltas + 1)
        elif isinstance(optimizer, ModelAdam):
            if self._buffers is None:
                self._buffers = _FileImage(self._layout, pin=trainer.device.type == "cuda")
            snapshot.flat = self._buffers  # filled by _fill (maybe on the writer thread)
            snapshot.spent_logs = self._start_chain(optimizer, step)
        else:
            _, snapshot.shards = optimizer.export_local()
            snapshot.spent_logs = self._start_chain(optimizer, step)
        snapshot.audit = self._audit(trainer, step, reason)
        snapshot.state_entry = self._state_entry(trainer, step)
        return snapshot

    def _start_chain(self, optimizer: ModelAdam | ShardedAdam, step: int) -> Any:
        """A full checkpoint at ``step``: the next deltas apply onto it, and hold the rows
        updated from here on. Returns the row logs swapped out (for the writer to drop)."""
        if not self._logging_rows:
            return None
        self._chain = (step, step, 0)
        if isinstance(optimizer, ModelAdam):
            return optimizer.detach_row_logs()
        optimizer.reset_logged_rows()
        return None

    def _delta_due(self, reason: str, step: int) -> bool:
        """A delta, not a full checkpoint: deltas are on, a full one this process wrote is
        there to apply onto, fewer than ``full_every - 1`` deltas since it, and this is not
        the run's last checkpoint (which stays a plain file)."""
        every = self.section.full_every
        return (
            every > 1
            and self._logging_rows
            and self._chain is not None
            and self._chain[2] < every - 1
            and reason != "end of training"
            and step < self.config.train.steps
        )

    def _state_entry(self, trainer: Trainer, step: int) -> dict[str, Any] | None:
        """Every rank's reader position and RNG state, gathered on rank 0."""
        mine = (trainer.loader.state_dict(), encode_rng(torch.get_rng_state()))
        if trainer.dist is not None:
            import torch.distributed as dist

            gathered: list[Any] = [None] * trainer.world_size
            dist.all_gather_object(gathered, mine)
        else:
            gathered = [mine]
        if not trainer.is_main:
            return None
        return step_entry(
            step,
            trainer.world_size,
            [reader for reader, _ in gathered],
            [rng for _, rng in gathered],
        )

    def _audit_due(self, step: int, reason: str) -> bool:
        every = self.section.sample_every or 0
        return every > 0 and (step % every == 0 or reason != "periodic")

    @torch.no_grad()
    def _audit(self, trainer: Trainer, step: int, reason: str) -> dict[str, Any] | None:
        """Predictions and metrics on the audit batch (a forward on every rank)."""
        if self._audit_batch is None or not self._audit_due(step, reason):
            return None
        batch = self._audit_batch
        trainer.eval_model.eval()
        logits = trainer.eval_model(batch.dense, batch.sparse).float().cpu()  # B x T
        if not trainer.is_main:
            return None
        x = logits.double().numpy()
        y = batch.labels.cpu().double().numpy()
        probs = 1.0 / (1.0 + np.exp(-x))
        if np.isfinite(x).all():
            aucs = [roc_auc(x[:, t], y[:, t]) for t in range(y.shape[1])]
        else:  # a diverged model trained on with accept_nonfinite: no AUC (null)
            aucs = [math.nan]
        return {
            "step": step,
            "reason": reason,
            "rows": int(y.shape[0]),
            "loss": json_safe(bce_from_logits(x, y)),
            "auc": json_safe(float(np.mean(aucs))),
            "mean_prediction": json_safe(float(probs.mean())),
            "label_mean": float(y.mean()),
            "predictions": [
                [json_safe(float(p)) for p in row] for row in probs[:AUDIT_PREDICTIONS]
            ],
        }

    # ------------------------------------------------------------------ the writer thread
    def _write(self, snapshot: _Snapshot) -> None:
        """The background job: sidecars, then the file, then retention (in this order: a
        crash leaves the previous checkpoint and its state entry intact)."""
        assert self._layout is not None and self._trainer is not None
        began = time.perf_counter()
        cpu_began = time.thread_time()
        final = checkpoint_path(self.run_dir, snapshot.step)
        if snapshot.delta is not None:
            file_began = time.perf_counter()
            final = self.run_dir / delta_filename(snapshot.step)
            delta = snapshot.delta
            parts = delta.blocks()
            if self._trainer.dist is not None:  # every rank's blocks, in rank order, on rank 0
                import torch.distributed as dist

                gathered: list[Any] = [None] * self._trainer.world_size
                dist.gather_object(parts, gathered if self.is_main else None, dst=0, group=self._pg)
                parts = [part for rank_parts in gathered if rank_parts for part in rank_parts]
            if not self.is_main:
                return
            self._write_sidecars(snapshot)
            blocks, payload = _DeltaImage.combine(parts)
            write_delta_payload(
                final,
                step=snapshot.step,
                parent=delta.parent,
                base=delta.base,
                n_params=self._layout.n_params,
                blocks=blocks,
                payload=payload,
            )
            self.stats.deltas += 1
        elif snapshot.flat is not None:
            self._write_sidecars(snapshot)
            file_began = time.perf_counter()
            snapshot.flat.write(final)
        else:
            file_began = time.perf_counter()
            self._write_distributed(snapshot, final)
        file_s = time.perf_counter() - file_began
        if not self.is_main:
            return
        size = final.stat().st_size
        deleted = apply_retention(self.run_dir, self.policy, layout=self._layout)
        for gone in deleted:  # their .state.json entries went with them
            self._state.forget(step_of_name(gone.name))
        self.stats.checkpoints += 1
        self.stats.steps.append(snapshot.step)
        self.stats.write_s.append(time.perf_counter() - began)
        self.stats.file_write_s.append(file_s)
        self.stats.write_cpu_s.append(time.thread_time() - cpu_began)
        self.stats.bytes_written += size
        log.info(
            "checkpoint %s written (%s, %.2f s in the background)",
            final,
            snapshot.reason,
            time.perf_counter() - began,
        )

    def _write_sidecars(self, snapshot: _Snapshot) -> None:
        """Rank 0, before the commit: ``.state.json`` entry, audit, fsync of ``.loss.json``."""
        if not self.is_main:
            return
        assert snapshot.state_entry is not None
        on_disk = {step_of_name(p.name) for p in list_checkpoints(self.run_dir)}
        trainer = self._trainer
        assert trainer is not None
        self._state.write(
            snapshot.step,
            snapshot.state_entry,
            on_disk=on_disk,
            data_policy={
                "world_size": trainer.world_size,
                "reader": {
                    k: v for k, v in trainer.reader_config.to_dict().items() if k not in ("rank",)
                },
            },
        )
        if snapshot.audit is not None:
            append_sample_audit(self.run_dir, snapshot.audit, keep_last=self.section.audit_keep)
        if self._losses is not None:
            self._losses.sync()

    def _write_distributed(self, snapshot: _Snapshot, final: Path) -> None:
        """Ranged writes of every rank into one temp file; rank 0 commits."""
        import torch.distributed as dist

        from recd.optim.sharded_adam import ShardedAdam

        assert self._trainer is not None and self._layout is not None
        optimizer = self._trainer.optimizer
        assert isinstance(optimizer, ShardedAdam) and snapshot.shards is not None
        tmp = temp_path_for(final, tag=f"job{self._job_tag}")
        if self.is_main:
            preallocate(tmp, snapshot.step, self._layout.n_params)
        dist.barrier(group=self._pg)
        optimizer.write_local_ranges(tmp, snapshot.shards)
        fsync_file(tmp)  # each rank's own bytes (a filesystem shared by several hosts)
        dist.barrier(group=self._pg)
        if self.is_main:
            self._write_sidecars(snapshot)
            commit(tmp, final)

    # ------------------------------------------------------------------ the end
    def wait(self) -> None:
        """Block until the write in flight (if any) is committed."""
        try:
            self._writer.wait()
        finally:
            self._unguard()

    def close(self, *, raise_errors: bool = True) -> None:
        """Wait for the write in flight, close ``.loss.json`` (idempotent)."""
        if self._closed:
            return
        try:
            self.wait()
        except CheckpointError:
            if raise_errors:
                raise
            log.exception("checkpoint write failed")
        finally:
            self._closed = True
            if self._losses is not None:
                self._losses.close()
                self._losses = None
            if self._dir_lock is not None:
                self._dir_lock.release()
                self._dir_lock = None
