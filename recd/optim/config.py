"""Adam's hyper-parameters, apart from the optimizer: a training config is validated without
importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from recd.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class AdamConfig:
    """Hyper-parameters of :class:`ModelAdam` (the checkpoint format assumes the betas)."""

    lr: float = 1e-3
    """Learning rate of the dense parameters."""
    embedding_lr: float | None = None
    """Learning rate of the embedding tables (None: ``lr``)."""
    beta1: float = 0.9
    """First-moment decay (the checkpoint's adam_m)."""
    beta2: float = 0.999
    """Second-moment decay (the checkpoint's adam_v)."""
    eps: float = 1e-8
    """Added to the bias-corrected sqrt(v)."""
    weight_decay: float = 0.0
    """Dense parameters: L2 penalty added to the gradient (``torch.optim.Adam``)."""
    embedding_weight_decay: float = 0.0
    """Embedding tables: fbgemm ADAM's decoupled decay, touched rows only."""

    def __post_init__(self) -> None:
        for name in ("lr", "eps", "weight_decay", "embedding_weight_decay"):
            if getattr(self, name) < 0:
                raise ConfigError(f"optimizer.{name} must be >= 0, got {getattr(self, name)}")
        if self.embedding_lr is not None and self.embedding_lr < 0:
            raise ConfigError(f"optimizer.embedding_lr must be >= 0, got {self.embedding_lr}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"optimizer.{name} must be in [0, 1), got {getattr(self, name)}")
