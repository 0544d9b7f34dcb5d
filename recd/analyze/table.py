"""Per-feature dedup analysis of a table: the RecD analytic model, measured, and a proposal.

For each sparse feature f of a table (committed partitions only):

* S    mean samples per session (rows / sessions; a session cut by an hourly partition
       boundary counts once per partition, as a reader sees it);
* d(f) fraction of adjacent row pairs of a session whose value of f is unchanged;
* l(f) mean length (ids per row).

These give RecD's analytic model at batch size B::

    DedupeLen(f)    = B * l(f) * (1/S + (1 - 1/S) * (1 - d(f)))
    DedupeFactor(f) = B * l(f) / DedupeLen(f)

and, next to it, the measured DedupeFactor: total ids / ids left after deduplicating exact
duplicate rows inside each batch that the reader itself cuts (:mod:`recd.reader.stream`, one
worker, no shuffle: batches of B rows that span row groups and partitions, the last partial
batch kept) with the reader's own dedup (:func:`recd.tensors.jagged.find_distinct_stacked`). The
factor is therefore exactly the one a reader of that table gets (ids in its KJT / ids in its
IKJT).

S, d and l are properties of sessions, so they are measured in (session_id, ts) order: a
clustered table (O2) already is in that order inside each partition; an unclustered one is
sorted in memory per partition (and reported as not clustered), while its measured factor
stays that of the stored order, i.e. what a reader of that table gets.

Proposal: features whose DedupeFactor (measured) exceeds ``threshold`` are candidates;
synchronised candidates are grouped to share one inverse lookup. Two features are
synchronised when the catalogue puts them in one ``group``, or when their change points
coincide on at least ``sync_threshold`` of the adjacent within-session row pairs. Then
``pricing`` decides which candidates are proposed: ``job`` (``recd analyze`` and ``recd run``,
through :mod:`recd.analyze.job`) times the training job's reader and trainer step on the
table's own batches and keeps the groups that pay (:mod:`recd.analyze.costs`); ``reader`` times
the reader alone, so a single feature of at most one id per row is never proposed unless the
table stores it in the dedup layout (no hashing: its timing decides); ``factor``: the factor
alone decides, as in the paper. Each proposed and rejected group carries its expected saving
in ms per 1k samples, split into the reader's and the trainer's part.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recd.analyze.costs import (
    JOB_REPS,
    REPS,
    SAMPLE_BATCHES,
    ConfigTimer,
    Cost,
    JobTimer,
    choose_groups,
    job_sample_batches,
    sample_batches,
    sparse_plan,
)
from recd.analyze.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_SYNC_THRESHOLD,
    DEFAULT_THRESHOLD,
    PAY_MARGIN,
    PRICINGS,
    Pricing,
)
from recd.errors import ConfigError, SchemaError
from recd.progress import progress
from recd.reader.stream import iter_stream_batches
from recd.schema import CATALOGUE_METADATA_KEY, SESSION_ID, TS, Catalogue, catalogue_from_schema
from recd.table.layout import layout_of
from recd.table.partitions import parse_time_ms
from recd.table.snapshot import committed_files
from recd.tensors.jagged import (
    JaggedColumn,
    find_distinct_stacked,
    read_list_column,
    read_stacked_columns,
)
from recd.tensors.stacked import read_plain

if TYPE_CHECKING:
    from recd.analyze.trainer_cost import TrainerStep


def dedupe_len(
    *, batch_size: int, mean_length: float, samples_per_session: float, unchanged: float
) -> float:
    """Analytic ids per batch after dedup: B * l * (1/S + (1 - 1/S) * (1 - d)).

    Evaluated as B * l * (1 + (S - 1) * (1 - d)) / S (the same value, fewer roundings: the
    paper's example B = S = 3, l = 3, d = 0.5 gives exactly 6.0).
    """
    s = samples_per_session
    return batch_size * mean_length * (1.0 + (s - 1.0) * (1.0 - unchanged)) / s


def dedupe_factor(
    *, batch_size: int, mean_length: float, samples_per_session: float, unchanged: float
) -> float:
    """Analytic B * l / DedupeLen (1.0 for a feature with no ids)."""
    length = dedupe_len(
        batch_size=batch_size,
        mean_length=mean_length,
        samples_per_session=samples_per_session,
        unchanged=unchanged,
    )
    return batch_size * mean_length / length if length > 0 else 1.0


@dataclass(kw_only=True, slots=True)
class FeatureAnalysis:
    """The model inputs and dedup factors of one sparse feature."""

    name: str
    mean_length: float
    """l(f): ids per row."""
    unchanged: float
    """d(f): fraction of adjacent within-session pairs with the same value."""
    dedupe_len: float
    """Analytic ids per batch after dedup."""
    dedupe_factor: float
    """Analytic B * l / DedupeLen."""
    measured_factor: float
    """Ids / ids after exact dedup inside the reader's batches of B rows."""
    values: int
    """Ids in the table."""
    values_after_dedup: int
    """Ids left after the per-batch dedup (the ids of the feature's IKJT)."""
    catalogue_group: str | None = None
    """The feature's synchronised group in the catalogue, if any."""


@dataclass(kw_only=True, slots=True)
class GroupProposal:
    """One proposed entry of ``dedup_sparse_features``."""

    features: list[str]
    source: str
    """Why the features are together: "single", "catalogue", "data" or "catalogue+data"."""
    measured_factor: float
    """Measured factor of the group deduplicated as one (shared inverse lookup)."""
    expected_saving_ms_per_1k: float | None = None
    """Ms per 1k samples the group saves the priced job (reader + trainer, or the reader
    alone) with the other groups of its last round deduplicated, as measured on the sample
    (None: priced by the factor alone)."""
    reader_saving_ms_per_1k: float | None = None
    """Its reader part (conversion + sparse preprocessing)."""
    trainer_saving_ms_per_1k: float | None = None
    """Its trainer part (the job's training step); None: the trainer was not priced."""


@dataclass(kw_only=True, slots=True)
class RejectedGroup(GroupProposal):
    """A candidate group (factor above the threshold) not proposed: it would not pay."""

    reason: str


@dataclass(kw_only=True, slots=True)
class SyncPair:
    """Two features whose change points (adjacent within-session pairs) coincide."""

    features: list[str]
    coincidence: float
    """Share of the adjacent within-session pairs where both change or neither does."""
    joint_changes: float
    """Of the pairs where either changes, the share where both do (information only: two
    features that rarely change coincide on most pairs even when independent)."""


@dataclass(kw_only=True, slots=True)
class TableAnalysis:
    """Everything ``recd analyze`` reports about one table."""

    table: str
    batch_size: int
    threshold: float
    sync_threshold: float
    rows: int
    sessions: int
    """Session-partitions: a session counted once per partition it spans (as a reader sees
    it), so more than the distinct session ids ``recd logs ingest`` reports when sessions
    cross partition boundaries."""
    samples_per_session: float
    """S: rows / sessions."""
    clustered: bool
    """Every partition stores each session contiguously, in ts order."""
    features: list[FeatureAnalysis]
    groups: list[GroupProposal]
    synchronised_pairs: list[SyncPair] = field(default_factory=list)
    """Feature pairs whose change points coincide on >= sync_threshold of the pairs."""
    rejected: list[RejectedGroup] = field(default_factory=list)
    """Candidate groups that would not make the priced job faster, with the reason."""
    pricing: Pricing = "factor"
    """What priced the proposal: "job" (reader + trainer of a training job), "reader" (the
    reader alone) or "factor" (the dedup factor alone)."""
    job: str | None = None
    """The training job priced (its reader only, with ``pricing = "reader"``), e.g. ``the job
    train.toml (model rm1, embedding_dim 16, ...)``; None: none."""
    cost_model: str = "none"
    """How the proposal was chosen: "none" (factor only) or what the timing measured."""
    batches: int = 0
    """Reader batches of B rows over the analysed window (the last one may be partial)."""
    reader_ms_per_1k: dict[str, float] = field(default_factory=dict)
    """Timed: the reader's ms per 1k samples (conversion + sparse preprocessing), "plain"
    (no dedup) and "proposed" (the proposed groups)."""
    trainer_ms_per_1k: dict[str, float] = field(default_factory=dict)
    """Priced for a job: the trainer step's ms per 1k samples, "plain" and "proposed"."""

    @property
    def dedup_sparse_features(self) -> list[list[str]]:
        """The proposal, ready for ``ReaderConfig.dedup_sparse_features``."""
        return [list(g.features) for g in self.groups]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["dedup_sparse_features"] = self.dedup_sparse_features
        return out


# ---------------------------------------------------------------------- vectorised kernels
def adjacent_unchanged(column: JaggedColumn) -> np.ndarray:
    """(N - 1,) bool: row i + 1 holds exactly the same ids as row i."""
    offsets, values = column
    lengths = np.diff(offsets)
    same = lengths[1:] == lengths[:-1]
    rows = np.flatnonzero(same)  # pair i compares row i and row i + 1
    n = lengths[rows]
    starts = np.repeat(offsets[rows], n)
    position = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    mismatch = values[starts + position] != values[starts + position + np.repeat(n, n)]
    bad_pairs = rows[np.repeat(np.arange(rows.size), n)[mismatch]]
    same[bad_pairs] = False
    return same


def session_breaks(session_ids: np.ndarray) -> np.ndarray:
    """(N - 1,) bool: rows i and i + 1 belong to different sessions."""
    return session_ids[1:] != session_ids[:-1]


def is_clustered(session_ids: np.ndarray, ts: np.ndarray) -> bool:
    """Each session is one contiguous run of rows, with non-decreasing ts inside it."""
    if len(session_ids) < 2:
        return True
    breaks = session_breaks(session_ids)
    if int(breaks.sum()) + 1 != len(np.unique(session_ids)):
        return False
    return bool(np.all((ts[1:] >= ts[:-1]) | breaks))


# ---------------------------------------------------------------------- reader batches
@dataclass(slots=True)
class DedupCounts:
    """One group's dedup over the reader's batches (a single feature is a group of one)."""

    batches: int = 0
    rows: int = 0
    ids: int = 0
    """Ids of the group's features (what its KJT would hold)."""
    distinct_ids: int = 0
    """Ids in the distinct rows of each batch (what its IKJT holds)."""

    @property
    def factor(self) -> float:
        return self.ids / self.distinct_ids if self.distinct_ids else 1.0


def reader_dedup_counts(
    root: Path,
    groups: list[list[str]],
    *,
    batch_size: int,
    start: str | None,
    end: str | None,
    show_progress: bool = False,
) -> list[DedupCounts]:
    """Dedup every group inside each batch the reader cuts from ``root`` (one stream, table
    order): ids in, distinct rows and ids out, exactly as the reader's IKJT conversion."""
    features = list(dict.fromkeys(f for g in groups for f in g))
    plan = sparse_plan(root, features, batch_size=batch_size, start=start, end=end)
    counts = [DedupCounts() for g in groups]
    batches = iter_stream_batches(plan, epoch=0, stream=0)
    total = plan.stream_num_batches(0, 0)
    if show_progress:
        batches = progress(batches, desc="analyze: reader batches", total=total, unit="batch")
    for batch in batches:
        _count_batch(batch.rows, groups, counts, source=str(root))
    return counts


def _count_batch(
    rows: pa.Table, groups: list[list[str]], counts: list[DedupCounts], *, source: str
) -> None:
    b = rows.num_rows
    for group, c in zip(groups, counts, strict=True):
        stacked = read_stacked_columns(rows, group, source=source)
        distinct, _ = find_distinct_stacked(stacked, num_keys=len(group), batch_size=b)
        lengths = np.diff(stacked.offsets).reshape(len(group), b)
        c.batches += 1
        c.rows += b
        c.ids += int(stacked.offsets[-1])
        c.distinct_ids += int(lengths[:, distinct].sum())


# ---------------------------------------------------------------------- table scan
@dataclass(slots=True)
class _Totals:
    rows: int = 0
    sessions: int = 0
    pairs: int = 0
    clustered: bool = True
    values: dict[str, int] = field(default_factory=dict)
    unchanged: dict[str, int] = field(default_factory=dict)
    coincide: dict[tuple[str, str], int] = field(default_factory=dict)
    either: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, bucket: dict[Any, int], key: Any, n: int) -> None:
        bucket[key] = bucket.get(key, 0) + n


def _iter_partitions(
    table: Path, columns: list[str], *, start: str | None, end: str | None
) -> Iterator[tuple[str, pa.Table]]:
    start_ms = parse_time_ms(start, field="start") if start else None
    end_ms = parse_time_ms(end, field="end") if end else None
    view = committed_files(table, start_ms=start_ms, end_ms=end_ms)
    for partition, files in view.partitions:
        parts = []
        for path in files:
            schema = _read_schema(path)
            stored = layout_of(schema, source=str(path)).physical_columns(columns)
            missing = [c for c in stored if schema.get_field_index(c) < 0]
            if missing:
                raise SchemaError(f"{path}: missing column {missing[0]!r}")
            try:
                parts.append(read_plain(str(path), columns))
            except (OSError, pa.ArrowInvalid) as exc:
                raise _unreadable(path, exc) from exc
        if parts:
            yield str(partition), pa.concat_tables(parts).combine_chunks()


def table_sparse_features(table: str | Path) -> list[str]:
    """The sparse features of a table's catalogue (SchemaError when it has none)."""
    catalogue = _read_catalogue(Path(table))
    if catalogue is None:
        raise SchemaError(f"{table}: no recd catalogue in the table; list the features")
    return catalogue.sparse_names


def _read_catalogue(table: Path) -> Catalogue | None:
    for path in committed_files(table).files:
        schema = _read_schema(path)
        if schema.metadata and CATALOGUE_METADATA_KEY in schema.metadata:
            return catalogue_from_schema(schema, source=str(path))
        return None
    return None


def _read_schema(path: Path) -> pa.Schema:
    try:
        return pq.read_schema(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise _unreadable(path, exc) from exc


def _unreadable(path: Path, exc: Exception) -> SchemaError:
    """A table file that cannot be read (truncated, damaged, missing): names it."""
    return SchemaError(f"{path}: not a readable Parquet file: {exc}")


GroupCounter = Callable[[list[list[str]]], list["DedupCounts"]]
"""Counts the dedup of each group over the batches of the source being analysed."""


def analyze_table(
    table: str | Path,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    threshold: float = DEFAULT_THRESHOLD,
    sync_threshold: float = DEFAULT_SYNC_THRESHOLD,
    features: list[str] | None = None,
    start: str | None = None,
    end: str | None = None,
    pricing: Pricing | None = None,
    cost_aware: bool = False,
    preprocessing: list[dict[str, Any]] | None = None,
    trainer: TrainerStep | None = None,
    show_progress: bool = False,
    timer: ConfigTimer | None = None,
) -> TableAnalysis:
    """Measure S, d(f), l(f) and the dedup factors of ``table``; propose dedup groups.

    ``pricing`` (module doc; None: ``"reader"`` if ``cost_aware`` or a ``timer`` is given,
    else ``"factor"``):

    * ``"job"`` keeps the groups whose dedup makes the training job faster: the reader's
      conversion with the job's sparse preprocessing and the ``trainer``'s step
      (:class:`recd.analyze.trainer_cost.TrainerStep`: its model, threads and reader
      preprocessing), timed on the table's own batches of every sparse feature the job reads;
    * ``"reader"`` keeps the groups whose dedup makes the reader faster, timed with
      ``preprocessing`` (reader config specs; the sparse ones matter: dedup runs them once per
      distinct row), else the ``trainer``'s reader preprocessing; one-id single features are
      refused;
    * ``"factor"``: the factor alone decides.

    ``timer`` replaces the timing (seconds per sample of the job with given dedup groups: a
    float, the reader's, or a :class:`recd.analyze.costs.Cost` with the trainer's part too).
    :func:`recd.analyze.job.analyze_for_job` resolves a training job into these arguments.
    """
    if pricing is None:
        pricing = "reader" if cost_aware or timer is not None else "factor"
    if pricing not in PRICINGS:
        raise ConfigError(
            f"analyze: pricing = {pricing!r}: expected one of {', '.join(map(repr, PRICINGS))}"
        )
    if pricing == "job" and trainer is None and timer is None:
        raise ConfigError("analyze: pricing = 'job' needs the training job to price")
    if batch_size < 1:
        raise ConfigError(f"analyze: batch_size must be >= 1, got {batch_size}")
    if not 0.0 < sync_threshold <= 1.0:
        raise ConfigError(f"analyze: sync_threshold must be in (0, 1], got {sync_threshold}")
    root = Path(table)
    if not root.is_dir():
        raise ConfigError(f"analyze: table {root} is not a directory")
    catalogue = _read_catalogue(root)
    if features is None:
        if catalogue is None:
            raise SchemaError(
                f"{root}: no recd catalogue in the table; list the features to analyze"
            )
        features = catalogue.sparse_names
    if preprocessing is None:
        preprocessing = trainer.preprocessing if trainer is not None else []
    timed = features
    if pricing == "job" and trainer is not None:
        timed = trainer.sparse  # the model reads every feature: the rest stays plain
        outside = [f for f in features if f not in timed]
        if outside:
            raise ConfigError(
                f"analyze: feature {outside[0]!r} is not one the priced job reads "
                f"({trainer.name}: {', '.join(timed)})"
            )
    totals = _Totals()
    for name, part in _iter_partitions(root, [SESSION_ID, TS, *features], start=start, end=end):
        _scan_partition(part, features, totals=totals, source=f"{root}/{name}")
    if totals.rows == 0:
        raise ConfigError(f"analyze: {root} has no committed rows in the window")

    def counter(groups: list[list[str]]) -> list[DedupCounts]:
        return reader_dedup_counts(
            root, groups, batch_size=batch_size, start=start, end=end, show_progress=show_progress
        )

    plan = sparse_plan(root, timed, batch_size=batch_size, start=start, end=end)
    with_trainer = pricing == "job"
    if timer is None and pricing != "factor":
        # the sample is read when the first configuration is timed
        timer = JobTimer(
            lambda: sample_batches(
                root,
                timed,
                batch_size=batch_size,
                start=start,
                end=end,
                preprocessing=preprocessing,
                count=job_sample_batches(batch_size) if with_trainer else SAMPLE_BATCHES,
            ),
            timed,
            preprocessing=preprocessing,
            stacked=plan.encoded,
            reps=JOB_REPS if with_trainer else REPS,
            trainer=trainer if with_trainer else None,
        )
    return _summarise(
        root,
        catalogue,
        features,
        totals,
        counter,
        batch_size=batch_size,
        threshold=threshold,
        sync_threshold=sync_threshold,
        timer=timer if pricing != "factor" else None,
        pricing=pricing,
        job=None if trainer is None else f"{trainer.name} ({trainer.describe()})",
        preprocessing=preprocessing,
        stacked=frozenset(plan.encoded),
    )


def analyze_rows(
    rows: pa.Table,
    *,
    catalogue: Catalogue | None = None,
    features: list[str] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    threshold: float = DEFAULT_THRESHOLD,
    sync_threshold: float = DEFAULT_SYNC_THRESHOLD,
    source: str = "<rows>",
) -> TableAnalysis:
    """Analyze rows held in memory (e.g. a raw log) as the clustered table would store them.

    Rows are first clustered by (session_id, ts) as the ETL does and cut into batches of
    ``batch_size`` consecutive rows (one partition read by one reader). The factor alone
    decides the proposal.
    """
    if features is None:
        if catalogue is None:
            raise ConfigError("analyze_rows: give the catalogue or the features to analyze")
        features = catalogue.sparse_names
    order = pc.sort_indices(rows, sort_keys=[(SESSION_ID, "ascending"), (TS, "ascending")])
    part = rows.select([SESSION_ID, TS, *features]).take(order).combine_chunks()
    totals = _Totals()
    _scan_partition(part, features, totals=totals, source=source)
    if totals.rows == 0:
        raise ConfigError(f"analyze: {source} has no rows")

    def counter(groups: list[list[str]]) -> list[DedupCounts]:
        counts = [DedupCounts() for g in groups]
        for start in range(0, part.num_rows, batch_size):
            _count_batch(part.slice(start, batch_size), groups, counts, source=source)
        return counts

    return _summarise(
        Path(source),
        catalogue,
        features,
        totals,
        counter,
        batch_size=batch_size,
        threshold=threshold,
        sync_threshold=sync_threshold,
        timer=None,
        preprocessing=[],
    )


def _scan_partition(part: pa.Table, features: list[str], *, totals: _Totals, source: str) -> None:
    sessions = part.column(SESSION_ID).to_numpy()
    ts = part.column(TS).to_numpy()
    stored = {f: read_list_column(part, f, source=source) for f in features}
    for f, col in stored.items():
        totals.add(totals.values, f, int(col.offsets[-1] - col.offsets[0]))
    clustered = is_clustered(sessions, ts)
    totals.clustered &= clustered
    if not clustered:  # S, d, l are session properties: measure them in (session, ts) order
        order = np.lexsort((ts, sessions))
        part = part.take(pa.array(order))
        sessions = sessions[order]
        stored = {f: read_list_column(part, f, source=source) for f in features}
    inside = ~session_breaks(sessions)
    totals.rows += len(sessions)
    totals.sessions += int((~inside).sum()) + 1 if len(sessions) else 0
    totals.pairs += int(inside.sum())
    changes = {f: ~adjacent_unchanged(col) & inside for f, col in stored.items()}
    for f in features:
        totals.add(totals.unchanged, f, int((inside & ~changes[f]).sum()))
    for i, f in enumerate(features):
        for g in features[i + 1 :]:
            agree = int((inside & (changes[f] == changes[g])).sum())
            totals.add(totals.coincide, (f, g), agree)
            totals.add(totals.either, (f, g), int((changes[f] | changes[g]).sum()))


def _summarise(
    root: Path,
    catalogue: Catalogue | None,
    features: list[str],
    totals: _Totals,
    counter: GroupCounter,
    *,
    batch_size: int,
    threshold: float,
    sync_threshold: float,
    timer: ConfigTimer | None,
    pricing: Pricing = "factor",
    job: str | None = None,
    preprocessing: list[dict[str, Any]],
    stacked: frozenset[str] = frozenset(),
) -> TableAnalysis:
    s = totals.rows / totals.sessions
    cat_group = {f.name: f.group for f in catalogue.sparse} if catalogue is not None else {}
    singles = dict(zip(features, counter([[f] for f in features]), strict=True))
    rows: list[FeatureAnalysis] = []
    for f in features:
        length = totals.values[f] / totals.rows
        d = totals.unchanged[f] / totals.pairs if totals.pairs else 1.0
        rows.append(
            FeatureAnalysis(
                name=f,
                mean_length=length,
                unchanged=d,
                dedupe_len=dedupe_len(
                    batch_size=batch_size, mean_length=length, samples_per_session=s, unchanged=d
                ),
                dedupe_factor=dedupe_factor(
                    batch_size=batch_size, mean_length=length, samples_per_session=s, unchanged=d
                ),
                measured_factor=singles[f].factor,
                values=singles[f].ids,
                values_after_dedup=singles[f].distinct_ids,
                catalogue_group=cat_group.get(f),
            )
        )
    pairs = [
        SyncPair(
            features=[f, g],
            coincidence=n / totals.pairs if totals.pairs else 1.0,
            joint_changes=(n - (totals.pairs - totals.either[f, g])) / totals.either[f, g]
            if totals.either[f, g]
            else 1.0,
        )
        for (f, g), n in totals.coincide.items()
    ]
    synced = [p for p in pairs if p.coincidence >= sync_threshold]
    candidates = [r.name for r in rows if r.measured_factor > threshold]
    groups = propose_groups(candidates, cat_group, [(p.features[0], p.features[1]) for p in synced])
    multi = [g for g, _ in groups if len(g) > 1]
    counts = {tuple(g): c for g, c in zip(multi, counter(multi), strict=True)} if multi else {}
    counts.update({(f,): singles[f] for g, _ in groups if len(g) == 1 for f in g})
    mean_length = {r.name: r.mean_length for r in rows}
    decided = _decide(groups, counts, mean_length, timer, pricing=pricing, stacked=stacked)
    proposals, rejected, reader_ms, trainer_ms = decided
    basis = "none"
    if timer is not None:
        kinds = sorted({spec["kind"] for spec in preprocessing}) or ["no preprocessing"]
        timed = "the reader" if pricing == "reader" else "the reader + the job's training step"
        basis = (
            f"{timed} timed on this machine on the table's own batches "
            f"({', '.join(kinds)}); each kept group saves > {PAY_MARGIN:.0%} of the plain job "
            "with the others kept"
        )
    return TableAnalysis(
        table=str(root),
        batch_size=batch_size,
        threshold=threshold,
        sync_threshold=sync_threshold,
        rows=totals.rows,
        sessions=totals.sessions,
        samples_per_session=s,
        clustered=totals.clustered,
        features=rows,
        groups=proposals,
        synchronised_pairs=synced,
        rejected=rejected,
        pricing=pricing,
        job=job,
        cost_model=basis,
        batches=next(iter(singles.values())).batches if singles else 0,
        reader_ms_per_1k=reader_ms,
        trainer_ms_per_1k=trainer_ms,
    )


def _decide(
    groups: list[tuple[list[str], str]],
    counts: dict[tuple[str, ...], DedupCounts],
    mean_length: dict[str, float],
    timer: ConfigTimer | None,
    *,
    pricing: Pricing,
    stacked: frozenset[str] = frozenset(),
) -> tuple[list[GroupProposal], list[RejectedGroup], dict[str, float], dict[str, float]]:
    """Proposed and rejected groups (with reasons) and the job's measured reader and trainer
    times (ms per 1k samples, plain and proposed).

    Priced for the reader alone, a single feature of at most one id per row is refused
    untimed, unless the table stores it in the dedup layout (``stacked``: its IKJT is built
    without hashing, so its timing decides)."""
    found = {
        tuple(g): GroupProposal(features=g, source=src, measured_factor=counts[tuple(g)].factor)
        for g, src in groups
    }
    if timer is None:  # the factor alone decides
        return list(found.values()), [], {}, {}
    with_trainer = pricing == "job"
    rejected: list[RejectedGroup] = []
    candidates = []
    for g, _ in groups:
        if not with_trainer and len(g) == 1 and mean_length[g[0]] <= 1.0 and g[0] not in stacked:
            reason = (
                "a single feature of at most one id per row: a hash probe per row costs the "
                "reader more than the id it saves"
            )
            rejected.append(RejectedGroup(**asdict(found[tuple(g)]), reason=reason))
        else:
            candidates.append(g)
    choice = choose_groups(candidates, timer, trainer_priced=with_trainer)
    margin_ms = PAY_MARGIN * choice.plain_s * PER_1K
    kept = {tuple(g) for g in choice.groups}
    proposals = []
    who = "the job" if with_trainer else "the reader"
    for g in candidates:
        item = found[tuple(g)]
        saving = choice.saving.get(tuple(g))
        if saving is not None:
            _set_saving(item, saving, choice.price(saving), with_trainer=with_trainer)
        if tuple(g) in kept:
            proposals.append(item)
            continue
        total = item.expected_saving_ms_per_1k
        reason = (
            f"leaving it out costs {who} {total:.3f} ms per 1k samples (measured, other "
            f"candidates deduplicated), not more than {margin_ms:.3f} ({PAY_MARGIN:.0%} of the "
            "plain job)"
            if total is not None and total <= margin_ms
            else f"the groups left do not beat the plain job by {PAY_MARGIN:.0%} (measured)"
        )
        rejected.append(RejectedGroup(**asdict(item), reason=reason))
    reader_ms = {
        "plain": choice.plain.reader_s * PER_1K,
        "proposed": choice.chosen.reader_s * PER_1K,
    }
    trainer_ms = (
        {"plain": choice.plain.trainer_s * PER_1K, "proposed": choice.chosen.trainer_s * PER_1K}
        if with_trainer
        else {}
    )
    return proposals, rejected, reader_ms, trainer_ms


PER_1K = 1e6
"""Seconds per sample -> ms per 1k samples."""


def _set_saving(item: GroupProposal, saving: Cost, priced: float, *, with_trainer: bool) -> None:
    """A group's measured saving (seconds per sample) as ms per 1k samples, split by side."""
    item.expected_saving_ms_per_1k = priced * PER_1K
    item.reader_saving_ms_per_1k = saving.reader_s * PER_1K
    item.trainer_saving_ms_per_1k = saving.trainer_s * PER_1K if with_trainer else None


def propose_groups(
    candidates: list[str],
    catalogue_groups: dict[str, str | None],
    synchronised: list[tuple[str, str]],
) -> list[tuple[list[str], str]]:
    """Group ``candidates`` (in order): union of catalogue groups and synchronised pairs.

    Returns (features, source) per group; source says which evidence joined them.
    """
    parent = {f: f for f in candidates}

    def find(f: str) -> str:
        while parent[f] != f:
            parent[f] = parent[parent[f]]
            f = parent[f]
        return f

    def union(a: str, b: str) -> None:
        parent[find(b)] = find(a)

    by_catalogue: dict[str, list[str]] = {}
    for f in candidates:
        if catalogue_groups.get(f):
            by_catalogue.setdefault(str(catalogue_groups[f]), []).append(f)
    cat_edges = {
        (a, b) for members in by_catalogue.values() for a in members for b in members if a < b
    }
    data_edges = {tuple(sorted(p)) for p in synchronised if p[0] in parent and p[1] in parent}
    for a, b in cat_edges | data_edges:
        union(a, b)
    out: dict[str, list[str]] = {}
    for f in candidates:
        out.setdefault(find(f), []).append(f)
    result = []
    for members in out.values():
        if len(members) == 1:
            result.append((members, "single"))
            continue
        inside = {(a, b) for a in members for b in members if a < b}
        has_cat, has_data = bool(inside & cat_edges), bool(inside & data_edges)
        source = "catalogue+data" if has_cat and has_data else "catalogue" if has_cat else "data"
        result.append((members, source))
    return result


# ---------------------------------------------------------------------- reports
def format_report(analysis: TableAnalysis) -> str:
    """A readable table plus the proposal in TOML syntax."""
    a = analysis
    lines = [
        f"table {a.table}: {a.rows} rows, {a.sessions} session-partitions (a session counted "
        f"once per partition it spans), S = {a.samples_per_session:.2f}, "
        f"B = {a.batch_size}, {'clustered' if a.clustered else 'NOT clustered (d measured after sorting)'}",
        "",
        f"{'feature':<24} {'l':>7} {'d':>6} {'DedupeLen':>10} {'factor':>7} {'measured':>8}  dedup",
    ]
    chosen = {f for g in a.groups for f in g.features}
    for r in a.features:
        mark = "yes" if r.name in chosen else "-"
        lines.append(
            f"{r.name:<24} {r.mean_length:>7.2f} {r.unchanged:>6.3f} {r.dedupe_len:>10.1f} "
            f"{r.dedupe_factor:>7.2f} {r.measured_factor:>8.2f}  {mark}"
        )
    lines.append("")
    lines.append(f"{a.batches} reader batches of B = {a.batch_size}; priced by: {pricing_rule(a)}")
    if a.pricing != "factor":
        lines.append(f"cost model: {a.cost_model}")
    if a.reader_ms_per_1k:
        lines.append(
            f"reader (conversion + sparse preprocessing), ms per 1k samples: plain "
            f"{a.reader_ms_per_1k['plain']:.3f}, with the proposal "
            f"{a.reader_ms_per_1k['proposed']:.3f}"
        )
    if a.trainer_ms_per_1k:
        lines.append(
            f"trainer (the job's training step), ms per 1k samples: plain "
            f"{a.trainer_ms_per_1k['plain']:.3f}, with the proposal "
            f"{a.trainer_ms_per_1k['proposed']:.3f}"
        )
    for g in a.groups:
        lines.append(
            f"group {g.features} ({g.source}): measured factor {g.measured_factor:.2f}"
            f"{_saving_text(g)}"
        )
    for rej in a.rejected:
        lines.append(
            f"not proposed: {rej.features} ({rej.source}), measured factor "
            f"{rej.measured_factor:.2f}{_saving_text(rej)}: {rej.reason}"
        )
    lines.append(f"dedup_sparse_features = {json.dumps(a.dedup_sparse_features)}")
    return "\n".join(lines)


def pricing_rule(analysis: TableAnalysis) -> str:
    """Which rule priced the proposal, in words (``reader + trainer of the job ...``)."""
    if analysis.pricing == "job":
        return f"reader + trainer of {analysis.job or 'the job'}"
    if analysis.pricing == "reader":
        return "reader only" + (f" (the reader of {analysis.job})" if analysis.job else "")
    return "factor only (the paper's rule: every candidate above the threshold)"


def _saving_text(group: GroupProposal) -> str:
    """``, saves 1.234 ms per 1k samples (reader -0.012, trainer 1.246)``, or nothing."""
    if group.expected_saving_ms_per_1k is None:
        return ""
    text = f", saves {group.expected_saving_ms_per_1k:.3f} ms per 1k samples"
    if group.trainer_saving_ms_per_1k is not None and group.reader_saving_ms_per_1k is not None:
        text += (
            f" (reader {group.reader_saving_ms_per_1k:.3f}, trainer "
            f"{group.trainer_saving_ms_per_1k:.3f})"
        )
    else:
        text += " (reader)"
    return text


def write_json(analysis: TableAnalysis, path: str | Path) -> None:
    Path(path).write_text(json.dumps(analysis.to_dict(), indent=1) + "\n")
