"""The run directory's three sidecars, and the run-level operations on them (pivot archive, fork).

::

    RUN_DIR/step_NNNNNN.bin     checkpoints (recd.checkpoint.format)
    RUN_DIR/step_NNNNNN.bin.crc32   each one's checksum (recd.checkpoint.checksum)
    RUN_DIR/step_NNNNNN.delta   delta checkpoints: rows changed since the previous one
                                (recd.checkpoint.delta; CRC in the header, no sidecar)
    RUN_DIR/_layout.json        parameter order of the checkpoints
    RUN_DIR/.loss.json          loss history: JSON Lines, append-only, never archived
    RUN_DIR/.samples.json       recent sample audits: one JSON document, archived at a pivot
    RUN_DIR/.state.json         data-policy and reader state: one JSON document, archived at a pivot
    RUN_DIR/archive/<ts>/       .samples.json and .state.json of earlier policy phases

``.loss.json`` — the audit trail
--------------------------------
Despite its name it is JSON Lines: one JSON object per line, so a step costs one ``write`` of
one line at the end of the file and the file is **never rewritten in place** (a whole-file JSON
document would have to be rewritten at every step, 200K times, each time risking the whole
history). Two kinds of record::

    {"step": 101, "loss": 0.6931471824645996, ...}      one per training step (extra keys allowed)
    {"event": "branch", "at_step": 112700, ...}         metadata (pivot, fork); no "step" key

A non-finite loss is stored as ``null``, as in every JSON file recd writes, with its kind
beside it so that a replay is still compared bitwise:
``{"step": 7, "loss": null, "nonfinite": "NaN"}`` (or ``"Infinity"``, ``"-Infinity"``); every
line is strict JSON. (Files of older recd versions hold the kind as the loss, ``"loss":
"NaN"``: still read.)

Guarantees:
- *Append-only.* Records are only ever appended. The one modification ever made to existing
  bytes: when the file ends in an incomplete line (a writer died inside its ``write``), opening
  a ``LossLog`` truncates exactly that partial tail — bytes after the last newline, never a
  complete line. Readers ignore such a tail without modifying anything.
- *No duplicates after a resume.* A run resumed from checkpoint k replays steps k+1, k+2, ...
  that may already be recorded. ``LossLog.append`` skips a step that is already in the history
  and checks that the replayed loss equals the recorded one bit for bit: a difference means the
  resume is not bit-exact, which raises ``SidecarError`` (or logs a warning with
  ``on_mismatch="warn"``). So the file holds exactly one entry per step.
- *Pivots and deliberate rewinds* (restart from checkpoint k under a new policy, although the
  history already has steps after k) append ``{"event": "branch", "at_step": k}``: entries after
  k that precede the event are kept in the file (audit trail) but superseded in the canonical
  history ``read_loss_history`` returns.
- *Cost.* ``append`` runs after every training step, when the step has just evicted the
  interpreter's working set from the caches: there the ``json.dumps`` of a two-key record is a
  visible share of a small step, so the common record (no extra keys, a finite loss) is
  formatted directly, to the same bytes. The one ``write`` per step stays.
- *Durability.* ``append`` writes through to the OS (one ``write`` per line, survives SIGKILL);
  ``sync`` fsyncs (survives power loss). The trainer must call ``sync()`` before it commits each
  checkpoint; then after a power cut the durable history reaches at least the newest checkpoint,
  the entries after it may be lost, and the resumed run re-produces them identically. No gap.
- *One writer.* ``LossLog`` holds an exclusive ``flock`` on the file (released when the process
  dies); in a distributed job only rank 0 writes.

``.samples.json`` and ``.state.json`` are whole-file JSON documents replaced atomically
(temp + fsync + rename + fsync dir): readers see the old document or the new one. The
per-checkpoint entries of ``.state.json`` (``checkpoints``, keyed by step) leave with their
checkpoints: retention drops them (``drop_state_entries``) right after deleting the files.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import struct
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np

from recd.checkpoint.atomic import (
    LAYOUT_FILE,
    copy_checkpoint,
    materialize_checkpoint,
    read_layout_or_none,
)
from recd.checkpoint.chain import chain_paths, is_delta, validate_any
from recd.checkpoint.format import checkpoint_filename
from recd.durable import copy_file_atomic, fsync_directory, sha256_file, write_json_atomic
from recd.errors import CheckpointError, SidecarError

log = logging.getLogger(__name__)

LOSS_FILE = ".loss.json"
SAMPLES_FILE = ".samples.json"
STATE_FILE = ".state.json"
ARCHIVE_DIR = "archive"

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _encode_loss(loss: float) -> dict[str, Any]:
    """The fields of a step record for ``loss``: ``{"loss": x}``, or ``{"loss": None,
    "nonfinite": kind}`` for NaN / infinity (``null`` in the file)."""
    if math.isnan(loss):
        return {"loss": None, "nonfinite": "NaN"}
    if math.isinf(loss):
        return {"loss": None, "nonfinite": "Infinity" if loss > 0 else "-Infinity"}
    return {"loss": loss}


def _decode_loss(record: dict[str, Any], where: str) -> float:
    """The loss of a step record (its ``nonfinite`` field consumed): a number, ``null`` with
    the kind in ``nonfinite`` (no kind: NaN), or an older file's ``"NaN"`` / ``"Infinity"`` /
    ``"-Infinity"``."""
    if "loss" not in record:
        raise SidecarError(f"{where}: field 'loss': missing")
    value = record["loss"]
    kind = record.pop("nonfinite", "NaN")
    if value is None and kind in _NONFINITE:
        return _NONFINITE[kind]
    if value is None:
        raise SidecarError(
            f"{where}: field 'nonfinite': expected one of {', '.join(_NONFINITE)}, got {kind!r}"
        )
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise SidecarError(f"{where}: field 'loss': expected a number or null, got {value!r}")


def same_bits(a: float, b: float) -> bool:
    """Bitwise float64 equality (NaN equals NaN: JSON keeps no NaN payload)."""
    if math.isnan(a) and math.isnan(b):
        return True
    return struct.pack("<d", a) == struct.pack("<d", b)


# ----------------------------------------------------------------------------- loss history


@dataclass(kw_only=True, slots=True)
class LossHistory:
    """The canonical loss history of a run, as ``read_loss_history`` resolves it."""

    path: Path
    steps: np.ndarray
    """int64 [n]: steps, ascending, each once."""
    losses: np.ndarray
    """float64 [n]: the loss of each step."""
    records: list[dict[str, Any]]
    """The canonical step records (same order as ``steps``), with any extra keys."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """Metadata records (fork origin, branches), in file order."""
    superseded: int = 0
    """Step records replaced by a later branch (kept in the file, not in the history)."""
    duplicate_steps: list[int] = field(default_factory=list)
    """Steps recorded twice in one branch (never written by LossLog; first record wins)."""
    torn_tail_bytes: int = 0
    """Bytes of an incomplete last line, ignored."""

    def loss_at(self, step: int) -> float:
        i = int(np.searchsorted(self.steps, step))
        if i == len(self.steps) or self.steps[i] != step:
            raise KeyError(f"{self.path}: no loss recorded for step {step}")
        return float(self.losses[i])


def _loss_path(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return p / LOSS_FILE if p.is_dir() else p


def _parse_loss_bytes(path: Path, data: bytes) -> tuple[LossHistory, int]:
    """Resolve the history from raw bytes; also returns the length of the complete part."""
    complete_len = data.rfind(b"\n") + 1
    canonical: dict[int, dict[str, Any]] = {}
    events: list[dict[str, Any]] = []
    superseded = 0
    duplicates: list[int] = []
    for lineno, raw in enumerate(data[:complete_len].split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        where = f"{path}: line {lineno}"
        try:
            record = json.loads(raw)
        except ValueError as exc:
            raise SidecarError(
                f"{where}: not a JSON object ({exc}); the history is damaged"
            ) from exc
        if not isinstance(record, dict):
            raise SidecarError(f"{where}: expected a JSON object, got {type(record).__name__}")
        if "event" in record:
            events.append(record)
            if record["event"] == "branch":
                at = int(record.get("at_step", -1))
                drop = [s for s in canonical if s > at]
                superseded += len(drop)
                for s in drop:
                    del canonical[s]
            continue
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise SidecarError(f"{where}: field 'step': expected an int >= 0, got {step!r}")
        record["loss"] = _decode_loss(record, where)
        if step in canonical:
            duplicates.append(step)
            continue
        canonical[step] = record
    ordered = sorted(canonical)
    history = LossHistory(
        path=path,
        steps=np.asarray(ordered, dtype=np.int64),
        losses=np.asarray([canonical[s]["loss"] for s in ordered], dtype=np.float64),
        records=[canonical[s] for s in ordered],
        events=events,
        superseded=superseded,
        duplicate_steps=duplicates,
        torn_tail_bytes=len(data) - complete_len,
    )
    return history, complete_len


def read_loss_history(path: str | os.PathLike[str]) -> LossHistory:
    """Read ``.loss.json`` (``path`` is the file or its run directory); never modifies it.

    An incomplete last line is ignored (counted in ``torn_tail_bytes``); a damaged complete
    line raises ``SidecarError`` naming the line. A missing file is an empty history.
    """
    file = _loss_path(path)
    data = file.read_bytes() if file.exists() else b""
    return _parse_loss_bytes(file, data)[0]


class LossLog:
    """The appender of ``.loss.json`` (see the module docstring for its guarantees).

    Usage in a trainer::

        with LossLog(run_dir) as losses:           # repairs a torn tail, loads the history
            for step in range(start + 1, end + 1):
                ...
                losses.append(step, loss)          # skipped (and checked) when replayed
                if step % checkpoint_every == 0:
                    losses.sync()                  # BEFORE committing the checkpoint
                    write_checkpoint(...)
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        on_mismatch: Literal["raise", "warn"] = "raise",
    ) -> None:
        self.path = Path(run_dir) / LOSS_FILE
        self.on_mismatch = on_mismatch
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self._acquire_exclusive()
            self._load_and_repair()
        except BaseException:
            os.close(self._fd)
            raise

    def _acquire_exclusive(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise SidecarError(
                f"{self.path}: another process is appending to this loss history; "
                "only one writer (rank 0 of one run) may own a run directory"
            ) from exc

    def _load_and_repair(self) -> None:
        size = os.fstat(self._fd).st_size
        data = os.pread(self._fd, size, 0) if size else b""
        history, complete_len = _parse_loss_bytes(self.path, data)
        if complete_len < len(data):
            log.warning(
                "%s: truncating a torn last line (%d bytes, %r) left by a crashed writer",
                self.path,
                len(data) - complete_len,
                data[complete_len : complete_len + 60],
            )
            os.ftruncate(self._fd, complete_len)
            os.fsync(self._fd)
        if history.duplicate_steps:
            log.warning("%s: steps recorded twice: %s", self.path, history.duplicate_steps[:10])
        self._losses: dict[int, float] = {
            int(s): float(v) for s, v in zip(history.steps, history.losses, strict=True)
        }
        self.last_step: int | None = max(self._losses) if self._losses else None
        self.events = history.events

    def __len__(self) -> int:
        return len(self._losses)

    def __contains__(self, step: int) -> bool:
        return step in self._losses

    def loss_at(self, step: int) -> float:
        return self._losses[step]

    def append(self, step: int, loss: float, **extra: Any) -> bool:
        """Record the loss of ``step``; False when the step was already recorded (a replay).

        A replayed step is not written again; its loss must equal the recorded one bitwise
        (``SidecarError`` otherwise, or a warning with ``on_mismatch="warn"``). ``extra`` keys
        (e.g. ``lr``) are stored with a new entry and not compared.
        """
        if "event" in extra:
            raise ValueError("an extra field must not be named 'event' (it marks metadata records)")
        if "nonfinite" in extra:
            raise ValueError("an extra field must not be named 'nonfinite' (a null loss's kind)")
        value = float(loss)
        with self._lock:
            if step in self._losses:
                recorded = self._losses[step]
                if not same_bits(recorded, value):
                    message = (
                        f"{self.path}: step {step}: recorded loss {recorded!r} but the resumed "
                        f"run produced {value!r}; resume is not bit-exact"
                    )
                    if self.on_mismatch == "raise":
                        raise SidecarError(message)
                    log.warning("%s", message)
                return False
            if self.last_step is not None and step != self.last_step + 1:
                log.warning(
                    "%s: step %d appended after step %d: the history has a gap or is out of order",
                    self.path,
                    step,
                    self.last_step,
                )
            if extra or not math.isfinite(value):
                self._write_record({"step": int(step), **_encode_loss(value), **extra})
            else:  # the common record, formatted as json.dumps would (float repr)
                self._write_line(f'{{"step":{int(step)},"loss":{value!r}}}\n'.encode())
            self._losses[step] = value
            self.last_step = step if self.last_step is None else max(self.last_step, step)
            return True

    def begin_branch(self, at_step: int, **info: Any) -> None:
        """Start a new branch of the history after ``at_step`` (a pivot or a deliberate rewind).

        Recorded steps after ``at_step`` stay in the file but are superseded: the steps that
        follow are new entries, not replays.
        """
        with self._lock:
            self._write_record({"event": "branch", "at_step": int(at_step), **info})
            for s in [s for s in self._losses if s > at_step]:
                del self._losses[s]
            self.last_step = max(self._losses) if self._losses else None

    def write_event(self, event: str, at_step: int, **info: Any) -> None:
        """Append a metadata record (no effect on the history), e.g. a fork origin."""
        if event == "branch":
            raise ValueError("use begin_branch() for branch events")
        with self._lock:
            self._write_record({"event": event, "at_step": int(at_step), **info})

    def _write_record(self, record: Mapping[str, Any]) -> None:
        self._write_line(
            (json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n").encode()
        )

    def _write_line(self, line: bytes) -> None:
        view = memoryview(line)
        while view:
            view = view[os.write(self._fd, view) :]

    def sync(self) -> None:
        """fsync: every entry appended so far survives a power cut."""
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LossLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# ----------------------------------------------------------------------------- samples and state


def _read_json_or_none(path: Path) -> Any:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise SidecarError(f"{path}: not valid JSON: {exc}") from exc


def write_state(run_dir: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Replace ``.state.json`` atomically with ``state`` (policy and reader state)."""
    return write_json_atomic(Path(run_dir) / STATE_FILE, dict(state))


def read_state(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``.state.json`` as a dict, or None when the run has none (fresh policy)."""
    data = _read_json_or_none(Path(run_dir) / STATE_FILE)
    if data is not None and not isinstance(data, dict):
        raise SidecarError(f"{Path(run_dir) / STATE_FILE}: expected a JSON object")
    return data


def drop_state_entries(run_dir: str | os.PathLike[str], steps: Iterable[int]) -> list[int]:
    """Remove the ``.state.json`` entries (``checkpoints``, keyed by step) of ``steps``, whose
    checkpoints retention deleted; returns the steps removed. The document is replaced
    atomically, and only when it changes; everything else in it is kept."""
    doc = read_state(run_dir)
    entries = None if doc is None else doc.get("checkpoints")
    if doc is None or not isinstance(entries, dict):
        return []
    gone = [step for step in sorted(set(steps)) if str(step) in entries]
    if gone:
        doc = {**doc, "checkpoints": {k: v for k, v in entries.items() if int(k) not in gone}}
        write_state(run_dir, doc)
    return gone


def write_samples(run_dir: str | os.PathLike[str], samples: Mapping[str, Any]) -> Path:
    """Replace ``.samples.json`` atomically (``{"audits": [...]}`` by convention)."""
    return write_json_atomic(Path(run_dir) / SAMPLES_FILE, dict(samples))


def read_samples(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    data = _read_json_or_none(Path(run_dir) / SAMPLES_FILE)
    if data is not None and not isinstance(data, dict):
        raise SidecarError(f"{Path(run_dir) / SAMPLES_FILE}: expected a JSON object")
    return data


def append_sample_audit(
    run_dir: str | os.PathLike[str], audit: Mapping[str, Any], *, keep_last: int | None = None
) -> Path:
    """Add one sample audit (must have an int ``step``) to ``.samples.json``, atomically.

    An audit of a step already present replaces it (a resumed run re-producing the audit of a
    replayed step), so the file holds one audit per step; ``keep_last`` keeps the most recent.
    """
    step = audit.get("step")
    if not isinstance(step, int):
        raise ValueError(f"sample audit needs an int 'step', got {step!r}")
    current = read_samples(run_dir) or {}
    audits = [a for a in current.get("audits", []) if a.get("step") != step]
    audits.append(dict(audit))
    audits.sort(key=lambda a: a["step"])
    if keep_last is not None:
        audits = audits[-keep_last:]
    return write_samples(run_dir, {**current, "audits": audits})


def utc_timestamp() -> str:
    """``YYYYmmddTHHMMSSZ``: the archive folder name of a pivot."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def archive_policy_sidecars(run_dir: str | os.PathLike[str], timestamp: str | None = None) -> Path:
    """Move ``.samples.json`` and ``.state.json`` to ``archive/<timestamp>/``; returns that folder.

    ``.loss.json`` is never touched. The folder is created even when neither file exists (it
    records that a pivot happened); an existing folder of that name is an error (history is
    never overwritten). Renames are within one filesystem and fsynced.
    """
    directory = Path(run_dir)
    stamp = timestamp or utc_timestamp()
    if "/" in stamp or stamp in ("", ".", ".."):
        raise ValueError(f"archive timestamp {stamp!r} is not a plain folder name")
    target = directory / ARCHIVE_DIR / stamp
    try:
        target.mkdir(parents=True, exist_ok=False)
    except FileExistsError as exc:
        raise SidecarError(f"{target}: archive folder already exists; not overwriting it") from exc
    for name in (SAMPLES_FILE, STATE_FILE):
        source = directory / name
        if source.exists():
            os.replace(source, target / name)
    fsync_directory(target)
    fsync_directory(target.parent)
    fsync_directory(directory)
    return target


# ----------------------------------------------------------------------------- fork


@dataclass(kw_only=True, slots=True)
class ForkResult:
    """What ``fork_run`` created."""

    run_dir: Path
    checkpoint: Path
    source: Path
    step: int
    sha256: str
    chain: list[str] = field(default_factory=list)
    """A delta's chain (file names, base first), materialised into ``checkpoint``; empty for a
    full source (copied)."""


def fork_run(checkpoint: str | os.PathLike[str], new_run_dir: str | os.PathLike[str]) -> ForkResult:
    """Start a new run directory from one checkpoint, for an audit comparison of two branches.

    The new directory gets, atomically (built as a temp folder, then renamed into place):
    the checkpoint (same name; a delta becomes a full ``.bin``, below) with its checksum
    sidecar, ``_layout.json`` when one sits beside the source, a fresh ``.state.json`` stating
    the origin (``{"fork_origin": {...}}``: no policy state is carried over) and a
    ``.loss.json`` whose only record is the origin event.
    No loss entries are copied: the fork's history starts at step+1, and its first record
    points to the source run, whose ``.loss.json`` holds the steps up to the fork.
    ``new_run_dir`` must not exist or be empty.

    The source is checked against its checksum as it is copied (``CheckpointChecksumError``,
    nothing created, when it fails), and the copy against the same checksum once written; a
    source without a checksum (an older recd's) gets one computed from the bytes copied. The
    sha256 of those bytes is recorded as the origin's identity.

    Forking a delta (``step_NNNNNN.delta``) materialises its chain: the new directory gets a
    full ``step_NNNNNN.bin`` (with its checksum sidecar) holding the state the chain restores,
    byte-identical to the full checkpoint the source run would have written at that step, so
    the fork never depends on the source directory's files. Every link is checked first (each
    delta's CRC, the base's sidecar); the origin records the chain's files (``chain``) and the
    sha256 of the materialised file.
    """
    source = Path(checkpoint).resolve()
    layout = read_layout_or_none(source.parent)
    header = validate_any(source, layout)  # a delta: its whole chain
    target = Path(new_run_dir).resolve()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise CheckpointError(f"{target}: fork target exists and is not an empty directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.tmp-{os.getpid()}"
    staging.mkdir()
    try:
        name = checkpoint_filename(header.step)
        chain: list[str] = []
        if is_delta(source):
            chain = [p.name for p in chain_paths(source)]
            made = materialize_checkpoint(source, staging / name, layout=layout)
            digest = sha256_file(made)
        else:
            _, digest = copy_checkpoint(source, staging / name, layout=layout)
        if layout is not None:
            copy_file_atomic(source.parent / LAYOUT_FILE, staging / LAYOUT_FILE)
        origin = {
            "source": str(source),
            "source_run_dir": str(source.parent),
            "step": header.step,
            "sha256": digest,
            "forked_at": utc_timestamp(),
            **({"chain": chain} if chain else {}),
        }
        write_state(staging, {"fork_origin": origin})
        with LossLog(staging) as losses:
            losses.write_event(
                "fork", header.step, **{k: v for k, v in origin.items() if k != "step"}
            )
        fsync_directory(staging)
        os.replace(staging, target)
    except BaseException:
        for entry in staging.iterdir() if staging.exists() else []:
            entry.unlink()
        if staging.exists():
            staging.rmdir()
        raise
    fsync_directory(target.parent)
    return ForkResult(
        run_dir=target,
        checkpoint=target / name,
        source=source,
        step=header.step,
        sha256=digest,
        chain=chain,
    )
