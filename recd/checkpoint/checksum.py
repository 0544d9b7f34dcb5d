"""Checksums of checkpoint files: ``step_NNNNNN.bin.crc32`` beside every ``step_NNNNNN.bin``.

The flat file carries no checksum of its own, so a bit flipped on the disk, in a copy or in
memory between write and read would load silently. Every checkpoint recd writes therefore
gets a small JSON sidecar holding a CRC-32 of each of its parts, and every reader that loads
weights from a checkpoint checks it first.

A sidecar file, not a trailer
-----------------------------
The layout of ``step_NNNNNN.bin`` is fixed: five regions and *no other bytes*; its size is
``8 + 12 * n_params`` exactly, and every reader (this one, and every earlier recd) rejects a
file with bytes after the ``adam_v`` region as "extended". A trailing checksum record would
therefore make every new checkpoint unreadable by an older recd, and would weaken the one
size equation that catches truncated and foreign files. A sidecar leaves the checkpoint
byte-for-byte what it always was: an older recd lists only ``step_NNNNNN.bin`` names and never
sees it, and a checkpoint written by an older recd (no sidecar) still loads, its checksum
reported as *absent* (``recd ckpt verify``), not failed.

CRC-32, not SHA-256
-------------------
The threat is bit flips (media, memory, copies), not an adversary forging a file: CRC-32
detects every single-bit error and every burst of up to 32 flipped bits, and misses random
damage with probability 2^-32 per part. ``zlib.crc32`` is several times cheaper than
``hashlib.sha256`` even with the CPU's SHA extensions (both release the GIL): a cryptographic
hash would buy nothing against bit flips and cost the writer thread far more CPU.

The sidecar
-----------
One JSON document; the CRCs as 8 hex digits, one per part, so a mismatch names the damaged
region::

    {"format": "recd-checkpoint-checksum", "version": 1, "algorithm": "crc32",
     "file": "step_000100.bin", "step": 100, "n_params": 1234, "size_bytes": 14816,
     "crc32": {"header": "1c291ca3", "weights": "...", "adam_m": "...", "adam_v": "..."}}

Where it is computed
--------------------
On bytes the writer already holds, never by a second pass over the model on the training
thread: the trainer's writer thread over its file image (``recd.train.checkpointing``, right
before the image goes to disk), ``write_checkpoint`` over each part as it writes it, a fork
over the bytes it copies. A distributed save is the one exception: no rank holds the whole
file, so rank 0's writer thread reads the assembled temp file back before committing it.

Written before its checkpoint
-----------------------------
``commit`` writes the sidecar (temp file, fsync, rename, fsync the directory) *before* it
renames the checkpoint into place, so a checkpoint this recd committed always has its
checksum. A crash between the two renames leaves a sidecar whose checkpoint is missing
(removed by ``clean_stray_temp_files`` at the next start) or, when an older file of the same
step is still there, a sidecar that file fails: such a rewrite only happens to a checkpoint a
resume skipped (corrupt, non-finite) or with identical bytes (a bit-exact replay). The
sidecar is deleted with its checkpoint (retention), moved with it (a pivot's archive) and
copied with it (fork).

Who verifies
------------
``newest_valid_checkpoint`` (and with it a resume's fallback: a checkpoint that fails its
checksum is skipped like a truncated one, with one warning, and the previous one is used),
``recd predict`` / ``Scorer``, ``recd ckpt export``, ``recd ckpt verify``, the source of
``recd fork`` and ``recd pivot``, and the recovery routes that load the newest checkpoint.
A mismatch raises :class:`recd.errors.CheckpointChecksumError` naming the file, the part and
both CRCs.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from recd.checkpoint.format import (
    BYTES_PER_PARAM,
    HEADER_BYTES,
    REGIONS,
    CheckpointHeader,
    checkpoint_size_bytes,
    parse_checkpoint_step,
    validate_checkpoint,
)
from recd.errors import CheckpointChecksumError, CheckpointCorruptError

__all__ = [
    "CHECKSUM_SUFFIX",
    "PARTS",
    "Checksum",
    "ChecksumStatus",
    "ChecksumStream",
    "checksum_of_file",
    "checksum_path",
    "crc32_of",
    "is_checksum_name",
    "read_checksum",
    "verify_checksum",
]

CHECKSUM_SUFFIX = ".crc32"
"""``step_NNNNNN.bin`` + this: the checkpoint's checksum sidecar."""
CHECKSUM_FORMAT = "recd-checkpoint-checksum"
CHECKSUM_VERSION = 1
PARTS: tuple[str, ...] = ("header", *REGIONS)
"""The checksummed parts, in file order: the 8-byte header, then the three regions."""
CHUNK_BYTES = 16 << 20
"""Bytes per ``zlib.crc32`` call over a memory-mapped or streamed file (bounded memory)."""

ChecksumStatus = Literal["ok", "absent"]
"""What ``verify_checksum`` found: the bytes match their sidecar, or there is no sidecar (a
checkpoint written before recd stored checksums). A mismatch raises instead."""


def checksum_path(checkpoint: str | os.PathLike[str]) -> Path:
    """``<dir>/step_NNNNNN.bin.crc32``: the sidecar of ``checkpoint``."""
    path = Path(checkpoint)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def is_checksum_name(name: str) -> bool:
    """True for ``step_NNNNNN.bin.crc32`` (and only that)."""
    return name.endswith(CHECKSUM_SUFFIX) and (
        parse_checkpoint_step(name[: -len(CHECKSUM_SUFFIX)]) is not None
    )


def crc32_of(data: Any, crc: int = 0) -> int:
    """CRC-32 of a contiguous buffer (bytes, numpy array, memmap), continuing ``crc``; in
    chunks of ``CHUNK_BYTES`` so a memory-mapped region is paged through, not held."""
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    for start in range(0, view.nbytes, CHUNK_BYTES):
        crc = zlib.crc32(view[start : start + CHUNK_BYTES], crc)
    return crc


@dataclass(frozen=True, slots=True)
class Checksum:
    """The CRC-32 of each part of one checkpoint file (see the module docstring)."""

    step: int
    n_params: int
    crc32: tuple[int, int, int, int]
    """CRC-32 of the header, weights, adam_m and adam_v bytes (``PARTS`` order)."""

    @property
    def size_bytes(self) -> int:
        return checkpoint_size_bytes(self.n_params)

    @classmethod
    def of_parts(cls, header: Any, weights: Any, adam_m: Any, adam_v: Any) -> Checksum:
        """Of a checkpoint's bytes held in memory (or memory-mapped): the 8 header bytes and
        the three float32 regions."""
        head = bytes(memoryview(header).cast("B"))
        if len(head) != HEADER_BYTES:
            raise ValueError(f"checkpoint header must be {HEADER_BYTES} bytes, got {len(head)}")
        step, n_params = np.frombuffer(head, dtype="<i4").tolist()
        crcs = [zlib.crc32(head)]
        for region, array in zip(REGIONS, (weights, adam_m, adam_v), strict=True):
            nbytes = memoryview(array).nbytes
            if nbytes != 4 * n_params:
                raise ValueError(f"{region}: {nbytes} bytes, the header says {4 * n_params}")
            crcs.append(crc32_of(array))
        return cls(step=step, n_params=n_params, crc32=(crcs[0], crcs[1], crcs[2], crcs[3]))

    @classmethod
    def of_image(cls, image: Any) -> Checksum:
        """Of a whole file image in memory (``8 + 12 * n_params`` bytes, header first)."""
        view = memoryview(image).cast("B")
        n = (view.nbytes - HEADER_BYTES) // BYTES_PER_PARAM
        if checkpoint_size_bytes(n) != view.nbytes:
            raise ValueError(f"a checkpoint image of {view.nbytes} bytes is not 8 + 12 * n")
        bounds = [HEADER_BYTES + 4 * n * k for k in range(4)]
        return cls.of_parts(
            view[:HEADER_BYTES],
            view[bounds[0] : bounds[1]],
            view[bounds[1] : bounds[2]],
            view[bounds[2] : bounds[3]],
        )

    def to_dict(self, file_name: str) -> dict[str, Any]:
        return {
            "format": CHECKSUM_FORMAT,
            "version": CHECKSUM_VERSION,
            "algorithm": "crc32",
            "file": file_name,
            "step": self.step,
            "n_params": self.n_params,
            "size_bytes": self.size_bytes,
            "crc32": {part: f"{crc:08x}" for part, crc in zip(PARTS, self.crc32, strict=True)},
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str) -> Checksum:
        """Inverse of ``to_dict``; ``CheckpointChecksumError`` naming ``source`` when the
        document is not a checksum sidecar (it cannot vouch for anything then)."""
        try:
            if not isinstance(data, Mapping):
                raise ValueError(f"expected a JSON object, got {type(data).__name__}")
            if data.get("format") != CHECKSUM_FORMAT:
                raise ValueError(
                    f"field 'format': expected {CHECKSUM_FORMAT!r}, got {data.get('format')!r}"
                )
            if data.get("algorithm") != "crc32":
                raise ValueError(
                    f"field 'algorithm': expected 'crc32', got {data.get('algorithm')!r}"
                )
            crcs = data["crc32"]
            values = tuple(int(crcs[part], 16) for part in PARTS)
            if any(not 0 <= v < 2**32 for v in values):
                raise ValueError("field 'crc32': values must be 32-bit")
            step, n_params = data["step"], data["n_params"]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (step, n_params)):
                raise ValueError("fields 'step' and 'n_params' must be integers")
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointChecksumError(_not_a_sidecar(source, str(exc))) from exc
        return cls(step=step, n_params=n_params, crc32=(values[0], values[1], values[2], values[3]))


def _not_a_sidecar(source: str, why: str) -> str:
    return (
        f"{source}: not a valid checkpoint checksum file ({why}); it cannot vouch for its "
        "checkpoint: delete it to load the checkpoint unverified"
    )


class ChecksumStream:
    """CRC-32 of each part of a checkpoint file fed as a byte stream, in file order."""

    def __init__(self, n_params: int) -> None:
        self.n_params = n_params
        self.bounds = [0, HEADER_BYTES] + [HEADER_BYTES + 4 * n_params * k for k in (1, 2, 3)]
        self.crcs = [0, 0, 0, 0]
        self.head = b""
        self.pos = 0

    def update(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            if self.pos >= self.bounds[-1]:
                raise ValueError(f"longer than the {self.bounds[-1]} bytes its header promises")
            part = next(k for k in range(4) if self.pos < self.bounds[k + 1])
            take = min(view.nbytes, self.bounds[part + 1] - self.pos)
            if part == 0:
                self.head += bytes(view[:take])
            self.crcs[part] = zlib.crc32(view[:take], self.crcs[part])
            view = view[take:]
            self.pos += take

    def result(self) -> Checksum:
        if self.pos != self.bounds[-1]:
            raise ValueError(f"checkpoint stream of {self.pos} bytes, expected {self.bounds[-1]}")
        step, n_params = np.frombuffer(self.head, dtype="<i4").tolist()
        a, b, c, d = self.crcs
        return Checksum(step=step, n_params=n_params, crc32=(a, b, c, d))


def checksum_of_file(
    path: str | os.PathLike[str], header: CheckpointHeader | None = None
) -> Checksum:
    """Read ``path`` (a checkpoint that passed ``validate_checkpoint``, or it is validated
    here) once, sequentially, and return the CRC-32 of each part."""
    header = header or validate_checkpoint(path)
    stream = ChecksumStream(header.n_params)
    buffer = bytearray(min(CHUNK_BYTES, max(header.size_bytes, 1)))
    view = memoryview(buffer)
    try:
        with open(path, "rb") as f:
            while got := f.readinto(view):
                stream.update(view[:got])
        return stream.result()
    except (OSError, ValueError) as exc:  # gone, unreadable, or resized while it was read
        raise CheckpointCorruptError(
            f"{path}: cannot read it to check its checksum: {exc}"
        ) from exc


def read_checksum(checkpoint: str | os.PathLike[str]) -> Checksum | None:
    """The checksum recorded beside ``checkpoint``; None when it has no sidecar (written by a
    recd that stored none). A sidecar that cannot be read raises ``CheckpointChecksumError``."""
    side = checksum_path(checkpoint)
    try:
        raw = side.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointChecksumError(f"{side}: cannot read the checksum file: {exc}") from exc
    try:
        data = json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError included
        raise CheckpointChecksumError(_not_a_sidecar(str(side), f"not JSON: {exc}")) from exc
    return Checksum.from_dict(data, source=str(side))


def verify_checksum(
    path: str | os.PathLike[str],
    *,
    computed: Checksum | None = None,
    data: tuple[Any, Any, Any, Any] | None = None,
) -> ChecksumStatus:
    """Check ``path``'s bytes against its sidecar: ``"ok"``, ``"absent"`` (no sidecar: the
    file is loaded unverified, as every checkpoint was before), or
    ``CheckpointChecksumError`` naming the file, each part that differs and both CRCs.

    The file is read once unless the caller already holds its bytes: ``computed`` (their
    checksum) or ``data`` (header bytes, weights, adam_m, adam_v, e.g. a checkpoint read into
    memory; hashed only when there is a sidecar to compare with).
    """
    path = Path(path)
    expected = read_checksum(path)
    if expected is None:
        return "absent"
    if computed is None:
        computed = Checksum.of_parts(*data) if data is not None else checksum_of_file(path)
    side = checksum_path(path).name
    if (computed.step, computed.n_params) != (expected.step, expected.n_params):
        raise CheckpointChecksumError(
            f"{path}: checksum does not match: the file holds step {computed.step} with "
            f"{computed.n_params:,} parameters, {side} was written for step {expected.step} with "
            f"{expected.n_params:,}"
        )
    bad = [
        f"{part} crc32 {got:08x}, {side} says {want:08x}"
        for part, got, want in zip(PARTS, computed.crc32, expected.crc32, strict=True)
        if got != want
    ]
    if bad:
        raise CheckpointChecksumError(
            f"{path}: checksum does not match ({'; '.join(bad)}): the bytes changed after the "
            "checkpoint was written (a flipped bit on disk, in memory or in a copy)"
        )
    return "ok"
