"""``.state.json`` of a training run: its data policy and, per checkpoint step, every rank's
reader position and RNG state, which a bit-exact resume needs beside the checkpoint's weights
and Adam state.

Entries are keyed by checkpoint step and leave with their checkpoints, so a resume from an
older checkpoint never pairs it with a newer reader position; a document without entries is a
fresh data policy (after ``recd pivot`` or ``recd fork``). The document's layout is in
docs/checkpoints.md; the file itself is read and replaced by :mod:`recd.checkpoint.sidecars`.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from recd.checkpoint.sidecars import STATE_FILE, read_state, utc_timestamp
from recd.durable import write_json_atomic
from recd.errors import SidecarError

if TYPE_CHECKING:
    import torch

__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
    "StateFile",
    "decode_rng",
    "encode_rng",
    "read_step_state",
    "step_entry",
]

STATE_FORMAT = "recd-train-state"
STATE_VERSION = 1


def encode_rng(state: torch.Tensor) -> str:
    """``torch.get_rng_state()`` as base64 text."""
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def decode_rng(text: str) -> torch.Tensor:
    """The RNG state :func:`encode_rng` wrote, for ``torch.set_rng_state``."""
    import torch  # only here: reading the document needs no torch

    return torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype=np.uint8).copy())


def step_entry(
    step: int, world_size: int, readers: list[dict[str, Any]], rngs: list[str]
) -> dict[str, Any]:
    """The entry of checkpoint ``step``: every rank's reader state and encoded RNG state."""
    return {
        "step": step,
        "world_size": world_size,
        "saved_at": utc_timestamp(),
        "readers": readers,
        "rng": rngs,
    }


def read_step_state(run_dir: str | os.PathLike[str], step: int) -> dict[str, Any] | None:
    """The ``.state.json`` entry of checkpoint ``step``; None for a fresh data policy.

    None when the run has no ``.state.json``, it holds no ``checkpoints`` (fresh after a
    pivot or fork) or the step's entry says ``fresh_policy`` (the checkpoint a pivot or fork
    restarted from); ``SidecarError`` when it holds entries but not this step's (its reader
    position is lost: resume from another checkpoint, or ``recd pivot`` to start the data
    policy afresh from this one).
    """
    doc = read_state(run_dir)
    path = Path(run_dir) / STATE_FILE
    if doc is None or not doc.get("checkpoints"):
        return None
    if doc.get("format") != STATE_FORMAT:
        raise SidecarError(f"{path}: field 'format': expected {STATE_FORMAT!r}")
    entry = doc["checkpoints"].get(str(step))
    if isinstance(entry, dict) and entry.get("fresh_policy"):
        return None
    if entry is None:
        raise SidecarError(
            f"{path}: no reader/RNG state for checkpoint step {step} (entries: "
            f"{sorted(int(s) for s in doc['checkpoints'])}); resume from one of those, or "
            "`recd pivot` to restart the data policy from this checkpoint"
        )
    if not isinstance(entry, dict) or entry.get("step") != step:
        raise SidecarError(f"{path}: entry {step!r} is malformed")
    return entry


def _empty_doc() -> dict[str, Any]:
    return {"format": STATE_FORMAT, "version": STATE_VERSION, "checkpoints": {}}


class StateFile:
    """The run's ``.state.json`` as the writing rank holds it: the document in memory,
    replaced on disk (atomically) with each checkpoint's entry."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.doc: dict[str, Any] = _empty_doc()

    def load(self) -> None:
        """Continue the document on disk, if there is one (its entries and policy kept)."""
        doc = read_state(self.run_dir)
        if doc is not None:
            self.doc = {**_empty_doc(), **doc}
            self.doc.setdefault("checkpoints", {})

    def mark_fresh(self, step: int) -> None:
        """Checkpoint ``step`` starts a fresh data policy (written with the next entry, so a
        later fallback to it starts the reader over too)."""
        self.doc["checkpoints"][str(step)] = {"step": step, "fresh_policy": True}

    def forget(self, step: int | None) -> None:
        """Drop the entry of checkpoint ``step`` (deleted by retention)."""
        self.doc["checkpoints"].pop(str(step), None)

    def write(
        self,
        step: int,
        entry: dict[str, Any],
        *,
        on_disk: set[int | None],
        data_policy: dict[str, Any],
    ) -> None:
        """Add ``entry`` for checkpoint ``step``, keep the entries of the checkpoints
        ``on_disk`` only, set the data policy and replace the file."""
        doc = self.doc
        kept = {s: e for s, e in doc["checkpoints"].items() if int(s) in on_disk}
        kept[str(step)] = entry
        doc["checkpoints"] = dict(sorted(kept.items(), key=lambda item: int(item[0])))
        doc["data_policy"] = data_policy
        write_json_atomic(self.run_dir / STATE_FILE, doc)
