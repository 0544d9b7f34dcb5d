"""How ``recd logs ingest`` splits its memory budget (``Plan``), and where pass 1 leaves the
rows for pass 2 (``Spill``): one file per bucket of sessions, so that pass 2 holds one bucket's
whole sessions at a time, not the file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from recd.logs.ingest_merge import MERGE_FAN_IN
from recd.logs.ingest_text import MIN_CHUNK_BYTES

OUTPUT_BATCH_ROWS = 1 << 16  # most samples per output batch
MIN_BATCH_ROWS = 1024  # fewest samples per output batch (and per batch of a bucket's file)
CHUNK_SHARE = 16  # a text chunk is budget / CHUNK_SHARE bytes
BUCKET_SHARE = 2  # one bucket's events take budget / BUCKET_SHARE at most (for small sessions)
BUCKET_BYTES_PER_INPUT_BYTE = 8  # measured peak bytes of pass 2 per input byte of a bucket
MERGE_SHARE = 4  # the merge's batches (one per bucket) take budget / MERGE_SHARE
MAX_BUCKETS = 256
ROW_BYTES = 512  # planning figure of one sample's bytes (with a history of ~20)


@dataclass(slots=True)
class Plan:
    """How the input is read: chunk size, buckets, rows per output batch."""

    file_bytes: int
    chunk_bytes: int
    buckets: int
    batch_rows: int


def make_plan(path: Path, budget: int, max_line_bytes: int) -> Plan:
    """Split ``budget``: a text chunk of ``budget / CHUNK_SHARE`` bytes (at least one line
    limit), and enough buckets that one bucket's events take ``budget / BUCKET_SHARE``."""
    size = path.stat().st_size
    chunk = max(MIN_CHUNK_BYTES, budget // CHUNK_SHARE, 2 * max_line_bytes)
    per_bucket = max(1, budget // BUCKET_SHARE)
    buckets = min(MAX_BUCKETS, max(1, math.ceil(size * BUCKET_BYTES_PER_INPUT_BYTE / per_bucket)))
    fan_in = min(buckets, MERGE_FAN_IN)
    batch_rows = max(
        MIN_BATCH_ROWS, min(OUTPUT_BATCH_ROWS, budget // (MERGE_SHARE * fan_in * ROW_BYTES))
    )
    return Plan(file_bytes=size, chunk_bytes=chunk, buckets=buckets, batch_rows=batch_rows)


class Spill:
    """Rows of the first pass, by bucket (hash of the session id): Arrow IPC stream files
    under ``root``, or with one bucket the record batches in memory."""

    def __init__(self, root: Path, buckets: int) -> None:
        self.root = root
        self.buckets = buckets
        self.memory: list[pa.RecordBatch] = []
        self._writers: list[ipc.RecordBatchStreamWriter] = []

    def path(self, bucket: int) -> Path:
        return self.root / f"bucket-{bucket:04d}.arrow"

    def write(self, batch: pa.RecordBatch, bucket_of: np.ndarray) -> None:
        if self.buckets == 1:
            self.memory.append(batch)
            return
        if not self._writers:
            self._writers = [
                ipc.new_stream(str(self.path(b)), batch.schema) for b in range(self.buckets)
            ]
        order = np.argsort(bucket_of, kind="stable")
        bounds = np.searchsorted(bucket_of[order], np.arange(self.buckets + 1))
        for b in range(self.buckets):
            if bounds[b + 1] > bounds[b]:
                rows = pa.array(order[bounds[b] : bounds[b + 1]])
                self._writers[b].write_batch(batch.take(rows))

    def close(self) -> None:
        for writer in self._writers:
            writer.close()

    def read(self, bucket: int, schema: pa.Schema | None) -> pa.Table:
        if schema is None:  # no rows were read
            return pa.table({})
        if self.buckets == 1:
            batches, self.memory = self.memory, []
            return pa.Table.from_batches(batches, schema=schema).combine_chunks()
        if not self._writers:
            return pa.Table.from_batches([], schema=schema)
        with pa.OSFile(str(self.path(bucket))) as source:
            table = ipc.open_stream(source).read_all().combine_chunks()
        self.path(bucket).unlink()
        return table
