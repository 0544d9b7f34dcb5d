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

A **delta checkpoint** (:class:`DeltaFill`) takes the same two rules to a smaller copy: at
the step boundary the training thread only swaps the optimizer's row logs for fresh ones
(a dict swap) and plans the dense copy; the writer thread merges the detached logs into each
table's updated rows, gathers those rows' weights, m and v (``index_select``), and then
writes the rows the steps handed over meanwhile onto the gathered rows they hit (a row
updated only after the boundary is not in this delta: the fresh log has it, for the next).

Written by hand: CheckFreq-style snapshotting exists in research code only, and torch's
distributed checkpoint stages whole tensors (it has no row-level copy-on-write for a lazily
updated optimizer).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from recd.checkpoint.delta import Block
from recd.errors import CheckpointError
from recd.optim.lazy_adam import RowsStep, RowUpdate, lazy_adam_update_rows

if TYPE_CHECKING:
    from recd.checkpoint.format import ParamLayout
    from recd.optim.model_adam import DeltaPart, ModelAdam
    from recd.optim.row_log import RowLog

__all__ = [
    "FILL_PIECE_ELEMENTS",
    "DeltaFill",
    "DeltaRowPatches",
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
        self._keys = frozenset(tables)
        """The tables a step may update (any other is an error)."""
        self._cond = threading.Condition()
        self._closed = False
        self._open_steps = 0
        self._saved: list[tuple[int, torch.Tensor, TableViews]] = []
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
            key = id(weight)
            if key not in self._keys:
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
                self._saved.append((key, rows, before))
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
        for key, rows, before in reversed(saved):
            self._put(key, rows, before)

    def _put(self, key: int, rows: torch.Tensor, before: TableViews) -> None:
        """Write one step's saved rows of table ``key`` over the copy."""
        for view, values in zip(self._tables[key], before, strict=True):
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
            self._copy_tables()
            self.patches.apply()
        finally:
            self.patches.close()

    def _copy_tables(self) -> None:
        """The tables' bulk copy (while steps hand their old rows over)."""
        self.tables.work(from_back=False)
        self.tables.finish()

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


class DeltaRowPatches(RowPatches):
    """:class:`RowPatches` for a delta's gathered rows: a table's copy is its updated rows
    only (``set_target``, once they are gathered), so a saved row is written at its position
    among them, and a saved row not among them is skipped (it was first updated after the
    checkpoint's step: the next delta's)."""

    def __init__(self, tables: set[int]) -> None:
        super().__init__({})
        self._keys = frozenset(tables)
        self._targets: dict[int, tuple[torch.Tensor, TableViews]] = {}

    def set_target(self, key: int, rows: torch.Tensor, copies: TableViews) -> None:
        """Table ``key``'s copy: ``copies`` (R x E each) holds the rows ``rows`` (sorted,
        unique)."""
        self._targets[key] = (rows, copies)

    def _put(self, key: int, rows: torch.Tensor, before: TableViews) -> None:
        target = self._targets.get(key)
        if target is None:  # nothing of this table in the delta
            return
        kept, copies = target
        at = torch.searchsorted(kept, rows).clamp_(max=kept.numel() - 1)
        hit = kept.index_select(0, at) == rows
        at = at[hit]
        if at.numel() == 0:
            return
        for copy, values in zip(copies, before, strict=True):
            copy.index_copy_(0, at, values[hit])


@dataclass(eq=False)
class _TableGather:
    """One embedding table of a delta: its detached row log and live tensors; after the
    gather, its updated rows and their copies."""

    start: int
    width: int
    log: RowLog
    sources: TableViews
    rows: torch.Tensor | None = None
    copies: TableViews | None = None


_DenseCopy = tuple[Block, TableViews]
"""A dense tensor of a delta: its block and its three copies (filled by the dense pieces)."""


@dataclass(eq=False)
class DeltaFill(SnapshotFill):
    """The copy of a delta checkpoint (module docstring): dense tensors whole (pieces the
    training thread may help with), then each table's updated rows, gathered on the writer
    thread with copy-on-write patches. Build it with :meth:`plan` at the step boundary;
    :meth:`parts` gives the delta's blocks once :meth:`run` is done."""

    order: list[_DenseCopy | _TableGather] = field(default_factory=list)
    """Every parameter with something to write, in checkpoint order."""
    merge_s: float = 0.0
    """Writer-thread seconds merging the detached row logs (after :meth:`run`)."""
    gather_s: float = 0.0
    """Writer-thread seconds gathering the updated rows' weights, m and v."""

    @classmethod
    @torch.no_grad()
    def plan(cls, optimizer: ModelAdam, layout: ParamLayout) -> DeltaFill:
        """On the training thread, at the boundary: detach the row logs (fresh ones take the
        next steps' rows) and plan the dense copies. CPU tensors only."""
        logs = optimizer.detach_row_logs()
        m, v = optimizer.moments("adam_m"), optimizer.moments("adam_v")
        tables = set(optimizer.embedding_names)
        order: list[_DenseCopy | _TableGather] = []
        dense: list[tuple[torch.Tensor, torch.Tensor]] = []
        for name in optimizer.names:
            spec, offset = layout.spec(name), layout.offset_of(name)
            sources = (optimizer.params[name], m[name], v[name])  # the live tensors (patch keys)
            if name in tables:
                log = logs.get(name)
                if log is not None:
                    width = spec.numel // spec.shape[0]
                    order.append(_TableGather(offset, width, log, sources))
                continue
            n = spec.numel
            f32 = torch.float32
            copies = (
                torch.empty(n, dtype=f32),
                torch.empty(n, dtype=f32),
                torch.empty(n, dtype=f32),
            )
            for target, source in zip(copies, sources, strict=True):
                dense.extend(cut_pieces(target, source.detach().reshape(-1)))
            order.append((Block(offset, n, n, np.zeros(1, np.int32)), copies))
        keys = {id(optimizer.params[name]) for name in tables}
        return cls(
            dense=FillPieces(dense),
            tables=FillPieces([]),
            patches=DeltaRowPatches(keys),
            order=order,
        )

    @torch.no_grad()
    def _copy_tables(self) -> None:
        patches = self.patches
        assert isinstance(patches, DeltaRowPatches)
        for item in self.order:
            if not isinstance(item, _TableGather):
                continue
            began = time.perf_counter()
            item.rows = rows = item.log.take()
            merged = time.perf_counter()
            self.merge_s += merged - began
            if rows is None:
                continue
            w, m, v = (s.index_select(0, rows) for s in item.sources)
            item.copies = (w, m, v)
            patches.set_target(id(item.sources[0]), rows, item.copies)
            self.gather_s += time.perf_counter() - merged

    def parts(self) -> list[DeltaPart]:
        """The delta's blocks and their weights, m and v (after :meth:`run`)."""
        out: list[DeltaPart] = []
        for item in self.order:
            if not isinstance(item, _TableGather):
                block, copies = item
                out.append((block, tuple(c.numpy() for c in copies)))
            elif item.rows is not None and item.copies is not None:
                rows = item.rows.numpy().astype(np.int32)
                block = Block(item.start, item.width, item.width, rows)
                out.append((block, tuple(c.reshape(-1).numpy() for c in item.copies)))
        return out
