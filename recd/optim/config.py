"""Adam's hyper-parameters, apart from the optimizer: a training config is validated without
importing torch.

:class:`AdamConfig` is what a user sets (the dense layers and the embedding tables may differ);
:class:`AdamHyper` is one param group's settings at run time, the one type every Adam update
and its inverse (:mod:`recd.optim.lazy_adam`, :mod:`recd.recovery.inverse`) read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from recd.config_types import NonNegativeFloat, check_fields

Decay = Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)]
"""A moment's decay (beta1, beta2): finite, in [0, 1)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class AdamHyper:
    """One param group's Adam hyper-parameters (hashable: updates sharing them are grouped)."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = True
    """Weight decay applied to the weight (AdamW; fbgemm's ADAM, hence every row-sparse
    update) rather than added to the gradient (``torch.optim.Adam``'s L2)."""

    @classmethod
    def of(cls, hyper: AdamHyper | None, fields: Mapping[str, Any]) -> AdamHyper:
        """``hyper``, or the one made of ``fields`` (``lr=..., beta1=...`` passed by keyword)."""
        if hyper is None:
            if not fields:
                raise TypeError("no hyper-parameters: pass hyper= (an AdamHyper) or its fields")
            return cls(**fields)
        if fields:
            raise TypeError(f"pass hyper= or its fields, not both (got {sorted(fields)})")
        return hyper

    @classmethod
    def from_group(cls, group: Mapping[str, Any], *, decoupled: bool | None = None) -> AdamHyper:
        """The settings of a torch param group (``lr``, ``betas``, ``eps``, ``weight_decay``;
        ``decoupled`` default: its ``decoupled_weight_decay``, as ``torch.optim.AdamW`` sets)."""
        beta1, beta2 = (float(b) for b in group["betas"])
        if decoupled is None:
            decoupled = bool(group.get("decoupled_weight_decay", False))
        return cls(
            lr=float(group["lr"]),
            beta1=beta1,
            beta2=beta2,
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            decoupled=decoupled,
        )

    def torch_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``torch.optim.Adam`` and :class:`recd.optim.LazyAdam`."""
        return {
            "lr": self.lr,
            "betas": (self.beta1, self.beta2),
            "eps": self.eps,
            "weight_decay": self.weight_decay,
        }

    def bias_corrections(self, step: int) -> tuple[float, float]:
        """``(1 - beta1^t, 1 - beta2^t)`` at step ``t >= 1``: one expression for every update
        and its inverse (the same floats give the same bits)."""
        return 1.0 - self.beta1**step, 1.0 - self.beta2**step


@dataclass(kw_only=True, slots=True)
class AdamConfig:
    """Hyper-parameters of :class:`ModelAdam` (the checkpoint format assumes the betas)."""

    lr: NonNegativeFloat = 1e-3
    """Learning rate of the dense parameters."""
    embedding_lr: NonNegativeFloat | None = None
    """Learning rate of the embedding tables (None: ``lr``)."""
    beta1: Decay = 0.9
    """First-moment decay (the checkpoint's adam_m)."""
    beta2: Decay = 0.999
    """Second-moment decay (the checkpoint's adam_v)."""
    eps: NonNegativeFloat = 1e-8
    """Added to the bias-corrected sqrt(v)."""
    weight_decay: NonNegativeFloat = 0.0
    """Dense parameters: L2 penalty added to the gradient (``torch.optim.Adam``)."""
    embedding_weight_decay: NonNegativeFloat = 0.0
    """Embedding tables: fbgemm ADAM's decoupled decay, touched rows only."""

    def __post_init__(self) -> None:
        # ConfigError "optimizer.lr must be >= 0, got -1.0"; NaN and infinity are refused.
        check_fields(self, "optimizer.", wording="must")

    def dense_hyper(self) -> AdamHyper:
        """The dense parameters' settings (``torch.optim.Adam``: L2 weight decay)."""
        return AdamHyper(
            lr=self.lr,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            decoupled=False,
        )

    def embedding_hyper(self) -> AdamHyper:
        """The embedding tables' settings (fbgemm's ADAM: decoupled decay, touched rows)."""
        return AdamHyper(
            lr=self.lr if self.embedding_lr is None else self.embedding_lr,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            weight_decay=self.embedding_weight_decay,
            decoupled=True,
        )
