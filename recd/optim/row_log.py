"""Which rows of an embedding table the optimizer updated since a delta checkpoint last asked.

A step hands over the unique rows it updated (a tensor the update made anyway); keeping a
reference is all a step pays. The checkpoint's :meth:`RowLog.take` merges them into one
sorted unique tensor. So that memory stays bounded by the table, not by the steps between
checkpoints, the kept tensors are merged early once they hold more than ``FOLD_FACTOR``
times the table's rows. A bool mask per table would cost an index write on every step.
"""

from __future__ import annotations

import torch

FOLD_FACTOR = 4
"""Kept row indices, in multiples of the table's rows, before they are merged."""


class RowLog:
    """The rows of one table of ``num_rows`` rows updated since the last :meth:`take`."""

    def __init__(self, num_rows: int) -> None:
        self._limit = FOLD_FACTOR * max(int(num_rows), 1)
        self._parts: list[torch.Tensor] = []
        self._kept = 0

    def add(self, rows: torch.Tensor) -> None:
        """Record one step's updated rows (int64; not modified afterwards by the caller)."""
        self._parts.append(rows)
        self._kept += rows.numel()
        if self._kept > self._limit:
            merged = torch.unique(torch.cat(self._parts))
            self._parts, self._kept = [merged], merged.numel()

    def take(self) -> torch.Tensor | None:
        """The rows updated since the last call (int64, sorted, unique; None: none), and an
        empty log."""
        parts, self._parts, self._kept = self._parts, [], 0
        if not parts:
            return None
        rows = torch.unique(torch.cat(parts)) if len(parts) > 1 else parts[0]
        return rows if rows.numel() else None

    def reset(self) -> None:
        """Forget every row recorded so far."""
        self._parts, self._kept = [], 0
