"""Which dedup groups make the reader faster, measured on the table's own batches.

A dedup group turns K sparse columns of a batch from part of the plain KJT into an IKJT. The
reader then pays the dedup conversion (stacking, run check, hash table, inverse, gathering the
distinct rows, one more preprocessing call) and saves the work it would have spent on the
duplicate rows (copying their ids, running the preprocessing modules on them). Whether that
pays depends on the machine, the preprocessing and the group's shape: a length-1 feature saves
one id per duplicate row while its dedup costs a hash-table probe per row, so a high
DedupeFactor alone does not make a group worth deduplicating (a real clickstream's item id:
factor 5-8, and the reader got slower).

So the reader itself is timed: on a sample of the batches it cuts from the table (evenly
spaced, full batches), its conversion + sparse preprocessing code
(:func:`recd.tensors.convert.convert_sparse` and the job's TorchScript modules, as
:class:`recd.reader.transform.BatchTransform` runs them) runs each configuration of dedup
groups (:class:`JobTimer`: one warm-up pass per configuration), and :func:`choose_groups`
keeps the candidates by backward elimination *in context*: with every candidate
deduplicated, each one is left out in turn, and a group stays only if leaving it out costs
the job more than :data:`PAY_MARGIN` of the plain job's time; what remains must beat the
plain job by that margin too, else nothing is proposed.

Every such verdict is a *paired* comparison (:meth:`JobTimer.difference`): the two
configurations' passes alternate (a b, b a, a b, ...) and the median of the per-pair
differences counts. Timing each configuration once and subtracting the medians let one slow
second of the machine decide: on rm1-like, a run in which the every-group configuration was
timed during such a second found every group "costing" 0.2-1.6 ms per 1k samples and
proposed none (the benchmark's reader then ran 1.10x instead of ~1.5x); the runs before
found the same groups saving 1.8-3.9 ms.

In context, because savings do not add up. On rm1-like at batch 2048 (hash + truncate
preprocessing), timing each group alone against the plain job kept 2 of 5 groups (1.25x over
the baseline reader in the benchmark) while all 5 together gave 1.50x: the sequence groups
each saved 0-1 ms per 1k samples alone but 2.1 ms together, next to the user group (a smaller
plain KJT stays in cache). A first design, a per-machine linear model fitted on synthetic
batches, mispredicted the same groups by up to 1.4 ms per 1k samples.

The timings are still noisy on a shared machine, so a group near the margin can go either
way between runs; either verdict then costs or saves little. ``recd analyze`` times the reader with
fixed malloc thresholds, as reader worker processes run (:mod:`recd.reader.memory`): with
glibc's dynamic threshold the plain rm1-like job alone moved between 8 and 14 ms per 1k
samples in one process.

What it leaves out: the trainer-side savings (lookups and transformers once per distinct row),
which only add to a group's gain; a group rejected here may still pay in the trainer.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from recd.analyze.defaults import PAY_MARGIN
from recd.layout_read import expand_stacked, read_stacked
from recd.reader.config import SPARSE_PREPROCESS_KINDS, ReaderConfig
from recd.reader.plan import ReadPlan, build_plan
from recd.reader.stored_ops import split_preprocessing
from recd.reader.stream import iter_worker_batches
from recd.reader.transform import build_preprocessing
from recd.tensors.convert import FeatureSpec, convert_sparse
from recd.tensors.preprocess import preprocess_sparse

SAMPLE_BATCHES = 12
"""Full batches of the table timed (evenly spaced over the table)."""
REPS = 5
"""Timed passes over the sample per configuration; the median counts."""

ConfigTimer = Callable[[list[list[str]]], float]
"""Reader seconds per sample of the job with the given dedup groups (plain KJT for the rest).
A :class:`JobTimer` also times pairs of configurations against each other; any other timer
(a model, a test's) is compared by subtraction."""


@dataclass(kw_only=True, slots=True)
class Choice:
    """The groups kept, and what each saves in the context of the others."""

    groups: list[list[str]]
    """Groups kept, in candidate order."""
    saving_s: dict[tuple[str, ...], float]
    """Per candidate group: job time without it minus job time with it, the other groups of
    its last round deduplicated (seconds per sample)."""
    plain_s: float
    """The job with no group deduplicated (seconds per sample)."""
    chosen_s: float
    """The job with the kept groups."""
    rounds: int


def choose_groups(candidates: list[list[str]], timer: ConfigTimer) -> Choice:
    """Backward elimination in context (module doc): at most one round per candidate. The
    savings are paired differences when ``timer`` is a :class:`JobTimer`."""
    plain = timer([])
    difference = (
        timer.difference if isinstance(timer, JobTimer) else lambda a, b: timer(a) - timer(b)
    )
    kept = [list(g) for g in candidates]
    saving: dict[tuple[str, ...], float] = {}
    rounds = 0
    while kept:
        rounds += 1
        with_all = timer(kept)
        for g in kept:
            saving[tuple(g)] = difference([h for h in kept if h is not g], kept)
        keep = [g for g in kept if saving[tuple(g)] > PAY_MARGIN * plain]
        if len(keep) == len(kept):
            if difference([], kept) > PAY_MARGIN * plain:
                return Choice(
                    groups=kept, saving_s=saving, plain_s=plain, chosen_s=with_all, rounds=rounds
                )
            keep = []
        kept = keep
    return Choice(groups=[], saving_s=saving, plain_s=plain, chosen_s=plain, rounds=rounds)


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


def sparse_plan(
    table: Path,
    sparse: list[str],
    *,
    batch_size: int,
    start: str | None,
    end: str | None,
    drop_last: bool = False,
    specs: list[dict[str, Any]] | None = None,
    groups: list[list[str]] | None = None,
) -> ReadPlan:
    """The reader's plan of ``table`` for just the ``sparse`` features (one worker, table
    order, no shuffle), with the sparse preprocessing ``specs`` if given: the batches
    ``recd analyze`` counts and times."""
    config = ReaderConfig(
        table=str(table),
        start=start,
        end=end,
        labels=[],
        dense=[],
        sparse=sparse,
        batch_size=batch_size,
        drop_last=drop_last,
        preprocessing=list(specs or []),
        dedup_sparse_features=groups or [],
    )
    return build_plan(config)


def sample_batches(
    table: Path,
    sparse: list[str],
    *,
    batch_size: int,
    start: str | None,
    end: str | None,
    count: int = SAMPLE_BATCHES,
    preprocessing: list[dict[str, Any]] | None = None,
) -> list[pa.Table]:
    """Up to ``count`` full batches the reader cuts from ``table`` (one worker, table order),
    evenly spaced; the table's only batch if it has no full one. With the job's
    ``preprocessing``, the features the table stores in the dedup layout arrive preprocessed,
    as a reader's do (``recd.reader.stored_ops``); the rest is left to :class:`JobTimer`."""
    specs = sparse_preprocessing(preprocessing or [], sparse)
    # every encoded feature stacked: each configuration gathers what it reads plain (_run)
    alone = [[f] for f in sparse]
    plan = sparse_plan(
        table,
        sparse,
        batch_size=batch_size,
        start=start,
        end=end,
        drop_last=True,
        specs=specs,
        groups=alone,
    )
    total = plan.worker_num_batches(0, 0)
    if total == 0:  # smaller than one batch: time what there is
        plan = sparse_plan(
            table, sparse, batch_size=batch_size, start=start, end=end, specs=specs, groups=alone
        )
        return [b.rows for b in iter_worker_batches(plan, epoch=0, worker=0)]
    step = max(1, total // count)
    wanted = set(range(0, total, step)[:count])
    return [
        b.rows for i, b in enumerate(iter_worker_batches(plan, epoch=0, worker=0)) if i in wanted
    ]


class JobTimer:
    """Times a job's configurations of dedup groups over ``batches`` (a list, or a callable
    reading it when the first configuration is timed): each configuration's conversion +
    sparse preprocessing with its own compiled module (as a reader has), warmed up by one
    pass. ``stacked``: the features that arrive preprocessed (:func:`sample_batches` with
    the same preprocessing), which the module leaves out as the reader's does."""

    def __init__(
        self,
        batches: list[pa.Table] | Callable[[], list[pa.Table]],
        sparse: list[str],
        *,
        preprocessing: list[dict[str, Any]],
        stacked: Sequence[str] = (),
        reps: int = REPS,
    ) -> None:
        self._batches = batches
        self.sparse = sparse
        self.reps = reps
        self._specs = split_preprocessing(sparse_preprocessing(preprocessing, sparse), stacked)[1]
        self._runs: dict[tuple[tuple[str, ...], ...], Callable[[], float]] = {}
        self._seconds: dict[tuple[tuple[str, ...], ...], float] = {}

    def __call__(self, groups: list[list[str]]) -> float:
        """Seconds per sample: the median of ``reps`` passes (cached per configuration)."""
        key = _key(groups)
        if key not in self._seconds:
            run = self._runner(groups)
            with _one_thread():
                self._seconds[key] = statistics.median(run() for _ in range(self.reps))
            self._seconds[key] /= self._rows
        return self._seconds[key]

    def difference(self, a: list[list[str]], b: list[list[str]]) -> float:
        """Seconds per sample of ``a`` minus ``b``: the median over ``reps`` pairs of passes,
        each pair run back to back in alternating order, so a slow stretch of the machine
        lands on both sides of a pair."""
        run_a, run_b = self._runner(a), self._runner(b)
        diffs = []
        with _one_thread():
            for i in range(self.reps):
                if i % 2:
                    tb = run_b()
                    diffs.append(run_a() - tb)
                else:
                    ta = run_a()
                    diffs.append(ta - run_b())
        return statistics.median(diffs) / self._rows

    @property
    def _rows(self) -> int:
        return sum(b.num_rows for b in self._sample())

    def _sample(self) -> list[pa.Table]:
        if callable(self._batches):
            self._batches = self._batches()
        return self._batches

    def _runner(self, groups: list[list[str]]) -> Callable[[], float]:
        key = _key(groups)
        if key not in self._runs:
            batches = self._sample()
            spec = FeatureSpec(sparse=self.sparse, labels=[], dedup_sparse_features=groups)
            with _one_thread():
                module = build_preprocessing(self._specs, dense=[])[0]
                _run(batches, spec, module)  # warm-up: TorchScript profiling, allocator
            self._runs[key] = lambda: _run(batches, spec, module)
        return self._runs[key]


def _key(groups: list[list[str]]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(g) for g in groups)


@contextmanager
def _one_thread() -> Iterator[None]:
    """One reader = one core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _run(batches: list[pa.Table], spec: FeatureSpec, module: torch.nn.Module | None) -> float:
    t0 = time.perf_counter()
    for rows in batches:
        # what the reader gathers per unit: the stacked features outside hash-free groups
        stacked = read_stacked(rows)
        if stacked is not None:
            held = set(stacked.features)
            groups = [g for g in spec.dedup_sparse_features if held.issuperset(g)]
            rows = expand_stacked(rows, keep={f for g in groups for f in g})
        sparse = convert_sparse(rows, spec, source="<analyze>")
        if module is not None:
            preprocess_sparse(sparse, module)
    return time.perf_counter() - t0
