"""The merge of ``recd logs ingest``'s output: each bucket's samples, sorted by arrival
(ts, request_id), go to a file of their own; the files are merged into one arrival-order stream
holding one batch per file, ``MERGE_FAN_IN`` files at a time."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

MERGE_FAN_IN = 16  # files merged at once: memory holds one batch of each


def write_sorted(path: Path, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> None:
    """Write one bucket's arrival-ordered samples to an Arrow IPC file."""
    with ipc.new_file(str(path), schema) as writer:
        for batch in batches:
            writer.write_batch(batch)


def merge_files(
    paths: Sequence[Path], *, scratch: Path, batch_rows: int, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Merge sorted IPC files (:func:`write_sorted`) into one stream in (ts, request_id) order,
    ``MERGE_FAN_IN`` files at a time: more files are first merged in groups into files under
    ``scratch`` (deleting their inputs), so memory holds at most ``MERGE_FAN_IN`` batches."""
    paths = list(paths)
    level = 0
    while len(paths) > MERGE_FAN_IN:
        merged = []
        for g in range(0, len(paths), MERGE_FAN_IN):
            group = paths[g : g + MERGE_FAN_IN]
            target = scratch / f"merged-{level}-{g // MERGE_FAN_IN:04d}.arrow"
            write_sorted(target, merge_sorted(group, batch_rows=batch_rows), schema)
            for path in group:
                path.unlink()
            merged.append(target)
        paths, level = merged, level + 1
    yield from merge_sorted(paths, batch_rows=batch_rows)


def merge_sorted(
    paths: Sequence[Path], *, batch_rows: int, keys: tuple[str, str] = ("ts", "request_id")
) -> Iterator[pa.RecordBatch]:
    """Merge IPC files, each sorted by ``keys``, into one stream sorted by ``keys``, in batches
    of at most ``batch_rows`` rows.

    Holds one batch per file: every round takes, from each file, its rows up to the smallest
    last key among the files' current batches (so at least one batch is used up), sorts them
    and yields them.
    """
    readers = [ipc.open_file(pa.OSFile(str(p))) for p in paths]
    next_batch = [0] * len(readers)
    current: list[pa.RecordBatch | None] = [None] * len(readers)
    offset = [0] * len(readers)

    def load(i: int) -> None:
        while current[i] is None or offset[i] >= current[i].num_rows:  # type: ignore[union-attr]
            if next_batch[i] >= readers[i].num_record_batches:
                current[i] = None
                return
            current[i] = readers[i].get_batch(next_batch[i])
            next_batch[i] += 1
            offset[i] = 0

    for i in range(len(readers)):
        load(i)
    while True:
        active = [i for i in range(len(readers)) if current[i] is not None]
        if not active:
            return
        lasts = []
        for i in active:
            batch = current[i]
            assert batch is not None
            lasts.append(tuple(batch.column(k)[batch.num_rows - 1].as_py() for k in keys))
        frontier = min(lasts)
        pieces = []
        for i in active:
            batch = current[i]
            assert batch is not None
            a = batch.column(keys[0]).to_numpy()[offset[i] :]
            b = batch.column(keys[1]).to_numpy()[offset[i] :]
            take = int(((a < frontier[0]) | ((a == frontier[0]) & (b <= frontier[1]))).sum())
            if take:
                pieces.append(batch.slice(offset[i], take))
                offset[i] += take
            load(i)
        table = pa.Table.from_batches(pieces)
        order = np.lexsort((table.column(keys[1]).to_numpy(), table.column(keys[0]).to_numpy()))
        merged = table.take(pa.array(order)).combine_chunks()
        for lo in range(0, merged.num_rows, batch_rows):
            yield from merged.slice(lo, batch_rows).to_batches()
