"""The snapshot copy of a one-process checkpoint: weights, Adam m and v into the file image
while training goes on, with the image holding exactly the state of the checkpoint's step.

Two kinds of parameters, two rules (what :class:`recd.optim.ModelAdam` changes, and when):

* **Dense parameters** (MLPs, transformers; ``torch.optim.Adam``) change everywhere in every
  ``optimizer.step()``. Their copy (:class:`FillPieces`) must be complete before the next
  step; a training thread that gets there first copies what is left instead of idling.
* **Embedding tables** (:class:`recd.optim.LazyAdam`) change only in the rows a step
  touches. Their bulk copy runs on the writer thread for as long as it takes, and never
  holds training up: copy-on-write by rows (:class:`RowPatches`). Every step that runs while
  it is in flight hands over the rows it updates as they were *before* it (the update
  gathers them anyway: ``RowsStep``), and once the bulk copy is done these saved rows are
  written over the image, newest first, so the oldest saved value of a row (its value at the
  checkpoint's step) is what remains. A row the bulk copy read while a step was writing it
  is one of those rows, so a torn read never survives.

Written by hand: CheckFreq-style snapshotting exists in research code only, and torch's
distributed checkpoint stages whole tensors (it has no row-level copy-on-write for a lazily
updated optimizer).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from recd.errors import CheckpointError
from recd.optim.lazy_adam import RowsStep, RowUpdate, lazy_adam_update_rows

__all__ = [
    "FILL_PIECE_ELEMENTS",
    "FillPieces",
    "RowPatches",
    "SnapshotFill",
    "TableViews",
    "cut_pieces",
]

FILL_PIECE_ELEMENTS = 1 << 20
"""A copy is cut into pieces of at most this many elements (4 MiB) so that two threads can
share it."""

TableViews = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""A table's weights, m and v in the image: three (num_rows x E) views."""


class FillPieces:
    """One copy as a list of (target, source) pieces that two threads share.

    The writer thread takes pieces from the front; a training thread that needs the copy
    complete before the writer is done takes pieces from the back instead of waiting idle,
    so the wait is roughly halved. Each piece is copied exactly once (claims happen under a
    lock); :meth:`finish` waits for every piece, whoever copies it.
    """

    def __init__(self, pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._pieces = pieces
        self._lock = threading.Lock()
        self._front, self._back = 0, len(pieces)
        self._pending = len(pieces)
        self._error: BaseException | None = None
        self.complete = threading.Event()
        """Set once every piece is copied (or a copy failed)."""
        self.copied_by_back = 0
        """Pieces the helping (training) thread copied."""
        if not pieces:
            self.complete.set()

    @torch.no_grad()
    def work(self, *, from_back: bool) -> None:
        """Copy pieces, from the front or the back, until none is left to claim."""
        while True:
            with self._lock:
                if self._front >= self._back or self._error is not None:
                    return
                if from_back:
                    self._back -= 1
                    index = self._back
                    self.copied_by_back += 1
                else:
                    index = self._front
                    self._front += 1
            target, source = self._pieces[index]
            try:
                target.copy_(source)
            except BaseException as exc:
                with self._lock:
                    self._error = exc
                self.complete.set()
                raise
            with self._lock:
                self._pending -= 1
                if self._pending == 0:
                    self.complete.set()

    def finish(self) -> None:
        """Wait until every piece is copied; raise CheckpointError if a copy failed."""
        self.complete.wait()
        if self._error is not None:
            raise CheckpointError(f"checkpoint snapshot copy failed: {self._error}") from (
                self._error
            )


def cut_pieces(
    target: torch.Tensor, source: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``target.copy_(source)`` (both 1-D, same length) as pieces of FILL_PIECE_ELEMENTS."""
    return [
        (target[start : start + FILL_PIECE_ELEMENTS], source[start : start + FILL_PIECE_ELEMENTS])
        for start in range(0, source.numel(), FILL_PIECE_ELEMENTS)
    ]


class RowPatches:
    """Copy-on-write by rows for the embedding tables' bulk copy (module docstring).

    ``tables`` maps ``id(weight)`` of each table to its views in the image. A step calls
    :meth:`open_step` first: True while the bulk copy is in flight, and then its row updates
    go through :meth:`wrap` (which saves the rows as they were before the update) until
    :meth:`close_step`. The writer thread calls :meth:`apply` once the bulk copy is done: no
    step opens after that, a step already open is waited for, and the saved rows are
    written over the image, newest first. :meth:`close` (idempotent) stops the recording
    without applying anything (a failed copy).
    """

    def __init__(self, tables: dict[int, TableViews]) -> None:
        self._tables = tables
        self._cond = threading.Condition()
        self._closed = False
        self._open_steps = 0
        self._saved: list[tuple[TableViews, torch.Tensor, TableViews]] = []
        self.rows_saved = 0
        """Rows (of any table, counted once per step that saved them) handed over."""

    def open_step(self) -> bool:
        """False once the bulk copy is done: the step may update rows freely."""
        with self._cond:
            if self._closed:
                return False
            self._open_steps += 1
            return True

    @property
    def closed(self) -> bool:
        """The bulk copy is over (applied or failed): steps no longer need the guard."""
        with self._cond:
            return self._closed

    def close_step(self) -> None:
        with self._cond:
            self._open_steps -= 1
            self._cond.notify_all()

    def wrap(self, inner: RowUpdate) -> RowUpdate:
        """``inner`` (a :class:`recd.optim.RowUpdate`), saving each table's rows before it
        changes them."""

        def update_rows(
            weight: torch.Tensor,
            exp_avg: torch.Tensor,
            exp_avg_sq: torch.Tensor,
            rows: torch.Tensor,
            grad_rows: torch.Tensor,
            **kwargs: Any,
        ) -> Any:
            views = self._tables.get(id(weight))
            if views is None:
                raise CheckpointError(
                    f"snapshot: a table of shape {tuple(weight.shape)} is updated but is not "
                    "in the checkpoint image"
                )
            if inner is lazy_adam_update_rows:  # it gathers the old rows itself
                done = inner(weight, exp_avg, exp_avg_sq, rows, grad_rows, **kwargs)
                assert isinstance(done, RowsStep)
                before = (done.weight_before, done.exp_avg_before, done.exp_avg_sq_before)
            else:
                before = (
                    weight.index_select(0, rows),
                    exp_avg.index_select(0, rows),
                    exp_avg_sq.index_select(0, rows),
                )
                done = inner(weight, exp_avg, exp_avg_sq, rows, grad_rows, **kwargs)
            with self._cond:
                self._saved.append((views, rows, before))
                self.rows_saved += int(rows.numel())
            return done

        return update_rows

    @torch.no_grad()
    def apply(self) -> None:
        """After the bulk copy: wait for an open step, then write the saved rows, newest
        first (the oldest saved value of a row wins: its value at the checkpoint's step)."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._open_steps == 0)
            saved, self._saved = self._saved, []
        for views, rows, before in reversed(saved):
            for view, values in zip(views, before, strict=True):
                view.index_copy_(0, rows, values)

    def close(self) -> None:
        """Stop recording (nothing is applied); waits for an open step."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._open_steps == 0)
            self._saved = []


@dataclass(eq=False)
class SnapshotFill:
    """The copy of one checkpoint: dense pieces first, then the tables' bulk copy and its
    row patches."""

    dense: FillPieces
    tables: FillPieces
    patches: RowPatches

    def run(self) -> None:
        """The writer thread's part: everything, in order; raises CheckpointError."""
        try:
            self.dense.work(from_back=False)
            self.dense.finish()
            self.tables.work(from_back=False)
            self.tables.finish()
            self.patches.apply()
        finally:
            self.patches.close()

    def guard_step(self, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The training thread's ``optimizer.step(*args, **kwargs)`` while this copy is in
        flight: help with the dense copy until it is complete, then step, handing over the
        tables' old rows while their bulk copy runs."""
        self.dense.work(from_back=True)
        self.dense.complete.wait()  # a failed copy is the writer's to report
        if not self.patches.open_step():
            return step(*args, **kwargs)
        try:
            inner = kwargs.pop("update_rows", lazy_adam_update_rows)
            return step(*args, update_rows=self.patches.wrap(inner), **kwargs)
        finally:
            self.patches.close_step()
