"""What an undo record holds for each updated tensor group, and how each one is taken back.

One :class:`ParamUndo` subclass per update: :class:`AdamParamUndo` (``torch.optim.Adam`` /
``AdamW``, one parameter), :class:`LazyRowsUndo` (row-sparse Adam, the touched rows of one
table or shard), :class:`SgdParamUndo` (``torch.optim.SGD``, one parameter); for the ``copy``
method, :class:`CopiedUndo` (any of those, from a copy of its pre-update tensors) and
:class:`CopiedRowsUndo` (row updates, from the rows they gathered); plus
:class:`CounterUndo` for step counters. The design (what is kept, the corrections, the
checksums) is in :mod:`recd.recovery.undo`; the inverse formulas in
:mod:`recd.recovery.inverse`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._utils import _flatten_dense_tensors  # flatten + cat in one C++ call (as DDP)

from recd.errors import UndoError
from recd.optim.config import AdamHyper
from recd.recovery.bits import Correction, Inexactness, bits_checksums, measure_inexactness
from recd.recovery.inverse import (
    adam_second_moment_before,
    adam_weight_before,
    lazy_adam_rows_before,
    sgd_weight_before,
)

__all__ = [
    "AdamParamUndo",
    "CopiedRowsUndo",
    "CopiedUndo",
    "CounterUndo",
    "Flats",
    "LazyRowsUndo",
    "ParamUndo",
    "SgdHyper",
    "SgdParamUndo",
    "TableRows",
    "flat_cat",
    "stacked",
]


Flats = Sequence[torch.Tensor] | torch.Tensor
"""Flat tensors, one per role: a list, or the rows of a (roles x N) tensor (:func:`stacked`)."""


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1)


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


@dataclass(kw_only=True, slots=True, eq=False)
class ParamUndo:
    """Undo of one update of a parameter (or of some rows of a table) and its optimizer state.

    Subclasses say which tensors the update changed (``_after``), how the inverse computes
    their pre-update values (``_candidates``) and how to put them back (``_write``). The
    pre-update tensors, in ``roles`` order, are flat float32; ``None`` among the candidates
    marks a tensor that did not exist before the step (first step: no optimizer state).
    """

    name: str
    """Parameter name (``rows`` of a table: the table's name)."""
    step: int | None
    """The step counter the update used (Adam, LazyAdam: t >= 1; SGD: None)."""
    roles: tuple[str, ...] = ()
    """Names of the pre-update tensors: ``weight`` first, then optimizer state."""
    fixes: list[Correction | None] = field(default_factory=list)
    """Per role: the correction of the inverse's candidate (None: kept exactly)."""
    pre_sums: list[int] = field(default_factory=list)
    """Checksums of the pre-update tensors (what a correct undo must reproduce)."""
    post_sums: list[int] = field(default_factory=list)
    """Checksums of ``_after()`` at capture (the state an undo expects to find)."""
    inexactness: dict[str, Inexactness] = field(default_factory=dict)
    """Per role, the pure inverse's distance from the truth (capture with ``measure=True``)."""

    # -- what subclasses provide
    def _after(self) -> Flats:
        raise NotImplementedError

    def _candidates(self, after: Flats) -> list[torch.Tensor]:
        raise NotImplementedError

    def _write(self, before: Flats) -> None:
        raise NotImplementedError

    @property
    def kept_nbytes(self) -> int:
        """Bytes of what the inverse needs besides the post-update state."""
        raise NotImplementedError

    @property
    def elements(self) -> int:
        """Weight elements the update changed."""
        raise NotImplementedError

    # -- shared mechanics
    @property
    def correction_nbytes(self) -> int:
        return sum(f.nbytes for f in self.fixes if f is not None)

    @property
    def nbytes(self) -> int:
        """Bytes this entry holds (kept tensors + corrections)."""
        return self.kept_nbytes + self.correction_nbytes

    @property
    def snapshot_nbytes(self) -> int:
        """Bytes a snapshot of the same pre-update tensors would hold."""
        return 4 * self.elements * len(self.roles)

    def _live(self) -> Flats:
        """``_after()`` without its consistency checks (at capture, right after the step)."""
        return self._after()

    def _kept(self) -> tuple[torch.Tensor | None, ...]:
        """The pre-update tensors the entry keeps as they were (their candidates are exact)."""
        return ()

    def finish(
        self,
        before: Flats,
        *,
        after: Flats | None = None,
        measure: bool = False,
    ) -> None:
        """At capture, right after the step: corrections of the candidates against ``before``.

        ``before``: the pre-update tensors, flat, in ``roles`` order (a list, or the rows of
        a :func:`stacked` tensor: one checksum pass). ``after``: the post-update tensors when
        the caller has them at hand (``_after()`` order: the same values ``_after()`` would
        gather); default gathered.
        """
        with torch.no_grad():
            after = self._live() if after is None else after
            candidates = self._candidates(after)
            kept = self._kept()
            self.fixes = []
            for role, cand, true in zip(self.roles, candidates, before, strict=True):
                if cand is true or any(cand is k for k in kept):
                    self.fixes.append(None)
                    continue
                if measure:
                    self.inexactness[role] = measure_inexactness(cand, true)
                self.fixes.append(Correction.between(cand, true))
            self.pre_sums = bits_checksums(before)
            self.post_sums = bits_checksums(after)

    def rollback(self, before: Flats) -> None:
        """Put the pre-update tensors back (the step raised part-way)."""
        with torch.no_grad():
            self._write(before)

    def check_after(self) -> None:
        """Raise :class:`UndoError` unless the live state is the captured post-update state."""
        with torch.no_grad():
            sums = bits_checksums(self._after())
        if sums != self.post_sums:
            raise UndoError(
                f"{self.name}: its weights or optimizer state changed since the step was "
                "captured (already undone, or another step ran); cannot undo"
            )

    def undo(self) -> bool:
        """Restore the pre-update tensors; True when their checksums match the captured ones."""
        with torch.no_grad():
            candidates = self._candidates(self._after())
            before = [
                cand if fix is None else fix.apply(cand)
                for cand, fix in zip(candidates, self.fixes, strict=True)
            ]
            self._write(before)
            return bits_checksums(before) == self.pre_sums


@dataclass(kw_only=True, slots=True, eq=False)
class AdamParamUndo(ParamUndo):
    """One ``torch.optim.Adam``/``AdamW`` update of some parameters of one param group.

    The parameters share the hyper-parameters and the step counter; their tensors are taken
    flat and concatenated in ``params`` order, so the inverse, the comparison and the
    checksums run once for all of them (a model's many small dense tensors cost one pass).
    """

    params: list[torch.Tensor]
    names: tuple[str, ...]
    """One name per parameter (``name`` is the entry's: the first, or a range)."""
    optimizer: torch.optim.Optimizer
    hyper: AdamHyper
    exp_avg_before: torch.Tensor | None
    """Flat m of every parameter before the step, kept; None when they had no state (first
    step)."""

    def _states(self) -> list[dict[str, Any]]:
        return [self.optimizer.state.get(p, {}) for p in self.params]

    def _after(self) -> Flats:
        for name, state in zip(self.names, self._states(), strict=True):
            if "exp_avg" not in state or int(state["step"]) != self.step:
                raise UndoError(f"{name}: Adam state is not at step {self.step}; cannot undo")
        return self._live()

    def _live(self) -> Flats:
        states = self._states()
        return stacked(
            [self.params, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]]
        )

    def _kept(self) -> tuple[torch.Tensor | None, ...]:
        return (self.exp_avg_before,)

    def _candidates(self, after: Flats) -> list[torch.Tensor]:
        w, m, v = after
        assert self.step is not None
        weight = adam_weight_before(w, m, v, hyper=self.hyper, step=self.step)
        if self.exp_avg_before is None:
            return [weight]
        v_before = adam_second_moment_before(v, m, self.exp_avg_before, hyper=self.hyper)
        return [weight, self.exp_avg_before, v_before]

    def _write(self, before: Flats) -> None:
        sizes = [p.numel() for p in self.params]
        for p, w in zip(self.params, before[0].split(sizes), strict=True):
            p.copy_(w.view_as(p))
        if self.exp_avg_before is None:
            for p in self.params:
                self.optimizer.state.pop(p, None)
            return
        assert self.step is not None
        pieces = zip(self.params, before[1].split(sizes), before[2].split(sizes), strict=True)
        for p, m, v in pieces:
            state = self.optimizer.state[p]
            state["exp_avg"].copy_(m.view_as(p))
            state["exp_avg_sq"].copy_(v.view_as(p))
            state["step"].fill_(self.step - 1)

    @property
    def kept_nbytes(self) -> int:
        return _nbytes(self.exp_avg_before)

    @property
    def elements(self) -> int:
        return sum(p.numel() for p in self.params)


def flat_cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors flattened and concatenated: (sum of numels,) (one tensor: a view).

    Call under ``torch.no_grad()`` (parameters are not detached one by one).
    """
    if len(tensors) == 1:
        return _flat(tensors[0])
    return _flatten_dense_tensors(tensors)


def stacked(roles: list[list[torch.Tensor]]) -> torch.Tensor:
    """A (len(roles) x N) tensor: row i holds ``roles[i]``'s tensors flattened and
    concatenated (every role has N elements). One copy for all (a view when there is a
    single tensor), and one row-sum gives every role's checksum
    (:func:`recd.recovery.bits.bits_checksums`). Call under ``no_grad``."""
    return _flatten_dense_tensors([t for tensors in roles for t in tensors]).view(len(roles), -1)


@dataclass(kw_only=True, slots=True, eq=False)
class TableRows:
    """The rows one row-sparse update touched in one table (or table shard)."""

    name: str
    weight: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    """The live (num_rows x E) table and its moments."""
    rows: torch.Tensor
    """(R,) int64 unique rows the update touched; no other row changed."""

    @property
    def elements(self) -> int:
        return self.rows.numel() * self.weight.shape[1]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.weight, self.exp_avg, self.exp_avg_sq


@dataclass(kw_only=True, slots=True, eq=False)
class LazyRowsUndo(ParamUndo):
    """One row-sparse Adam update of the touched rows of some tables (or table shards).

    The tables share the hyper-parameters and the step; their touched rows are taken flat
    and concatenated in ``tables`` order, so the inverse, the comparison and the checksums
    run once for all of them.
    """

    tables: list[TableRows]
    hyper: AdamHyper
    exp_avg_before: torch.Tensor
    """(sum R * E,) m of those rows before the step, kept."""
    direction: torch.Tensor | None = None
    """Transient, at capture only: the update's direction ``u`` (:class:`recd.optim.RowsStep`),
    the bits the inverse would recompute from m', v'; consumed by the first candidates."""

    def _after(self) -> Flats:
        return stacked(
            [[t.tensors()[role].index_select(0, t.rows) for t in self.tables] for role in range(3)]
        )

    def _kept(self) -> tuple[torch.Tensor | None, ...]:
        return (self.exp_avg_before,)

    def _candidates(self, after: Flats) -> list[torch.Tensor]:
        w, m, v = after
        assert self.step is not None
        direction, self.direction = self.direction, None
        weight, v_before = lazy_adam_rows_before(
            w, m, v, self.exp_avg_before, hyper=self.hyper, step=self.step, direction=direction
        )
        return [weight, self.exp_avg_before, v_before]

    def _write(self, before: Flats) -> None:
        sizes = [t.elements for t in self.tables]
        for role, flat in enumerate(before):
            for t, rows_before in zip(self.tables, flat.split(sizes), strict=True):
                target = t.tensors()[role]
                target.index_copy_(0, t.rows, rows_before.view(-1, target.shape[1]))

    @property
    def kept_nbytes(self) -> int:
        return _nbytes(self.exp_avg_before) + sum(_nbytes(t.rows) for t in self.tables)

    @property
    def elements(self) -> int:
        return sum(t.elements for t in self.tables)


@dataclass(kw_only=True, slots=True, frozen=True)
class SgdHyper:
    """The hyper-parameters of a ``torch.optim.SGD`` update."""

    lr: float
    momentum: float
    dampening: float
    weight_decay: float
    nesterov: bool
    maximize: bool


@dataclass(kw_only=True, slots=True, eq=False)
class SgdParamUndo(ParamUndo):
    """One ``torch.optim.SGD`` update of one parameter."""

    param: torch.Tensor
    optimizer: torch.optim.Optimizer
    hyper: SgdHyper
    buffer_before: torch.Tensor | None
    """Flat momentum buffer before the step, kept; None without momentum or on the step that
    created the buffer."""
    weight_before: torch.Tensor | None
    """Flat weight before the step, kept only without momentum: the inverse would need the
    gradient, which costs the same 4 bytes and still misses some elements."""

    def _kept(self) -> tuple[torch.Tensor | None, ...]:
        return (self.buffer_before, self.weight_before)

    def _after(self) -> Flats:
        if self.hyper.momentum == 0:
            return [_flat(self.param)]
        buffer = self.optimizer.state.get(self.param, {}).get("momentum_buffer")
        if buffer is None:
            raise UndoError(f"{self.name}: SGD has no momentum buffer; cannot undo")
        return [_flat(self.param), _flat(buffer)]

    def _candidates(self, after: Flats) -> list[torch.Tensor]:
        h = self.hyper
        if self.weight_before is not None:
            return [self.weight_before]
        weight = sgd_weight_before(
            after[0],
            lr=h.lr,
            momentum=h.momentum,
            dampening=h.dampening,
            weight_decay=h.weight_decay,
            nesterov=h.nesterov,
            maximize=h.maximize,
            buffer_after=after[1] if len(after) > 1 else None,
            buffer_before=self.buffer_before,
        )
        return [weight] if self.buffer_before is None else [weight, self.buffer_before]

    def _write(self, before: Flats) -> None:
        self.param.copy_(before[0].view_as(self.param))
        if self.hyper.momentum == 0:
            return
        if self.buffer_before is None:
            self.optimizer.state.pop(self.param, None)
        else:
            self.optimizer.state[self.param]["momentum_buffer"].copy_(before[1].view_as(self.param))

    @property
    def kept_nbytes(self) -> int:
        return _nbytes(self.buffer_before) + _nbytes(self.weight_before)

    @property
    def elements(self) -> int:
        return self.param.numel()


@dataclass(kw_only=True, slots=True, eq=False)
class CopiedUndo(ParamUndo):
    """Another entry's update, taken back from a copy of its pre-update tensors (the
    ``copy`` method of :class:`recd.recovery.undo.StepCapture`).

    ``before`` is the copy the capture made before the step anyway (torch's kernels update
    dense parameters in place); keeping it instead of computing corrections against it costs
    no time at capture and 4 bytes per role per element of memory. The undo writes it back
    through ``inner``: bit-exact by construction. No checksums: the record's step counters
    and ``inner``'s own state checks (an Adam state at another step) guard against undoing a
    state another step has moved on.
    """

    inner: ParamUndo
    """The entry whose ``_write`` restores the tensors (its corrections are never made)."""
    before: Flats
    """The pre-update tensors, flat, in ``inner.roles`` order."""

    def _after(self) -> Flats:
        return self.inner._after()

    def _write(self, before: Flats) -> None:
        self.inner._write(before)

    def check_after(self) -> None:
        """``inner``'s state checks (raises :class:`UndoError`); no checksums."""
        with torch.no_grad():
            self.inner._after()

    def undo(self) -> bool:
        with torch.no_grad():
            self.inner._write(self.before)
        return True

    @property
    def kept_nbytes(self) -> int:
        return 4 * self.inner.elements * len(self.roles)

    @property
    def elements(self) -> int:
        return self.inner.elements


@dataclass(kw_only=True, slots=True, eq=False)
class CopiedRowsUndo(ParamUndo):
    """Row-sparse Adam updates taken back from the pre-update rows the updates gathered
    (:class:`recd.optim.RowsStep`): the update reads them before it writes, so keeping them
    costs no time, only their memory (12 bytes per touched element) until the next step."""

    tables: list[TableRows]
    """The tables (or shards) and rows, in update order."""
    befores: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    """Per update: the (R x E) weight, m and v rows before it."""

    def _after(self) -> Flats:
        return stacked(
            [[t.tensors()[role].index_select(0, t.rows) for t in self.tables] for role in range(3)]
        )

    def _write(self, before: Flats) -> None:
        raise UndoError(f"{self.name}: restored from its kept rows only (undo)")

    def check_after(self) -> None:
        """Nothing to check beyond the record's counters (as :class:`CopiedUndo`)."""

    def undo(self) -> bool:
        with torch.no_grad():  # newest first: a table updated twice ends as before the first
            pairs = zip(reversed(self.tables), reversed(self.befores), strict=True)
            for table, rows_before in pairs:
                for target, values in zip(table.tensors(), rows_before, strict=True):
                    target.index_copy_(0, table.rows, values)
        return True

    @property
    def kept_nbytes(self) -> int:
        return sum(_nbytes(t) for b in self.befores for t in b) + sum(
            _nbytes(t.rows) for t in self.tables
        )

    @property
    def elements(self) -> int:
        return sum(t.elements for t in self.tables)


@dataclass(kw_only=True, slots=True, eq=False)
class CounterUndo:
    """A step counter to put back: ``target[key]`` (a param-group dict) or ``target.key``."""

    target: Any
    key: str
    before: int
    after: int = -1
    """Its value right after the captured step."""

    def read(self) -> int:
        if isinstance(self.target, dict):
            return int(self.target[self.key])
        return int(getattr(self.target, self.key))

    def write(self, value: int) -> None:
        if isinstance(self.target, dict):
            self.target[self.key] = value
        else:
            setattr(self.target, self.key, value)
