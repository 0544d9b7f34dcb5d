"""Readers (RecD O3/O4): committed table partitions -> batches of dense, labels, KJT + IKJTs.

``build_plan`` lists the (file, row group) units and splits them over (rank, worker);
``iter_batches`` reads them in this process (tools, benchmarks); ``make_loader`` returns a
``ResumableLoader`` over torch's DataLoader with worker processes, whose ``state_dict()`` /
``load_state_dict()`` resume at exactly the next batch. Reader worker processes keep freed
memory (``keep_freed_memory``: fixed glibc malloc thresholds, 1.5x faster on rm1-like).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recd.lazy import lazy_exports

# Names load their submodule on first use (recd.lazy): the light ones (configs) without torch.
_HOME = {
    "config": (
        "ReaderConfig",
        "Shuffle",
        "load_reader_config",
    ),
    "dataset": (
        "ReaderDataset",
        "ResumableLoader",
        "iter_batches",
        "make_loader",
    ),
    "memory": ("keep_freed_memory",),
    "plan": (
        "ReadPlan",
        "WorkUnit",
        "build_plan",
    ),
    "stats": (
        "BatchTiming",
        "ReaderStats",
    ),
}
__all__ = [
    "BatchTiming",
    "ReadPlan",
    "ReaderConfig",
    "ReaderDataset",
    "ReaderStats",
    "ResumableLoader",
    "Shuffle",
    "WorkUnit",
    "build_plan",
    "iter_batches",
    "keep_freed_memory",
    "load_reader_config",
    "make_loader",
]

if TYPE_CHECKING:
    from recd.reader.config import ReaderConfig, Shuffle, load_reader_config
    from recd.reader.dataset import ReaderDataset, ResumableLoader, iter_batches, make_loader
    from recd.reader.memory import keep_freed_memory
    from recd.reader.plan import ReadPlan, WorkUnit, build_plan
    from recd.reader.stats import BatchTiming, ReaderStats

__getattr__, __dir__ = lazy_exports(__name__, _HOME, globals())
