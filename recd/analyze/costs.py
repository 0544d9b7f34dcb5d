"""What deduplicating a group costs the reader, measured on the table's own batches.

A dedup group turns K sparse columns of a batch from part of the plain KJT into an IKJT. The
reader then pays the dedup conversion (stacking, run check, hash table, inverse, gathering the
distinct rows, one more preprocessing call) and saves the work it would have spent on the
duplicate rows (copying their ids, running the preprocessing modules on them). Whether that
pays depends on the machine, the preprocessing and the group's shape: a length-1 feature saves
one id per duplicate row while its dedup costs a hash-table probe per row, so a high
DedupeFactor alone does not make a group worth deduplicating (a real clickstream's item id:
factor 5-8, and the reader got slower).

So the reader itself is timed (:func:`time_group`): on a sample of the batches it cuts from the
table (evenly spaced, full batches), its conversion + preprocessing code
(:func:`recd.convert.convert_sparse`, the job's TorchScript modules, as
:class:`recd.reader.transform.BatchTransform` runs them) runs three ways, interleaved, median
of ``reps``: every sparse feature in the plain KJT (*plain*), the group as an IKJT (*dedup*),
and without the group's features at all (*base*: what the rest of the batch costs). The
group's plain cost is plain - base; its saving is plain - dedup. A group is proposed when the
saving exceeds :data:`PAY_MARGIN` of its plain cost. The margin keeps groups that clearly
lose out; a group whose saving is close to it can go either way between two runs on a noisy
machine (seen on rm1-like at batch 2048: ``seq_watch_items`` measured +1.0 and -0.02 ms per
1k samples in two runs), and either verdict then costs or saves little.

Why not a per-machine model fitted once on synthetic batches (the first design): fitted on
timings of synthetic groups, it mispredicted rm1-like's real groups by 0.3-1.4 ms per 1k
samples (the 40-key user group: predicted 0.04, measured 1.39; a 2-key sequence group:
predicted +0.55, measured -0.06), because the real cost depends on the job's whole
preprocessing chain (truncation, per-key work over every key of the batch) and on the table's
layout, which a synthetic grid does not reproduce. Timing the reader on the table costs a few
seconds per group and is exact for that table, batch size, preprocessing and machine.

What it leaves out: the trainer-side savings (lookups and transformers once per distinct row),
which only add to a group's gain; a group rejected here may still pay in the trainer.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from recd.convert import FeatureSpec, convert_sparse
from recd.preprocess import preprocess_sparse
from recd.reader.config import SPARSE_PREPROCESS_KINDS, ReaderConfig
from recd.reader.plan import build_plan
from recd.reader.stream import iter_worker_batches
from recd.reader.transform import build_preprocessing

PAY_MARGIN = 0.1
"""A group is proposed only if it saves more than this share of its plain cost."""
SAMPLE_BATCHES = 12
"""Full batches of the table timed per group (evenly spaced over the table)."""
REPS = 5
"""Interleaved repetitions per path; the median counts."""
WARMUP_BATCHES = 3
"""Batches each path's preprocessing module runs before timing (TorchScript profiling)."""


@dataclass(kw_only=True, slots=True)
class GroupTiming:
    """Reader seconds on the sampled batches, three ways (median of the repetitions)."""

    plain_s: float
    """Every sparse feature in the plain KJT, converted and preprocessed."""
    dedup_s: float
    """The same with the group as an IKJT."""
    base_s: float
    """The same without the group's features (the rest of the batch)."""
    rows: int
    """Rows timed per path (batches x batch size)."""

    @property
    def plain_cost_ms_per_1k(self) -> float:
        return (self.plain_s - self.base_s) * 1e6 / self.rows

    @property
    def dedup_cost_ms_per_1k(self) -> float:
        return (self.dedup_s - self.base_s) * 1e6 / self.rows

    @property
    def saving_ms_per_1k(self) -> float:
        return (self.plain_s - self.dedup_s) * 1e6 / self.rows

    @property
    def pays(self) -> bool:
        return self.saving_ms_per_1k > PAY_MARGIN * max(self.plain_cost_ms_per_1k, 0.0) and (
            self.saving_ms_per_1k > 0.0
        )


def hash_all_preprocessing(sparse: Sequence[str]) -> list[dict[str, Any]]:
    """``--preprocessed``: ``hash_modulo`` of every sparse feature (a typical reader job)."""
    return [{"kind": "hash_modulo", "features": list(sparse), "modulo": 1 << 20}]


def sparse_preprocessing(
    preprocessing: list[dict[str, Any]], sparse: Sequence[str]
) -> list[dict[str, Any]]:
    """The job's sparse preprocessing specs restricted to ``sparse`` (dense specs dropped:
    dedup does not change dense work)."""
    out = []
    for spec in preprocessing:
        if spec["kind"] in SPARSE_PREPROCESS_KINDS:
            features = [f for f in spec["features"] if f in set(sparse)]
            if features:
                out.append({**spec, "features": features})
    return out


def sample_batches(
    table: Path,
    sparse: list[str],
    *,
    batch_size: int,
    start: str | None,
    end: str | None,
    count: int = SAMPLE_BATCHES,
) -> list[pa.Table]:
    """Up to ``count`` full batches the reader cuts from ``table`` (one worker, table order),
    evenly spaced; the table's only batch if it has no full one."""
    config = ReaderConfig(
        table=str(table),
        start=start,
        end=end,
        labels=[],
        dense=[],
        sparse=sparse,
        batch_size=batch_size,
        drop_last=True,
    )
    plan = build_plan(config)
    total = plan.worker_num_batches(0, 0)
    if total == 0:  # smaller than one batch: time what there is
        config.drop_last = False
        plan = build_plan(config)
        return [b.rows for b in iter_worker_batches(plan, epoch=0, worker=0)]
    step = max(1, total // count)
    wanted = set(range(0, total, step)[:count])
    return [
        b.rows for i, b in enumerate(iter_worker_batches(plan, epoch=0, worker=0)) if i in wanted
    ]


def time_group(
    batches: list[pa.Table],
    group: list[str],
    sparse: list[str],
    *,
    preprocessing: list[dict[str, Any]],
    reps: int = REPS,
) -> GroupTiming:
    """Time the reader's conversion + preprocessing of ``batches`` three ways (module doc).

    Each path gets its own compiled preprocessing module, warmed up on a few batches (as a
    reader's module is: TorchScript specialises on what it has seen). The paths then run in
    turn ``reps`` times; each path's time is its median over the repetitions, so a burst of
    load in one repetition moves neither the time nor the verdict.
    """
    specs = {
        "plain": FeatureSpec(sparse=sparse, labels=[]),
        "dedup": FeatureSpec(sparse=sparse, labels=[], dedup_sparse_features=[group]),
        "base": FeatureSpec(sparse=[f for f in sparse if f not in group], labels=[]),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one reader = one core
    try:
        modules = {
            path: build_preprocessing(sparse_preprocessing(preprocessing, sparse), dense=[])[0]
            for path in specs
        }
        for path, spec in specs.items():
            _run(batches[:WARMUP_BATCHES], spec, modules[path])
        times: dict[str, list[float]] = {path: [] for path in specs}
        for _ in range(reps):  # interleaved: drift in load hits every path alike
            for path, spec in specs.items():
                times[path].append(_run(batches, spec, modules[path]))
    finally:
        torch.set_num_threads(threads)
    return GroupTiming(
        plain_s=statistics.median(times["plain"]),
        dedup_s=statistics.median(times["dedup"]),
        base_s=statistics.median(times["base"]),
        rows=sum(b.num_rows for b in batches),
    )


def _run(batches: list[pa.Table], spec: FeatureSpec, module: torch.nn.Module | None) -> float:
    t0 = time.perf_counter()
    for rows in batches:
        sparse = convert_sparse(rows, spec, source="<analyze>")
        if module is not None:
            preprocess_sparse(sparse, module)
    return time.perf_counter() - t0
