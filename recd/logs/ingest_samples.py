"""Samples of ingested events: histories, measured statistics, the catalogue.

``recd logs ingest`` parses an event log into buckets of whole sessions; per bucket,
:class:`BucketSamples` puts the events in session order (session, ts, line) and cuts each
sample's history out of it, then yields the samples in arrival order (ts, request_id)
(``ingest_merge`` merges the buckets' samples). :class:`SampleStats` sums what the catalogue
reports over the buckets.

Events and samples. An event (a row of the input, or in a log of one row per candidate the
rows of one request) has ``counts`` samples: in an event log 1 (an event with an item) or 0
(a history-only event); in an impression log one per candidate of a request, 0 for an
interaction event. A sample takes the request-level columns of its event (session, ts,
request_id, histories, request features) and its own candidate-level ones (item, labels,
candidate features, position).

History of an event = the session's last N earlier *entries* in (ts, line) order, items and
event types: the events that enter histories (``is_entry``: events with an item, and the
kept itemless ones). For the event at session-order index ``r`` with ``p`` earlier entries,
its history is the entry slice ``[g - min(p, N), g)`` where ``g`` counts the entries before
``r`` in session order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recd.logs.ingest_mapping import (
    HISTORY_DENSE,
    HISTORY_GROUP,
    HISTORY_SPARSE,
    ITEM_FEATURE,
    TIME_DENSE,
    IngestMapping,
)
from recd.schema import (
    Catalogue,
    DenseFeature,
    DenseKind,
    SessionModel,
    SparseFeature,
    SparseKind,
)

CATALOGUE_NAME = "ingest"
STATIC_UNCHANGED = 0.5  # a mapped sparse feature unchanged on more rows than this is "static"
ZIPF_TOP_IDS = 1000  # the most frequent ids the Zipf exponent is fitted on
ZIPF_FALLBACK = 1.1  # exponent recorded when fewer than 3 distinct ids were seen
TAIL_SHAPE_MAX = 100.0  # Pareto shape recorded when (almost) every session has one sample
HISTORY_STAT = "history"  # SampleStats key of the built history's unchanged count


@dataclass(slots=True)
class SampleColumns:
    """Candidate-level columns of a bucket's M samples, in event order (event 0's samples
    first, an event's in list order)."""

    item: np.ndarray  # (M,) int64 the sample's item id
    labels: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (M,) float32
    dense: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (M,) float32
    sparse: dict[str, pa.Array] = field(default_factory=dict)  # name -> (M,) list<int64>

    def __len__(self) -> int:
        return len(self.item)


@dataclass(slots=True)
class BucketEvents:
    """The good events of one bucket (whole sessions), in input order; N events, M samples."""

    lines: np.ndarray  # (N,) int64 1-based input line (row) numbers (a request: its first row's)
    session: np.ndarray  # (N,) int64
    ts: np.ndarray  # (N,) int64 epoch ms
    request_id: np.ndarray  # (N,) int64 the request id its samples carry
    item: np.ndarray  # (N,) int64 the event's item in later histories (itemless: the stand-in)
    event_ids: np.ndarray  # (N,) int64 event type ids (provisional: remapped on output)
    is_entry: np.ndarray  # (N,) bool: the event enters the session's later histories
    counts: np.ndarray  # (N,) int64 samples of the event (0: history only)
    samples: SampleColumns  # the M = counts.sum() samples' own columns
    dense: dict[str, np.ndarray] = field(default_factory=dict)  # request-level: (N,) float32
    sparse: dict[str, pa.Array] = field(default_factory=dict)  # request-level: (N,) list<int64>
    sample_lines: int = 0  # input lines the samples came from (rows in = these + history only)

    @property
    def is_sample(self) -> np.ndarray:
        """(N,) bool: the event has samples (False: history only)."""
        return self.counts > 0


@dataclass(slots=True)
class SampleStats:
    """Sums over buckets of what the catalogue and the report hold (samples only)."""

    samples: int = 0
    sample_lines: int = 0  # input lines that gave samples (requests of a per-request log)
    requests: int = 0  # events with samples
    max_candidates: int = 0  # most samples of one request
    history_only: int = 0
    sessions: int = 0  # sessions with at least one sample
    ts_min: int | None = None
    ts_max: int | None = None
    hist_sum: float = 0.0  # sum of hist_len over samples
    pairs: int = 0  # consecutive samples of one session
    request_pairs: int = 0  # consecutive requests of one session
    list_repeats: int = 0  # of which the later shows the earlier's candidate items
    gap_s_sum: float = 0.0  # their ts differences
    log_session_sum: float = 0.0  # sum of ln(requests per session)
    max_session: int = 0  # most samples of one session
    item_max: int = -1  # over samples
    history_item_max: int = -1  # over every history entry
    unchanged: dict[str, int] = field(default_factory=dict)  # feature -> pairs equal
    id_max: dict[str, int] = field(default_factory=dict)  # sparse feature -> max id
    id_total: dict[str, int] = field(default_factory=dict)  # sparse feature -> ids
    length_max: dict[str, int] = field(default_factory=dict)
    log_sum: dict[str, float] = field(default_factory=dict)  # dense: sum ln(x), x > 0
    positive: dict[str, int] = field(default_factory=dict)  # dense: count x > 0
    label_sum: dict[str, float] = field(default_factory=dict)
    label_min: dict[str, float] = field(default_factory=dict)
    label_max: dict[str, float] = field(default_factory=dict)
    zipf: dict[str, float] = field(default_factory=dict)  # from the first bucket

    def add(self, other: SampleStats) -> None:
        """Add another bucket's sums (sessions never span buckets)."""
        for name in (
            "samples",
            "sample_lines",
            "requests",
            "history_only",
            "sessions",
            "hist_sum",
            "pairs",
            "request_pairs",
            "list_repeats",
            "gap_s_sum",
            "log_session_sum",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("max_candidates", "max_session", "item_max", "history_item_max"):
            setattr(self, name, max(getattr(self, name), getattr(other, name)))
        if other.ts_min is not None:
            self.ts_min = other.ts_min if self.ts_min is None else min(self.ts_min, other.ts_min)
        if other.ts_max is not None:
            self.ts_max = other.ts_max if self.ts_max is None else max(self.ts_max, other.ts_max)
        _add(self.unchanged, other.unchanged)
        _add(self.id_total, other.id_total)
        _add(self.log_sum, other.log_sum)
        _add(self.positive, other.positive)
        _add(self.label_sum, other.label_sum)
        for ints, pick_int in ((self.id_max, other.id_max), (self.length_max, other.length_max)):
            for k, i in pick_int.items():
                ints[k] = max(ints.get(k, i), i)
        for k, x in other.label_min.items():
            self.label_min[k] = min(self.label_min.get(k, x), x)
        for k, x in other.label_max.items():
            self.label_max[k] = max(self.label_max.get(k, x), x)
        for k, v in other.zipf.items():
            self.zipf.setdefault(k, v)

    def constant_labels(self) -> dict[str, float]:
        """Labels with one value on every sample: name -> that value."""
        return {
            name: self.label_min[name]
            for name in self.label_min
            if self.samples and self.label_min[name] == self.label_max[name]
        }


def _add(target: dict, source: dict) -> None:
    for k, v in source.items():
        target[k] = target.get(k, 0) + v


class BucketSamples:
    """The samples of one bucket: histories cut from session order, output in arrival order."""

    def __init__(self, events: BucketEvents, mapping: IngestMapping) -> None:
        self.events = events
        self.mapping = mapping
        self.history = mapping.history
        ev = events
        n = len(ev.lines)
        # session order: (session, ts, line)
        self.by_session = np.lexsort((ev.lines, ev.ts, ev.session))
        session_sorted = ev.session[self.by_session]
        self.new_session = np.ones(n, dtype=bool)
        self.new_session[1:] = session_sorted[1:] != session_sorted[:-1]
        session_start = np.maximum.accumulate(np.where(self.new_session, np.arange(n), 0))
        self.position = np.arange(n) - session_start  # earlier events of the session
        self.rank = np.empty(n, dtype=np.int64)
        self.rank[self.by_session] = np.arange(n)  # input event -> index in session order
        self.ts = ev.ts[self.by_session]
        entry = ev.is_entry[self.by_session]
        # entries before each session-order position: globally (an index into the entry
        # arrays), and within its session
        self.entry_index = np.cumsum(entry) - entry
        self.entries_before = self.entry_index - self.entry_index[session_start]
        self.entry_items = ev.item[self.by_session][entry]
        self.entry_types = ev.event_ids[self.by_session][entry]
        # samples: event of each, and where each event's samples start
        self.offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(ev.counts, out=self.offsets[1:])
        self.parent = np.repeat(np.arange(n), ev.counts)  # (M,) event of each sample
        requests = np.flatnonzero(ev.counts)
        arrival_events = requests[
            np.lexsort((ev.lines[requests], ev.request_id[requests], ev.ts[requests]))
        ]
        self.arrival = _ranges(self.offsets[arrival_events], ev.counts[arrival_events])

    def __len__(self) -> int:
        return len(self.arrival)

    def hist_len(self, ranks: np.ndarray) -> np.ndarray:
        return np.minimum(self.entries_before[ranks], self.history)

    def secs_since_prev(self, ranks: np.ndarray) -> np.ndarray:
        first = self.position[ranks] == 0
        prev_ts = self.ts[np.maximum(ranks - 1, 0)]
        return np.where(first, 0.0, (self.ts[ranks] - prev_ts) / 1000.0)

    def batches(self, schema: pa.Schema, *, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """The samples in arrival order (ts, request_id; a request's in list order),
        ``batch_rows`` rows per batch."""
        for lo in range(0, len(self.arrival), batch_rows):
            yield self._batch(self.arrival[lo : lo + batch_rows], schema)

    def _batch(self, rows: np.ndarray, schema: pa.Schema) -> pa.RecordBatch:
        """The samples ``rows`` (B,) (indices into the bucket's M samples), columns in
        ``schema`` order."""
        ev, cand = self.events, self.events.samples
        parents = self.parent[rows]
        ranks = self.rank[parents]
        one = pa.array(np.arange(len(rows) + 1, dtype=np.int32))
        take_rows, take_parents = pa.array(rows), pa.array(parents)
        columns: dict[str, pa.Array] = {
            "session_id": pa.array(ev.session[parents]),
            "request_id": pa.array(ev.request_id[parents]),
            "ts": pa.array(ev.ts[parents]),
            TIME_DENSE[0]: pa.array(self.secs_since_prev(ranks).astype(np.float32)),
            ITEM_FEATURE: pa.ListArray.from_arrays(one, pa.array(cand.item[rows])),
        }
        if self.mapping.impressions and self.mapping.position:
            place = (rows - self.offsets[parents]).astype(np.float32)
            columns[self.mapping.position] = pa.array(place)
        for name, values in {**cand.labels, **cand.dense}.items():
            columns[name] = pa.array(values[rows])
        for name, values in ev.dense.items():
            columns[name] = pa.array(values[parents])
        for name, lists in cand.sparse.items():
            columns[name] = lists.take(take_rows)
        for name, lists in ev.sparse.items():
            columns[name] = lists.take(take_parents)
        if self.history:
            lengths = self.hist_len(ranks)  # (B,)
            offsets, take = _ragged(self.entry_index[ranks] - lengths, lengths)
            list_offsets = pa.array(offsets.astype(np.int32))
            columns[HISTORY_DENSE[0]] = pa.array(lengths.astype(np.float32))
            built = (self.entry_items, self.entry_types)
            for name, values in zip(self.mapping.hist_sparse, built, strict=False):
                columns[name] = pa.ListArray.from_arrays(list_offsets, pa.array(values[take]))
        return pa.RecordBatch.from_arrays([columns[f.name] for f in schema], schema=schema)

    def stats(self, *, measure_zipf: bool) -> SampleStats:
        """This bucket's sums; ``measure_zipf``: also fit the id distributions' exponents."""
        ev, cand = self.events, self.events.samples
        out = SampleStats()
        counts_sorted = ev.counts[self.by_session]
        starts = np.flatnonzero(self.new_session)
        per_session = (
            np.add.reduceat(counts_sorted, starts) if len(starts) else np.zeros(0, np.int64)
        )
        requests_per_session = (
            np.add.reduceat((counts_sorted > 0).astype(np.int64), starts)
            if len(starts)
            else np.zeros(0, np.int64)
        )
        has_samples = per_session > 0
        out.samples = len(self.arrival)
        out.sample_lines = ev.sample_lines
        out.requests = int((ev.counts > 0).sum())
        out.max_candidates = int(ev.counts.max(initial=0))
        out.history_only = int((ev.counts == 0).sum())
        out.sessions = int(has_samples.sum())
        out.log_session_sum = float(np.log(requests_per_session[has_samples]).sum())
        out.max_session = int(per_session.max(initial=0))
        if not out.samples:
            return out
        sample_ts = ev.ts[ev.counts > 0]
        out.ts_min, out.ts_max = int(sample_ts.min()), int(sample_ts.max())
        out.item_max = int(cand.item.max())
        if len(self.entry_items):
            out.history_item_max = int(self.entry_items.max())
        # the samples in session order (events in session order, a request's in list order)
        events_sorted = self.by_session[counts_sorted > 0]
        order = _ranges(self.offsets[events_sorted], ev.counts[events_sorted])
        parents = self.parent[order]
        ranks = self.rank[parents]
        same = ev.session[parents][1:] == ev.session[parents][:-1]
        out.pairs = int(same.sum())
        same_session = ev.session[events_sorted][1:] == ev.session[events_sorted][:-1]
        out.request_pairs = int(same_session.sum())
        keys = _list_keys(ev.counts[events_sorted], cand.item[order])  # a request's items
        out.list_repeats = int(((keys[1:] == keys[:-1]) & same_session).sum())
        out.gap_s_sum = float((np.diff(ev.ts[events_sorted])[same_session]).sum() / 1000.0)

        def unchanged(values: np.ndarray) -> int:
            return int(((values[1:] == values[:-1]) & same).sum())

        out.unchanged[ITEM_FEATURE] = unchanged(cand.item[order])
        dense = {
            **{name: values[parents] for name, values in ev.dense.items()},
            **{name: values[order] for name, values in cand.dense.items()},
            TIME_DENSE[0]: self.secs_since_prev(ranks),
        }
        if self.mapping.impressions and self.mapping.position:
            dense[self.mapping.position] = (order - self.offsets[parents]).astype(np.float32)
        if self.history:
            lengths = self.hist_len(ranks)
            out.hist_sum = float(lengths.sum())
            dense[HISTORY_DENSE[0]] = lengths.astype(np.float32)
            # a history is unchanged when it is the same slice of the session's entries
            end = self.entry_index[ranks]
            out.unchanged[HISTORY_STAT] = unchanged(end * (self.history + 1) + lengths)
        for name, values in dense.items():
            values = np.asarray(values)
            out.unchanged[name] = unchanged(values)
            positive = values[values > 0]
            out.log_sum[name] = float(np.log(positive.astype(np.float64)).sum())
            out.positive[name] = len(positive)
        lists = {
            **{name: col.take(pa.array(parents)) for name, col in ev.sparse.items()},
            **{name: col.take(pa.array(order)) for name, col in cand.sparse.items()},
        }
        for name, taken in lists.items():
            lengths = np.asarray(pc.list_value_length(taken).to_numpy(zero_copy_only=False))
            flat = np.asarray(pc.list_flatten(taken).to_numpy(zero_copy_only=False))
            out.unchanged[name] = unchanged(_list_keys(lengths, flat))
            out.id_max[name] = int(flat.max(initial=-1))
            out.id_total[name] = int(lengths.sum())
            out.length_max[name] = int(lengths.max(initial=0))
            if measure_zipf:
                out.zipf[name] = zipf_exponent(flat)
        for name, values in cand.labels.items():
            out.label_sum[name] = float(values.sum())
            out.label_min[name] = float(values.min())
            out.label_max[name] = float(values.max())
        if measure_zipf:
            out.zipf[ITEM_FEATURE] = zipf_exponent(cand.item)
            out.zipf[HISTORY_SPARSE[0]] = zipf_exponent(self.entry_items)
            out.zipf[HISTORY_SPARSE[1]] = zipf_exponent(self.entry_types)
        return out


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenated index ranges ``[starts[i], starts[i] + lengths[i])``."""
    return _ragged(starts, lengths)[1]


def _ragged(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets (K + 1,), indices) of the concatenated ranges ``[starts[i], starts[i] +
    lengths[i])``."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    within = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    return offsets, np.repeat(np.asarray(starts, dtype=np.int64), lengths) + within


def _list_keys(lengths: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """(R,) uint64 key per list (length, then a polynomial hash of the ids): equal lists have
    equal keys; unequal ones collide with probability ~2^-64."""
    keys = np.zeros(len(lengths), dtype=np.uint64)
    if flat.size:
        row = np.repeat(np.arange(len(lengths)), lengths)
        within = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        with np.errstate(over="ignore"):
            mixed = (flat.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)) * (
                np.uint64(0xBF58476D1CE4E5B9) ** (within.astype(np.uint64) + np.uint64(1))
            )
            np.add.at(keys, row, mixed)
    with np.errstate(over="ignore"):
        return keys ^ (lengths.astype(np.uint64) << np.uint64(48))


def zipf_exponent(ids: np.ndarray) -> float:
    """Exponent s of a Zipf law count(rank k) ~ k^-s fitted (least squares on log-log) to the
    ``ZIPF_TOP_IDS`` most frequent ``ids``; clamped to [1.01, 5] (the generator needs s > 1);
    ``ZIPF_FALLBACK`` with fewer than 3 distinct ids."""
    if ids.size == 0:
        return ZIPF_FALLBACK
    counts = np.sort(np.unique(ids, return_counts=True)[1])[::-1][:ZIPF_TOP_IDS]
    if len(counts) < 3:
        return ZIPF_FALLBACK
    x = np.log(np.arange(1, len(counts) + 1))
    slope = float(np.polyfit(x, np.log(counts), 1)[0])
    return float(min(max(-slope, 1.01), 5.0))


def build_catalogue(stats: SampleStats, mapping: IngestMapping, *, event_types: int) -> Catalogue:
    """The catalogue of the samples written: columns as ingested, statistics measured.

    Measured: sessions, samples per session (mean, max, Pareto shape of requests per
    session), candidates per request, start, duration, mean gap, label rate, and per feature
    its unchanged-from-previous-sample rate d, mean and max length, cardinality (max id + 1),
    Zipf exponent (on the first bucket) and, dense, the geometric mean of the positive values
    (``scale``). Kinds: ``item_id`` and per-candidate features are ``item``, the built history
    and every declared history group ``history``, request-level sparse features of an
    impression log ``static``, other mapped ones ``static`` when d > ``STATIC_UNCHANGED``.
    ``servers`` (how many writers interleave the generator's sessions) does not apply to a
    real log: it is 1.
    """
    n = stats.samples
    pairs = max(1, stats.pairs)
    sessions = max(1, stats.sessions)
    per_request = mapping.impressions

    def d(name: str) -> float:
        return stats.unchanged.get(name, 0) / pairs if stats.pairs else 0.0

    def zipf(name: str) -> float:
        return stats.zipf.get(name, ZIPF_FALLBACK)

    def dense(name: str, kind: DenseKind = DenseKind.REQUEST) -> DenseFeature:
        count = stats.positive.get(name, 0)
        scale = math.exp(stats.log_sum[name] / count) if count else 1.0
        return DenseFeature(name=name, unchanged_prob=d(name), scale=scale, kind=kind)

    def mapped(name: str, kind: SparseKind, group: str | None = None) -> SparseFeature:
        return SparseFeature(
            name=name,
            kind=kind,
            mean_length=max(stats.id_total.get(name, 0) / max(1, n), 1e-3),
            unchanged_prob=d(name),
            cardinality=max(1, stats.id_max.get(name, -1) + 1),
            zipf_exponent=zipf(name),
            max_length=max(1, stats.length_max.get(name, 0)),
            group=group,
        )

    def by_d(name: str) -> SparseKind:
        return SparseKind.STATIC if d(name) > STATIC_UNCHANGED else SparseKind.ITEM

    item_cardinality = max(1, stats.item_max + 1)
    sparse = [
        SparseFeature(
            name=ITEM_FEATURE,
            kind=SparseKind.ITEM,
            mean_length=1.0,
            unchanged_prob=d(ITEM_FEATURE),
            cardinality=item_cardinality,
            zipf_exponent=zipf(ITEM_FEATURE),
            max_length=1,
        )
    ]
    dense_features = [dense(TIME_DENSE[0])]
    if mapping.history:
        dense_features.insert(0, dense(HISTORY_DENSE[0]))
        mean_hist = stats.hist_sum / n if n else 0.0
        cardinalities = (
            max(item_cardinality, stats.history_item_max + 1),
            event_types + 1,
        )
        for name, cardinality in zip(mapping.hist_sparse, cardinalities, strict=False):
            sparse.append(
                SparseFeature(
                    name=name,
                    kind=SparseKind.HISTORY,
                    mean_length=max(mean_hist, 1e-3),
                    unchanged_prob=d(HISTORY_STAT),
                    cardinality=cardinality,
                    zipf_exponent=zipf(name),
                    max_length=mapping.history,
                    group=HISTORY_GROUP,
                )
            )
    if mapping.candidates:  # one row per request: mapped columns are request-level
        dense_features += [dense(name) for name in mapping.dense]
        dense_features += [dense(name, DenseKind.CANDIDATE) for name in mapping.candidate_dense]
        sparse += [mapped(name, SparseKind.STATIC) for name in mapping.sparse]
        sparse += [mapped(name, SparseKind.STATIC) for name in mapping.sparse_lists]
        sparse += [mapped(name, SparseKind.ITEM) for name in mapping.candidate_sparse]
    else:  # an event or a candidate per row: as measured
        for name in mapping.dense:
            kind = DenseKind.CANDIDATE if per_request and d(name) <= STATIC_UNCHANGED else None
            dense_features.append(dense(name, kind or DenseKind.REQUEST))
        sparse += [mapped(name, by_d(name)) for name in [*mapping.sparse, *mapping.sparse_lists]]
    if per_request and mapping.position:
        dense_features.append(dense(mapping.position, DenseKind.POSITION))
    for group, columns in mapping.histories.items():
        sparse += [mapped(name, SparseKind.HISTORY, group) for name in columns]
    first_label = mapping.label_names[0]
    rate = stats.label_sum.get(first_label, 0.0) / n if n else 0.5
    start_ms = stats.ts_min or 0
    span_s = ((stats.ts_max or 0) - start_ms) // 1000
    per_candidate = n / stats.requests if stats.requests else 1.0
    return Catalogue(
        name=CATALOGUE_NAME,
        labels=mapping.label_names,
        dense=dense_features,
        sparse=sparse,
        sessions=SessionModel(
            num_sessions=sessions,
            mean_samples=max(1.0, per_candidate, n / sessions),
            tail_shape=tail_shape(stats),
            max_samples=max(1, stats.max_session),
            servers=1,
            start=datetime.fromtimestamp(start_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S"),
            duration_s=max(1, span_s),
            mean_gap_s=stats.gap_s_sum / stats.request_pairs if stats.request_pairs else 0.0,
            label_rate=min(max(rate, 1e-6), 1 - 1e-6),
            candidates_per_request=max(1.0, per_candidate),
            max_candidates=max(1, stats.max_candidates),
            repeat_list_prob=(
                stats.list_repeats / stats.request_pairs
                if per_request and stats.request_pairs
                else 0.0
            ),
        ),
    )


def tail_shape(stats: SampleStats) -> float:
    """Pareto shape of requests (samples of an event log) per session, maximum-likelihood
    with x_min = 1: sessions / sum(ln requests); in [1.01, ``TAIL_SHAPE_MAX``] (the generator
    needs > 1)."""
    if stats.log_session_sum <= 0:
        return TAIL_SHAPE_MAX
    return float(min(max(stats.sessions / stats.log_session_sum, 1.01), TAIL_SHAPE_MAX))


def remap_values(batch: pa.RecordBatch, name: str, lookup: np.ndarray) -> pa.RecordBatch:
    """``batch`` with the ids of list column ``name`` replaced by ``lookup[id]``."""
    index = batch.schema.get_field_index(name)
    column = batch.column(index)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    values = np.asarray(column.values.to_numpy(zero_copy_only=False), dtype=np.int64)
    mapped = pa.ListArray.from_arrays(column.offsets, pa.array(lookup[values]))
    return batch.set_column(index, batch.schema.field(index), mapped)
