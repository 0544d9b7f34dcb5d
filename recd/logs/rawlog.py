"""On-disk formats of raw inference logs and of log-bus shards.

Raw logs (what inference servers emit, in arrival order)::

    RAWDIR/_catalogue.json        the catalogue (schema) the rows follow
    RAWDIR/segment-000000.arrow   Arrow IPC file: record batches of rows, arrival order
    RAWDIR/segment-000001.arrow   ...

Log-bus shards (output of ``recd logs shard``, input of ``recd etl``)::

    SHARDDIR/_catalogue.json
    SHARDDIR/_manifest.json       key, shard count, rows and bytes per shard
    SHARDDIR/shard-0000.zst       a sequence of independent zstd frames ("blocks"); each frame
    SHARDDIR/shard-0001.zst       decompresses to one Arrow IPC stream holding the rows the shard
                                  buffered before flushing (bounded, like a log bus buffer)

Arrow IPC inside the frames keeps the encode/decode vectorised; the schema inside a frame
carries no metadata (the catalogue sits once beside the shards), so it costs a few bytes.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import zstandard

from recd.errors import ConfigError, SchemaError
from recd.schema import Catalogue

CATALOGUE_FILE = "_catalogue.json"
MANIFEST_FILE = "_manifest.json"
SEGMENT_GLOB = "segment-*.arrow"
SHARD_GLOB = "shard-*.zst"


def write_catalogue(directory: Path, catalogue: Catalogue) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CATALOGUE_FILE).write_text(json.dumps(catalogue.to_dict(), indent=1))


def read_catalogue(directory: Path) -> Catalogue:
    path = directory / CATALOGUE_FILE
    if not directory.is_dir():
        raise ConfigError(f"{directory}: directory does not exist")
    if not path.is_file():
        raise SchemaError(
            f"{directory}: no {CATALOGUE_FILE}: not a recd raw-log or shard directory"
        )
    return Catalogue.from_dict(json.loads(path.read_text()), source=str(path))


def segment_path(directory: Path, index: int) -> Path:
    return directory / f"segment-{index:06d}.arrow"


def shard_path(directory: Path, shard: int) -> Path:
    return directory / f"shard-{shard:04d}.zst"


class RawLogWriter:
    """Append rows (record batches) to a raw-log directory, one segment file per ``segment_rows``."""

    def __init__(
        self, directory: Path, catalogue: Catalogue, *, segment_rows: int = 200_000
    ) -> None:
        self.directory = directory
        self.schema = catalogue.arrow_schema().remove_metadata()
        self.segment_rows = segment_rows
        self.rows_written = 0
        self._segment = 0
        self._rows_in_segment = 0
        self._writer: ipc.RecordBatchFileWriter | None = None
        write_catalogue(directory, catalogue)

    def write(self, batch: pa.RecordBatch) -> None:
        batch = _conform(batch, self.schema, str(self.directory))
        offset = 0
        while offset < batch.num_rows:
            if self._writer is None:
                self._writer = ipc.new_file(
                    str(segment_path(self.directory, self._segment)), self.schema
                )
            take = min(batch.num_rows - offset, self.segment_rows - self._rows_in_segment)
            self._writer.write_batch(batch.slice(offset, take))
            offset += take
            self._rows_in_segment += take
            self.rows_written += take
            if self._rows_in_segment >= self.segment_rows:
                self._roll()

    def _roll(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._segment += 1
            self._rows_in_segment = 0

    def close(self) -> None:
        self._roll()

    def __enter__(self) -> RawLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def list_segments(directory: Path) -> list[Path]:
    return sorted(directory.glob(SEGMENT_GLOB))


def iter_raw_log(directory: Path) -> Iterator[tuple[Path, int, pa.RecordBatch]]:
    """Yield ``(segment path, first row number in that segment, batch)`` in arrival order."""
    for path in list_segments(directory):
        with pa.memory_map(str(path)) as source:
            reader = ipc.open_file(source)
            row = 0
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                yield path, row, batch
                row += batch.num_rows


def count_raw_rows(directory: Path) -> int:
    total = 0
    for path in list_segments(directory):
        with pa.memory_map(str(path)) as source:
            reader = ipc.open_file(source)
            total += sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
    return total


@dataclass(slots=True)
class Block:
    """One decoded shard block: the rows, the shard file, and the block's index in it."""

    path: Path
    index: int
    batch: pa.RecordBatch


def encode_block(batch: pa.RecordBatch, compressor: zstandard.ZstdCompressor) -> bytes:
    """Serialise a batch to an Arrow IPC stream and compress it as one zstd frame."""
    sink = io.BytesIO()
    with ipc.new_stream(sink, batch.schema.remove_metadata()) as writer:
        writer.write_batch(batch)
    return compressor.compress(sink.getvalue())


def iter_shard(path: Path) -> Iterator[Block]:
    """Yield the blocks of one shard file, decompressing one zstd frame at a time.

    Frames are length-prefixed (little-endian uint64) so a reader can skip or stream blocks
    without decompressing the whole shard; memory is bounded by one block.
    """
    decompressor = zstandard.ZstdDecompressor()
    with path.open("rb") as f:
        index = 0
        while True:
            header = f.read(8)
            if not header:
                return
            if len(header) != 8:
                raise SchemaError(f"{path}: truncated block header at block {index}")
            (size,) = struct.unpack("<Q", header)
            frame = f.read(size)
            if len(frame) != size:
                raise SchemaError(f"{path}: truncated block {index} ({len(frame)} of {size} bytes)")
            data = decompressor.decompress(frame)
            with ipc.open_stream(pa.py_buffer(data)) as reader:
                for batch in reader:
                    yield Block(path, index, batch)
            index += 1


def write_frame(f: io.BufferedWriter, frame: bytes) -> int:
    """Append one length-prefixed zstd frame; returns the bytes written."""
    f.write(struct.pack("<Q", len(frame)))
    f.write(frame)
    return 8 + len(frame)


def _conform(batch: pa.RecordBatch, schema: pa.Schema, source: str) -> pa.RecordBatch:
    if batch.schema.remove_metadata().equals(schema):
        return batch
    try:
        return pa.RecordBatch.from_arrays(
            [batch.column(name).cast(schema.field(name).type) for name in schema.names],
            schema=schema,
        )
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaError(f"{source}: batch does not match the catalogue schema: {exc}") from exc
