"""Summaries of repeated measurements, shared by recd's reports and the benchmark scripts.

Kept to what the project's measuring protocol needs (median and range of repetitions), so no
statistics library is pulled in for it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max, count and the values of repeated measurements (None when empty)."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {
        "median": float(statistics.median(values)),
        "min": float(min(values)),
        "max": float(max(values)),
        "n": len(values),
        "values": [float(v) for v in values],
    }
