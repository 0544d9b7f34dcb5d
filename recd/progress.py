"""Progress bars for long work (tqdm on stderr; silenced with RECD_PROGRESS=0), and the peak
memory a long-running command reports."""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
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


def peak_rss_bytes() -> int:
    """Peak resident memory of this process.

    Linux: ``VmHWM`` from /proc/self/status, which starts afresh at exec (``ru_maxrss`` would
    include the RSS of the parent at fork time). Elsewhere: ``ru_maxrss``.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
