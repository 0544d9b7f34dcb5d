"""The algebraic inverses of the optimizer updates recd uses: pre-update state from post-update.

Notation: ``fl(x)`` rounds to float32; ``fma(a, b, c) = fl(a * b + c)`` rounds once; scalars
(``lr``, betas, ...) enter the kernels rounded to float32; ``t >= 1`` is the step counter the
update used; primes are post-update values. The forward formulas are what torch 2.13's CPU
kernels compute on x86-64 with FMA (``lerp``, ``addcmul`` and ``add(alpha=)`` fuse the
multiply-add; if they stop matching, the miss rates asserted in ``tests/unit/test_undo.py``
rise); other kernels (CUDA, ``foreach``, ``fused``) compute the same real numbers with other
roundings, which only changes how often the float inverse misses (:mod:`recd.recovery.undo`
makes every miss exact anyway).

**torch.optim.Adam / AdamW** (single-tensor path; ``c1 = 1 - beta1``, ``c2 = 1 - beta2``)::

    g  = -grad if maximize else grad;  Adam:  g = fma(w, wd, g)     (L2, into the moments)
                                       AdamW: w = fl(w * (1 - lr wd))  (decoupled, first)
    m' = lerp(m, g, c1) = fma(c1, fl(g - m), m)
    v' = fma(fl(c2 g), g, fl(beta2 v))
    d  = fl(fl(-s m') / denom),  s = lr / (1 - beta1^t),
         denom = fl(fl(sqrt(v')) / sqrt(1 - beta2^t)) + eps
    w' = fl(w + d)

Inverse. ``d`` depends only on ``(m', v', t)``: the same ops give the same bits, so
``w = fl(w' - d)`` (AdamW: ``fl(fl(w' - d) / (1 - lr wd))``). The moments need the gradient
*or* a moment: ``m' = (1 - c1) m + c1 g`` gives ``m = (m' - c1 g) / beta1`` from ``g``, or
``g = m + (m' - m) / c1`` from ``m``. recd keeps ``m`` (see :mod:`recd.recovery.undo` for
why: it costs the same 4 bytes and makes ``m`` exact by construction), recovers the effective
gradient ``g`` (L2 term and sign included) in float64, and then
``v = fl(fl(v' - fl(c2 g) g) / beta2)`` (one fused multiply-subtract, the mirror of the
forward's ``fma``), clamped at 0, and 0 wherever ``m == 0`` (a row or element never updated
has ``m = v = 0``; a fresh embedding row is the common case).

**LazyAdam / lazy_adam_update_rows** (fbgemm's ADAM, per touched row)::

    m' = fma(g, c1, fl(beta1 m))        v' = fma(fl(c2 g), g, fl(beta2 v))
    u  = fl(fl(m' / b1) / fl(fl(sqrt(fl(v' / b2))) + eps)),  b1 = 1 - beta1^t, b2 = 1 - beta2^t
    w' = fma(fma(w, wd, u), -lr, w)      (= w (1 - lr wd) - lr u in real arithmetic)

Inverse (:func:`lazy_adam_rows_before`): ``u`` again from ``(m', v', t)``; ``w = fl(w' +
lr u)`` (``wd > 0``: divided by ``1 - lr wd``); ``g = (m' - fl(beta1 m)) / c1`` from the kept
``m``; ``v`` as for Adam.

**torch.optim.SGD** (``mu`` momentum, ``damp`` dampening)::

    g  = (-grad if maximize else grad);  g = fma(w, wd, g)   (L2)
    b' = g (first step: the buffer is created)  |  fma(g, 1 - damp, fl(mu b))
    d  = b'  |  fma(b', mu, g) (nesterov)          (mu = 0: d = g, no buffer)
    w' = fma(d, -lr, w)

Inverse: ``w = fl(w' + lr d)``. Plain momentum needs only ``b'`` (post-update state); keeping
the pre-update buffer ``b`` restores it exactly, and nesterov recovers ``g = b' - fl(mu b)``
(nesterov requires ``damp = 0``; first step: ``g = b'``). Without momentum there is no
state: the gradient must be kept, ``w = fl(w' + lr g) / (1 - lr wd)``.

Every function takes and returns float32 tensors of any (equal) shape and allocates new ones.
"""

from __future__ import annotations

import struct
from typing import Any

import torch

from recd.optim.config import AdamHyper
from recd.optim.lazy_adam import lazy_adam_direction

__all__ = [
    "adam_second_moment_before",
    "adam_weight_before",
    "lazy_adam_rows_before",
    "sgd_weight_before",
]


def _f32(x: float) -> float:
    """``x`` rounded to float32 (what a kernel's float scalar holds)."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def adam_weight_before(
    weight: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    step: int,
    hyper: AdamHyper | None = None,
    **fields: Any,
) -> torch.Tensor:
    """Adam/AdamW's weight before step ``step`` from the weight, m and v after it (``hyper``:
    the group's settings, or their fields by keyword; ``decoupled``: AdamW)."""
    h = AdamHyper.of(hyper, fields)
    bias_correction1, bias_correction2 = h.bias_corrections(step)
    step_size = h.lr / bias_correction1
    denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(h.eps)
    increment = exp_avg.mul(-step_size).div_(denom)  # the forward's addcdiv term, same bits
    before = weight.sub(increment)
    if h.decoupled and h.weight_decay:
        before.div_(1 - h.lr * h.weight_decay)
    return before


def adam_second_moment_before(
    exp_avg_sq: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_before: torch.Tensor,
    *,
    hyper: AdamHyper | None = None,
    **fields: Any,
) -> torch.Tensor:
    """Adam/AdamW's v before the step from v and m after it and m before it (reads the betas)."""
    h = AdamHyper.of(hyper, fields)
    # m' = m + c1 (g - m) (torch's lerp)  =>  g = m + (m' - m) / c1, in float64.
    weight = _f32(1 - h.beta1)
    before64 = exp_avg_before.double()
    grad = (before64 + (exp_avg.double() - before64) / weight).float()
    return _second_moment_before(exp_avg_sq, grad, exp_avg_before, beta2=h.beta2)


def lazy_adam_rows_before(
    weight: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    exp_avg_before: torch.Tensor,
    *,
    hyper: AdamHyper,
    step: int,
    direction: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of :func:`recd.optim.lazy_adam_update_rows`: the rows' weight and v before
    step ``step``, from their w, m, v after it and m before it (m itself is kept).

    ``direction``: ``lazy_adam_direction(exp_avg, exp_avg_sq, ...)`` when the caller has it
    (the update computed it: same bits), else computed here.
    """
    if direction is None:
        direction = lazy_adam_direction(exp_avg, exp_avg_sq, hyper=hyper, step=step)
    # fma: the exact mirror of w' = fma(u, -lr, w)
    weight_before = weight.add(direction, alpha=hyper.lr)
    if hyper.weight_decay:
        weight_before.div_(1.0 - hyper.lr * hyper.weight_decay)
    # m' = fma(g, c1, fl(beta1 m))  =>  g = (m' - fl(beta1 m)) / c1, in float64.
    decayed = exp_avg_before.mul(hyper.beta1)
    grad = ((exp_avg.double() - decayed.double()) / _f32(1.0 - hyper.beta1)).float()
    v_before = _second_moment_before(exp_avg_sq, grad, exp_avg_before, beta2=hyper.beta2)
    return weight_before, v_before


def _second_moment_before(
    exp_avg_sq: torch.Tensor, grad: torch.Tensor, exp_avg_before: torch.Tensor, *, beta2: float
) -> torch.Tensor:
    # v' = fma(fl(c2 g), g, fl(beta2 v)): addcmul with -c2 is fma(-fl(c2 g), g, v'), one rounding.
    before = torch.addcmul(exp_avg_sq, grad, grad, value=-(1 - beta2)).div_(beta2)
    return before.clamp_min_(0.0).masked_fill_(exp_avg_before == 0, 0.0)


def sgd_weight_before(
    weight: torch.Tensor,
    *,
    lr: float,
    momentum: float,
    dampening: float,
    weight_decay: float,
    nesterov: bool,
    maximize: bool,
    buffer_after: torch.Tensor | None = None,
    buffer_before: torch.Tensor | None = None,
    grad: torch.Tensor | None = None,
) -> torch.Tensor:
    """SGD's weight before the step from the weight after it.

    Args:
        weight: the weight after the step.
        buffer_after: the momentum buffer after the step (``momentum != 0``).
        buffer_before: the buffer before it (None: this step created it).
        grad: the raw gradient (``momentum == 0`` only).
    """
    if momentum == 0:
        if grad is None:
            raise ValueError("sgd_weight_before: momentum 0 needs the gradient")
        before = weight.add(grad, alpha=-lr if maximize else lr)
        if weight_decay:
            before.div_(1 - lr * weight_decay)
        return before
    if buffer_after is None:
        raise ValueError("sgd_weight_before: momentum needs the buffer after the step")
    direction = buffer_after
    if nesterov:
        if buffer_before is None:
            g = buffer_after
        else:  # b' = fma(g, 1, fl(mu b)) (nesterov needs dampening 0)
            decayed = buffer_before.mul(momentum)
            g = ((buffer_after.double() - decayed.double()) / (1 - dampening)).float()
        direction = g.add(buffer_after, alpha=momentum)
    return weight.add(direction, alpha=lr)
