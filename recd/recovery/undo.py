"""Update-undo: take back an applied optimizer step, bit-exactly, without a snapshot (SwIFT).

Why. When a data-parallel rank dies, the survivors' replicas of the dense parameters are the
recovery source, but only if they agree: a survivor may have
applied the step the dead rank never finished. SwIFT's answer is to *undo* that step: Adam and
SGD are element-wise adds and scalar multiplies, invertible given a little extra state, so no
per-step snapshot (CheckFreq, Elastic Horovod: 12 bytes per parameter for w, m, v, copied
every step) is needed.

What must be kept (algebra in :mod:`recd.recovery.inverse`):

============================  ============================================  ===============
update                        kept per updated element                      bytes / element
============================  ============================================  ===============
Adam, AdamW (+L2/decay)       m before the step (first step: nothing)       4 + corrections
LazyAdam rows (fbgemm ADAM)   the touched rows' ids and m of those rows     4 + 8/E + corr.
SGD with momentum             the momentum buffer before (first: nothing)   4 + corrections
SGD without momentum          the weight before (a snapshot: see below)     4
============================  ============================================  ===============

Everything else is recomputed from the post-update state: Adam's applied increment depends
only on (m', v', t), so the weight needs nothing kept; v needs the gradient, which the kept m
gives back (``g = m + (m' - m) / (1 - beta1)``). Keeping the gradient instead (SwIFT's
wording) costs the same 4 bytes but leaves m to be inverted, ``m = (m' - (1 - beta1) g) /
beta1``, which loses information whenever ``|m'|`` is in a higher binade than ``|m|``:
measured, 46-55% of m's elements miss (up to 7e4 ulp), about one more byte per element of
corrections. The pre-update m is also exactly what the capture copies anyway. SGD without
momentum has no state to recover the gradient from: keeping the gradient costs the same 4
bytes as keeping the weight and still needs corrections, so the weight is kept.

Exactness, honestly. In float32 the algebraic inverse is *not* bit-exact in general:
``w' = fl(w + d)`` has several preimages when ``|w|`` is below ``|w'|``'s binade (small
weights, large steps), ``fl(beta2 v)`` merges neighbouring values, early steps' v is dominated
by the new ``g^2`` (v's low bits are lost), and the recovered gradient carries float64
rounding into v. Measured (``python -m recd.recovery.measure``, 200k random elements; step t):

=========================  ===========================  ==================================
update                     weight misses (max ulp)       v misses (max ulp)
=========================  ===========================  ==================================
Adam / L2 / AdamW          6% (508) t=1, 1-3% t>=2       58% t=2, 15% t=10, 0.9% (2) t=100
LazyAdam rows              1-3%                          40% t=2, 16% t=10, 2.4% (2) t=100
SGD momentum / nesterov    0.2-1.5%                      (buffer kept: exact)
DLRM ``small``, 12 steps   10% (7472)                    17.5% (fresh and young rows)
=========================  ===========================  ==================================

Large ulp counts come from values near zero (tiny weights, v of rows touched for the second
time). Recovery is made exact anyway by the cheapest correct means found: at capture time,
right after the step and while the pre-update values are still at hand, the capture runs
the inverse, compares it bitwise with the truth, and stores a
:class:`~recd.recovery.bits.Correction` for the misses (index + exact value, 8 bytes each, or
an int8 ulp offset per element + exceptions once more than 1/8 miss, whichever is smaller).
:func:`undo_step` recomputes the same candidates (same ops, same inputs: same bits) and
applies the corrections; this holds for any kernel (CUDA, ``foreach``, ``fused``): a kernel
the inverse does not mirror only costs more corrections (undo on the device and kernels the
capture ran on). A checksum of the post-update state
guards against undoing a record whose state has moved on; a checksum of the pre-update state
confirms the result (``UndoResult.exact``, for the audit trail). Not chosen: making the update
itself exactly invertible (e.g. keeping the rounding residual of ``w + d``): it costs a float
per element, as much as keeping the weight, and changes nothing for m and v; a full copy
(CheckFreq, Elastic Horovod) is the 12-byte baseline.

Cost. Persistent, per updated element: Adam 4 bytes kept + corrections, 4.15 bytes in steady
state on random tensors (5.1-5.6 in the first ten steps) against 12 for a snapshot of w, m,
v; SGD momentum 4.1 against 8. On ``models.DLRM`` of the ``small`` catalogue (5.06M
parameters, batch 512, ModelAdam): 483 kB per step, 6.2 bytes per updated element (4.5 kept:
m and the row ids; 1.7 corrections), i.e. 0.095 bytes per model parameter against 12 for a
full snapshot (126x less) and 12 per updated element for a snapshot of just the touched rows
(2x less). Transient, during the captured step only: the pre-update w, m, v of the updated
elements (12 bytes per element: a copy for dense parameters; for table rows the rows the
update gathers anyway), freed before the step returns.

Time. The capture does no work the update already did and pays per-op overhead once per
param group, not per tensor: a table's update returns the pre-update rows it gathered, the
new rows and its direction ``u`` (:class:`recd.optim.RowsStep`; the inverse would recompute
the same bits), so nothing is gathered or recomputed for the weight; the dense parameters of
a param group (same step) and the row updates of a step (same hyper-parameters) are each
flattened into one (roles x N) buffer (one copy, one inverse, one comparison per role, one
row-sum for every checksum); a comparison finds the mismatches with one ``ne`` +
``nonzero``; ulp offsets use an int32 xor map. Measured on the survivor job's model
(``benchmarks/recovery.py`` ``undo_capture``: 4 tables x 1000 x 8, batch 128, one thread,
best of 3 runs on a busy 2-core CPU): training step 3.4 ms, optimizer step 1.4 ms, captured
step 2.9 ms, i.e. an overhead of 0.44 of a training step (before this design: 4.5 ms, 1.9 ms,
8.9 ms, 1.55). On the ``small`` DLRM above (medians of 12 steps): optimizer step 7.4 ms,
captured step 16.6 ms, undo 8.0 ms, a full in-memory snapshot 53 ms, forward + backward
7.5 ms: the capture costs about one more update (the inverse and a comparison), far less
than copying the whole state.

One record is enough. A rank starts step k+1's update only after its gradient all-reduce of
step k+1 completed, which needs every rank to have contributed, i.e. to have finished step
k's update. So when a rank dies, every survivor has completed step k (the last step completed
by everyone is at least k) and is at most one update ahead (k+1, applied or partially
applied). :class:`UndoLog` therefore keeps only the last step's record, dropping the previous
one when the next step is captured. A step that raises part-way (e.g. a collective inside the
optimizer fails) is rolled back from the transient copy before the exception propagates:
a captured step is all or nothing, so "partially applied" never needs an undo.

Usage::

    log = UndoLog(optimizer)                  # ModelAdam, LazyAdam, torch Adam/AdamW, SGD
    loss.backward(); log.step(touched_rows=...)   # instead of optimizer.step(...)
    ...
    result = log.undo()                       # back to the state before the last step
    assert result.exact

An optimizer that applies its step in pieces builds the record with a :class:`StepCapture`:
``recd.optim.sharded_adam.ShardedAdam.step(capture=True)`` runs its dense ModelAdam through
:meth:`StepCapture.run` and each table shard through :meth:`StepCapture.update_rows` (in
place of :func:`recd.optim.lazy_adam_update_rows`, same bits), and returns the record.
:func:`update_rows_with_undo` captures a single row update.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from recd.errors import UndoError
from recd.optim.config import AdamHyper
from recd.optim.lazy_adam import LazyAdam, RowsStep, lazy_adam_update_rows
from recd.optim.model_adam import ModelAdam
from recd.recovery.bits import Inexactness
from recd.recovery.entries import (
    AdamParamUndo,
    CopiedRowsUndo,
    CopiedUndo,
    CounterUndo,
    Flats,
    LazyRowsUndo,
    ParamUndo,
    SgdHyper,
    SgdParamUndo,
    TableRows,
    flat_cat,
    stacked,
)

__all__ = [
    "UNDO_METHODS",
    "AdamParamUndo",
    "CounterUndo",
    "LazyRowsUndo",
    "ParamUndo",
    "SgdParamUndo",
    "StepCapture",
    "UndoLog",
    "UndoMethod",
    "UndoRecord",
    "UndoResult",
    "step_with_undo",
    "undo_step",
    "update_rows_with_undo",
]


UndoMethod = Literal["inverse", "copy"]
"""How a record takes a step back: ``inverse`` (SwIFT's algebra + corrections: 4-6 bytes per
updated element kept, an inverse pass at capture) or ``copy`` (the pre-update values the step
makes or reads anyway: 12 bytes per updated element kept, no work at capture)."""
UNDO_METHODS: tuple[UndoMethod, ...] = ("inverse", "copy")


# ----------------------------------------------------------------------------- records


@dataclass(kw_only=True, slots=True)
class UndoResult:
    """What :func:`undo_step` did."""

    step: int | None
    """The optimizer's step counter after the undo (None: it has none)."""
    exact: bool
    """Every restored tensor's checksum equals the captured pre-update one."""
    inexact: list[str]
    """Names of the parameters whose checksum did not match (empty when exact)."""


@dataclass(kw_only=True, slots=True, eq=False)
class UndoRecord:
    """Everything needed to take back one optimizer step (see the module docstring)."""

    step: int | None
    """The optimizer's step counter right after the captured step (None: it has none)."""
    params: list[ParamUndo]
    """One entry per updated parameter (or table shard)."""
    counters: list[CounterUndo] = field(default_factory=list)
    """Step counters the step advanced."""
    undone: bool = False

    @property
    def elements(self) -> int:
        """Weight elements the step changed."""
        return sum(p.elements for p in self.params)

    @property
    def nbytes(self) -> int:
        """Bytes the record holds (kept tensors, row ids and corrections)."""
        return sum(p.nbytes for p in self.params)

    @property
    def snapshot_nbytes(self) -> int:
        """Bytes a snapshot of the pre-update state of the same elements would hold."""
        return sum(p.snapshot_nbytes for p in self.params)

    def inexactness(self) -> dict[str, Inexactness]:
        """Per role (``weight``, ``exp_avg_sq``, ...), the pure inverse's misses over all
        entries (only when captured with ``measure=True``)."""
        out: dict[str, Inexactness] = {}
        for p in self.params:
            for role, stats in p.inexactness.items():
                out[role] = out[role].merge(stats) if role in out else stats
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-ready sizes and correction counts (for logs and the audit trail)."""
        corrected: dict[str, int] = {}
        for p in self.params:
            for role, fix in zip(p.roles, p.fixes, strict=True):
                if fix is not None:
                    corrected[role] = corrected.get(role, 0) + fix.mismatched
        return {
            "step": self.step,
            "params": len(self.params),
            "elements": self.elements,
            "record_bytes": self.nbytes,
            "kept_bytes": sum(p.kept_nbytes for p in self.params),
            "correction_bytes": sum(p.correction_nbytes for p in self.params),
            "snapshot_bytes": self.snapshot_nbytes,
            "corrected_elements": corrected,
        }

    def undo(self) -> UndoResult:
        """:func:`undo_step` of this record."""
        return undo_step(self)


def undo_step(record: UndoRecord) -> UndoResult:
    """Take back the step ``record`` captured: weights, optimizer state and step counters.

    Checks first that every parameter and counter is still in the captured post-update state
    (raises :class:`UndoError` otherwise, changing nothing), then restores all of them.
    """
    if record.undone:
        raise UndoError("this step was already undone")
    for counter in record.counters:
        if counter.read() != counter.after:
            raise UndoError(
                f"step counter {counter.key!r} is {counter.read()}, the captured step left "
                f"{counter.after}: another step ran since; cannot undo"
            )
    for entry in record.params:
        entry.check_after()
    inexact = [entry.name for entry in record.params if not entry.undo()]
    for counter in record.counters:
        counter.write(counter.before)
    record.undone = True
    step = None if record.step is None else record.step - 1
    return UndoResult(step=step, exact=not inexact, inexact=inexact)


# ----------------------------------------------------------------------------- capture


class StepCapture:
    """Builds the :class:`UndoRecord` of one optimizer step while the step runs.

    :meth:`run` captures a whole ``optimizer.step()``; an optimizer that applies its step in
    pieces (``recd.optim.sharded_adam.ShardedAdam``: a :class:`~recd.optim.ModelAdam`, then its
    table shards) calls :meth:`run` for the first piece, :meth:`update_rows` instead of
    :func:`recd.optim.lazy_adam_update_rows` for each shard and :meth:`counter` for its own
    step counter, then :meth:`finish`; if anything raises, :meth:`rollback` puts back every
    tensor and counter touched so far.

    Row updates are captured fused with the update itself: the update gathers the pre-update
    rows and computes the direction anyway and hands them over. Dense parameters are copied
    before the step (torch's kernels change them in place). :meth:`finish` computes the
    corrections once per group (a param group's dense parameters at one step; the row
    updates sharing hyper-parameters and step) and drops the pre-update values.

    ``method="copy"`` keeps those pre-update values instead (:class:`CopiedUndo`,
    :class:`CopiedRowsUndo`): :meth:`finish` then does no work at all, and the record holds
    12 bytes per updated element until it is dropped (see :data:`UndoMethod`).

    Args:
        names: ``(name, parameter)`` pairs naming the entries (default: ModelAdam's names,
            else ``param<i>`` in group order).
        measure: also record the pure inverse's bitwise error (extra passes; for reports;
            ``inverse`` only).
        method: ``inverse`` (default) or ``copy``.
    """

    def __init__(
        self,
        *,
        names: Iterable[tuple[str, torch.Tensor]] | None = None,
        measure: bool = False,
        method: UndoMethod = "inverse",
    ) -> None:
        if method not in UNDO_METHODS:
            raise UndoError(f"undo method must be one of {UNDO_METHODS}, got {method!r}")
        if measure and method != "inverse":
            raise UndoError("measure=True measures the inverse: it needs method='inverse'")
        self.measure = measure
        self.method = method
        self._names: dict[int, str] = {} if names is None else {id(p): n for n, p in names}
        self._entries: list[ParamUndo] = []
        """Every entry, in capture order."""
        self._pending: list[tuple[ParamUndo, Flats]] = []
        """Entries with their pre-update copies, corrected by :meth:`finish`."""
        self._rows: list[tuple[TableRows, AdamHyper, int, RowsStep]] = []
        """Row updates applied, with their pre-update rows, grouped by :meth:`finish`."""
        self._counters: list[CounterUndo] = []

    # ------------------------------------------------------------------ pieces
    def counter(self, target: Any, key: str) -> None:
        """Remember ``target[key]`` (a dict) or ``target.key`` before the step advances it."""
        counter = CounterUndo(target=target, key=key, before=0)
        counter.before = counter.read()
        self._counters.append(counter)

    def update_rows(
        self,
        weight: torch.Tensor,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
        rows: torch.Tensor,
        grad_rows: torch.Tensor,
        *,
        step: int,
        hyper: AdamHyper | None = None,
        name: str | None = None,
        **fields: Any,
    ) -> RowsStep:
        """:func:`recd.optim.lazy_adam_update_rows`, recorded (a :class:`recd.optim.RowUpdate`:
        pass it as ``LazyAdam.step(update_rows=...)``); returns what the update returns.

        ``name`` names the table in the record (default: its parameter's name). The update's
        pre-update rows are held until :meth:`finish`, which turns the row updates sharing
        hyper-parameters and step into one :class:`LazyRowsUndo`.
        """
        hyper = AdamHyper.of(hyper, fields)
        done = lazy_adam_update_rows(
            weight, exp_avg, exp_avg_sq, rows, grad_rows, hyper=hyper, step=step
        )
        table = TableRows(
            name=name or self._names.get(id(weight), "table"),
            weight=weight,
            exp_avg=exp_avg,
            exp_avg_sq=exp_avg_sq,
            rows=rows,
        )
        self._rows.append((table, hyper, step, done))
        return done

    def run(self, optimizer: Any, **step_kwargs: Any) -> int | None:
        """``optimizer.step(**step_kwargs)``, captured (see :func:`step_with_undo`).

        Returns the optimizer's step counter after the step (None: it has none). If the
        step raises, call :meth:`rollback`.
        """
        if isinstance(optimizer, ModelAdam):
            for n, p in optimizer.params.items():
                self._names.setdefault(id(p), n)
            if optimizer.dense is not None:
                self._prepare_adam(optimizer.dense)
            if optimizer.embeddings is not None:
                self._lazy_counters(optimizer.embeddings)
            self.counter(optimizer, "step_count")
            optimizer.step(**step_kwargs, update_rows=self.update_rows)
            step: int | None = optimizer.step_count
        elif isinstance(optimizer, LazyAdam):
            self._default_names(optimizer)
            self._lazy_counters(optimizer)
            optimizer.step(**step_kwargs, update_rows=self.update_rows)
            step = optimizer.step_count
        elif isinstance(optimizer, torch.optim.Adam):
            self._prepare_adam(optimizer)
            optimizer.step(**step_kwargs)
            step = None
        elif isinstance(optimizer, torch.optim.SGD):
            self._prepare_sgd(optimizer)
            optimizer.step(**step_kwargs)
            step = None
        else:
            raise UndoError(f"no update-undo for optimizer {type(optimizer).__name__}")
        return step

    def rollback(self) -> None:
        """Put back everything the step changed so far (it raised part-way)."""
        with torch.no_grad():
            for table, _, _, done in reversed(self._rows):
                befores = (done.weight_before, done.exp_avg_before, done.exp_avg_sq_before)
                for target, rows_before in zip(table.tensors(), befores, strict=True):
                    target.index_copy_(0, table.rows, rows_before)
            for entry, before in reversed(self._pending):
                entry.rollback(before)
        for counter in reversed(self._counters):
            counter.write(counter.before)
        self._entries, self._pending, self._rows, self._counters = [], [], [], []

    def finish(self, step: int | None) -> UndoRecord:
        """The record of the captured step (``step``: the step counter after it).

        ``inverse``: computes the corrections (the inverse against the pre-update copies) and
        drops the copies. ``copy``: keeps the copies (no work).
        """
        if self.method == "copy":
            return self._finish_copied(step)
        for entry, before in self._pending:
            entry.finish(before, measure=self.measure)
        self._pending = []
        for entry, parts in _group_rows(self._rows):
            self._entries.append(entry)
            entry.finish(
                stacked([[getattr(d, f"{r}_before") for d in parts] for r in _ROLES]),
                after=stacked([[getattr(d, f"{r}_after") for d in parts] for r in _ROLES]),
                measure=self.measure,
            )
        self._rows = []
        for counter in self._counters:
            counter.after = counter.read()
        return UndoRecord(step=step, params=self._entries, counters=self._counters)

    def _finish_copied(self, step: int | None) -> UndoRecord:
        entries: list[ParamUndo] = [
            CopiedUndo(
                name=entry.name,
                step=entry.step,
                roles=entry.roles,
                fixes=[None] * len(entry.roles),
                inner=entry,
                before=before,
            )
            for entry, before in self._pending
        ]
        if self._rows:
            tables = [table for table, _, _, _ in self._rows]
            entries.append(
                CopiedRowsUndo(
                    name=tables[0].name
                    if len(tables) == 1
                    else f"{tables[0].name} .. {tables[-1].name}",
                    step=self._rows[0][2],
                    roles=_ROLES,
                    fixes=[None] * len(_ROLES),
                    tables=tables,
                    befores=[
                        (d.weight_before, d.exp_avg_before, d.exp_avg_sq_before)
                        for _, _, _, d in self._rows
                    ],
                )
            )
        self._pending, self._rows = [], []
        for counter in self._counters:
            counter.after = counter.read()
        return UndoRecord(step=step, params=entries, counters=self._counters)

    # ------------------------------------------------------------------ preparation
    def _name(self, p: torch.Tensor, index: int) -> str:
        return self._names.get(id(p), f"param{index}")

    def _default_names(self, opt: torch.optim.Optimizer) -> None:
        params = [p for group in opt.param_groups for p in group["params"]]
        for index, p in enumerate(params):
            self._names.setdefault(id(p), f"param{index}")

    def _lazy_counters(self, opt: LazyAdam) -> None:
        for group in opt.param_groups:
            self.counter(group, "step")

    def _prepare_adam(self, opt: torch.optim.Adam) -> None:
        index = 0
        for group in opt.param_groups:
            hyper = _adam_hyper(group, type(opt).__name__)
            # One entry per (step, device): the members' flat tensors are concatenated.
            buckets: dict[tuple[int, bool, torch.device], list[tuple[str, torch.Tensor]]] = {}
            for p in group["params"]:
                name = self._name(p, index)
                index += 1
                if p.grad is None:
                    continue
                _check_param(p, name)
                state = opt.state.get(p, {})
                fresh = "exp_avg" not in state
                step = 1 if fresh else int(state["step"]) + 1
                buckets.setdefault((step, fresh, p.device), []).append((name, p))
            for (step, fresh, _), members in buckets.items():
                params = [p for _, p in members]
                if fresh:
                    before = _copy_stacked([params])
                    kept: torch.Tensor | None = None
                    roles: tuple[str, ...] = ("weight",)
                else:
                    states = [opt.state[p] for p in params]
                    before = _copy_stacked(
                        [params, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]]
                    )
                    kept = before[1] if self.method == "copy" else before[1].clone()
                    roles = ("weight", "exp_avg", "exp_avg_sq")
                names = tuple(n for n, _ in members)
                entry = AdamParamUndo(
                    name=names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}",
                    names=names,
                    step=step,
                    roles=roles,
                    params=params,
                    optimizer=opt,
                    hyper=hyper,
                    exp_avg_before=kept,
                )
                self._entries.append(entry)
                self._pending.append((entry, before))

    def _prepare_sgd(self, opt: torch.optim.SGD) -> None:
        index = 0
        for group in opt.param_groups:
            hyper = SgdHyper(
                lr=float(group["lr"]),
                momentum=float(group["momentum"]),
                dampening=float(group["dampening"]),
                weight_decay=float(group["weight_decay"]),
                nesterov=bool(group["nesterov"]),
                maximize=bool(group["maximize"]),
            )
            for p in group["params"]:
                name = self._name(p, index)
                index += 1
                if p.grad is None:
                    continue
                _check_param(p, name)
                buffer = opt.state.get(p, {}).get("momentum_buffer")
                kept_weight = None
                if hyper.momentum != 0 and buffer is not None:
                    before = list(_copy_stacked([[p], [buffer]]))
                    kept: torch.Tensor | None = before[1]
                    roles: tuple[str, ...] = ("weight", "momentum_buffer")
                else:
                    before, kept, roles = list(_copy_stacked([[p]])), None, ("weight",)
                    if hyper.momentum == 0:
                        kept_weight = before[0]
                entry = SgdParamUndo(
                    name=name,
                    step=None,
                    roles=roles,
                    param=p,
                    optimizer=opt,
                    hyper=hyper,
                    buffer_before=kept,
                    weight_before=kept_weight,
                )
                self._entries.append(entry)
                self._pending.append((entry, before))


_ROLES = ("weight", "exp_avg", "exp_avg_sq")


def _group_rows(
    updates: list[tuple[TableRows, AdamHyper, int, RowsStep]],
) -> list[tuple[LazyRowsUndo, list[RowsStep]]]:
    """One :class:`LazyRowsUndo` per (hyper-parameters, step, device) of the row updates, in
    order (a table updated twice starts a new one: its second update undoes first)."""
    groups: list[tuple[LazyRowsUndo, list[RowsStep]]] = []
    open_: dict[tuple[AdamHyper, int, torch.device], int] = {}
    for table, hyper, step, done in updates:
        key = (hyper, step, table.weight.device)
        at = open_.get(key)
        if at is not None and any(t.weight is table.weight for t in groups[at][0].tables):
            at = None
        if at is None:
            open_[key] = len(groups)
            entry = LazyRowsUndo(
                name=table.name,
                step=step,
                roles=_ROLES,
                tables=[],
                hyper=hyper,
                exp_avg_before=done.exp_avg_before,  # replaced below
            )
            groups.append((entry, []))
            at = open_[key]
        entry, parts = groups[at]
        entry.tables.append(table)
        parts.append(done)
    for entry, parts in groups:
        if len(entry.tables) > 1:
            entry.name = f"{entry.tables[0].name} .. {entry.tables[-1].name}"
        entry.exp_avg_before = flat_cat([d.exp_avg_before for d in parts])
        entry.direction = flat_cat([d.direction for d in parts])
    return groups


def _copy_stacked(roles: list[list[torch.Tensor]]) -> torch.Tensor:
    """The transient pre-update values: a (roles x N) copy (:func:`stacked`)."""
    with torch.no_grad():
        out = stacked(roles)
        return out.clone() if sum(len(r) for r in roles) == 1 else out


def _adam_hyper(group: Mapping[str, Any], where: str) -> AdamHyper:
    if group.get("amsgrad"):
        raise UndoError(f"{where}: AMSGrad's running maximum has no inverse")
    return AdamHyper.from_group(group)


def _check_param(p: torch.Tensor, name: str) -> None:
    if p.dtype != torch.float32:
        raise UndoError(f"{name}: update-undo needs float32 parameters, got {p.dtype}")
    if p.grad is not None and p.grad.is_sparse:
        raise UndoError(f"{name}: sparse gradient (use LazyAdam for embedding tables)")


def step_with_undo(
    optimizer: Any,
    *,
    names: Iterable[tuple[str, torch.Tensor]] | None = None,
    measure: bool = False,
    method: UndoMethod = "inverse",
    **step_kwargs: Any,
) -> UndoRecord:
    """``optimizer.step(**step_kwargs)``, returning the record that takes it back.

    Args:
        optimizer: a :class:`recd.optim.ModelAdam`, :class:`recd.optim.LazyAdam`,
            ``torch.optim.Adam`` / ``AdamW`` (not AMSGrad) or ``torch.optim.SGD``.
        names: ``(name, parameter)`` pairs (e.g. ``model.named_parameters()``) to name the
            entries (default: ModelAdam's names, else ``param<i>`` in group order).
        measure: also record the pure inverse's bitwise error (extra passes; for reports).
        method: ``inverse`` or ``copy`` (:data:`UndoMethod`).
        step_kwargs: passed to ``step`` (``touched_rows=`` for ModelAdam / LazyAdam).

    If the step raises, every parameter, state tensor and counter it touched is put back
    before the exception propagates.
    """
    capture = StepCapture(names=names, measure=measure, method=method)
    try:
        step = capture.run(optimizer, **step_kwargs)
    except BaseException:
        capture.rollback()
        raise
    return capture.finish(step)


def update_rows_with_undo(
    weight: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    rows: torch.Tensor,
    grad_rows: torch.Tensor,
    *,
    name: str,
    step: int,
    hyper: AdamHyper | None = None,
    measure: bool = False,
    **fields: Any,
) -> LazyRowsUndo:
    """:func:`recd.optim.lazy_adam_update_rows`, returning the entry that takes it back.

    Arguments as ``lazy_adam_update_rows`` (``rows`` unique); ``name`` names the entry.
    Collect entries into an :class:`UndoRecord` with the step counters, or use
    :class:`StepCapture`, which does that.
    """
    capture = StepCapture(measure=measure)
    capture.update_rows(
        weight,
        exp_avg,
        exp_avg_sq,
        rows,
        grad_rows,
        hyper=AdamHyper.of(hyper, fields),
        step=step,
        name=name,
    )
    (entry,) = capture.finish(step).params
    assert isinstance(entry, LazyRowsUndo)
    return entry


# ----------------------------------------------------------------------------- the log


class UndoLog:
    """The last optimizer step's :class:`UndoRecord` (one is enough: module docstring).

    Args:
        optimizer: what :func:`step_with_undo` accepts.
        names: ``(name, parameter)`` pairs naming the entries.
        method: ``inverse`` or ``copy`` (:data:`UndoMethod`).
    """

    def __init__(
        self,
        optimizer: Any,
        *,
        names: Iterable[tuple[str, torch.Tensor]] | None = None,
        method: UndoMethod = "inverse",
    ) -> None:
        self.optimizer = optimizer
        self.method: UndoMethod = method
        self.names = None if names is None else list(names)
        self.record: UndoRecord | None = None
        """The last captured step's record (None: none, or it was undone/cleared)."""

    def step(self, **step_kwargs: Any) -> UndoRecord:
        """Run ``optimizer.step(**step_kwargs)`` capturing its record.

        The previous record is dropped first (its step is complete on every rank once this
        step's gradients were all-reduced), so only one record's memory is ever held.
        """
        self.record = None
        self.record = step_with_undo(
            self.optimizer, names=self.names, method=self.method, **step_kwargs
        )
        return self.record

    def undo(self) -> UndoResult:
        """Take back the last captured step (raises :class:`UndoError` when there is none)."""
        if self.record is None:
            raise UndoError("no captured step to undo (none yet, or already undone)")
        record, self.record = self.record, None
        return undo_step(record)

    def clear(self) -> None:
        """Drop the record (e.g. after a checkpoint or once every rank passed the step)."""
        self.record = None

    @property
    def nbytes(self) -> int:
        """Bytes the held record takes (0 when none)."""
        return 0 if self.record is None else self.record.nbytes
