"""The checkpoint file ``step_NNNNNN.bin``: byte layout, parameter order, reader, ranged writes.

One file, five contiguous regions, little-endian, no padding and no other metadata::

    offset 0                 int32    step       optimizer steps completed at the snapshot
    offset 4                 int32    n_params   length of each of the three arrays
    offset 8                 float32  weights[n_params]
    offset 8 + 4 n           float32  adam_m[n_params]   Adam first moment  (beta1 = 0.9)
    offset 8 + 8 n           float32  adam_v[n_params]   Adam second moment (beta2 = 0.999)
    total size               8 + 12 * n_params bytes, exactly

The parameter order
-------------------
The file holds the *logical, unsharded* model: every learned tensor flattened (C order) and
concatenated in the order of the unsharded model's parameter iterator (``named_parameters()``
of the model built on one process, before any sharding plan is applied). That order is defined
in exactly one place: the ``ParamLayout`` the caller builds from that iterator
(``ParamLayout.from_named_arrays(model.named_parameters())``). The same layout is written beside
the checkpoints as ``_layout.json`` (see ``recd.checkpoint.atomic.write_layout``) so tools such
as ``recd ckpt inspect`` can name every range. Because the order does not depend on the world
size or the sharding plan, a file written by N ranks loads on M ranks: a rank holding rows
``[r0, r1)`` of a table finds them at ``layout.offset_of(name, row=r0)`` in every region.

Limits
------
Both header fields are int32. A model with more than 2,147,483,647 parameters (or a step above
that) cannot be stored in one file: ``pack_header``, ``preallocate`` and every writer raise
``CheckpointTooLargeError`` before touching the disk. There is no multi-file extension (yet);
a model that large needs one, and each part would have to be a valid file of this format.

The reader (``read_checkpoint``) checks the size equation first, so a truncated, extended or
foreign file is rejected with ``CheckpointCorruptError`` before any array is mapped; arrays are
``np.memmap`` views (zero copy, read-only).

Checksum: a sidecar, not a trailer
----------------------------------
The file holds no checksum: any byte after ``adam_v`` would break the size equation above,
which every recd reader, older ones included, enforces. The CRC-32 of each part (header,
weights, adam_m, adam_v) is written beside the file instead, as ``step_NNNNNN.bin.crc32``
(:mod:`recd.checkpoint.checksum`: format, why CRC-32, who computes and who checks it). It is
committed before the checkpoint and travels with it (retention, pivot, fork); a file without
one (written before recd stored checksums) still loads, unverified. ``read_checkpoint`` maps
the file without reading it, so it does not check the checksum: the readers that load
weights do (``newest_valid_checkpoint``, resume, predict, export, ``recd ckpt verify``, fork,
pivot).

Finite values
-------------
The format can hold NaN and infinity (a diverged run's state). ``check_finite`` (one
vectorised pass, in chunks) refuses them with ``CheckpointNonFiniteError`` naming the file,
the region, the tensor and the first bad element; a resume skips such a file like a truncated
one unless told to accept it (``recd train --accept-nonfinite``).
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from recd.errors import CheckpointCorruptError, CheckpointNonFiniteError, CheckpointTooLargeError

HEADER_BYTES = 8
"""Size of the header: int32 step + int32 n_params."""
BYTES_PER_PARAM = 12
"""Bytes each parameter costs: float32 weight + float32 adam_m + float32 adam_v."""
INT32_MAX = 2**31 - 1
MAX_PARAMS = INT32_MAX
"""Most parameters one file can hold (the header's n_params is int32)."""
MAX_STEP = INT32_MAX
"""Largest step the header's int32 can hold."""

Region = Literal["weights", "adam_m", "adam_v"]
REGIONS: tuple[Region, ...] = ("weights", "adam_m", "adam_v")
"""The three float32 arrays, in file order."""

FINITE_CHUNK_ELEMS = 1 << 22
"""Elements per chunk of the finite check (16 MiB of float32; bounds its scratch memory)."""

FLOAT_DTYPE = np.dtype("<f4")
INT_DTYPE = np.dtype("<i4")
_HEADER = struct.Struct("<ii")

CHECKPOINT_NAME_RE = re.compile(r"^step_(\d{6,})\.bin$")
"""Final checkpoint names: ``step_`` + the step zero-padded to at least six digits."""


# ----------------------------------------------------------------------------- names and sizes


def checkpoint_filename(step: int) -> str:
    """``step_NNNNNN.bin``: the step zero-padded to six digits, wider when it needs more."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step_{step:06d}.bin"


def parse_checkpoint_step(name: str) -> int | None:
    """The step encoded in a checkpoint file name, or None when ``name`` is not one."""
    match = CHECKPOINT_NAME_RE.match(name)
    return int(match.group(1)) if match else None


def checkpoint_size_bytes(n_params: int) -> int:
    """Exact size of a checkpoint holding ``n_params`` parameters: ``8 + 12 * n_params``."""
    return HEADER_BYTES + BYTES_PER_PARAM * n_params


def region_index(region: str) -> int:
    """Position (0, 1, 2) of ``region`` in the file; ValueError for an unknown name."""
    try:
        return REGIONS.index(region)
    except ValueError:
        raise ValueError(
            f"unknown checkpoint region {region!r}; expected one of {REGIONS}"
        ) from None


def region_byte_offset(region: str, n_params: int, offset_elems: int = 0) -> int:
    """Byte offset of element ``offset_elems`` of ``region`` in a file of ``n_params``."""
    return HEADER_BYTES + 4 * (region_index(region) * n_params + offset_elems)


def check_header_fits(step: int, n_params: int) -> None:
    """Raise ``CheckpointTooLargeError`` (or ValueError when negative) unless both fit int32."""
    if step < 0 or n_params < 0:
        raise ValueError(f"checkpoint step and n_params must be >= 0, got {step}, {n_params}")
    if n_params > MAX_PARAMS:
        raise CheckpointTooLargeError(
            f"model has {n_params:,} parameters; one checkpoint file holds at most "
            f"{MAX_PARAMS:,} (int32 n_params in the header)"
        )
    if step > MAX_STEP:
        raise CheckpointTooLargeError(
            f"step {step:,} does not fit the int32 step field of the checkpoint header"
        )


def pack_header(step: int, n_params: int) -> bytes:
    """The 8 header bytes: little-endian int32 step, int32 n_params."""
    check_header_fits(step, n_params)
    return _HEADER.pack(step, n_params)


# ----------------------------------------------------------------------------- parameter layout


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One learned tensor of the logical (unsharded) model."""

    name: str
    """The name the model's parameter iterator gives it, e.g. ``sparse_arch.tables.t0.weight``."""
    shape: tuple[int, ...]
    """Its full unsharded shape, e.g. ``(num_embeddings, embedding_dim)``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if not self.name:
            raise ValueError("ParamSpec.name must not be empty")
        if any(d < 0 for d in self.shape):
            raise ValueError(f"ParamSpec {self.name!r}: negative dimension in shape {self.shape}")

    @property
    def numel(self) -> int:
        """Number of float32 elements (``prod(shape)``; 1 for a scalar)."""
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class ParamLayout:
    """THE parameter order of the checkpoint: the logical model's tensors, in iterator order.

    Build it once from the unsharded model (``ParamLayout.from_named_arrays(
    model.named_parameters())``); every writer, reader, shard and tool uses this object (or its
    ``_layout.json`` copy) and nothing else to know where a tensor lives in the flat arrays.
    Tensor ``i`` occupies elements ``[offsets[i], offsets[i] + numel)`` of each region.
    """

    specs: tuple[ParamSpec, ...]
    """The tensors, in the unsharded model's parameter-iterator order."""
    offsets: tuple[int, ...] = field(init=False)
    """Element offset of each tensor in the flat arrays (same index as ``specs``)."""
    n_params: int = field(init=False)
    """Total elements: the header's n_params (may exceed MAX_PARAMS; writers then refuse)."""
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        specs = tuple(self.specs)
        object.__setattr__(self, "specs", specs)
        offsets, index, total = [], {}, 0
        for i, spec in enumerate(specs):
            if spec.name in index:
                raise ValueError(f"ParamLayout: parameter name {spec.name!r} appears twice")
            index[spec.name] = i
            offsets.append(total)
            total += spec.numel
        object.__setattr__(self, "offsets", tuple(offsets))
        object.__setattr__(self, "n_params", total)
        object.__setattr__(self, "_index", index)

    @classmethod
    def from_named_arrays(cls, named: Iterable[tuple[str, Any]]) -> ParamLayout:
        """Layout from ``(name, tensor_or_array)`` pairs, e.g. ``model.named_parameters()``."""
        return cls(specs=tuple(ParamSpec(name, tuple(t.shape)) for name, t in named))

    def __len__(self) -> int:
        return len(self.specs)

    def __iter__(self) -> Iterator[ParamSpec]:
        return iter(self.specs)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def spec(self, name: str) -> ParamSpec:
        return self.specs[self._position(name)]

    def offset_of(self, name: str, row: int = 0) -> int:
        """Element offset of ``name`` (of its row ``row``, for sharded row ranges)."""
        i = self._position(name)
        spec = self.specs[i]
        rows = spec.shape[0] if spec.shape else 1
        if not 0 <= row <= rows:
            raise ValueError(f"{name}: row {row} outside [0, {rows}]")
        return self.offsets[i] + row * math.prod(spec.shape[1:])

    def slice_of(self, name: str) -> slice:
        """Slice of the flat arrays holding ``name``."""
        i = self._position(name)
        return slice(self.offsets[i], self.offsets[i] + self.specs[i].numel)

    def iter_flat(
        self, named: Mapping[str, Any] | Iterable[tuple[str, Any]], *, region: str = "weights"
    ) -> Iterator[np.ndarray]:
        """Each tensor of ``named`` as a flat float32 array, in layout order (a region source).

        ``named`` is a mapping or ``(name, tensor)`` pairs; names and shapes must match the
        layout exactly (ValueError naming the tensor otherwise). Tensors may be numpy arrays or
        CPU torch tensors (detached). No concatenated copy of the model is ever made.
        """
        items = dict(named.items() if isinstance(named, Mapping) else named)
        missing = [n for n in self._index if n not in items]
        extra = [n for n in items if n not in self._index]
        if missing or extra:
            raise ValueError(
                f"{region}: tensors do not match the layout: missing {missing[:5]}, "
                f"unexpected {extra[:5]}"
            )
        for spec in self.specs:
            arr = np.asarray(items[spec.name])
            if tuple(arr.shape) != spec.shape:
                raise ValueError(
                    f"{region}: tensor {spec.name!r} has shape {tuple(arr.shape)}, "
                    f"layout says {spec.shape}"
                )
            yield arr.reshape(-1)

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Views of a flat array of ``n_params`` elements, one per tensor, reshaped (no copy)."""
        if flat.shape != (self.n_params,):
            raise ValueError(f"flat array has shape {flat.shape}, layout needs ({self.n_params},)")
        return {
            s.name: flat[o : o + s.numel].reshape(s.shape)
            for s, o in zip(self.specs, self.offsets, strict=True)
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "recd-checkpoint-layout",
            "version": 1,
            "order": "logical unsharded model, parameter-iterator order, C-order flattening",
            "n_params": self.n_params,
            "params": [
                {"name": s.name, "shape": list(s.shape), "offset": o, "numel": s.numel}
                for s, o in zip(self.specs, self.offsets, strict=True)
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "<layout>") -> ParamLayout:
        """Inverse of ``to_dict``; ValueError naming ``source`` when fields disagree."""
        try:
            layout = cls(
                specs=tuple(ParamSpec(p["name"], tuple(p["shape"])) for p in data["params"])
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{source}: not a recd checkpoint layout ({exc!r})") from exc
        if "n_params" in data and int(data["n_params"]) != layout.n_params:
            raise ValueError(
                f"{source}: n_params {data['n_params']} != sum of shapes {layout.n_params}"
            )
        return layout

    def _position(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"parameter {name!r} is not in the checkpoint layout") from None


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class CheckpointHeader:
    """What ``validate_checkpoint`` learned about a file without mapping it."""

    path: Path
    step: int
    n_params: int
    size_bytes: int


def validate_checkpoint(
    path: str | os.PathLike[str], layout: ParamLayout | None = None
) -> CheckpointHeader:
    """Check header and size of a checkpoint file; ``CheckpointCorruptError`` saying why not.

    Order of checks: the file is at least 8 bytes, the header is plausible (step >= 0,
    n_params >= 0), the size equals ``8 + 12 * n_params`` exactly (catches truncated, extended
    and foreign files), the step matches the ``step_NNNNNN.bin`` name when it has one, and
    ``n_params`` equals ``layout.n_params`` when a layout is given. The float contents are not
    checked here (``check_finite`` does, and a resume runs it too).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(HEADER_BYTES)
    except FileNotFoundError as exc:
        raise CheckpointCorruptError(f"{path}: no such checkpoint file") from exc
    except OSError as exc:
        raise CheckpointCorruptError(f"{path}: cannot read checkpoint: {exc}") from exc
    if size == 0:
        raise CheckpointCorruptError(f"{path}: empty file (0 bytes), not a checkpoint")
    if size < HEADER_BYTES:
        raise CheckpointCorruptError(
            f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte header; truncated "
            "or not a recd checkpoint"
        )
    step, n_params = _HEADER.unpack(head)
    if step < 0 or n_params < 0:
        raise CheckpointCorruptError(
            f"{path}: impossible header (step={step}, n_params={n_params}); not a recd "
            "checkpoint or corrupted"
        )
    expected = checkpoint_size_bytes(n_params)
    if size != expected:
        if (size - HEADER_BYTES) % BYTES_PER_PARAM:
            hint = "not a recd checkpoint, or truncated/extended"
        elif size < expected:
            hint = "truncated"
        else:
            hint = "extra bytes after the adam_v region"
        raise CheckpointCorruptError(
            f"{path}: size {size:,} bytes, but header n_params={n_params:,} requires "
            f"8 + 12 * n_params = {expected:,} bytes ({size - expected:+,} bytes): {hint}"
        )
    named_step = parse_checkpoint_step(path.name)
    if named_step is not None and named_step != step:
        raise CheckpointCorruptError(
            f"{path}: header says step {step} but the file name says step {named_step}"
        )
    if layout is not None and n_params != layout.n_params:
        raise CheckpointCorruptError(
            f"{path}: header n_params={n_params:,} disagrees with the model layout "
            f"({layout.n_params:,} parameters in {len(layout)} tensors): a checkpoint of a "
            "different model"
        )
    return CheckpointHeader(path=path, step=step, n_params=n_params, size_bytes=size)


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """A validated checkpoint; the three regions are read-only memmapped views (zero copy)."""

    path: Path
    step: int
    """Optimizer steps completed when the snapshot was taken."""
    n_params: int
    weights: np.ndarray
    """float32 [n_params], little-endian, memmapped."""
    adam_m: np.ndarray
    """float32 [n_params]: Adam first moment."""
    adam_v: np.ndarray
    """float32 [n_params]: Adam second moment."""
    layout: ParamLayout | None = None
    """The layout it was checked against (needed by ``tensors``)."""

    @property
    def size_bytes(self) -> int:
        return checkpoint_size_bytes(self.n_params)

    def region(self, region: str) -> np.ndarray:
        """The flat array of ``region`` (``weights``, ``adam_m`` or ``adam_v``)."""
        return (self.weights, self.adam_m, self.adam_v)[region_index(region)]

    def tensors(self, region: str = "weights") -> dict[str, np.ndarray]:
        """``name -> array`` views of ``region`` reshaped per the layout, in layout order."""
        if self.layout is None:
            raise ValueError(f"{self.path}: read without a layout; pass layout= to read tensors")
        return self.layout.unflatten(self.region(region))


def read_checkpoint(path: str | os.PathLike[str], layout: ParamLayout | None = None) -> Checkpoint:
    """Validate (see ``validate_checkpoint``) and memory-map a checkpoint file.

    The arrays stay valid after the file is deleted or replaced (the mapping keeps the inode);
    copy them (``np.array(ckpt.weights)``) to own the memory.
    """
    header = validate_checkpoint(path, layout)
    n = header.n_params
    if n == 0:
        empty = np.empty(0, dtype=FLOAT_DTYPE)
        regions: tuple[np.ndarray, ...] = (empty, empty, empty)
    else:
        mm = np.memmap(header.path, dtype=FLOAT_DTYPE, mode="r", offset=HEADER_BYTES, shape=(3, n))
        regions = (mm[0], mm[1], mm[2])
    return Checkpoint(
        path=header.path,
        step=header.step,
        n_params=n,
        weights=regions[0],
        adam_m=regions[1],
        adam_v=regions[2],
        layout=layout,
    )


# ----------------------------------------------------------------------------- finite values


def first_nonfinite(array: np.ndarray) -> int | None:
    """Index of the first NaN / infinity of a 1-D float array (a memmap is read in chunks of
    ``FINITE_CHUNK_ELEMS``), or None when every value is finite."""
    for start in range(0, array.size, FINITE_CHUNK_ELEMS):
        finite = np.isfinite(array[start : start + FINITE_CHUNK_ELEMS])
        if not finite.all():
            return start + int(np.argmin(finite))
    return None


def count_nonfinite(array: np.ndarray) -> int:
    """Number of NaN / infinity values of a 1-D float array (in chunks)."""
    bad = 0
    for start in range(0, array.size, FINITE_CHUNK_ELEMS):
        chunk = array[start : start + FINITE_CHUNK_ELEMS]
        bad += chunk.size - int(np.count_nonzero(np.isfinite(chunk)))
    return bad


def check_finite(
    path: str | os.PathLike[str],
    regions: Sequence[np.ndarray],
    *,
    layout: ParamLayout | None = None,
) -> None:
    """Raise ``CheckpointNonFiniteError`` unless every value of the three regions (weights,
    adam_m, adam_v: flat float32 arrays of ``n_params``, in memory or memmapped) is finite.

    The message names ``path``, the first region holding a bad value, the tensor (with a
    layout) and the index inside it, the value, and how many bad values each region holds.
    When every value is finite (the usual case) this is one vectorised pass over the regions.
    """
    for region, array in zip(REGIONS, regions, strict=True):
        index = first_nonfinite(array)
        if index is None:
            continue
        where = f"element {index:,} of {region}"
        if layout is not None and layout.n_params == array.size:
            i = int(np.searchsorted(np.asarray(layout.offsets), index, side="right")) - 1
            spec = layout.specs[i]
            inside = np.unravel_index(index - layout.offsets[i], spec.shape) if spec.shape else ()
            where = (
                f"{region} of tensor {spec.name!r} (shape {spec.shape}) at index "
                f"{tuple(int(k) for k in inside)} (element {index:,} of {region})"
            )
        counts = ", ".join(
            f"{name} {count_nonfinite(values):,}"
            for name, values in zip(REGIONS, regions, strict=True)
        )
        raise CheckpointNonFiniteError(
            f"{path}: non-finite value {float(array[index])} in {where}; non-finite values: "
            f"{counts}"
        )


def check_checkpoint_finite(
    path: str | os.PathLike[str], layout: ParamLayout | None = None
) -> CheckpointHeader:
    """``validate_checkpoint``, then ``check_finite`` over the memory-mapped file (read once,
    in chunks: memory stays bounded whatever its size)."""
    ckpt = read_checkpoint(path, layout)
    check_finite(ckpt.path, (ckpt.weights, ckpt.adam_m, ckpt.adam_v), layout=layout)
    return CheckpointHeader(
        path=ckpt.path, step=ckpt.step, n_params=ckpt.n_params, size_bytes=ckpt.size_bytes
    )


# ----------------------------------------------------------------------------- writing bytes


def as_float32_flat(array: Any, *, what: str = "array") -> np.ndarray:
    """``array`` as a C-contiguous little-endian float32 1-D array (copy only when needed).

    Anything but float32 is refused (ValueError): a checkpoint never silently changes precision.
    """
    arr = np.asarray(array)
    if arr.dtype.kind != "f" or arr.dtype.itemsize != 4:
        raise ValueError(f"{what}: dtype {arr.dtype}, a checkpoint stores float32 only")
    return np.ascontiguousarray(arr.reshape(-1), dtype=FLOAT_DTYPE)


def write_all(fd: int, array: np.ndarray, offset: int | None = None) -> int:
    """Write the bytes of a contiguous array to ``fd`` (at ``offset`` with pwrite); bytes written.

    Loops over partial writes; chunks of 64 MiB keep each syscall below Linux's 2 GiB cap.
    """
    view = array.data.cast("B")
    done, total, chunk = 0, view.nbytes, 64 << 20
    while done < total:
        piece = view[done : done + chunk]
        if offset is None:
            done += os.write(fd, piece)
        else:
            done += os.pwrite(fd, piece, offset + done)
    return total


def preallocate(tmp_path: str | os.PathLike[str], step: int, n_params: int) -> Path:
    """Create (or truncate) ``tmp_path`` as a sparse file of the exact size, header written.

    The first step of a distributed save: one rank preallocates the temp file (see
    ``recd.checkpoint.atomic.temp_path_for``), every rank then fills its own element ranges
    with ``write_region_range``, and after a barrier one rank calls ``commit``. Unwritten
    ranges read as zeros.
    """
    header = pack_header(step, n_params)
    path = Path(tmp_path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.pwrite(fd, header, 0)
        os.ftruncate(fd, checkpoint_size_bytes(n_params))
    finally:
        os.close(fd)
    return path


def read_header(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(step, n_params)`` from the first 8 bytes, unchecked (see ``validate_checkpoint``)."""
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) != HEADER_BYTES:
        raise CheckpointCorruptError(f"{path}: {len(head)} bytes, shorter than the header")
    step, n_params = _HEADER.unpack(head)
    return step, n_params


def write_region_range(
    tmp_path: str | os.PathLike[str],
    region: str,
    offset_elems: int,
    array: Any,
    *,
    fsync: bool = False,
) -> None:
    """pwrite ``array`` (float32) at element ``offset_elems`` of ``region`` in a preallocated file.

    Ranks write disjoint ranges concurrently; nothing else in the file is touched. The range
    must lie inside the region (ValueError otherwise: a rank must never spill into the next
    region). ``commit`` fsyncs the whole file, which covers every rank on one host; on a
    shared filesystem across hosts pass ``fsync=True`` on each rank's last write before the
    barrier.
    """
    data = as_float32_flat(array, what=f"{region}[{offset_elems}:]")
    _, n_params = read_header(tmp_path)
    if offset_elems < 0 or offset_elems + data.size > n_params:
        raise ValueError(
            f"{tmp_path}: {region} range [{offset_elems}, {offset_elems + data.size}) outside "
            f"[0, {n_params})"
        )
    fd = os.open(tmp_path, os.O_WRONLY)
    try:
        write_all(fd, data, region_byte_offset(region, n_params, offset_elems))
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
