"""Readers (RecD O3/O4): committed table partitions -> batches of dense, labels, KJT + IKJTs.

``build_plan`` lists the (file, row group) units and splits them over (rank, worker);
``iter_batches`` reads them in this process (tools, benchmarks); ``make_loader`` returns a
``ResumableLoader`` over torch's DataLoader with worker processes, whose ``state_dict()`` /
``load_state_dict()`` resume at exactly the next batch. Reader worker processes keep freed
memory (``keep_freed_memory``: fixed glibc malloc thresholds, 1.5x faster on rm1-like).
"""

from recd.reader.config import ReaderConfig, Shuffle, load_reader_config
from recd.reader.dataset import ReaderDataset, ResumableLoader, iter_batches, make_loader
from recd.reader.memory import keep_freed_memory
from recd.reader.plan import ReadPlan, WorkUnit, build_plan
from recd.reader.stats import BatchTiming, ReaderStats

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
