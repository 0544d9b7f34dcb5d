"""Reader tier on Ray Data: batches built by Ray workers, possibly on other machines.

``[reader] engine = "ray"`` moves reading, conversion (KJT + IKJTs) and preprocessing out of
the trainer's process into Ray Data tasks. The work is the local reader's: the same plan, the
same streams (``recd.reader.order``), the same rows per batch, built by the same functions
(``recd.reader.tagged.iter_tagged_batches``), so every batch equals the local reader's.

How one epoch of one rank runs::

    chunks   each stream's batches from its resume position, cut in chunks of
             ``ray_chunk_batches`` (``rows`` / ``session``: one shuffle window, so that no
             window is read by two tasks): (stream s, first batch b), listed round-robin over
             the streams (chunk 0 of every stream, then chunk 1, ...): the order batches are
             used
    Ray Data from_items(chunks of every epoch left) -> map_batches(read_chunk), one chunk
             per task, at most ``num_workers`` tasks at once, ``preserve_order`` (chunks come
             back in list order whatever order the tasks finish in), object store use capped
             at ``ray_memory_mb`` (Ray's backpressure stops scheduling tasks beyond it); the
             worker processes stay up across epochs, each unpickles the plan and compiles the
             preprocessing once
    task     builds the chunk's batches: iter_tagged_batches(plan, transform, epoch, s, b),
             IKJTs per unit inside the task, pickled into one binary cell
    trainer  unpickles, and the loader's reorder buffer hands them out in the rank's
             (seq, stream) order: the local reader's sequence, resumable at any batch

A task reads its chunk from the chunk's first row (the plan maps a batch to its unit and
offset, or to its window, from the footers), so chunks are independent: a task whose worker process dies is run
again by Ray (Ray Data retries a task whose process died), giving the same batches; nothing
is lost or duplicated. A
RecdError in a task (a bad row) comes back as data and is raised in the trainer with its own
type and message, as with DataLoader workers.

Why Ray Data's ``streaming_split`` is not used: it deals blocks to the splits as consumers ask
for them, so which rank gets which rows, and in which order, depends on timing. That would
break the equality with the local reader and exact resume; building each rank's own ordered
dataset keeps both and still uses Ray Data's streaming executor, backpressure and retries.

Ray is imported lazily (the ``ray`` extra); ``ray_address`` names an existing cluster, or
None joins the one this process already joined, else a cluster ``ray start`` left running on
this machine, else starts a local one for the job (whose start and stop add seconds to the
job: docs/scaling.md gives the measured cost).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from recd.errors import ConfigError, RecdError
from recd.reader.plan import ReadPlan
from recd.reader.transform import BatchTransform

log = logging.getLogger(__name__)

KILL_DIR_ENV = "RECD_READER_TEST_KILL_DIR"
"""Test hook: a directory. A task about to read chunk ``e<epoch>-s<stream>-b<first batch>``
finds ``<chunk>.kill`` there, renames it ``<chunk>.killed`` and kills its own worker process
(os._exit), as a lost machine would. Unset in normal runs."""


def ensure_ray(address: str | None) -> Any:
    """The ``ray`` module, connected: to ``address``, to the cluster ``ray.init`` already
    joined, or to a local cluster started now."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "reader.engine = 'ray' needs Ray Data: pip install 'ray[data]' (recd's `ray` extra)"
        ) from exc
    quiet = not log.isEnabledFor(logging.DEBUG)  # Ray's own INFO lines: with --verbose only
    if not ray.is_initialized():
        # None: Ray's own rule, the cluster `ray start` left running on this machine if there
        # is one (no start-up to pay), else a new local one for the job
        log.info("ray: %s", f"connecting to {address}" if address else "starting or joining")
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR if quiet else logging.INFO,
        )
    if quiet:
        import ray.data  # its first import configures the "ray.data" logger

        logging.getLogger("ray.data").setLevel(logging.ERROR)
    return ray


def chunk_list(
    totals: list[int], start_batches: list[int], chunk_batches: int
) -> list[tuple[int, int, int]]:
    """(stream, first batch, batches) of every chunk left in an epoch, round-robin over the
    streams: chunk 0 of each stream, then chunk 1, ... Chunks end at multiples of
    ``chunk_batches`` (a resumed stream's first chunk is the rest of its chunk)."""
    per_stream = [
        [
            (s, b, min(total, (b // chunk_batches + 1) * chunk_batches) - b)
            for b in [
                start,
                *range((start // chunk_batches + 1) * chunk_batches, total, chunk_batches),
            ]
            if b < total
        ]
        for s, (total, start) in enumerate(zip(totals, start_batches, strict=True))
    ]
    longest = max((len(c) for c in per_stream), default=0)
    return [c[j] for j in range(longest) for c in per_stream if j < len(c)]


def read_chunk(item: dict[str, np.ndarray], *, plan: bytes) -> dict[str, Any]:
    """The Ray Data UDF (``map_batches``, one chunk per call): the chunk's TaggedBatches, or a
    WorkerFailure after the ones before a bad row, pickled into one binary cell."""
    from recd.reader.tagged import WorkerFailure, iter_tagged_batches

    epoch, stream, first, count = (int(item[k][0]) for k in ("epoch", "stream", "first", "count"))
    _kill_if_asked(f"e{epoch}-s{stream}-b{first}")
    read_plan, read_transform = _prepared(plan)
    out: list[Any] = []
    try:
        for tagged in iter_tagged_batches(
            read_plan, read_transform, epoch=epoch, stream=stream, start_batch=first
        ):
            out.append(tagged)
            if len(out) == count:
                break
    except RecdError as exc:
        out.append(WorkerFailure.capture(stream, exc))
    payload = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
    return {
        "epoch": np.array([epoch]),
        "stream": np.array([stream]),
        "first": np.array([first]),
        "payload": np.array([payload], dtype=object),
    }


_PREPARED: dict[bytes, tuple[ReadPlan, BatchTransform]] = {}


def _prepared(plan_blob: bytes) -> tuple[ReadPlan, BatchTransform]:
    """The plan and its transform, made once per Ray worker process and plan. The transform
    is compiled here rather than shipped: a TorchScript archive of a module taking a KJT does
    not load in a process where torchrec's KJT was never scripted."""
    key = hashlib.sha256(plan_blob).digest()
    if key not in _PREPARED:
        if len(_PREPARED) >= 4:
            _PREPARED.clear()
        plan = pickle.loads(plan_blob)
        _PREPARED[key] = (plan, BatchTransform(plan))
    return _PREPARED[key]


def _kill_if_asked(name: str) -> None:
    directory = os.environ.get(KILL_DIR_ENV)
    if not directory:
        return
    request = Path(directory) / f"{name}.kill"
    if request.exists():
        request.rename(request.with_suffix(".killed"))
        os._exit(17)


def ray_dataset(plan: ReadPlan, epochs: list[tuple[int, list[int], list[int]]]) -> Any:
    """The Ray Data dataset of one rank's chunks (see the module docstring), or None when
    nothing is left to read. ``epochs``: (epoch, batches of each stream, first batch of each
    stream) of every epoch to read; one Ray Data execution covers them all, so Ray's worker
    processes (and their imports) serve every epoch."""
    cfg = plan.config
    chunk = cfg.window_rows // cfg.batch_size if cfg.shuffle.windowed else cfg.ray_chunk_batches
    items = [
        {"epoch": epoch, "stream": s, "first": b, "count": n}
        for epoch, totals, starts in epochs
        for s, b, n in chunk_list(totals, starts, chunk)
    ]
    if not items:
        return None
    ray = ensure_ray(cfg.ray_address)
    from ray.data import DataContext, ExecutionResources, TaskPoolStrategy

    # The dataset keeps a copy of the context it was made with: set what the reader needs,
    # make it, and give the process its own settings back.
    ctx = DataContext.get_current()
    saved = ctx.copy()
    try:
        ctx.execution_options.preserve_order = True
        ctx.execution_options.resource_limits = ExecutionResources(
            object_store_memory=cfg.ray_memory_mb * 2**20
        )
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        dataset = ray.data.from_items(items, override_num_blocks=len(items))
        return dataset.map_batches(
            read_chunk,
            batch_size=1,
            batch_format="numpy",
            fn_kwargs={"plan": pickle.dumps(plan)},
            compute=TaskPoolStrategy(size=cfg.workers_per_rank),
            num_cpus=1,
        )
    finally:
        DataContext._set_current(saved)


def iter_ray_batches(
    plan: ReadPlan, epochs: list[tuple[int, list[int], list[int]]]
) -> Iterator[Any]:
    """The ``TaggedBatch``es (or ``WorkerFailure``s) of one rank from Ray Data, epoch after
    epoch in chunk order (:func:`ray_dataset`)."""
    dataset = ray_dataset(plan, epochs)
    if dataset is None:
        return
    rows = iter(dataset.iter_rows())
    try:
        for row in rows:
            yield from pickle.loads(row["payload"])
    finally:  # closed early (the trainer stopped): end the execution while Ray is up
        close = getattr(rows, "close", None)
        if close is not None:
            close()
