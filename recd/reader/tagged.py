"""A batch tagged with where it was read, and how a reading process produces them.

``iter_tagged_batches`` is the one function that builds a stream's batches, shared by the
local reader's processes (:mod:`recd.reader.dataset`) and the Ray Data tasks
(:mod:`recd.reader.ray_tier`), so both hand out the same tensors. A :class:`WorkerFailure`
carries a worker's RecdError back as data, so the trainer re-raises it with its own type.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from recd.errors import RecdError
from recd.reader.plan import ReadPlan
from recd.reader.stats import BatchTiming
from recd.reader.stream import iter_stream_batches
from recd.reader.transform import BatchTransform
from recd.tensors.batch import Batch

__all__ = ["TaggedBatch", "WorkerFailure", "iter_tagged_batches"]


@dataclass(slots=True)
class TaggedBatch:
    """A batch with the position it was read at (what DataLoader workers send back)."""

    epoch: int
    stream: int
    """Stream of this rank the batch belongs to."""
    seq: int
    """Index of the batch among its stream's batches of the epoch."""
    batch: Batch
    timing: BatchTiming

    def pin_memory(self) -> TaggedBatch:
        """Called by DataLoader(pin_memory=True)."""
        return TaggedBatch(self.epoch, self.stream, self.seq, self.batch.pin_memory(), self.timing)


@dataclass(slots=True)
class WorkerFailure:
    """A RecdError raised in a worker, sent back as data so the main process re-raises the
    same exception type and message (DataLoader would turn it into a RuntimeError)."""

    worker: int
    error_type: type[RecdError]
    state: dict[str, Any]
    message: str

    @classmethod
    def capture(cls, worker: int, exc: RecdError) -> WorkerFailure:
        return cls(worker, type(exc), dict(getattr(exc, "__dict__", {})), str(exc))

    def rebuild(self) -> RecdError:
        exc = self.error_type.__new__(self.error_type)
        Exception.__init__(exc, self.message)
        exc.__dict__.update(self.state)
        return exc


def iter_tagged_batches(
    plan: ReadPlan,
    transform: BatchTransform,
    *,
    epoch: int,
    stream: int,
    start_batch: int = 0,
) -> Iterator[TaggedBatch]:
    """Converted, preprocessed batches of ``stream`` in ``epoch`` from ``start_batch``."""
    seq = start_batch
    for rows in iter_stream_batches(plan, epoch=epoch, stream=stream, start_batch=start_batch):
        t0 = time.perf_counter()
        batch = transform.convert(rows.rows)
        t1 = time.perf_counter()
        batch = transform.process(batch)
        t2 = time.perf_counter()
        timing = BatchTiming(
            rows=rows.rows.num_rows,
            fill_s=rows.fill_s,
            convert_s=t1 - t0,
            process_s=t2 - t1 + rows.process_s,
            read_bytes=rows.read_bytes,
            buffer_rows=rows.buffer_rows,
        )
        yield TaggedBatch(epoch, stream, seq, batch, timing)
        seq += 1
