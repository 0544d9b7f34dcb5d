"""Which dedup groups make a job faster, measured on the table's own batches.

A dedup group turns K sparse columns of a batch from part of the plain KJT into an IKJT. The
reader then pays the dedup conversion (stacking, run check, hash table, inverse, gathering the
distinct rows, one more preprocessing call) and saves the work it would have spent on the
duplicate rows; the trainer saves more: the model (:mod:`recd.models`) looks a group's ids up
once per distinct row and runs the ``rm1`` sequence transformers once per distinct sequence.
Whether a group pays depends on the machine, the preprocessing, the model and the group's
shape, so a high DedupeFactor alone does not decide it (a one-id item feature saves the reader
one id per duplicate row while its dedup costs a hash-table probe per row).

So the job itself is timed (:class:`JobTimer`) on an evenly spaced sample of the full batches
the reader cuts from the table, one pass per configuration of groups: the **reader**'s
conversion and sparse preprocessing on one thread, as a reader worker runs it (with fixed
malloc thresholds, :mod:`recd.reader.memory`), and, for a training job, the **trainer**'s step
of the job's own model and optimizer on its ``train.num_threads``
(:class:`recd.analyze.trainer_cost.TrainerStep`; dense features and labels are zeros: that
work is the same in every configuration and cancels). A trainer-priced analysis times fewer
rows (:data:`JOB_SAMPLE_ROWS`, :data:`JOB_REPS` passes): it must stay a step of ``recd run``.

:func:`choose_groups` keeps the candidates by backward elimination *in context*, because
savings do not add up (groups that each save little alone can save clearly together): with
every candidate deduplicated, each one is left out in turn, and a group stays only if leaving
it out costs the priced job more than :data:`PAY_MARGIN` of the plain job's time; what remains
must beat the plain job by that margin too, else nothing is proposed. Every verdict is a
*paired* comparison (:meth:`JobTimer.difference`: the two configurations' passes alternate and
the median difference counts), so that one slow second of a shared machine cannot decide it.
A group near the margin can still go either way between runs; either verdict then costs or
saves little.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import torch

from recd.analyze.defaults import PAY_MARGIN
from recd.reader.config import SPARSE_PREPROCESS_KINDS, ReaderConfig
from recd.reader.plan import ReadPlan, build_plan
from recd.reader.stored_ops import split_preprocessing
from recd.reader.stream import iter_stream_batches
from recd.reader.transform import build_preprocessing
from recd.tensors.batch import SparseFeatures
from recd.tensors.convert import FeatureSpec, convert_sparse
from recd.tensors.preprocess import preprocess_sparse
from recd.tensors.stacked import expand_stacked, read_stacked

SAMPLE_BATCHES = 12
"""Full batches of the table timed (evenly spaced over the table), reader only."""
REPS = 5
"""Timed passes over the sample per configuration, reader only; the median counts."""
JOB_SAMPLE_ROWS = 2048
"""Rows of full batches timed when the trainer step is priced too (each batch costs a
training step): ``ceil(JOB_SAMPLE_ROWS / B)`` batches, at least one, at most
:data:`SAMPLE_BATCHES`, so that a pass costs about the same whatever the batch size."""
JOB_REPS = 5
"""Timed passes (or pairs of passes) per configuration when the trainer step is priced too."""


def job_sample_batches(batch_size: int) -> int:
    """Batches sampled for a trainer-priced analysis at batch size ``batch_size``."""
    return max(1, min(SAMPLE_BATCHES, -(-JOB_SAMPLE_ROWS // batch_size)))


@dataclass(frozen=True, slots=True)
class Cost:
    """Seconds per sample of one configuration of dedup groups (or a difference of two),
    split into the reader's and the trainer's part."""

    reader_s: float
    """Conversion + sparse preprocessing."""
    trainer_s: float = 0.0
    """The job's training step; 0 when only the reader is timed."""

    @property
    def total_s(self) -> float:
        return self.reader_s + self.trainer_s

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.reader_s - other.reader_s, self.trainer_s - other.trainer_s)

    def per(self, rows: int) -> Cost:
        """Seconds of a pass -> seconds per sample of a pass over ``rows`` samples."""
        return Cost(self.reader_s / rows, self.trainer_s / rows)


ConfigTimer = Callable[[list[list[str]]], float | Cost]
"""Seconds per sample of the job with the given dedup groups (plain KJT for the rest): a float
(the reader alone) or a :class:`Cost` (reader and trainer). A :class:`JobTimer` also times
pairs of configurations against each other (``difference``); any other timer (a model, a
test's) is compared by subtraction."""


def as_cost(value: float | Cost) -> Cost:
    """A timer's answer as a :class:`Cost` (a float is the reader's part)."""
    return value if isinstance(value, Cost) else Cost(float(value))


class TrainerPart(Protocol):
    """The trainer's side of a priced job (:class:`recd.analyze.trainer_cost.TrainerStep`)."""

    def seconds(self, batches: list[SparseFeatures]) -> float:
        """Wall seconds of one training step per batch of ``batches``."""
        ...


@dataclass(kw_only=True, slots=True)
class Choice:
    """The groups kept, and what each saves in the context of the others."""

    groups: list[list[str]]
    """Groups kept, in candidate order."""
    saving: dict[tuple[str, ...], Cost]
    """Per candidate group: job time without it minus job time with it, the other groups of
    its last round deduplicated (seconds per sample, reader and trainer parts)."""
    plain: Cost
    """The job with no group deduplicated (seconds per sample)."""
    chosen: Cost
    """The job with the kept groups."""
    rounds: int
    """Elimination rounds run."""
    trainer_priced: bool = True
    """The verdicts priced the reader + trainer total (False: the reader's part alone)."""

    def price(self, cost: Cost) -> float:
        """What a verdict compares: the total, or the reader's part."""
        return cost.total_s if self.trainer_priced else cost.reader_s

    @property
    def saving_s(self) -> dict[tuple[str, ...], float]:
        """Per candidate group, the priced saving (seconds per sample)."""
        return {g: self.price(c) for g, c in self.saving.items()}

    @property
    def plain_s(self) -> float:
        return self.price(self.plain)

    @property
    def chosen_s(self) -> float:
        return self.price(self.chosen)


def choose_groups(
    candidates: list[list[str]], timer: ConfigTimer, *, trainer_priced: bool = True
) -> Choice:
    """Backward elimination in context (module doc): at most one round per candidate. The
    savings are paired differences when ``timer`` has a ``difference`` (a :class:`JobTimer`).
    ``trainer_priced=False``: the verdicts compare the timer's reader part only."""
    paired = getattr(timer, "difference", None)

    def difference(a: list[list[str]], b: list[list[str]]) -> Cost:
        if paired is not None:
            return as_cost(paired(a, b))
        return as_cost(timer(a)) - as_cost(timer(b))

    plain = as_cost(timer([]))
    choice = Choice(
        groups=[], saving={}, plain=plain, chosen=plain, rounds=0, trainer_priced=trainer_priced
    )
    margin = PAY_MARGIN * choice.plain_s
    kept = [list(g) for g in candidates]
    while kept:
        choice.rounds += 1
        for g in kept:
            choice.saving[tuple(g)] = difference([h for h in kept if h is not g], kept)
        keep = [g for g in kept if choice.price(choice.saving[tuple(g)]) > margin]
        if len(keep) == len(kept):
            if choice.price(difference([], kept)) > margin:
                choice.groups, choice.chosen = kept, as_cost(timer(kept))
                return choice
            keep = []
        kept = keep
    return choice


def hash_all_preprocessing(sparse: Sequence[str], *, modulo: int = 1 << 20) -> list[dict[str, Any]]:
    """``--preprocessed``: ``hash_modulo`` of every sparse feature (a typical reader job)."""
    return [{"kind": "hash_modulo", "features": list(sparse), "modulo": modulo}]


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
        streams=1,  # table order, as one process reads it
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
    total = plan.stream_num_batches(0, 0)
    if total == 0:  # smaller than one batch: time what there is
        plan = sparse_plan(
            table, sparse, batch_size=batch_size, start=start, end=end, specs=specs, groups=alone
        )
        return [b.rows for b in iter_stream_batches(plan, epoch=0, stream=0)]
    step = max(1, total // count)
    wanted = set(range(0, total, step)[:count])
    return [
        b.rows for i, b in enumerate(iter_stream_batches(plan, epoch=0, stream=0)) if i in wanted
    ]


class JobTimer:
    """Times a job's configurations of dedup groups over ``batches`` (a list, or a callable
    reading it when the first configuration is timed): each configuration's conversion +
    sparse preprocessing with its own compiled module (as a reader has) and, with a
    ``trainer``, the job's training step on what that conversion produced; warmed up by one
    pass. ``stacked``: the features that arrive preprocessed (:func:`sample_batches` with
    the same preprocessing), which the module leaves out as the reader's does.

    Without a trainer a configuration's time is a float (seconds per sample, the reader);
    with one, a :class:`Cost` (reader and trainer parts)."""

    def __init__(
        self,
        batches: list[pa.Table] | Callable[[], list[pa.Table]],
        sparse: list[str],
        *,
        preprocessing: list[dict[str, Any]],
        stacked: Sequence[str] = (),
        reps: int = REPS,
        trainer: TrainerPart | None = None,
    ) -> None:
        self._batches = batches
        self.sparse = sparse
        self.reps = reps
        self.trainer = trainer
        self._specs = split_preprocessing(sparse_preprocessing(preprocessing, sparse), stacked)[1]
        self._runs: dict[tuple[tuple[str, ...], ...], Callable[[], Cost]] = {}
        self._costs: dict[tuple[tuple[str, ...], ...], Cost] = {}

    def __call__(self, groups: list[list[str]]) -> float | Cost:
        """Seconds per sample: the median of ``reps`` passes, per part (cached per
        configuration)."""
        key = _key(groups)
        if key not in self._costs:
            run = self._runner(groups)
            passes = [run() for _ in range(self.reps)]
            self._costs[key] = Cost(
                statistics.median(p.reader_s for p in passes),
                statistics.median(p.trainer_s for p in passes),
            ).per(self._rows)
        return self._answer(self._costs[key])

    def difference(self, a: list[list[str]], b: list[list[str]]) -> float | Cost:
        """Seconds per sample of ``a`` minus ``b``: the pair of median total difference over
        ``reps`` pairs of passes, each pair run back to back in alternating order, so a slow
        stretch of the machine lands on both sides of a pair."""
        run_a, run_b = self._runner(a), self._runner(b)
        diffs = []
        for i in range(self.reps):
            if i % 2:
                tb = run_b()
                diffs.append(run_a() - tb)
            else:
                ta = run_a()
                diffs.append(ta - run_b())
        return self._answer(median_pair(diffs).per(self._rows))

    def _answer(self, cost: Cost) -> float | Cost:
        return cost if self.trainer is not None else cost.reader_s

    @property
    def _rows(self) -> int:
        return sum(b.num_rows for b in self._sample())

    def _sample(self) -> list[pa.Table]:
        if callable(self._batches):
            self._batches = self._batches()
        return self._batches

    def _runner(self, groups: list[list[str]]) -> Callable[[], Cost]:
        key = _key(groups)
        if key not in self._runs:
            batches = self._sample()
            spec = FeatureSpec(sparse=self.sparse, labels=[], dedup_sparse_features=groups)
            with torch_threads(1):
                module = build_preprocessing(self._specs, dense=[])[0]
            trainer = self.trainer

            def run() -> Cost:
                if trainer is None:
                    with torch_threads(1):  # one reader = one core
                        return Cost(_run(batches, spec, module))
                converted: list[SparseFeatures] = []
                with torch_threads(1):
                    reader_s = _run(batches, spec, module, converted)
                return Cost(reader_s, trainer.seconds(converted))

            run()  # warm-up: TorchScript profiling, allocator, the model's first steps
            self._runs[key] = run
        return self._runs[key]


def median_pair(diffs: list[Cost]) -> Cost:
    """The difference of median total (the mean of the two middle ones for an even count):
    its parts add up to the median total."""
    ranked = sorted(diffs, key=lambda c: c.total_s)
    mid = len(ranked) // 2
    if len(ranked) % 2:
        return ranked[mid]
    lo, hi = ranked[mid - 1], ranked[mid]
    return Cost((lo.reader_s + hi.reader_s) / 2, (lo.trainer_s + hi.trainer_s) / 2)


def _key(groups: list[list[str]]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(g) for g in groups)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch intra-op threads = ``n`` inside the block (restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _run(
    batches: list[pa.Table],
    spec: FeatureSpec,
    module: torch.nn.Module | None,
    out: list[SparseFeatures] | None = None,
) -> float:
    """Seconds of the reader's conversion + sparse preprocessing of ``batches``; ``out``
    collects the sparse features it produced (what the trainer is fed)."""
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
            sparse = preprocess_sparse(sparse, module)
        if out is not None:
            out.append(sparse)
    return time.perf_counter() - t0
