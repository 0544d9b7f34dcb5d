"""Which rows of an embedding table the optimizer updated since a delta checkpoint last asked.

A step hands over the unique rows it updated (a tensor the update made anyway); keeping a
reference costs nothing on the training thread. Every ``FOLD_EVERY`` steps the kept tensors
are merged into one sorted unique tensor, so the memory stays that of the rows touched, not
of the steps taken, and the checkpoint's ``take`` merges at most ``FOLD_EVERY`` more. A
per-table bool mask would cost an index write per step and a scan of every row per
checkpoint.
"""

from __future__ import annotations

import torch

FOLD_EVERY = 64
"""Steps whose rows are kept as they came before they are merged."""


class RowLog:
    """The rows of one table updated since the last :meth:`take` (or :meth:`reset`)."""

    def __init__(self) -> None:
        self._parts: list[torch.Tensor] = []
        self._rows: torch.Tensor | None = None

    def add(self, rows: torch.Tensor) -> None:
        """Record one step's updated rows (int64; not modified afterwards by the caller)."""
        self._parts.append(rows)
        if len(self._parts) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        parts = self._parts if self._rows is None else [self._rows, *self._parts]
        if parts:
            self._rows = torch.unique(torch.cat(parts))
        self._parts = []

    def take(self) -> torch.Tensor | None:
        """The rows updated since the last call (int64, sorted, unique; None: none), and an
        empty log."""
        self._fold()
        rows, self._rows = self._rows, None
        return rows if rows is not None and rows.numel() else None

    def reset(self) -> None:
        """Forget every row recorded so far."""
        self._parts, self._rows = [], None
