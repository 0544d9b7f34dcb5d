"""Reading shard frames defensively, finding bad rows (vectorised), and the quarantine.

What counts as bad input, and where the error points:

* a truncated or corrupt zstd frame / Arrow IPC stream: ``FILE: block B (byte offset O)``;
* a block whose schema does not match the catalogue (missing, extra or mistyped column):
  ``FILE: block B: column C ...`` (SchemaError);
* a row with a null ``session_id``, ``request_id`` or ``ts``, or a ``ts`` outside
  [1970, 2100): ``FILE: block B: row R: field F: ... (request_id X)`` (BadRowError);
* a row with a null label or dense value, a null sparse list, or a null id inside a sparse
  list (an empty list is fine): same message. Such rows would otherwise reach the table and
  stop every reader that meets them, hours into a training job.

With ``on_bad_rows="fail"`` the first one raises. With ``"quarantine"`` they go to
``TABLE/_quarantine/<run>/`` (``rows.parquet``: bad rows with ``_file``, ``_block``, ``_row``,
``_field``, ``_reason`` columns; ``block-*.arrow``: whole mismatched blocks as Arrow IPC files;
``frame-*.zst``: the raw bytes of unreadable frames; ``_summary.json``: counts and an entry per
block/frame) and are counted: nothing is dropped silently.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import zstandard

from recd.errors import BadRowError, SchemaError
from recd.schema import REQUEST_ID, SESSION_ID, TS, Catalogue
from recd.table.partitions import TS_MAX_MS, TS_MIN_MS, format_time_ms, window_mask

FRAME_HEADER_BYTES = 8  # little-endian uint64 length prefix (recd.logs.rawlog.write_frame)
ZSTD_MAX_FRAME_HEADER_BYTES = 18
# Reason codes of a bad row, checked in this order (a row gets the first that applies).
OK, NULL_SESSION, NULL_REQUEST, NULL_TS, TS_TOO_SMALL, TS_TOO_LARGE = range(6)
TS_CODES = (NULL_TS, TS_TOO_SMALL, TS_TOO_LARGE)
# Then, per feature column j of the batch (labels, dense, sparse in schema order):
# NULL_FEATURE + 2 * j (a null value or null list), NULL_FEATURE + 2 * j + 1 (a null id inside
# a sparse list).
NULL_FEATURE = 8
REASON_FIELD = {
    NULL_SESSION: SESSION_ID,
    NULL_REQUEST: REQUEST_ID,
    NULL_TS: TS,
    TS_TOO_SMALL: TS,
    TS_TOO_LARGE: TS,
}
REASON_TEXT = {
    NULL_SESSION: "session_id is null",
    NULL_REQUEST: "request_id is null",
    NULL_TS: "ts is null",
    TS_TOO_SMALL: f"ts is before {format_time_ms(TS_MIN_MS)} (negative ms)",
    TS_TOO_LARGE: f"ts is at or after {format_time_ms(TS_MAX_MS)} (wrong unit or corrupt clock)",
}
META_COLUMNS = ("_file", "_block", "_row", "_field", "_reason")


@dataclass(slots=True)
class Frame:
    """One length-prefixed zstd frame of a shard file, as read from disk."""

    path: Path
    index: int
    """Block index in the shard (0-based)."""
    offset: int
    """Byte offset of the frame's length prefix."""
    data: bytes
    """The compressed frame (short if truncated)."""
    error: str | None = None
    """Why the frame cannot be read (truncation), or None."""

    @property
    def where(self) -> str:
        return f"{self.path}: block {self.index} (byte offset {self.offset})"


def iter_frames(path: Path) -> Iterator[Frame]:
    """Yield the frames of a shard file; a truncated last frame comes with ``error`` set."""
    with path.open("rb") as f:
        index = offset = 0
        while True:
            header = f.read(FRAME_HEADER_BYTES)
            if not header:
                return
            if len(header) != FRAME_HEADER_BYTES:
                yield Frame(
                    path,
                    index,
                    offset,
                    header,
                    f"truncated length prefix ({len(header)} of 8 bytes)",
                )
                return
            (size,) = struct.unpack("<Q", header)
            data = f.read(size)
            if len(data) != size:
                yield Frame(
                    path, index, offset, data, f"truncated frame ({len(data)} of {size} bytes)"
                )
                return
            yield Frame(path, index, offset, data)
            index += 1
            offset += FRAME_HEADER_BYTES + size


def frame_content_sizes(path: Path) -> list[int]:
    """Decoded bytes of every frame, from the zstd frame headers (no decompression).

    Frames without a recorded content size count 8x their compressed size (an estimate).
    """
    sizes: list[int] = []
    with path.open("rb") as f:
        while True:
            header = f.read(FRAME_HEADER_BYTES)
            if len(header) != FRAME_HEADER_BYTES:
                return sizes
            (size,) = struct.unpack("<Q", header)
            head = f.read(min(size, ZSTD_MAX_FRAME_HEADER_BYTES))
            try:
                content = zstandard.frame_content_size(head)
            except zstandard.ZstdError:
                content = -1
            sizes.append(content if content >= 0 else 8 * size)
            f.seek(size - len(head), 1)


def decode_frame(frame: Frame) -> pa.RecordBatch:
    """Decompress a frame and decode its Arrow IPC stream into one batch (SchemaError if bad).

    Decompression goes through pyarrow's zstd codec when the frame header records the content
    size (recd's writer always does), so the decoded rows live in Arrow's memory pool and the
    batch references them without a copy.
    """
    if frame.error is not None:
        raise SchemaError(f"{frame.where}: {frame.error}")
    try:
        content = zstandard.frame_content_size(frame.data[:ZSTD_MAX_FRAME_HEADER_BYTES])
        if content >= 0:
            data = pa.decompress(frame.data, decompressed_size=content, codec="zstd", asbytes=False)
        else:
            data = pa.py_buffer(zstandard.ZstdDecompressor().decompressobj().decompress(frame.data))
        with ipc.open_stream(data) as reader:
            batches = list(reader)
            schema = reader.schema
    except (zstandard.ZstdError, pa.ArrowInvalid, OSError) as exc:
        raise SchemaError(f"{frame.where}: corrupt block (zstd or Arrow IPC): {exc}") from exc
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=schema)
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def check_block_schema(schema: pa.Schema, expected: pa.Schema, *, where: str) -> None:
    """Raise SchemaError naming the block and the first missing, mistyped or extra column.

    ``expected`` is the catalogue's row schema; a block may list the columns in another order.
    """
    if schema.equals(expected):  # the common case, checked once per block
        return
    for fld in expected:
        idx = schema.get_field_index(fld.name)
        if idx < 0:
            if fld.name in schema.names:
                raise SchemaError(f"{where}: column {fld.name!r} appears more than once")
            raise SchemaError(f"{where}: missing column {fld.name!r} (expected {fld.type})")
        got = schema.field(idx).type
        if not got.equals(fld.type):
            raise SchemaError(f"{where}: column {fld.name!r} has type {got}, expected {fld.type}")
    extra = [name for name in schema.names if expected.get_field_index(name) < 0]
    if extra:
        raise SchemaError(f"{where}: unexpected column {extra[0]!r} (not in the catalogue)")


def bad_row_codes(batch: pa.RecordBatch) -> np.ndarray:
    """Reason code of every row (OK = 0): shape (N,) int32. Vectorised over the batch; a
    feature column without nulls costs two null counts."""
    ts = batch.column(TS)
    ts_values = pc.fill_null(ts, 0).to_numpy(zero_copy_only=False)
    conditions = [
        batch.column(SESSION_ID).is_null().to_numpy(zero_copy_only=False),
        batch.column(REQUEST_ID).is_null().to_numpy(zero_copy_only=False),
        ts.is_null().to_numpy(zero_copy_only=False),
        ts_values < TS_MIN_MS,
        ts_values >= TS_MAX_MS,
    ]
    codes = [NULL_SESSION, NULL_REQUEST, NULL_TS, TS_TOO_SMALL, TS_TOO_LARGE]
    for j, name in enumerate(batch.schema.names):
        if name in (SESSION_ID, REQUEST_ID, TS):
            continue
        column = batch.column(j)
        if column.null_count:
            conditions.append(column.is_null().to_numpy(zero_copy_only=False))
            codes.append(NULL_FEATURE + 2 * j)
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            ids = column.flatten()  # the ids of the non-null lists, in row order
            if ids.null_count:
                rows = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
                has_null_id = np.zeros(len(column), dtype=bool)
                has_null_id[rows[ids.is_null().to_numpy(zero_copy_only=False)]] = True
                conditions.append(has_null_id)
                codes.append(NULL_FEATURE + 2 * j + 1)
    return np.select(conditions, codes, default=OK).astype(np.int32)


def reason_of(code: int, names: list[str]) -> tuple[str, str]:
    """(field, problem) of a reason code from :func:`bad_row_codes` (``names``: the batch's
    column names)."""
    if code < NULL_FEATURE:
        return REASON_FIELD[code], REASON_TEXT[code]
    name = names[(code - NULL_FEATURE) // 2]
    if (code - NULL_FEATURE) % 2:
        return name, f"{name} holds a null id (a list may be empty, its ids may not be null)"
    return name, f"{name} is null"


def bad_row_error(batch: pa.RecordBatch, codes: np.ndarray, *, where: str) -> BadRowError:
    """The error for the first bad row of a batch (codes from :func:`bad_row_codes`)."""
    row = int(np.flatnonzero(codes)[0])
    code = int(codes[row])
    request_id = batch.column(REQUEST_ID)[row].as_py()
    field, problem = reason_of(code, batch.schema.names)
    if code in (TS_TOO_SMALL, TS_TOO_LARGE):
        problem += f": got {batch.column(TS)[row].as_py()}"
    problem += f" (request_id {request_id})" if request_id is not None else " (request_id unknown)"
    return BadRowError(where, row, field, problem)


@dataclass(kw_only=True, slots=True)
class BlockResult:
    """What checking one decoded block gave."""

    rows: pa.RecordBatch | None
    """Good rows inside the window, in the catalogue's column order (None: none)."""
    rows_read: int = 0
    rows_outside_window: int = 0
    rows_quarantined: int = 0
    block_quarantined: bool = False


class Quarantine:
    """Side files for bad input (created on first use) under ``directory``."""

    def __init__(self, directory: Path, catalogue: Catalogue) -> None:
        self.directory = directory
        self.row_schema = pa.schema(
            [
                pa.field("_file", pa.string()),
                pa.field("_block", pa.int64()),
                pa.field("_row", pa.int64()),
                pa.field("_field", pa.string()),
                pa.field("_reason", pa.string()),
                *catalogue.arrow_schema(),
            ],
            metadata=catalogue.arrow_schema().metadata,
        )
        self.rows = 0
        self.blocks = 0
        self.frames = 0
        self.rows_by_field: dict[str, int] = {}
        """Bad rows (not whole blocks) per field named in their reason."""
        self.entries: list[dict[str, Any]] = []
        self._writer: pq.ParquetWriter | None = None

    @property
    def used(self) -> bool:
        return bool(self.rows or self.blocks or self.frames)

    def add_rows(self, batch: pa.RecordBatch, codes: np.ndarray, *, path: Path, block: int) -> int:
        """Quarantine the rows of ``batch`` whose code is not OK; returns how many."""
        row_numbers = np.flatnonzero(codes)
        if row_numbers.size == 0:
            return 0
        bad = batch.take(pa.array(row_numbers))
        distinct, which = np.unique(codes[row_numbers], return_inverse=True)
        explained = [reason_of(int(c), batch.schema.names) for c in distinct]
        fields = np.array([f for f, _ in explained], dtype=object)[which]
        reasons = np.array([r for _, r in explained], dtype=object)[which]
        for (field_name, _), count in zip(explained, np.bincount(which), strict=True):
            self.rows_by_field[field_name] = self.rows_by_field.get(field_name, 0) + int(count)
        n = len(row_numbers)
        meta = [
            pa.array([str(path)] * n, pa.string()),
            pa.array(np.full(n, block, dtype=np.int64)),
            pa.array(row_numbers.astype(np.int64)),
            pa.array(fields, pa.string()),
            pa.array(reasons, pa.string()),
        ]
        table = pa.Table.from_arrays([*meta, *bad.columns], schema=self.row_schema)
        if self._writer is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(
                self.directory / "rows.parquet", self.row_schema, compression="zstd"
            )
        self._writer.write_table(table)
        self.rows += n
        return n

    def add_block(self, batch: pa.RecordBatch, *, path: Path, block: int, reason: str) -> None:
        """Keep a whole block that does not match the catalogue, as an Arrow IPC file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"block-{path.stem}-{block:06d}.arrow"
        with ipc.new_file(str(self.directory / name), batch.schema) as writer:
            writer.write_batch(batch)
        self.rows += batch.num_rows
        self.blocks += 1
        self.entries.append(
            {
                "kind": "block",
                "file": str(path),
                "block": block,
                "rows": batch.num_rows,
                "reason": reason,
                "saved_as": name,
            }
        )

    def add_frame(self, frame: Frame, *, reason: str) -> None:
        """Keep the raw bytes of a frame that cannot be decoded (its rows cannot be counted)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"frame-{frame.path.stem}-{frame.index:06d}.zst"
        (self.directory / name).write_bytes(frame.data)
        self.frames += 1
        self.entries.append(
            {
                "kind": "frame",
                "file": str(frame.path),
                "block": frame.index,
                "byte_offset": frame.offset,
                "bytes": len(frame.data),
                "reason": reason,
                "saved_as": name,
            }
        )

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.used:
            summary = {
                "rows": self.rows,
                "blocks": self.blocks,
                "frames": self.frames,
                "rows_by_field": dict(sorted(self.rows_by_field.items())),
                "entries": self.entries,
            }
            (self.directory / "_summary.json").write_text(json.dumps(summary, indent=1) + "\n")


@dataclass(kw_only=True, slots=True)
class BlockValidator:
    """Checks decoded blocks against the catalogue and the run's window."""

    catalogue: Catalogue
    start_ms: int | None = None
    end_ms: int | None = None
    quarantine: Quarantine | None = None
    """None: fail on the first bad input; else quarantine it."""
    row_schema: pa.Schema = field(init=False)

    def __post_init__(self) -> None:
        self.row_schema = self.catalogue.arrow_schema().remove_metadata()

    def check(self, batch: pa.RecordBatch, *, path: Path, block: int, record: bool) -> BlockResult:
        """Validate one block; quarantine bad input when ``record`` (the first pass over it)."""
        where = f"{path}: block {block}"
        result = BlockResult(rows=None, rows_read=batch.num_rows)
        try:
            check_block_schema(batch.schema, self.row_schema, where=where)
        except SchemaError as exc:
            if self.quarantine is None:
                raise
            if record:
                self.quarantine.add_block(batch, path=path, block=block, reason=str(exc))
            result.rows_quarantined = batch.num_rows
            result.block_quarantined = True
            return result
        batch = pa.RecordBatch.from_arrays(
            [batch.column(n) for n in self.row_schema.names], schema=self.row_schema
        )
        codes = bad_row_codes(batch)
        # Rows with a valid ts outside the window belong to another run: never bad here.
        ts = pc.fill_null(batch.column(TS), 0).to_numpy(zero_copy_only=False)
        ts_ok = ~np.isin(codes, TS_CODES)
        outside = ts_ok & ~window_mask(ts, start_ms=self.start_ms, end_ms=self.end_ms)
        codes[outside] = OK
        bad = codes != OK
        if bad.any():
            if self.quarantine is None:
                raise bad_row_error(batch, codes, where=where)
            if record:
                self.quarantine.add_rows(batch, codes, path=path, block=block)
            result.rows_quarantined = int(bad.sum())
        keep = ~(bad | outside)
        result.rows_outside_window = int(outside.sum())
        if keep.all():
            result.rows = batch
        elif keep.any():
            result.rows = batch.filter(pa.array(keep))
        return result
