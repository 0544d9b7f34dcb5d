"""Update-undo: take back an applied optimizer step, bit-exactly, without a snapshot (SwIFT).

Why. When a data-parallel rank dies, the survivors' replicas of the dense parameters are the
recovery source (``shared/specs/recovery.md``), but only if they agree: a survivor may have
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
parameters, batch 512, ModelAdam): 476 kB per step, 6.1 bytes per updated element (4.5 kept:
m and the row ids; 1.6 corrections), i.e. 0.094 bytes per model parameter against 12 for a
full snapshot (128x less) and 12 per updated element for a snapshot of just the touched rows
(2x less). Transient, during the captured step only: a copy of the pre-update weight and v
(8 bytes per updated element), freed before the step returns. Time (same model, best of 12
on a busy 2-core CPU): optimizer step 18 ms, captured step 72 ms, undo 61 ms, a full
in-memory snapshot 157 ms, forward + backward 30 ms: the capture costs about the inverse and
a comparison (a few times the update), less than copying the whole state.

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

A sharded optimizer can build records from parts: :func:`update_rows_with_undo` wraps
:func:`recd.optim.lazy_adam_update_rows` for one table shard, :func:`step_with_undo` the
dense ModelAdam, and :class:`UndoRecord` takes both plus the step counters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from recd.errors import UndoError
from recd.optim import LazyAdam, ModelAdam, lazy_adam_update_rows
from recd.recovery.bits import Inexactness
from recd.recovery.entries import (
    AdamHyper,
    AdamParamUndo,
    CounterUndo,
    LazyHyper,
    LazyRowsUndo,
    ParamUndo,
    SgdHyper,
    SgdParamUndo,
)

__all__ = [
    "AdamParamUndo",
    "CounterUndo",
    "LazyRowsUndo",
    "ParamUndo",
    "SgdParamUndo",
    "UndoLog",
    "UndoRecord",
    "UndoResult",
    "step_with_undo",
    "undo_step",
    "update_rows_with_undo",
]


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


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A flat copy (the transient pre-update value)."""
    return t.detach().reshape(-1).clone()


@dataclass(kw_only=True, slots=True, eq=False)
class _Pending:
    """Entries of a step about to run, each with its transient pre-update copies."""

    entries: list[tuple[ParamUndo, list[torch.Tensor]]] = field(default_factory=list)
    counters: list[CounterUndo] = field(default_factory=list)

    def rollback(self) -> None:
        for entry, before in self.entries:
            entry.rollback(before)
        for counter in self.counters:
            counter.write(counter.before)

    def finish(self, step: int | None, *, measure: bool) -> UndoRecord:
        for entry, before in self.entries:
            entry.finish(before, measure=measure)
        for counter in self.counters:
            counter.after = counter.read()
        record = UndoRecord(step=step, params=[e for e, _ in self.entries], counters=self.counters)
        self.entries = []
        return record


def step_with_undo(
    optimizer: Any,
    *,
    names: Iterable[tuple[str, torch.Tensor]] | None = None,
    measure: bool = False,
    **step_kwargs: Any,
) -> UndoRecord:
    """``optimizer.step(**step_kwargs)``, returning the record that takes it back.

    Args:
        optimizer: a :class:`recd.optim.ModelAdam`, :class:`recd.optim.LazyAdam`,
            ``torch.optim.Adam`` / ``AdamW`` (not AMSGrad) or ``torch.optim.SGD``.
        names: ``(name, parameter)`` pairs (e.g. ``model.named_parameters()``) to name the
            entries (default: ModelAdam's names, else ``param<i>`` in group order).
        measure: also record the pure inverse's bitwise error (extra passes; for reports).
        step_kwargs: passed to ``step`` (``touched_rows=`` for ModelAdam / LazyAdam).

    If the step raises, every parameter, state tensor and counter it touched is put back
    before the exception propagates.
    """
    by_id = {id(p): n for n, p in names} if names is not None else None
    pending = _Pending()
    if isinstance(optimizer, ModelAdam):
        step = _prepare_model_adam(optimizer, pending, step_kwargs.get("touched_rows"))
    elif isinstance(optimizer, LazyAdam):
        rows = step_kwargs.get("touched_rows")
        _prepare_lazy(optimizer, pending, by_id, rows)
        step = optimizer.step_count + 1
    elif isinstance(optimizer, torch.optim.Adam):
        _prepare_adam(optimizer, pending, by_id)
        step = None
    elif isinstance(optimizer, torch.optim.SGD):
        _prepare_sgd(optimizer, pending, by_id)
        step = None
    else:
        raise UndoError(f"no update-undo for optimizer {type(optimizer).__name__}")
    try:
        optimizer.step(**step_kwargs)
    except BaseException:
        pending.rollback()
        raise
    return pending.finish(step, measure=measure)


def _name(by_id: Mapping[int, str] | None, p: torch.Tensor, index: int) -> str:
    return by_id.get(id(p), f"param{index}") if by_id is not None else f"param{index}"


def _prepare_model_adam(
    opt: ModelAdam, pending: _Pending, touched_rows: Mapping[str, torch.Tensor] | None
) -> int:
    by_id = {id(p): n for n, p in opt.params.items()}
    if opt.dense is not None:
        _prepare_adam(opt.dense, pending, by_id)
    if opt.embeddings is not None:
        rows = None
        if touched_rows is not None:
            rows = {opt.params[n]: r for n, r in touched_rows.items() if n in opt.params}
        _prepare_lazy(opt.embeddings, pending, by_id, rows)
    pending.counters.append(CounterUndo(target=opt, key="step_count", before=opt.step_count))
    return opt.step_count + 1


def _adam_hyper(group: Mapping[str, Any], where: str) -> AdamHyper:
    if group.get("amsgrad"):
        raise UndoError(f"{where}: AMSGrad's running maximum has no inverse")
    beta1, beta2 = (float(b) for b in group["betas"])
    return AdamHyper(
        lr=float(group["lr"]),
        beta1=beta1,
        beta2=beta2,
        eps=float(group["eps"]),
        weight_decay=float(group["weight_decay"]),
        decoupled=bool(group.get("decoupled_weight_decay", False)),
    )


def _check_param(p: torch.Tensor, name: str) -> None:
    if p.dtype != torch.float32:
        raise UndoError(f"{name}: update-undo needs float32 parameters, got {p.dtype}")
    if p.grad is not None and p.grad.is_sparse:
        raise UndoError(f"{name}: sparse gradient (use LazyAdam for embedding tables)")


def _prepare_adam(
    opt: torch.optim.Adam, pending: _Pending, by_id: Mapping[int, str] | None
) -> None:
    index = 0
    for group in opt.param_groups:
        hyper = _adam_hyper(group, type(opt).__name__)
        for p in group["params"]:
            name = _name(by_id, p, index)
            index += 1
            if p.grad is None:
                continue
            _check_param(p, name)
            state = opt.state.get(p, {})
            if "exp_avg" in state:
                step = int(state["step"]) + 1
                before = [_copy(p), _copy(state["exp_avg"]), _copy(state["exp_avg_sq"])]
                kept: torch.Tensor | None = before[1]
                roles: tuple[str, ...] = ("weight", "exp_avg", "exp_avg_sq")
            else:
                step, before, kept, roles = 1, [_copy(p)], None, ("weight",)
            entry = AdamParamUndo(
                name=name,
                step=step,
                roles=roles,
                param=p,
                optimizer=opt,
                hyper=hyper,
                exp_avg_before=kept,
            )
            pending.entries.append((entry, before))


def _prepare_lazy(
    opt: LazyAdam,
    pending: _Pending,
    by_id: Mapping[int, str] | None,
    touched_rows: Mapping[torch.Tensor, torch.Tensor] | None,
) -> None:
    index = 0
    for group in opt.param_groups:
        pending.counters.append(CounterUndo(target=group, key="step", before=int(group["step"])))
        beta1, beta2 = group["betas"]
        hyper = LazyHyper(
            lr=float(group["lr"]),
            beta1=float(beta1),
            beta2=float(beta2),
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
        )
        for p in group["params"]:
            name = _name(by_id, p, index)
            index += 1
            if p.grad is not None and p.grad.is_sparse and not p.grad.is_coalesced():
                p.grad = p.grad.coalesce()  # once here; LazyAdam.step then reuses it
            touched = LazyAdam._touched(p, touched_rows)
            if touched is None or touched[0].numel() == 0:
                continue
            state = opt.state[p]
            entry, before = _lazy_entry(
                name,
                p.detach(),
                state["exp_avg"],
                state["exp_avg_sq"],
                touched[0],
                hyper=hyper,
                step=int(group["step"]) + 1,
            )
            pending.entries.append((entry, before))


def _lazy_entry(
    name: str,
    weight: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    rows: torch.Tensor,
    *,
    hyper: LazyHyper,
    step: int,
) -> tuple[LazyRowsUndo, list[torch.Tensor]]:
    rows = rows.to(device=weight.device, dtype=torch.int64)
    before = [t.detach().index_select(0, rows).reshape(-1) for t in (weight, exp_avg, exp_avg_sq)]
    entry = LazyRowsUndo(
        name=name,
        step=step,
        roles=("weight", "exp_avg", "exp_avg_sq"),
        weight=weight,
        exp_avg=exp_avg,
        exp_avg_sq=exp_avg_sq,
        rows=rows,
        hyper=hyper,
        exp_avg_before=before[1],
    )
    return entry, before


def _prepare_sgd(opt: torch.optim.SGD, pending: _Pending, by_id: Mapping[int, str] | None) -> None:
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
            name = _name(by_id, p, index)
            index += 1
            if p.grad is None:
                continue
            _check_param(p, name)
            buffer = opt.state.get(p, {}).get("momentum_buffer")
            kept_weight = None
            if hyper.momentum != 0 and buffer is not None:
                before = [_copy(p), _copy(buffer)]
                kept: torch.Tensor | None = before[1]
                roles: tuple[str, ...] = ("weight", "momentum_buffer")
            else:
                before, kept, roles = [_copy(p)], None, ("weight",)
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
            pending.entries.append((entry, before))


def update_rows_with_undo(
    weight: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    rows: torch.Tensor,
    grad_rows: torch.Tensor,
    *,
    name: str,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
    measure: bool = False,
) -> LazyRowsUndo:
    """:func:`recd.optim.lazy_adam_update_rows`, returning the entry that takes it back.

    For optimizers that update table shards themselves (``recd.train.sharding.ShardedAdam``):
    collect the entries into an :class:`UndoRecord` with the step counters. Arguments as
    ``lazy_adam_update_rows`` (``rows`` unique); ``name`` names the entry.
    """
    hyper = LazyHyper(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
    entry, before = _lazy_entry(name, weight, exp_avg, exp_avg_sq, rows, hyper=hyper, step=step)
    try:
        lazy_adam_update_rows(
            weight,
            exp_avg,
            exp_avg_sq,
            entry.rows,
            grad_rows,
            lr=lr,
            beta1=beta1,
            beta2=beta2,
            eps=eps,
            weight_decay=weight_decay,
            step=step,
        )
    except BaseException:
        entry.rollback(before)
        raise
    entry.finish(before, measure=measure)
    return entry


# ----------------------------------------------------------------------------- the log


class UndoLog:
    """The last optimizer step's :class:`UndoRecord` (one is enough: module docstring).

    Args:
        optimizer: what :func:`step_with_undo` accepts.
        names: ``(name, parameter)`` pairs naming the entries.
    """

    def __init__(
        self, optimizer: Any, *, names: Iterable[tuple[str, torch.Tensor]] | None = None
    ) -> None:
        self.optimizer = optimizer
        self.names = None if names is None else list(names)
        self.record: UndoRecord | None = None
        """The last captured step's record (None: none, or it was undone/cleared)."""

    def step(self, **step_kwargs: Any) -> UndoRecord:
        """Run ``optimizer.step(**step_kwargs)`` capturing its record.

        The previous record is dropped first (its step is complete on every rank once this
        step's gradients were all-reduced), so only one record's memory is ever held.
        """
        self.record = None
        self.record = step_with_undo(self.optimizer, names=self.names, **step_kwargs)
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
