"""Progress bars for long work (tqdm on stderr; silenced with RECD_PROGRESS=0)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress_enabled() -> bool:
    return os.environ.get("RECD_PROGRESS", "1") != "0"


def progress(
    iterable: Iterable[T], *, desc: str, total: int | None = None, unit: str = "it"
) -> Iterator[T]:
    """Wrap ``iterable`` in a progress bar unless progress is disabled."""
    if not progress_enabled():
        yield from iterable
        return
    yield from tqdm(iterable, desc=desc, total=total, unit=unit, dynamic_ncols=True, leave=False)


def progress_bar(*, desc: str, total: int | None = None, unit: str = "it") -> tqdm:
    """A manually updated progress bar (``bar.update(n)``; use as a context manager)."""
    return tqdm(
        desc=desc,
        total=total,
        unit=unit,
        unit_scale=True,
        dynamic_ncols=True,
        leave=False,
        disable=not progress_enabled(),
    )
