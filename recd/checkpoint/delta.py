"""The delta checkpoint ``step_NNNNNN.delta``: the rows changed since the previous checkpoint.

A full checkpoint (``step_NNNNNN.bin``, :mod:`recd.checkpoint.format`) writes every element of
every table. Between two full checkpoints lazy Adam changes only the embedding rows a batch
looked up (their weights, m and v) and every dense parameter, so a delta holds just those
elements, as *blocks* of rows in the flat (logical, unsharded) parameter order. Restoring step
S = the full checkpoint the chain starts at, then every delta of the chain in order
(Check-N-Run, Eisenman et al., NSDI'22, https://www.usenix.org/conference/nsdi22/presentation/eisenman).

Layout (little-endian, no padding)::

    offset 0    8 bytes   magic      b"RECDDLT1"
    offset 8    int32     step       optimizer steps completed at this delta
    offset 12   int32     parent     step of the checkpoint (full or delta) it applies onto
    offset 16   int32     base       step of the full checkpoint the chain starts at
    offset 20   int32     n_params   the model's n_params (the base's header must agree)
    offset 24   int32     n_blocks
    offset 28   uint32    crc32      CRC-32 of every byte after the header
    offset 32   n_blocks x (int64 start, int32 row_stride, int32 width, int32 n_rows,
                            int32 reserved = 0)
                n_rows int32 row indices per block, block after block (strictly increasing)
                float32 weights of every block's rows, block after block, row after row
                float32 adam_m, same order
                float32 adam_v, same order
    total size  32 + 24 n_blocks + 4 R + 12 E bytes, exactly (R rows, E elements)

Block b covers the flat elements ``start + row * row_stride + [0, width)`` for each of its
rows: an embedding table is one block (per shard) whose rows are the touched row indices; a
column-wise shard starts at its first column and is narrower than the stride; a dense tensor
is one block of one row holding all its elements. The CRC lives in the header because no
older reader knows this format (the full format keeps its checksum in a sidecar for that
reason). A delta is committed like a full checkpoint (temp file, fsync, rename, fsync the
directory), so a torn one never carries the final name.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recd.checkpoint.format import FLOAT_DTYPE, REGIONS, ParamLayout, check_header_fits
from recd.durable import replacing
from recd.errors import CheckpointCorruptError

MAGIC = b"RECDDLT1"
_HEADER = struct.Struct("<8siiiiiI")
HEADER_BYTES = _HEADER.size
_BLOCK = np.dtype(
    [
        ("start", "<i8"),
        ("row_stride", "<i4"),
        ("width", "<i4"),
        ("n_rows", "<i4"),
        ("reserved", "<i4"),
    ]
)
INDEX_DTYPE = np.dtype("<i4")
DELTA_NAME_RE = re.compile(r"^step_(\d{6,})\.delta$")
"""Final delta names: ``step_`` + the step zero-padded to at least six digits + ``.delta``."""


def delta_filename(step: int) -> str:
    """``step_NNNNNN.delta``, padded like the full checkpoint of the same step."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step_{step:06d}.delta"


def parse_delta_step(name: str) -> int | None:
    """The step encoded in a delta file name, or None when ``name`` is not one."""
    match = DELTA_NAME_RE.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class Block:
    """``width`` elements of each row in ``rows`` (rows ``row_stride`` elements apart),
    starting at flat element ``start``."""

    start: int
    row_stride: int
    width: int
    rows: np.ndarray
    """int32, strictly increasing."""

    @property
    def n_elems(self) -> int:
        return self.width * len(self.rows)

    def element_index(self) -> np.ndarray:
        """int64 [n_elems]: the flat positions this block covers, row after row."""
        cols = np.arange(self.width, dtype=np.int64)
        rows = self.rows.astype(np.int64)
        return (self.start + rows[:, None] * self.row_stride + cols[None, :]).reshape(-1)


def blocks_for(
    layout: ParamLayout, touched_rows: Mapping[str, np.ndarray], dense: Iterable[str]
) -> list[Block]:
    """The blocks of a delta, in layout order: each table of ``touched_rows`` (row indices,
    any order, duplicates allowed) and every tensor named in ``dense`` whole."""
    dense = set(dense)
    unknown = (set(touched_rows) | dense) - set(layout.names)
    if unknown:
        raise ValueError(f"not in the checkpoint layout: {sorted(unknown)}")
    both = set(touched_rows) & dense
    if both:
        raise ValueError(f"named as both a table and a dense tensor: {sorted(both)}")
    blocks = []
    for spec in layout:
        if spec.name in dense:
            whole = np.zeros(1, INDEX_DTYPE)
            blocks.append(Block(layout.offset_of(spec.name), spec.numel, spec.numel, whole))
        elif spec.name in touched_rows:
            n_rows = spec.shape[0] if spec.shape else 1
            rows = np.unique(np.asarray(touched_rows[spec.name], dtype=np.int64))
            if rows.size and (rows[0] < 0 or rows[-1] >= n_rows):
                raise ValueError(f"{spec.name}: row indices outside [0, {n_rows})")
            if rows.size:
                width = spec.numel // n_rows
                rows32 = rows.astype(INDEX_DTYPE)
                blocks.append(Block(layout.offset_of(spec.name), width, width, rows32))
    return blocks


def delta_size_bytes(blocks: Sequence[Block]) -> int:
    """Exact size of a delta holding ``blocks``."""
    rows = sum(len(b.rows) for b in blocks)
    elems = sum(b.n_elems for b in blocks)
    return HEADER_BYTES + _BLOCK.itemsize * len(blocks) + 4 * rows + 12 * elems


def _table(blocks: Sequence[Block]) -> np.ndarray:
    table = np.empty(len(blocks), dtype=_BLOCK)
    table["start"] = [b.start for b in blocks]
    table["row_stride"] = [b.row_stride for b in blocks]
    table["width"] = [b.width for b in blocks]
    table["n_rows"] = [len(b.rows) for b in blocks]
    table["reserved"] = 0
    return table


def write_delta(
    path: str | os.PathLike[str],
    *,
    step: int,
    parent: int,
    base: int,
    n_params: int,
    blocks: Sequence[Block],
    regions: Mapping[str, np.ndarray],
) -> Path:
    """Write ``blocks`` of the flat arrays ``regions`` (``weights``, ``adam_m``, ``adam_v``,
    each float32 [n_params]; numpy or anything ``np.asarray`` takes) as a delta, atomically and
    durably. The payload is gathered here, one region at a time."""
    index = np.concatenate([b.element_index() for b in blocks]) if blocks else np.zeros(0, np.int64)
    if index.size and (int(index.min()) < 0 or int(index.max()) >= n_params):
        raise ValueError(f"a block reaches outside the {n_params} parameters")
    payload = []
    for region in REGIONS:
        flat = np.asarray(regions[region])
        if flat.shape != (n_params,):
            raise ValueError(f"{region}: expected shape ({n_params},), got {flat.shape}")
        payload.append(flat[index])
    return write_delta_payload(
        path, step=step, parent=parent, base=base, n_params=n_params, blocks=blocks,
        payload=payload,
    )  # fmt: skip


def write_delta_payload(
    path: str | os.PathLike[str],
    *,
    step: int,
    parent: int,
    base: int,
    n_params: int,
    blocks: Sequence[Block],
    payload: Sequence[np.ndarray | Sequence[np.ndarray]],
) -> Path:
    """Write a delta whose values are already gathered: ``payload`` = weights, adam_m, adam_v,
    each float32 [E] in block order (row after row), or each a list of 1-D pieces that
    together are that array (written one after the other: no concatenated copy). Atomic and
    durable."""
    check_header_fits(step, n_params)
    if not base <= parent < step:
        raise ValueError(f"a delta needs base <= parent < step, got {base}, {parent}, {step}")
    n_elems = sum(b.n_elems for b in blocks)
    regions = [
        [np.asarray(p)] if isinstance(p, np.ndarray) else [np.asarray(c) for c in p]
        for p in payload
    ]
    if len(regions) != 3 or any(
        any(c.ndim != 1 for c in r) or sum(c.size for c in r) != n_elems for r in regions
    ):
        raise ValueError(f"payload: expected 3 arrays of {n_elems} elements")
    arrays = [_table(blocks), *(b.rows.astype(INDEX_DTYPE, copy=False) for b in blocks)]
    arrays += [np.ascontiguousarray(c, dtype=FLOAT_DTYPE) for r in regions for c in r]
    parts = [np.ascontiguousarray(a).view(np.uint8).data for a in arrays]
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    header = _HEADER.pack(MAGIC, step, parent, base, n_params, len(blocks), crc)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(header)
        for part in parts:
            f.write(part)
    return Path(path)


@dataclass(frozen=True, slots=True)
class Delta:
    """A validated delta; ``payload`` is float32 [3, E] (weights, adam_m, adam_v)."""

    path: Path
    step: int
    parent: int
    base: int
    n_params: int
    blocks: list[Block]
    payload: np.ndarray

    def apply(self, regions: Sequence[np.ndarray]) -> None:
        """Write this delta's elements into ``regions`` (weights, adam_m, adam_v; writable
        float32 [n_params] arrays), in place."""
        if not self.blocks:
            return
        index = np.concatenate([b.element_index() for b in self.blocks])
        for region, values in zip(regions, self.payload, strict=True):
            region[index] = values


@dataclass(frozen=True, slots=True)
class DeltaHeader:
    path: Path
    step: int
    parent: int
    base: int
    n_params: int
    n_blocks: int
    crc32: int


def read_delta_header(path: str | os.PathLike[str]) -> DeltaHeader:
    """The header of a delta; CheckpointCorruptError when it is not one."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except OSError as exc:
        raise CheckpointCorruptError(f"{path}: cannot read delta: {exc}") from exc
    if len(raw) < HEADER_BYTES:
        raise CheckpointCorruptError(f"{path}: truncated delta ({len(raw)} bytes of header)")
    magic, step, parent, base, n_params, n_blocks, crc = _HEADER.unpack(raw)
    if magic != MAGIC:
        raise CheckpointCorruptError(f"{path}: not a recd delta checkpoint (magic {magic!r})")
    if min(step, parent, base, n_params, n_blocks) < 0 or not base <= parent < step:
        raise CheckpointCorruptError(
            f"{path}: bad delta header (step {step}, parent {parent}, base {base}, "
            f"n_params {n_params}, n_blocks {n_blocks})"
        )
    named = parse_delta_step(path.name)
    if named is not None and named != step:
        raise CheckpointCorruptError(f"{path}: header says step {step}, the name says {named}")
    return DeltaHeader(path, step, parent, base, n_params, n_blocks, crc)


def read_delta(path: str | os.PathLike[str], *, verify: bool = True, payload: bool = True) -> Delta:
    """Validate (size equation, block bounds, and with ``verify`` the CRC-32) and read a
    delta. The payload is read into memory (a delta is small by design).

    ``payload=False`` (no ``verify``): the header, the block table and the rows only, the
    size taken from the file system; the returned delta's payload is empty. What a check of
    a chain's links needs, without reading every link's weights (retention does it after
    every checkpoint)."""
    header = read_delta_header(path)
    path = header.path
    table_bytes = _BLOCK.itemsize * header.n_blocks
    if payload:
        data = np.fromfile(path, dtype=np.uint8)
        size, body = data.size, data[HEADER_BYTES:]
    elif verify:
        raise ValueError("read_delta: verify needs the payload")
    else:
        size = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(HEADER_BYTES)
            body = np.frombuffer(f.read(table_bytes), dtype=np.uint8)
            if body.size == table_bytes:
                counts = body.view(_BLOCK)["n_rows"]
                wanted = 4 * int(counts.astype(np.int64).clip(min=0).sum())
                body = np.frombuffer(body.tobytes() + f.read(wanted), dtype=np.uint8)
    if body.size < table_bytes:
        raise CheckpointCorruptError(f"{path}: truncated delta (block table cut short)")
    table = body[:table_bytes].view(_BLOCK)
    if (
        (table["width"] < 1).any()
        or (table["row_stride"] < table["width"]).any()
        or (table["n_rows"] < 0).any()
        or (table["reserved"] != 0).any()
    ):
        raise CheckpointCorruptError(f"{path}: a block's row shape is impossible")
    n_rows = int(table["n_rows"].sum())
    n_elems = int((table["width"].astype(np.int64) * table["n_rows"]).sum())
    expected = HEADER_BYTES + table_bytes + 4 * n_rows + 12 * n_elems
    if size != expected:
        raise CheckpointCorruptError(
            f"{path}: delta is {size} bytes, its header and blocks say {expected}"
        )
    if verify and zlib.crc32(body.data) != header.crc32:
        raise CheckpointCorruptError(f"{path}: delta checksum does not match (damaged file)")
    rows_flat = body[table_bytes : table_bytes + 4 * n_rows].view(INDEX_DTYPE)
    blocks = []
    at = 0
    for start, stride, width, count, _ in table.tolist():
        rows = rows_flat[at : at + count]
        at += count
        if count and (
            (np.diff(rows) <= 0).any()
            or rows[0] < 0
            or start < 0
            or start + int(rows[-1]) * stride + width > header.n_params
        ):
            raise CheckpointCorruptError(f"{path}: a block's rows are out of order or range")
        blocks.append(Block(int(start), int(stride), int(width), rows))
    if payload:
        values = body[table_bytes + 4 * n_rows :].view(FLOAT_DTYPE).reshape(3, n_elems)
    else:
        values = np.zeros((3, 0), FLOAT_DTYPE)
    return Delta(path, header.step, header.parent, header.base, header.n_params, blocks, values)
