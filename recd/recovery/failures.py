"""What a failed step's error says: a peer is gone (survivor recovery takes over,
:mod:`recd.recovery.rejoin`), or this rank has a bug (the error propagates). Its own module so
that the training loop can ask without importing recovery."""

from __future__ import annotations

import torch

__all__ = ["is_peer_failure"]


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error`` is a failed collective (a peer is gone), not a bug of this rank."""
    if isinstance(error, torch.distributed.DistError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        marker in text
        for marker in (
            "Connection closed by peer",
            "Connection reset by peer",
            "Broken pipe",
            "Gloo",
            "gloo",
            "ProcessGroup",
        )
    )
