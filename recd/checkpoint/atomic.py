"""How checkpoints and run-directory files land on disk: atomically, durably, recoverably.

Every file of a run directory is written the same way:

1. write into a temp file in the *same* directory, named ``.<final name>.tmp-<tag>`` (a dot
   file that never matches ``step_NNNNNN.bin``, so no listing can mistake it for a checkpoint);
2. fsync the temp file;
3. ``os.replace`` it onto the final name (atomic on POSIX: readers see the old file or the new
   one, never a mix);
4. fsync the directory, so the rename itself survives a power cut.

A SIGKILL or power cut before step 3 leaves only a stray temp file (removed at the next start
by ``clean_stray_temp_files``) and the previous checkpoint untouched; after step 3 the new file
is complete. A checkpoint therefore counts only once ``commit`` returned.

A checkpoint's checksum sidecar (``step_NNNNNN.bin.crc32``, :mod:`recd.checkpoint.checksum`)
is committed the same way by ``commit``, *before* the checkpoint's rename, so every checkpoint
committed here has one; ``remove_checkpoint``, ``move_checkpoint`` and ``copy_checkpoint``
delete, move and copy a checkpoint together with it.

On resume ``newest_valid_checkpoint`` validates from the newest file backwards (size, header,
checksum) and falls back to the previous one with a logged warning naming the skipped file
and the reason.

A checkpoint is a full ``step_NNNNNN.bin`` or a delta ``step_NNNNNN.delta`` (the rows changed
since the previous checkpoint, :mod:`recd.checkpoint.delta`), which stands for its whole chain
(:mod:`recd.checkpoint.chain`: the full file it starts at and every delta up to it). Every
function here takes either: ``list_checkpoints`` lists both, ``newest_valid_checkpoint``
validates a delta's whole chain, ``remove/move/copy_checkpoint`` handle a delta (no sidecar:
its CRC is in its header) and ``materialize_checkpoint`` turns a chain into a full file.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from recd.checkpoint.chain import is_delta, read_any, step_of_name, validate_any
from recd.checkpoint.checksum import (
    Checksum,
    ChecksumStream,
    checksum_of_file,
    checksum_path,
    crc32_of,
    is_checksum_name,
    read_checksum,
    verify_checksum,
)
from recd.checkpoint.delta import delta_filename, parse_delta_step, read_delta
from recd.checkpoint.format import (
    HEADER_BYTES,
    REGIONS,
    ParamLayout,
    as_float32_flat,
    check_header_fits,
    checkpoint_filename,
    pack_header,
    parse_checkpoint_step,
    validate_checkpoint,
    write_all,
)
from recd.durable import (
    copy_bytes,
    is_temp_name,
    replace_durably,
    temp_path_for,
    write_json_atomic,
)
from recd.errors import CheckpointCorruptError

log = logging.getLogger(__name__)

LAYOUT_FILE = "_layout.json"
"""The ordered parameter names and shapes, written beside the checkpoints of a run."""

RegionSource = Any
"""A float32 array (numpy or CPU torch tensor, any shape: flattened in C order), or an iterable
of such arrays written one after the other (e.g. ``layout.iter_flat(named_tensors)``), so a
model never needs to be concatenated into one big copy."""


# ----------------------------------------------------------------------------- primitives


# ----------------------------------------------------------------------------- checkpoints


def write_checksum(checkpoint: str | os.PathLike[str], checksum: Checksum) -> Path:
    """Write ``checkpoint``'s sidecar ``step_NNNNNN.bin.crc32`` atomically and durably."""
    final = Path(checkpoint)
    return write_json_atomic(checksum_path(final), checksum.to_dict(final.name))


def commit(
    tmp_path: str | os.PathLike[str],
    final_path: str | os.PathLike[str],
    *,
    checksum: Checksum | None = None,
) -> Path:
    """Validate a finished temp checkpoint, commit its checksum sidecar, then fsync + rename +
    fsync-dir the checkpoint into place.

    The temp file must pass ``validate_checkpoint`` (exact size for its header) and its header
    step must match the final ``step_NNNNNN.bin`` name; otherwise ``CheckpointCorruptError``
    and nothing is renamed. ``checksum``: the CRCs of the bytes the writer wrote (computed as
    it handled them); None reads the temp file back to compute them (a distributed save,
    whose ranks each wrote a part). The sidecar ``final_path + ".crc32"`` is durable before
    the checkpoint's rename, so a committed checkpoint always has its checksum. An existing
    file of the same name (and its sidecar) is replaced atomically.
    """
    header = validate_checkpoint(tmp_path)
    final = Path(final_path)
    named_step = parse_checkpoint_step(final.name)
    if named_step is not None and named_step != header.step:
        raise CheckpointCorruptError(
            f"{tmp_path}: header step {header.step} cannot be committed as {final_path}"
        )
    if checksum is None:
        checksum = checksum_of_file(tmp_path, header)
    elif (checksum.step, checksum.n_params) != (header.step, header.n_params):
        raise CheckpointCorruptError(
            f"{tmp_path}: the checksum given is of step {checksum.step} with "
            f"{checksum.n_params:,} parameters, the file holds step {header.step} with "
            f"{header.n_params:,}"
        )
    write_checksum(final, checksum)
    return replace_durably(tmp_path, final)


def remove_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Delete a checkpoint, then its checksum sidecar; False when the checkpoint was already
    gone. (In that order: a crash in between leaves a sidecar without a checkpoint, which
    ``clean_stray_temp_files`` removes, never a checkpoint stripped of its checksum.) A delta
    has no sidecar (its CRC is in its header); removing one never touches its chain."""
    path = Path(path)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    if not is_delta(path):
        checksum_path(path).unlink(missing_ok=True)
    return True


def move_checkpoint(path: str | os.PathLike[str], directory: str | os.PathLike[str]) -> Path:
    """Move a checkpoint, then its checksum sidecar (when it has one: a delta never has),
    into ``directory`` (same filesystem: renames); returns the new path. The caller fsyncs
    both directories. A delta moves alone: its chain's other files stay where they are."""
    source, target_dir = Path(path), Path(directory)
    target = target_dir / source.name
    os.replace(source, target)
    side = checksum_path(source)
    if not is_delta(source) and side.exists():
        os.replace(side, checksum_path(target))
    return target


def copy_checkpoint(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    layout: ParamLayout | None = None,
) -> tuple[Checksum | None, str]:
    """Copy a checkpoint with its checksum, verifying the source as it is read; returns the
    checksum and the sha256 of the bytes copied.

    One pass over the source computes both (``CheckpointChecksumError`` when the source fails
    its sidecar: nothing is left at ``target``); a source without a sidecar is copied as it is
    and its copy gets the checksum of the bytes read. The copy is committed like any
    checkpoint (``commit``: sidecar first, then the file), then read back and verified.

    A delta (``step_NNNNNN.delta``) is copied alone, its bytes checked against the CRC in its
    header before the copy takes the final name (``CheckpointCorruptError``, nothing left at
    ``target``, when they differ); the checksum returned is None (a delta has no sidecar).
    Its chain is not copied: to copy a delta's state to another directory, materialise it
    (``materialize_checkpoint``).
    """
    source, final = Path(source), Path(target)
    if is_delta(source):
        return None, _copy_delta(source, final, layout)
    header = validate_checkpoint(source, layout)
    expected = read_checksum(source)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(final)
    stream = ChecksumStream(header.n_params)
    try:
        sha256 = copy_bytes(source, tmp, each=stream.update)
        checksum = stream.result()
        if expected is not None:
            verify_checksum(source, computed=checksum)
        commit(tmp, final, checksum=checksum)
    except ValueError as exc:  # the source changed size while it was read
        tmp.unlink(missing_ok=True)
        raise CheckpointCorruptError(f"{source}: changed while it was copied: {exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    verify_checksum(final)  # the copy as it landed on disk
    return checksum, sha256


def _copy_delta(source: Path, final: Path, layout: ParamLayout | None) -> str:
    """``copy_checkpoint`` of a delta: the bytes copied to a temp file, checked there (size,
    blocks, CRC, the final name's step, n_params against ``layout``), then renamed."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(final)
    try:
        sha256 = copy_bytes(source, tmp)
        copied = read_delta(tmp, verify=True)  # the bytes as they landed, CRC included
        named = parse_delta_step(final.name)
        if named is not None and named != copied.step:
            raise CheckpointCorruptError(
                f"{source}: a delta of step {copied.step} cannot be copied as {final.name}"
            )
        if layout is not None and copied.n_params != layout.n_params:
            raise CheckpointCorruptError(
                f"{source}: delta of {copied.n_params:,} parameters, the model layout has "
                f"{layout.n_params:,}"
            )
        replace_durably(tmp, final)
    except FileNotFoundError as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointCorruptError(f"{source}: no such checkpoint file") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return sha256


def materialize_checkpoint(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    layout: ParamLayout | None = None,
    verify: bool = True,
) -> Path:
    """Write the full flat file of checkpoint ``source`` (a delta: its whole chain applied;
    a full file: a verified copy) to ``target``, with its checksum sidecar, atomically and
    durably (``write_checkpoint``); returns ``target``.

    Every link is checked first (sizes, headers, links; with ``verify`` a delta's CRC, the
    base's sidecar, a full source's sidecar: pass False only when the caller just checked
    them): ``CheckpointCorruptError`` naming the file, and nothing written, when one fails.
    The bytes are those of the full checkpoint the run would have written at that step:
    header, weights, Adam m, Adam v.
    """
    source = Path(source)
    ckpt = read_any(source, layout, verify=verify)
    if verify and not is_delta(source):
        verify_checksum(source)  # read_any checks a full file's size and header only
    return write_checkpoint(
        target, ckpt.step, ckpt.weights, ckpt.adam_m, ckpt.adam_v, layout=layout
    )


def _iter_source(source: RegionSource, region: str) -> Iterable[np.ndarray]:
    if isinstance(source, np.ndarray) or hasattr(source, "__array__"):
        return [as_float32_flat(source, what=region)]
    return (as_float32_flat(part, what=region) for part in source)


def _known_size(source: RegionSource) -> int | None:
    if isinstance(source, np.ndarray) or hasattr(source, "__array__"):
        return int(np.asarray(source).size)
    return None


def write_checkpoint(
    path: str | os.PathLike[str],
    step: int,
    weights: RegionSource,
    adam_m: RegionSource,
    adam_v: RegionSource,
    *,
    layout: ParamLayout | None = None,
) -> Path:
    """Write ``step_NNNNNN.bin`` atomically and durably; returns the final path.

    ``weights``, ``adam_m`` and ``adam_v`` are float32 arrays of ``n_params`` elements in the
    layout's order, or iterables of arrays (one per tensor) written back to back. When a layout
    is given every region must hold exactly ``layout.n_params`` elements. The bytes go to a
    temp file beside ``path`` (sequential buffer writes, no copy of contiguous float32 data),
    which is then committed (fsync, rename, fsync dir) with its checksum sidecar, the CRC of
    each region computed as it is written. On any error the temp file is removed and an older
    file at ``path`` is left as it was.
    """
    final = Path(path)
    sizes = {n for s in (weights, adam_m, adam_v) if (n := _known_size(s)) is not None}
    if len(sizes) > 1:
        raise ValueError(f"{final}: weights/adam_m/adam_v sizes differ: {sorted(sizes)}")
    n_known = layout.n_params if layout is not None else next(iter(sizes), None)
    if n_known is not None:
        check_header_fits(step, n_known)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(final)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, bytes(HEADER_BYTES))  # patched below once the sizes are counted
            counts, crcs = [], []
            for region, source in zip(REGIONS, (weights, adam_m, adam_v), strict=True):
                written, crc = 0, 0
                for part in _iter_source(source, region):
                    crc = crc32_of(part, crc)  # the checksum of the bytes as they are written
                    written += write_all(fd, part)
                counts.append(written // 4)
                crcs.append(crc)
            if len(set(counts)) != 1 or (n_known is not None and counts[0] != n_known):
                raise ValueError(
                    f"{final}: region sizes (weights, adam_m, adam_v) = {counts}, expected "
                    f"{n_known if n_known is not None else 'equal sizes'}"
                )
            header = pack_header(step, counts[0])
            os.pwrite(fd, header, 0)
        finally:
            os.close(fd)
        checksum = Checksum(
            step=step, n_params=counts[0], crc32=(zlib.crc32(header), crcs[0], crcs[1], crcs[2])
        )
        return commit(tmp, final, checksum=checksum)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def clean_stray_temp_files(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Delete temp files left by killed writers (``.*.tmp-*``: a full checkpoint's, a delta's
    ``.step_NNNNNN.delta.tmp-*``, any sidecar's) and checksum sidecars whose checkpoint is not
    there (a writer killed between committing the two); returns what was removed.

    Call it once at start, before any writer of this run directory runs: it cannot tell a
    stray temp file from one a live writer is filling.
    """
    removed: list[Path] = []
    directory = Path(run_dir)
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        orphan = is_checksum_name(entry.name) and not entry.with_suffix("").exists()
        if (is_temp_name(entry.name) or orphan) and entry.is_file():
            entry.unlink(missing_ok=True)
            removed.append(entry)
            log.info("removed stray %s %s", "checksum" if orphan else "temp file", entry)
    return sorted(removed)


def checkpoint_step(path: str | os.PathLike[str]) -> int | None:
    """The step a checkpoint's name encodes (``step_NNNNNN.bin`` or ``step_NNNNNN.delta``),
    or None when ``path`` is named neither way."""
    return step_of_name(Path(path).name)


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Every checkpoint of ``run_dir`` (unvalidated), sorted by step ascending: each
    ``step_NNNNNN.bin`` and ``step_NNNNNN.delta``; where both exist for one step, the full
    file only (it holds the same state without a chain)."""
    directory = Path(run_dir)
    if not directory.is_dir():
        return []
    full: dict[int, Path] = {}
    deltas: dict[int, Path] = {}
    for entry in directory.iterdir():
        if (step := parse_checkpoint_step(entry.name)) is not None:
            full[step] = entry
        elif (step := parse_delta_step(entry.name)) is not None:
            deltas[step] = entry
    chosen = deltas | full
    return [chosen[step] for step in sorted(chosen)]


def checkpoint_file(run_dir: str | os.PathLike[str], step: int) -> Path | None:
    """The checkpoint of ``step`` in ``run_dir``: ``step_NNNNNN.bin`` when it exists, else
    ``step_NNNNNN.delta`` when that does, else None (unvalidated)."""
    directory = Path(run_dir)
    for name in (checkpoint_filename(step), delta_filename(step)):
        if (directory / name).is_file():
            return directory / name
    return None


def newest_valid_checkpoint(
    run_dir: str | os.PathLike[str],
    layout: ParamLayout | None = None,
    *,
    check: Callable[[Path], object] | None = None,
    verify: bool = True,
) -> Path | None:
    """The newest checkpoint that validates (against ``layout`` when given), or None if none.

    Walks from the newest file backwards; each invalid file is skipped with one warning line
    naming it and the reason, and the previous one is tried. Valid means: the size and
    header checks pass, and (``verify``) the bytes match the checksum sidecar when there is
    one (``recd.checkpoint.checksum``; this reads the file; a caller that reads it anyway
    passes ``verify=False`` and checks the bytes it read in ``check``, as a resume does).
    A delta is valid when its whole chain is (``recd.checkpoint.chain.validate_any``: every
    link present, sized and linked right, and with ``verify`` every delta's CRC and the base's
    sidecar): a torn, missing or damaged link skips it like a truncated file.
    ``check(path)`` runs on a file that passed those checks and rejects it too by raising
    ``CheckpointCorruptError`` (a resume passes one that loads the file and refuses
    non-finite values: ``recd.checkpoint.format.check_finite``). None means the directory
    holds no checkpoint at all (a fresh run). When checkpoints exist but *none* is valid this
    raises ``CheckpointCorruptError`` listing every reason rather than returning None:
    silently restarting a run from scratch (e.g. after a model change that breaks every file)
    would overwrite its history.
    """
    candidates = list_checkpoints(run_dir)
    reasons = []
    for path in reversed(candidates):
        try:
            validate_any(path, layout, verify=verify)  # a delta: its whole chain
            if verify and not is_delta(path):
                verify_checksum(path)  # reads the file only when it has a sidecar
            if check is not None:
                check(path)
        except CheckpointCorruptError as exc:
            reasons.append(str(exc))
            log.warning("skipping checkpoint %s: %s; falling back to the previous one", path, exc)
            continue
        if reasons:
            log.info("resuming from %s after skipping %d invalid newer file(s)", path, len(reasons))
        return path
    if reasons:
        raise CheckpointCorruptError(
            f"{run_dir}: none of {len(candidates)} checkpoints is valid: " + "; ".join(reasons)
        )
    return None


# ----------------------------------------------------------------------------- layout file


def write_layout(run_dir: str | os.PathLike[str], layout: ParamLayout) -> Path:
    """Write ``_layout.json`` (ordered names, shapes, offsets) into ``run_dir`` atomically."""
    directory = Path(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    return write_json_atomic(directory / LAYOUT_FILE, layout.to_dict())


def read_layout(path: str | os.PathLike[str]) -> ParamLayout:
    """The layout in ``path`` (a ``_layout.json`` file, or a run directory holding one)."""
    file = Path(path)
    if file.is_dir():
        file = file / LAYOUT_FILE
    try:
        data = json.loads(file.read_text())
        return ParamLayout.from_dict(data, source=str(file))
    except FileNotFoundError as exc:
        raise CheckpointCorruptError(f"{file}: no checkpoint layout file") from exc
    except (ValueError, AttributeError) as exc:
        raise CheckpointCorruptError(f"{file}: not a valid checkpoint layout: {exc}") from exc


def read_layout_or_none(path: str | os.PathLike[str]) -> ParamLayout | None:
    """Like ``read_layout`` but None when the file does not exist."""
    file = Path(path)
    if (file / LAYOUT_FILE if file.is_dir() else file).exists():
        return read_layout(file)
    return None


def checkpoint_path(run_dir: str | os.PathLike[str], step: int) -> Path:
    """``run_dir/step_NNNNNN.bin`` (the full file's name; ``checkpoint_file`` finds the
    checkpoint a step has, full or delta)."""
    return Path(run_dir) / checkpoint_filename(step)
