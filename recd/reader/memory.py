"""Keep freed memory in a reader process: fixed glibc malloc thresholds.

A reader allocates and frees the same large buffers every batch (decoded Arrow columns, the
KJT's values, the preprocessing's temporaries: megabytes each). glibc serves an allocation
above its *mmap threshold* with a fresh ``mmap`` and returns it to the kernel on ``free``, so
the next batch page-faults the same megabytes in again (the kernel zeroes every page); and
the threshold moves with the history of frees (glibc's dynamic threshold), so the same job's
speed depends on what ran before it. Fixed thresholds make both readers faster and repeated
passes far less spread (docs/benchmarks.md).

:func:`keep_freed_memory` fixes both thresholds high (``mallopt``): buffers up to 256 MiB come
from the heap and freed memory stays in the process for the next batch. The cost is resident
memory that stays at the reader's peak. Reader worker processes call it at start; a process
that runs a reader in-process (a tool, a benchmark) may call it itself. No-op where the C
library is not glibc. Written by hand: no maintained Python package sets these two knobs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

MMAP_THRESHOLD_BYTES = 256 << 20
"""Allocations below this come from the heap (glibc's maximum dynamic value is 32 MiB)."""
TRIM_THRESHOLD_BYTES = 1 << 30
"""Free memory at the top of the heap is returned to the kernel only above this."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def keep_freed_memory() -> bool:
    """Set the thresholds once per process; True when they are set (glibc), else False."""
    global _done
    if _done:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok
    _done = ok
    return ok


def worker_init(_worker_id: int) -> None:
    """DataLoader ``worker_init_fn`` of reader worker processes."""
    keep_freed_memory()
