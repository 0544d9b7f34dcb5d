"""Row-sparse ("lazy") Adam for embedding tables, with fbgemm's fused ADAM semantics.

On GPU, fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen(optimizer=OptimType.ADAM)`` updates,
inside the backward pass, only the rows a batch looked up. For each touched row, with ``g`` the
row's gradient summed over its occurrences in the batch and ``t`` the module's iteration
counter (incremented once per training step, 1 on the first step; fbgemm's ``iter``)::

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    w = w - lr * ( (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * w )

(fbgemm_gpu ``codegen/genscript/optimizers.py``, ``adam()``; ``use_rowwise_bias_correction``
off, its default). Rows the batch did not touch keep their weights, ``m`` and ``v`` unchanged:
there is no decay of the moments of untouched rows, which is what makes the update cost
proportional to the batch rather than to the table. Bias correction uses the global step
``t``, not a per-row count. ``weight_decay`` is decoupled (it is not folded into ``g`` or the
moments) and reads the weight before the update.

fbgemm has no ADAM kernel on CPU (``Optimizer adam is not supported in CPU mode``), so
:class:`LazyAdam` implements the same update with torch ops over the touched rows only. A
touched row is one whose id occurs in the batch (its gradient may be exactly zero), not a row
with a nonzero gradient. The rows come from

* a sparse (COO) gradient, as ``nn.Embedding``/``nn.EmbeddingBag`` with ``sparse=True`` give
  (torchrec's unsharded EBC/EC once their modules are switched to sparse): its indices are
  exactly the ids looked up; or
* ``touched_rows`` passed to :meth:`LazyAdam.step` next to a dense gradient, in the
  parameter's own row space. A sharded table (row-wise or table-wise under DMP) holds only
  its local rows: pass the local row indices and each rank updates only its rows.

``torch.optim.SparseAdam`` is also lazy, but adds ``eps`` to ``sqrt(v)`` before the bias
correction of ``v`` (effectively ``eps * sqrt(1 - beta2^t)``) and has no weight decay; with
``eps = 0`` the two agree (a test checks this).

State, readable and writable for checkpoints: per parameter ``exp_avg`` (m) and
``exp_avg_sq`` (v), float32 and the parameter's shape, allocated up front; the step counter is
the param group's ``step`` (saved by ``state_dict()``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from recd.optim.config import AdamHyper
from recd.optim.row_log import RowLog

__all__ = [
    "LazyAdam",
    "RowUpdate",
    "RowsStep",
    "lazy_adam_direction",
    "lazy_adam_update_rows",
]


@dataclass(kw_only=True, slots=True, eq=False)
class RowsStep:
    """The tensors one :func:`lazy_adam_update_rows` call computed (R x E each).

    The update gathers the rows before changing them and computes their new values in fresh
    tensors before writing them back, so these cost nothing extra to return; an update-undo
    capture (:mod:`recd.recovery.undo`) uses them instead of gathering and recomputing.
    """

    weight_before: torch.Tensor
    exp_avg_before: torch.Tensor
    exp_avg_sq_before: torch.Tensor
    weight_after: torch.Tensor
    exp_avg_after: torch.Tensor
    exp_avg_sq_after: torch.Tensor
    direction: torch.Tensor
    """``u``: :func:`lazy_adam_direction` of the new m and v (before weight decay)."""


class RowUpdate(Protocol):
    """How :meth:`LazyAdam.step` calls its row update, per table: :func:`lazy_adam_update_rows`
    or a wrapper that also records it (an update-undo capture, a checkpoint's row patches)."""

    def __call__(
        self,
        weight: torch.Tensor,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
        rows: torch.Tensor,
        grad_rows: torch.Tensor,
        *,
        hyper: AdamHyper,
        step: int,
    ) -> Any: ...


def lazy_adam_direction(
    exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *, hyper: AdamHyper, step: int
) -> torch.Tensor:
    """``u = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)`` of post-update m, v.

    One function for the update and its inverse (:mod:`recd.recovery.inverse`): the same ops
    on the same inputs give the same bits, which is what makes the weight's inverse cheap.
    """
    bias1, bias2 = hyper.bias_corrections(step)
    return torch.div(exp_avg, bias1).div_(torch.div(exp_avg_sq, bias2).sqrt_().add_(hyper.eps))


def lazy_adam_update_rows(
    weight: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    rows: torch.Tensor,
    grad_rows: torch.Tensor,
    *,
    step: int,
    hyper: AdamHyper | None = None,
    **fields: Any,
) -> RowsStep:
    """Apply one fbgemm-ADAM update to ``rows`` (R,) of a table, in place.

    weight, exp_avg, exp_avg_sq: (num_rows x E) float32; rows: (R,) int64 unique row indices;
    grad_rows: (R x E) the rows' summed gradients; step: t >= 1 (bias correction); hyper:
    the settings (or their fields by keyword, ``lr=..., beta1=...``; decay is decoupled).
    Everything is computed before the three tables are written, and a write that raises
    puts the three back: the update is all or nothing. Returns the gathered
    pre-update rows, the new rows and the direction (:class:`RowsStep`).
    """
    h = AdamHyper.of(hyper, fields)
    if h.weight_decay and not h.decoupled:
        raise ValueError("lazy_adam_update_rows: fbgemm's ADAM decays decoupled, not as L2")
    m0 = exp_avg.index_select(0, rows)
    v0 = exp_avg_sq.index_select(0, rows)
    w0 = weight.index_select(0, rows)
    # fbgemm: m_t.mul_(beta1); m_t.fma_(grad, 1 - beta1); likewise v with grad^2.
    m = m0.mul(h.beta1).add_(grad_rows, alpha=1.0 - h.beta1)
    v = v0.mul(h.beta2).addcmul_(grad_rows, grad_rows, value=1.0 - h.beta2)
    u = lazy_adam_direction(m, v, hyper=h, step=step)
    w = w0.add(u.add(w0, alpha=h.weight_decay) if h.weight_decay else u, alpha=-h.lr)
    try:
        exp_avg.index_copy_(0, rows, m)
        exp_avg_sq.index_copy_(0, rows, v)
        weight.index_copy_(0, rows, w)
    except BaseException:  # all or nothing (e.g. an interrupt between the writes)
        exp_avg.index_copy_(0, rows, m0)
        exp_avg_sq.index_copy_(0, rows, v0)
        weight.index_copy_(0, rows, w0)
        raise
    return RowsStep(
        weight_before=w0,
        exp_avg_before=m0,
        exp_avg_sq_before=v0,
        weight_after=w,
        exp_avg_after=m,
        exp_avg_sq_after=v,
        direction=u,
    )


class LazyAdam(torch.optim.Optimizer):
    """Adam over the touched rows of 2-D embedding tables (fbgemm fused-ADAM semantics).

    Args:
        params: the tables (num_rows x E float32 parameters), or param groups.
        lr: learning rate.
        betas: (beta1, beta2).
        eps: added to the bias-corrected ``sqrt(v)``.
        weight_decay: decoupled decay, applied to touched rows only (fbgemm's ADAM).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"LazyAdam: lr={lr}, eps={eps}, weight_decay={weight_decay} < 0")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"LazyAdam: betas must be in [0, 1), got {betas}")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "step": 0}
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2 or p.dtype != torch.float32:
                    raise ValueError(
                        f"LazyAdam: embedding tables must be 2-D float32, got {p.dtype} "
                        f"{tuple(p.shape)}"
                    )
                self.state[p]["exp_avg"] = torch.zeros_like(
                    p, memory_format=torch.contiguous_format
                )
                self.state[p]["exp_avg_sq"] = torch.zeros_like(
                    p, memory_format=torch.contiguous_format
                )

    @property
    def step_count(self) -> int:
        """Optimizer steps completed (the first group's counter: t of the last update)."""
        return int(self.param_groups[0]["step"]) if self.param_groups else 0

    row_log: dict[torch.Tensor, RowLog] | None = None
    """With :meth:`log_rows` on: each table -> the rows updated since the log was last taken
    (what a delta checkpoint writes)."""

    def log_rows(self) -> None:
        """From now on, remember which rows the updates touch (:meth:`take_logged_rows`)."""
        if self.row_log is None:
            self.row_log = {}

    def _log_rows(self, p: torch.Tensor, rows: torch.Tensor) -> None:
        assert self.row_log is not None
        log = self.row_log.get(p)
        if log is None:
            log = self.row_log[p] = RowLog(p.shape[0])
        log.add(rows)

    def reset_logged_rows(self) -> None:
        """Forget the rows logged so far (a full checkpoint was taken)."""
        if self.row_log is not None:
            self.row_log = {}

    def detach_row_logs(self) -> dict[torch.Tensor, RowLog]:
        """The row logs as they are (each table -> its :class:`RowLog`), fresh empty ones
        taking the next steps' rows: a dict swap (a delta checkpoint merges the detached
        logs on another thread)."""
        if self.row_log is None:
            raise RuntimeError("LazyAdam.detach_row_logs: call log_rows() first")
        logs, self.row_log = self.row_log, {}
        return logs

    def take_logged_rows(self) -> dict[torch.Tensor, torch.Tensor]:
        """Each table's rows updated since the last call (int64, sorted; tables not updated
        are absent), and a fresh log."""
        if self.row_log is None:
            raise RuntimeError("LazyAdam.take_logged_rows: call log_rows() first")
        taken = {p: log.take() for p, log in self.row_log.items()}
        return {p: rows for p, rows in taken.items() if rows is not None}

    def set_step_count(self, step: int) -> None:
        """Set every group's step counter (restoring a checkpoint)."""
        for group in self.param_groups:
            group["step"] = int(step)

    @torch.no_grad()
    def step(  # type: ignore[override]
        self,
        closure: Callable[[], float] | None = None,
        *,
        touched_rows: Mapping[torch.Tensor, torch.Tensor] | None = None,
        update_rows: RowUpdate = lazy_adam_update_rows,
    ) -> float | None:
        """One step: t += 1, then update each table's touched rows.

        Args:
            closure: re-evaluates the loss (optional, as in torch optimizers).
            touched_rows: parameter -> row indices (any order, repeats allowed) for tables
                whose gradient is dense. Tables with sparse gradients read their rows from
                the gradient; tables without a gradient are untouched.
            update_rows: applies the update to one table's rows (default
                :func:`lazy_adam_update_rows`; an update-undo capture passes one that also
                records it, :mod:`recd.recovery.undo`).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            group["step"] += 1
            hyper = AdamHyper.from_group(group, decoupled=True)
            for p in group["params"]:
                touched = self.touched(p, touched_rows)
                if touched is None:
                    continue
                rows, grad_rows = touched
                if self.row_log is not None:
                    self._log_rows(p, rows)
                state = self.state[p]
                update_rows(
                    p,
                    state["exp_avg"],
                    state["exp_avg_sq"],
                    rows,
                    grad_rows,
                    hyper=hyper,
                    step=group["step"],
                )
        return loss

    @staticmethod
    def touched(
        p: torch.Tensor, touched_rows: Mapping[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rows :meth:`step` updates in table ``p`` and their gradient rows.

        Returns ``(rows, grad_rows)``: (R,) int64 sorted unique rows and (R x E) their summed
        gradients, from ``p``'s sparse gradient (coalesced: repeated ids summed) or, for a
        dense gradient, from ``touched_rows[p]``; None when ``p`` has no gradient. Raises
        ``ValueError`` for a dense gradient without (or with out-of-range) touched rows.
        """
        grad = p.grad
        if grad is None:
            return None
        if grad.is_sparse:
            grad = grad.coalesce()  # sums repeated ids; indices sorted and unique
            return grad.indices()[0], grad.values()
        rows = None if touched_rows is None else touched_rows.get(p)
        if rows is None:
            raise ValueError(
                f"LazyAdam: table of shape {tuple(p.shape)} has a dense gradient and no "
                "touched_rows; pass the rows the batch looked up (or use sparse gradients)"
            )
        rows = torch.unique(rows.to(device=p.device, dtype=torch.int64))
        if rows.numel() and (int(rows[0]) < 0 or int(rows[-1]) >= p.shape[0]):
            raise ValueError(
                f"LazyAdam: touched rows [{int(rows[0])}, {int(rows[-1])}] outside the "
                f"table's {p.shape[0]} rows"
            )
        return rows, grad.index_select(0, rows)
