"""Which rows of an embedding table the optimizer updated since a delta checkpoint last asked.

A step hands over the unique rows it updated (a tensor the update made anyway); keeping a
reference is all a step pays. The checkpoint's :meth:`RowLog.take` merges them: a sort of
the kept indices when they are few against the table (``torch.unique``), else one write
into a bool mask of the table's rows and a scan of it (no sort; numpy's on the CPU). Once
the kept indices outnumber ``FOLD_FACTOR`` times the table's rows (and ``MIN_FOLD``
indices) they are folded into the mask early, so memory stays bounded by the table, not by
the steps between checkpoints.
"""

from __future__ import annotations

import numpy as np
import torch

FOLD_FACTOR = 4
"""Kept row indices, in multiples of the table's rows, before they are folded."""
MIN_FOLD = 1 << 16
"""Kept row indices never fold below this (small tables would fold at every step)."""
SORT_BELOW = 1 / 16
"""Merge by sorting while the kept indices are fewer than this fraction of the rows."""


class RowLog:
    """The rows of one table of ``num_rows`` rows updated since the last :meth:`take`."""

    def __init__(self, num_rows: int) -> None:
        self.num_rows = max(int(num_rows), 1)
        self._limit = max(FOLD_FACTOR * self.num_rows, MIN_FOLD)
        self._parts: list[torch.Tensor] = []
        self._kept = 0
        self._mask: torch.Tensor | None = None
        self._marked = False

    def add(self, rows: torch.Tensor) -> None:
        """Record one step's updated rows (int64; not modified afterwards by the caller)."""
        self._parts.append(rows)
        self._kept += rows.numel()
        if self._kept > self._limit:
            self._fold()

    def _fold(self) -> None:
        if self._mask is None:
            self._mask = torch.zeros(self.num_rows, dtype=torch.bool, device=self._parts[0].device)
        self._mask.index_fill_(0, torch.cat(self._parts), True)
        self._parts, self._kept, self._marked = [], 0, True

    def take(self) -> torch.Tensor | None:
        """The rows updated since the last call (int64, sorted, unique; None: none), and an
        empty log."""
        if not self._marked and self._kept < SORT_BELOW * self.num_rows:
            parts, self._parts, self._kept = self._parts, [], 0
            if not parts:
                return None
            rows = parts[0] if len(parts) == 1 else torch.unique(torch.cat(parts))
            return rows if rows.numel() else None
        if self._parts:
            self._fold()
        assert self._mask is not None
        if self._mask.is_cuda:
            rows = self._mask.nonzero().reshape(-1)
        else:  # numpy's scan of a bool array is ~40x torch's nonzero on one CPU thread
            rows = torch.from_numpy(np.flatnonzero(self._mask.numpy()).astype(np.int64))
        self._mask.zero_()
        self._marked = False
        return rows if rows.numel() else None

    def reset(self) -> None:
        """Forget every row recorded so far."""
        self._parts, self._kept = [], 0
        if self._marked and self._mask is not None:
            self._mask.zero_()
        self._marked = False
