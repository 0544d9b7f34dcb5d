"""Synthetic production inference logs (``recd logs generate``), vectorised and deterministic.

The model, from users to the log bus (docs/synthetic-logs.md has it in full): sessions start
uniformly in the window with a heavy-tailed (discrete Lomax) number of requests and
exponential gaps; every sparse feature has a change mask (unchanged with probability d(f))
shared by its ``group``, bounded Zipf ids and mean length l(f), and ``history`` features are
per-session id streams of which a row shows the last ``max_length``; dense features are
log-normal; labels follow a logistic model of item popularity and history depth (an
impression log: at most one click per request); inference servers flush their buffers to the
log bus, so the raw log interleaves concurrent sessions in landing order.

Everything is built as flat values + offsets with index arithmetic across all sessions of a
chunk (change masks, cumulative sums reset at session starts, ragged gathers), never with a
per-row or per-session Python loop. Memory follows the rows still in flight, not the log:
sessions are generated in chunks of about ``CHUNK_ROWS`` rows by start time, and after each
chunk every row landing before the next chunk's first session is merged and written; the rest
waits as zero-copy suffixes with history lists unexpanded. The same catalogue, seed, session
count, ``flush_interval_s`` and ``segment_rows`` give byte-identical segment files (on one
platform and numpy version).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from recd.errors import ConfigError
from recd.logs.rawlog import CATALOGUE_FILE, RawLogWriter, list_segments
from recd.progress import progress_bar
from recd.schema import Catalogue, DenseKind, SessionModel, SparseFeature, SparseKind

FLUSH_INTERVAL_S = 10.0
"""Default period at which an inference server flushes its log buffer."""
CHUNK_ROWS = 25_000
"""Target rows generated per chunk (bounds memory together with the pending rows)."""
ZIPF_HEAD = 1 << 15
"""Ranks sampled from an exact table; rarer ranks from the continuous power law."""
HISTORY_APPEND_EXTRA = 0.25
"""A history change appends 1 + Poisson(HISTORY_APPEND_EXTRA) ids."""
HISTORY_START_SHAPE = 4.0
"""Gamma shape of the per-session factor of the warmed-up history length (CV 1/sqrt(shape))."""
CALIBRATION_ROWS = 400_000
"""At most this many rows are simulated to calibrate a history's warmed-up length."""
DENSE_SIGMA = 1.0
"""Log-normal sigma of dense features."""
LABEL_POPULARITY_WEIGHT = 3.0
LABEL_DEPTH_WEIGHT = 1.0
LABEL_POSITION_WEIGHT = 3.0
"""Impression logs: the logit falls by this much from the first to past the last position."""

_log = logging.getLogger(__name__)
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
_MASK63 = np.uint64(_INT64_MAX)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@dataclass(kw_only=True, slots=True)
class GenerateReport:
    """What one ``generate_logs`` call wrote."""

    rows: int
    """Rows written (all sessions, all samples; candidate rows in an impression log)."""
    sessions: int
    """Sessions generated."""
    segments: int
    """Segment files written."""
    raw_bytes: int
    """Total size of the segment files."""
    seconds: float
    """Wall time of the whole call."""

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


def generate_logs(
    catalogue: Catalogue,
    out_dir: Path,
    *,
    seed: int,
    num_sessions: int | None = None,
    rows: int | None = None,
    segment_rows: int = 200_000,
    show_progress: bool = True,
    overwrite: bool = False,
    flush_interval_s: float = FLUSH_INTERVAL_S,
) -> GenerateReport:
    """Write a synthetic raw log of ``catalogue`` into ``out_dir`` (segments in arrival order).

    ``num_sessions`` overrides ``catalogue.sessions.num_sessions``; ``rows`` instead asks for
    about that many rows (``num_sessions = rows / mean_samples``). ``overwrite`` allows
    replacing an existing raw log in ``out_dir``. Deterministic for a given seed.
    """
    began = time.perf_counter()
    model = catalogue.sessions
    n_sessions = _resolve_num_sessions(model, num_sessions, rows)
    if seed < 0:
        raise ConfigError(f"seed must be >= 0, got {seed}")
    if segment_rows < 1:
        raise ConfigError(f"segment_rows must be >= 1, got {segment_rows}")
    if flush_interval_s <= 0:
        raise ConfigError(f"flush_interval_s must be > 0, got {flush_interval_s}")
    plan = _plan_sessions(model, n_sessions, seed)
    gen = _Generator(catalogue, plan, seed=seed, flush_interval_ms=int(flush_interval_s * 1000))
    _prepare_out_dir(out_dir, overwrite=overwrite)  # only once the catalogue is known good
    total_rows = int(plan.row_offsets[-1])
    bar_ctx = (
        progress_bar(desc=f"generate {catalogue.name}", total=total_rows, unit="row")
        if show_progress
        else nullcontext()
    )
    with RawLogWriter(out_dir, catalogue, segment_rows=segment_rows) as writer, bar_ctx as bar:
        for emitted in gen.iter_arrival_batches():
            for batch in emitted.to_batches():
                writer.write(batch)
            if bar is not None:
                bar.update(emitted.num_rows)
        written = writer.rows_written
    segments = list_segments(out_dir)
    return GenerateReport(
        rows=written,
        sessions=n_sessions,
        segments=len(segments),
        raw_bytes=sum(p.stat().st_size for p in segments),
        seconds=time.perf_counter() - began,
    )


def _resolve_num_sessions(model: SessionModel, num_sessions: int | None, rows: int | None) -> int:
    if num_sessions is not None and rows is not None:
        raise ConfigError("give the number of sessions or a target row count, not both")
    if num_sessions is not None:
        if num_sessions < 1:
            raise ConfigError(f"num_sessions must be >= 1, got {num_sessions}")
        return num_sessions
    if rows is not None:
        if rows < 1:
            raise ConfigError(f"rows must be >= 1, got {rows}")
        return max(1, round(rows / model.mean_samples))
    return model.num_sessions


def _prepare_out_dir(out_dir: Path, *, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"output {out_dir} exists and is not a directory")
    old = list_segments(out_dir) if out_dir.is_dir() else []
    catalogue_file = out_dir / CATALOGUE_FILE
    if (old or catalogue_file.exists()) and not overwrite:
        raise ConfigError(
            f"output {out_dir} already holds a raw log; choose another directory or pass "
            "--overwrite"
        )
    for path in old:
        path.unlink()
    catalogue_file.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# Sessions


@dataclass(slots=True)
class _SessionPlan:
    """All sessions of a run, sorted by start time (small: a few arrays of num_sessions, plus
    one count per request in an impression log)."""

    window_start_ms: int
    starts_ms: np.ndarray  # (N,) int64, relative to the window start, sorted
    sizes: np.ndarray  # (N,) int64 requests per session (= rows unless an impression log)
    request_offsets: np.ndarray  # (N + 1,) int64 global request number of each session's first
    row_offsets: np.ndarray  # (N + 1,) int64 global row number of each session's first row
    candidates: np.ndarray | None  # (Q,) int64 candidate rows per request; None: one row each
    list_source: np.ndarray | None  # (Q,) int64 the request whose candidate list each shows
    session_ids: np.ndarray  # (N,) int64
    request_base: int
    server_phase_ms: np.ndarray  # (servers,) int64
    delay_salt: int


def _plan_sessions(model: SessionModel, n_sessions: int, seed: int) -> _SessionPlan:
    impressions = is_impression_log(model)
    if impressions:
        mean = model.mean_samples / model.candidates_per_request
        cap = max(1, model.max_samples // model.max_candidates)
        if mean > cap:
            raise ConfigError(
                f"sessions.mean_samples / candidates_per_request ({mean:g} requests) must be "
                f"<= sessions.max_samples // max_candidates ({cap} requests)"
            )
        _check_label_rate(model)
    else:
        mean, cap = model.mean_samples, model.max_samples
        if mean > cap:
            raise ConfigError(
                f"sessions.mean_samples ({model.mean_samples}) must be <= sessions.max_samples "
                f"({model.max_samples})"
            )
    if model.servers < 1:
        raise ConfigError(f"sessions.servers must be >= 1, got {model.servers}")
    rng = np.random.default_rng([seed, 0])
    scale = solve_lomax_scale(mean, model.tail_shape, cap)
    u = (rng.permutation(n_sessions) + rng.random(n_sessions)) / n_sessions
    sizes = lomax_sizes(u, model.tail_shape, scale, cap)
    starts = np.sort(rng.integers(0, model.duration_s * 1000, size=n_sessions, dtype=np.int64))
    request_offsets = np.zeros(n_sessions + 1, dtype=np.int64)
    np.cumsum(sizes, out=request_offsets[1:])
    row_offsets, candidates = request_offsets, None
    list_source: np.ndarray | None = None
    if impressions:
        list_rng = np.random.default_rng([seed, 3])
        q = int(request_offsets[-1])
        candidates = candidate_counts(
            list_rng.random(q), model.candidates_per_request, model.max_candidates
        )
        list_source = np.arange(q, dtype=np.int64)
        if model.repeat_list_prob > 0:
            repeat = list_rng.random(q) < model.repeat_list_prob
            repeat[request_offsets[:-1]] = False  # a session's first request: a fresh list
            list_source = np.maximum.accumulate(np.where(repeat, 0, list_source))
            candidates = candidates[list_source]
        rows_before = np.concatenate([[0], np.cumsum(candidates)])
        row_offsets = rows_before[request_offsets]
    session_base, request_base, delay_salt = (int(x) for x in rng.integers(0, _INT64_MAX, 3))
    return _SessionPlan(
        window_start_ms=_window_start_ms(model),
        starts_ms=starts,
        sizes=sizes,
        request_offsets=request_offsets,
        row_offsets=row_offsets,
        candidates=candidates,
        list_source=list_source,
        session_ids=mix63(np.arange(n_sessions, dtype=np.uint64) + np.uint64(session_base)),
        request_base=request_base,
        server_phase_ms=rng.integers(0, 1 << 62, size=model.servers, dtype=np.int64),
        delay_salt=delay_salt,
    )


def is_impression_log(model: SessionModel) -> bool:
    """Whether requests score several candidates (one row per candidate, see the docstring)."""
    return model.candidates_per_request > 1.0


def candidate_counts(u: np.ndarray, mean: float, cap: int) -> np.ndarray:
    """Candidates per request at uniforms ``u`` (Q,): a full list of ``cap`` with probability
    p, else uniform on 1..cap-1 (mean cap / 2), with p = 2 * mean / cap - 1 so E[C] == mean.

    A mean below cap / 2 cannot be met that way; then the short lists are a mixture: uniform
    on 1..cap-1 with probability q = (mean - 1) / (cap / 2 - 1), else a single candidate.
    """
    if not 1.0 <= mean <= cap:
        raise ConfigError(
            f"sessions.candidates_per_request must be in [1, max_candidates = {cap}], got {mean}"
        )
    if cap == 1:
        return np.ones(len(u), dtype=np.int64)
    full = max(0.0, 2.0 * mean / cap - 1.0)
    short = 1.0 if mean >= cap / 2 else (mean - 1.0) / (cap / 2 - 1.0)
    counts = np.ones(len(u), dtype=np.int64)
    counts[u >= 1.0 - full] = cap
    # the lowest ``short * (1 - full)`` quantiles spread uniformly over 1..cap-1
    spread = u < short * (1.0 - full)
    counts[spread] = 1 + np.floor(u[spread] / (short * (1.0 - full)) * (cap - 1)).astype(np.int64)
    return np.minimum(counts, cap)


def _check_label_rate(model: SessionModel) -> None:
    """At most one click per request: label_rate (clicks per row) <= 1 / candidates_per_request."""
    most = 1.0 / model.candidates_per_request
    if model.label_rate > most:
        raise ConfigError(
            f"sessions.label_rate ({model.label_rate}) must be <= 1 / candidates_per_request = "
            f"{most:.4g} in an impression log (at most one click per request)"
        )


def solve_lomax_scale(mean: float, shape: float, cap: int) -> float:
    """Scale s of ``n = min(cap, 1 + floor(Lomax(shape, s)))`` such that E[n] == mean.

    E[n] = sum_{j < cap} P(Lomax >= j) = sum_{j < cap} (1 + j / s) ** -shape, increasing in s.
    """
    j = np.arange(cap, dtype=np.float64)
    lo, hi = 1e-9, 1e12
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if float(np.sum((1.0 + j / mid) ** -shape)) < mean:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def lomax_sizes(u: np.ndarray, shape: float, scale: float, cap: int) -> np.ndarray:
    """Inverse CDF of the capped discrete Lomax at quantiles ``u`` in [0, 1)."""
    with np.errstate(over="ignore", divide="ignore"):
        y = scale * ((1.0 - u) ** (-1.0 / shape) - 1.0)
    return np.minimum(float(cap), 1.0 + np.floor(y)).astype(np.int64)


def _window_start_ms(model: SessionModel) -> int:
    try:
        start = datetime.fromisoformat(model.start)
    except ValueError as exc:
        raise ConfigError(f"sessions.start: {model.start!r} is not an ISO 8601 time") from exc
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    return round(start.timestamp() * 1000)


def mix63(x: np.ndarray) -> np.ndarray:
    """Bijection of [0, 2**63) (splitmix64's finaliser reduced mod 2**63), as int64 >= 0."""
    return _mix_u64(np.asarray(x).astype(np.uint64)).astype(np.int64)


def _mix_u64(x: np.ndarray) -> np.ndarray:
    """``mix63`` on uint64 arrays, returning uint64 (values < 2**63)."""
    z = x & _MASK63
    z ^= z >> np.uint64(30)
    z = (z * _MIX1) & _MASK63
    z ^= z >> np.uint64(27)
    z = (z * _MIX2) & _MASK63
    z ^= z >> np.uint64(31)
    return z


# ---------------------------------------------------------------------------------------------
# Ids


class BoundedZipf:
    """Bounded Zipf ranks over [0, cardinality): P(rank r) proportional to (r + 1) ** -s.

    Exact inverse CDF (binary search on cumulative weights) for the first ZIPF_HEAD ranks,
    which hold most of the mass and whose table stays in cache; beyond them the continuous
    power law, whose mass on [k - 1/2, k + 1/2) equals the discrete weight of k to within
    about s * (s + 1) / (24 * k**2) relative (< 1e-9 there), inverted in closed form.
    """

    def __init__(self, cardinality: int, exponent: float) -> None:
        self.cardinality = cardinality
        self.exponent = exponent
        head = min(cardinality, ZIPF_HEAD)
        self.head_cdf = np.cumsum(np.arange(1, head + 1, dtype=np.float64) ** -exponent)
        self.head_total = float(self.head_cdf[-1])
        e = 1.0 - exponent
        self._e = e
        self._a = (head + 0.5) ** e
        self._b = (cardinality + 0.5) ** e
        tail_total = (self._b - self._a) / e if cardinality > head else 0.0
        self.total = self.head_total + tail_total

    def ranks(self, u: np.ndarray) -> np.ndarray:
        """Ranks at quantiles ``u`` in [0, 1)."""
        x = u * self.total
        ranks = np.searchsorted(self.head_cdf, x, side="right")
        tail = x >= self.head_total
        if self.cardinality > len(self.head_cdf) and tail.any():
            v = (x[tail] - self.head_total) / (self.total - self.head_total)
            k = np.floor((self._a + v * (self._b - self._a)) ** (1.0 / self._e) + 0.5)
            ranks[tail] = k.astype(np.int64) - 1
        return np.clip(ranks, 0, self.cardinality - 1).astype(np.int64)


class _IdSampler:
    """Zipf ranks of one feature, scattered over the id space by a bijection."""

    def __init__(self, feature: SparseFeature, zipf: BoundedZipf, rng: np.random.Generator) -> None:
        self.cardinality = feature.cardinality
        self.zipf = zipf
        limit = max(2, min(feature.cardinality, (1 << 62) // max(1, feature.cardinality)))
        mult = int(rng.integers(1, limit))
        while math.gcd(mult, feature.cardinality) != 1:
            mult = int(rng.integers(1, limit))
        self.mult = mult
        self.add = int(rng.integers(0, feature.cardinality))
        self.salt = int(rng.integers(0, _INT64_MAX))

    def draw_ranks(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.zipf.ranks(rng.random(n))

    def derive_ranks(self, leader_ids: np.ndarray) -> np.ndarray:
        """Zipf ranks that are a deterministic function of another feature's ids."""
        u = (mix63(leader_ids.astype(np.uint64) ^ np.uint64(self.salt)) >> 11) * (2.0**-52)
        return self.zipf.ranks(u)

    def to_ids(self, ranks: np.ndarray) -> np.ndarray:
        return (ranks * self.mult + self.add) % self.cardinality


@dataclass(slots=True)
class _SparseGroup:
    """Features that change on the same rows; ``members[0]`` draws, the others derive."""

    members: list[SparseFeature]
    samplers: list[_IdSampler]
    history_start: float  # mean warmed-up history length c (history kind only)

    @property
    def leader(self) -> SparseFeature:
        return self.members[0]


def _sparse_groups(
    catalogue: Catalogue, plan: _SessionPlan, rng: np.random.Generator
) -> list[_SparseGroup]:
    by_group: dict[str, list[SparseFeature]] = {}
    ordered: list[list[SparseFeature]] = []
    for f in catalogue.sparse:
        if f.group is None:
            ordered.append([f])
        elif f.group in by_group:
            by_group[f.group].append(f)
        else:
            by_group[f.group] = [f]
            ordered.append(by_group[f.group])
    cache: dict[tuple[int, float], BoundedZipf] = {}
    groups = []
    for members in ordered:
        _check_group(members)
        lead = members[0]
        samplers = [
            _IdSampler(f, _zipf(f.cardinality, f.zipf_exponent, cache), rng) for f in members
        ]
        start = 0.0
        if lead.kind is SparseKind.HISTORY:
            start = solve_history_start(lead, plan.sizes)
        groups.append(_SparseGroup(members=members, samplers=samplers, history_start=start))
    return groups


def _zipf(
    cardinality: int, exponent: float, cache: dict[tuple[int, float], BoundedZipf]
) -> BoundedZipf:
    key = (cardinality, exponent)
    if key not in cache:
        cache[key] = BoundedZipf(cardinality, exponent)
    return cache[key]


def _check_group(members: list[SparseFeature]) -> None:
    lead = members[0]
    if lead.kind is SparseKind.HISTORY and lead.max_length < lead.mean_length:
        raise ConfigError(
            f"sparse feature {lead.name!r}: max_length ({lead.max_length}) must be >= "
            f"mean_length ({lead.mean_length})"
        )
    for f in members[1:]:
        for attr in ("kind", "unchanged_prob", "mean_length", "max_length"):
            if getattr(f, attr) != getattr(lead, attr):
                raise ConfigError(
                    f"sparse feature {f.name!r}: group {f.group!r} is updated synchronously, so "
                    f"its {attr} must equal {lead.name!r}'s ({getattr(lead, attr)}), "
                    f"got {getattr(f, attr)}"
                )


def solve_history_start(feature: SparseFeature, sizes: np.ndarray) -> float:
    """Mean warmed-up length c at row 0 so that the mean length over all rows is l(f).

    Simulates only the lengths of the history (warmed-up start ``floor(c * G + U)``, the
    appends, the ``max_length`` cap) over the run's actual session sizes (a sample of at most
    ``CALIBRATION_ROWS`` rows) with fixed random numbers, so the mean is monotone in c and a
    bisection finds it. When even an empty start gives a mean above l(f) (long sessions with
    frequent changes), c is 0 and a warning says what the mean will be instead.
    """
    rng = np.random.default_rng(0)
    step = max(1, int(sizes.sum()) // CALIBRATION_ROWS)
    sample = sizes[::step]
    rows = _Rows.of(sample)
    added = _history_appends(rows, feature.unchanged_prob, rng)
    grown = rows.segmented_cumsum(added)
    factor = rng.gamma(HISTORY_START_SHAPE, 1.0 / HISTORY_START_SHAPE, len(sample))
    jitter = rng.random(len(sample))
    target, cap = feature.mean_length, feature.max_length

    def mean_length(c: float) -> float:
        start = np.minimum(cap, np.floor(c * factor + jitter)).astype(np.int64)
        return float(np.minimum(cap, start[rows.sess] + grown).mean())

    floor = mean_length(0.0)
    if floor >= target:
        _log.warning(
            "history feature %r: with these session sizes and unchanged_prob %.3f the mean "
            "length cannot be as low as %.2f (it will be about %.2f); raise unchanged_prob or "
            "lower max_length / sessions.max_samples",
            feature.name,
            feature.unchanged_prob,
            target,
            floor,
        )
        return 0.0
    lo, hi = 0.0, 8.0 * cap
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mean_length(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


def _history_appends(rows: _Rows, unchanged_prob: float, rng: np.random.Generator) -> np.ndarray:
    """Ids appended on each row: 1 + Poisson(HISTORY_APPEND_EXTRA) on change rows, else 0."""
    append = rng.random(rows.n) >= unchanged_prob
    append[rows.first] = False
    added = np.zeros(rows.n, dtype=np.int64)
    added[append] = 1 + rng.poisson(HISTORY_APPEND_EXTRA, size=int(append.sum()))
    return added


# ---------------------------------------------------------------------------------------------
# Chunks


@dataclass(slots=True)
class _Rows:
    """The rows of one chunk of sessions, in session-major order."""

    sizes: np.ndarray  # (S,) samples per session
    offsets: np.ndarray  # (S + 1,) first row of each session
    sess: np.ndarray  # (R,) local session index of each row
    first: np.ndarray  # (R,) bool: first row of its session

    @staticmethod
    def of(sizes: np.ndarray) -> _Rows:
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        first = np.zeros(int(offsets[-1]), dtype=bool)
        first[offsets[:-1]] = True
        sess = np.repeat(np.arange(len(sizes)), sizes)
        return _Rows(sizes=sizes, offsets=offsets, sess=sess, first=first)

    @property
    def n(self) -> int:
        return int(self.offsets[-1])

    def segmented_cumsum(self, x: np.ndarray) -> np.ndarray:
        """Inclusive cumulative sum of ``x`` restarting at every session's first row."""
        c = np.cumsum(x, dtype=np.int64)
        starts = self.offsets[:-1]
        base = c[starts] - x[starts]
        return c - np.repeat(base, self.sizes)

    def change_mask(self, rng: np.random.Generator, unchanged_prob: float) -> np.ndarray:
        """True where the value is new: every first row, other rows with 1 - d."""
        mask = rng.random(self.n) >= unchanged_prob
        mask[self.first] = True
        return mask


@dataclass(slots=True)
class _Keys:
    """Arrival-order sort keys of rows (landing time, server, ts, global row number)."""

    arrival: np.ndarray
    server: np.ndarray
    ts: np.ndarray
    row: np.ndarray

    def order(self) -> np.ndarray:
        return np.lexsort((self.row, self.ts, self.server, self.arrival))

    def take(self, idx: np.ndarray | slice) -> _Keys:
        return _Keys(self.arrival[idx], self.server[idx], self.ts[idx], self.row[idx])

    @staticmethod
    def concat(parts: list[_Keys]) -> _Keys:
        return _Keys(
            np.concatenate([k.arrival for k in parts]),
            np.concatenate([k.server for k in parts]),
            np.concatenate([k.ts for k in parts]),
            np.concatenate([k.row for k in parts]),
        )


@dataclass(slots=True)
class _LazyLists:
    """History columns of pending rows, not yet expanded (they are most of a row's bytes).

    Row i of member m is ``streams[m][starts[i] : starts[i] + lengths[i]]``; the streams
    (a few ids per session) are far smaller than the expanded lists (l(f) ids per row).
    """

    names: list[str]
    streams: list[np.ndarray]
    starts: np.ndarray
    lengths: np.ndarray

    def take(self, rows: slice) -> _LazyLists:
        return _LazyLists(self.names, self.streams, self.starts[rows], self.lengths[rows])

    def compact(self) -> _LazyLists:
        """A copy holding only the part of the streams these rows still use."""
        if not len(self.starts):
            return _LazyLists(self.names, [s[:0] for s in self.streams], self.starts, self.lengths)
        lo, hi = int(self.starts.min()), int((self.starts + self.lengths).max())
        streams = [s[lo:hi].copy() for s in self.streams]
        return _LazyLists(self.names, streams, self.starts - lo, self.lengths.copy())

    def expand(self) -> dict[str, pa.Array | pa.ChunkedArray]:
        offsets, index = _ragged_index(self.starts, self.lengths)
        return {
            n: _list_array(offsets, s[index]) for n, s in zip(self.names, self.streams, strict=True)
        }


@dataclass(slots=True)
class _Pending:
    """Rows of one chunk not yet written, in arrival order (a suffix of the chunk)."""

    keys: _Keys
    eager: pa.Table
    """Materialised columns (ids, ts, labels, dense, static and item lists)."""
    lazy: list[_LazyLists]
    parent_rows: int
    """Rows of the chunk whose buffers ``eager`` slices (for compaction)."""

    @property
    def rows(self) -> int:
        return self.eager.num_rows

    def split(self, horizon: int) -> tuple[_Pending, _Pending]:
        """The rows landing before ``horizon`` and the rest (zero-copy slices)."""
        cut = int(np.searchsorted(self.keys.arrival, horizon, side="left"))
        head, tail = slice(0, cut), slice(cut, None)
        return (
            _Pending(
                self.keys.take(head),
                self.eager.slice(0, cut),
                [z.take(head) for z in self.lazy],
                self.parent_rows,
            ),
            _Pending(
                self.keys.take(tail),
                self.eager.slice(cut),
                [z.take(tail) for z in self.lazy],
                self.parent_rows,
            ),
        )

    def compact(self) -> _Pending:
        """A copy that no longer holds the chunk's buffers (call once few rows are left)."""
        eager = self.eager.take(np.arange(self.rows))
        keys = self.keys.take(slice(None))
        keys = _Keys(keys.arrival.copy(), keys.server.copy(), keys.ts.copy(), keys.row.copy())
        return _Pending(keys, eager, [z.compact() for z in self.lazy], self.rows)

    def materialise(self, schema: pa.Schema) -> pa.Table:
        columns: dict[str, pa.Array | pa.ChunkedArray] = {}
        for lazy in self.lazy:
            columns.update(lazy.expand())
        return pa.Table.from_arrays(
            [columns[n] if n in columns else self.eager.column(n) for n in schema.names],
            schema=schema,
        )


def _merge(heads: list[_Pending], schema: pa.Schema) -> pa.Table:
    """The rows of ``heads`` (each sorted) as one table in arrival order."""
    tables = [h.materialise(schema) for h in heads]
    if len(tables) == 1:
        return tables[0]
    order = _Keys.concat([h.keys for h in heads]).order()
    return pa.concat_tables(tables).take(order)


class _Generator:
    def __init__(
        self, catalogue: Catalogue, plan: _SessionPlan, *, seed: int, flush_interval_ms: int
    ) -> None:
        self.catalogue = catalogue
        self.plan = plan
        self.seed = seed
        self.flush_ms = max(2, flush_interval_ms)
        self.schema = catalogue.arrow_schema().remove_metadata()
        self.groups = _sparse_groups(catalogue, plan, np.random.default_rng([seed, 1]))
        lazy = {
            f.name for g in self.groups if g.leader.kind is SparseKind.HISTORY for f in g.members
        }
        self.eager_schema = pa.schema([f for f in self.schema if f.name not in lazy])
        per_row_values = sum(
            f.max_length if f.kind is SparseKind.HISTORY else 2 * f.mean_length + 4
            for f in catalogue.sparse
        )
        chunk_rows = min(CHUNK_ROWS, max(1, int(_INT32_MAX // 4 // max(1.0, per_row_values))))
        self.sessions_per_chunk = max(1, int(chunk_rows / catalogue.sessions.mean_samples))
        self.label_item = next((g for g in self.groups if g.leader.kind is SparseKind.ITEM), None)
        self.label_history = next(
            (g for g in self.groups if g.leader.kind is SparseKind.HISTORY), None
        )

    def iter_arrival_batches(self) -> Iterator[pa.Table]:
        """Yield tables of rows in arrival order; each is everything landed before a horizon.

        Every chunk's rows are generated sorted by arrival; pending rows stay as zero-copy
        suffixes of their chunk (history lists unexpanded) until a suffix falls below a
        quarter of its chunk and is compacted, so memory stays within a small multiple of the
        pending rows' compact size and each row is copied O(1) times.
        """
        n_sessions = len(self.plan.sizes)
        pending: list[_Pending] = []
        for index, lo in enumerate(range(0, n_sessions, self.sessions_per_chunk)):
            hi = min(n_sessions, lo + self.sessions_per_chunk)
            pending.append(self._build_chunk(lo, hi, np.random.default_rng([self.seed, 2, index])))
            horizon = int(self.plan.starts_ms[hi]) if hi < n_sessions else _INT64_MAX
            for step in self._steps(pending, horizon):
                heads, tails = zip(*(p.split(step) for p in pending), strict=True)
                landed = [h for h in heads if h.rows]
                if landed:
                    yield _merge(landed, self.schema)
                pending = [
                    t.compact() if 4 * t.rows < t.parent_rows else t for t in tails if t.rows
                ]
        assert not pending, "rows left after the last chunk"

    @staticmethod
    def _steps(pending: list[_Pending], horizon: int) -> list[int]:
        """Horizons up to ``horizon`` that land at most about CHUNK_ROWS rows each."""
        arrival = np.concatenate([p.keys.arrival for p in pending])
        landed = np.sort(arrival[arrival < horizon])
        cuts = [int(a) for a in landed[CHUNK_ROWS::CHUNK_ROWS]]
        return [*sorted(set(cuts)), horizon]

    def _build_chunk(self, lo: int, hi: int, rng: np.random.Generator) -> _Pending:
        """Rows of sessions [lo, hi), in arrival order (history columns left unexpanded).

        Everything per request is drawn for the chunk's Q requests in session-major order;
        ``rep`` (R,) maps each output row to its request, so request-level columns are gathers
        ``x[rep]`` and a request's candidate rows come out consecutive. With one row per
        request ``rep`` is the arrival permutation itself.
        """
        plan, model = self.plan, self.catalogue.sessions
        rows = _Rows.of(plan.sizes[lo:hi])
        n, sess, first = rows.n, rows.sess, rows.first
        requests = plan.request_offsets[lo] + np.arange(n, dtype=np.int64)

        gap_scale = max(0.0, model.mean_gap_s * 1000.0 - 0.5)
        gaps = 1 + np.floor(rng.exponential(gap_scale, size=n)).astype(np.int64)
        gaps[first] = 0
        ts = plan.starts_ms[lo:hi][sess] + rows.segmented_cumsum(gaps)
        server = rng.integers(0, model.servers, size=n, dtype=np.int64)
        counts: np.ndarray | None = None  # (Q,) candidates per request, in arrival order
        position: np.ndarray | None = None  # (R,) a row's place in its request's list
        session_major_counts = slot = np.zeros(0, dtype=np.int64)  # impression logs: below
        if plan.candidates is None:
            keys = _Keys(self._arrival(ts, server), server, ts, requests)
            perm = keys.order()  # output row i is session-major row perm[i]
            rep, out_keys = perm, keys.take(perm)
        else:
            assert plan.list_source is not None
            session_major_counts = plan.candidates[requests]
            row_start = plan.row_offsets[lo] + np.cumsum(session_major_counts)
            row_start -= session_major_counts
            keys = _Keys(self._arrival(ts, server), server, ts, row_start)
            perm = keys.order()
            counts = session_major_counts[perm]
            rep = np.repeat(perm, counts)
            position = np.arange(len(rep), dtype=np.int64) - np.repeat(
                np.cumsum(counts) - counts, counts
            )
            out_keys = _Keys(keys.arrival[rep], server[rep], ts[rep], row_start[rep] + position)
            # candidate slots: the chunk's requests' candidates in session-major order; an
            # output row shows the slot of its place in the list its request shows
            source = plan.list_source[requests] - plan.request_offsets[lo]
            slot_start = np.cumsum(session_major_counts) - session_major_counts
            slot = slot_start[source[rep]] + position
        n_out = len(rep)

        columns: dict[str, pa.Array | pa.ChunkedArray] = {
            "session_id": pa.array(plan.session_ids[lo:hi][sess[rep]]),
            "request_id": pa.array(
                mix63(requests[rep].astype(np.uint64) + np.uint64(plan.request_base))
            ),
            "ts": pa.array(ts[rep] + plan.window_start_ms),
        }
        for f in self.catalogue.dense:
            if f.kind is DenseKind.POSITION:
                at = position if position is not None else np.zeros(n_out, dtype=np.int64)
                columns[f.name] = pa.array(at.astype(np.float32))
            elif f.kind is DenseKind.CANDIDATE:
                values = f.scale * np.exp(DENSE_SIGMA * rng.standard_normal(n_out))
                at_slot = values if counts is None else values[slot]
                columns[f.name] = pa.array(at_slot.astype(np.float32))
            else:
                change = rows.change_mask(rng, f.unchanged_prob)
                event = np.cumsum(change) - 1
                values = f.scale * np.exp(DENSE_SIGMA * rng.standard_normal(int(event[-1]) + 1))
                columns[f.name] = pa.array(values.astype(np.float32)[event[rep]])
        popularity = np.full(n_out if counts is not None else n, 0.5)
        depth = np.full(n, 0.5)
        lazy: list[_LazyLists] = []
        for group in self.groups:
            if group.leader.kind is SparseKind.HISTORY:
                lists, lengths = _history_lists(group, rows, rep, rng)
                lazy.append(lists)
                if group is self.label_history:
                    depth = np.minimum(1.0, lengths / group.leader.max_length)
                continue
            if group.leader.kind is SparseKind.ITEM and counts is not None:
                fresh, first_ranks = _candidate_lists(group, session_major_counts, slot, rng)
            else:
                fresh, first_ranks = _fresh_lists(group, rows, rep, rng)
            columns.update(fresh)
            if group is self.label_item:
                scale = math.log(group.leader.cardinality + 1)
                popularity = 1.0 - np.log1p(first_ranks) / scale
        if counts is None or position is None:  # one row per request: Bernoulli labels
            logit = LABEL_POPULARITY_WEIGHT * (popularity - 0.5)
            logit += LABEL_DEPTH_WEIGHT * (depth - 0.5)
            prob = _sigmoid(logit + _solve_intercept(logit, model.label_rate))[perm]
            for name in self.catalogue.labels:
                columns[name] = pa.array((rng.random(n) < prob).astype(np.float32))
        else:
            logit = LABEL_POPULARITY_WEIGHT * (popularity - 0.5)
            logit -= LABEL_POSITION_WEIGHT * position / model.max_candidates
            logit += LABEL_DEPTH_WEIGHT * (depth[rep] - 0.5)
            clicks = _click_labels(logit, counts, model.label_rate, len(self.catalogue.labels), rng)
            for name, label in zip(self.catalogue.labels, clicks, strict=True):
                columns[name] = pa.array(label)
        eager = pa.Table.from_arrays(
            [columns[f.name] for f in self.eager_schema], schema=self.eager_schema
        )
        return _Pending(out_keys, eager, lazy, n_out)

    def _arrival(self, ts: np.ndarray, server: np.ndarray) -> np.ndarray:
        """When each row lands on the log bus: its server's next flush plus a delivery delay."""
        period = self.flush_ms
        phase = self.plan.server_phase_ms[server] % period
        flush_index = -((phase - ts) // period)  # ceil((ts - phase) / period) >= 0
        flush_at = phase + flush_index * period
        flush_key = (server.astype(np.uint64) << np.uint64(40)) ^ flush_index.astype(np.uint64)
        delay = mix63(flush_key ^ np.uint64(self.plan.delay_salt)) % (period // 2)
        return flush_at + delay


def _fresh_lists(
    group: _SparseGroup, rows: _Rows, rep: np.ndarray, rng: np.random.Generator
) -> tuple[dict[str, pa.Array | pa.ChunkedArray], np.ndarray]:
    """Static / item features: a fresh list on every change row, shared by the group.

    Returns the list columns (output row i carries session-major row ``rep[i]``'s list) and,
    per session-major row, the Zipf rank of the leader's first id (the cardinality when the
    list is empty), for the labels.
    """
    change = rows.change_mask(rng, group.leader.unchanged_prob)
    event = np.cumsum(change) - 1  # (R,) index of the value each row carries
    events = _Events.draw(group, rows.first[change], rng)
    return events.columns(group, event[rep]), events.first_rank(group)[event]


def _candidate_lists(
    group: _SparseGroup, counts: np.ndarray, slot: np.ndarray, rng: np.random.Generator
) -> tuple[dict[str, pa.Array | pa.ChunkedArray], np.ndarray]:
    """Item features of an impression log: a fresh list in each of a request's ``counts`` (Q,)
    candidate slots (never the previous slot's list); output row i shows slot ``slot[i]``.
    Returns the columns and each row's leader first rank (as ``_fresh_lists``)."""
    first = np.zeros(int(counts.sum()), dtype=bool)
    first[np.cumsum(counts) - counts] = True
    events = _Events.draw(group, first, rng)
    return events.columns(group, slot), events.first_rank(group)[slot]


@dataclass(slots=True)
class _Events:
    """Fresh lists of a static / item group's leader, as Zipf ranks (E events)."""

    lengths: np.ndarray  # (E,) ids per list
    offsets: np.ndarray  # (E + 1,) int64
    ranks: np.ndarray  # (offsets[-1],) leader ranks

    @staticmethod
    def draw(group: _SparseGroup, session_first: np.ndarray, rng: np.random.Generator) -> _Events:
        """One list per event; ``session_first`` (E,) marks the events that start a session
        (or a request), the only ones allowed to repeat their predecessor."""
        lead, sampler = group.leader, group.samplers[0]
        n_events = len(session_first)
        lengths = _draw_lengths(rng, lead.mean_length, n_events)
        offsets = np.zeros(n_events + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ranks = sampler.draw_ranks(rng, int(offsets[-1]))
        _make_events_distinct(ranks, offsets, lengths, session_first, sampler.cardinality)
        return _Events(lengths, offsets, ranks)

    def columns(
        self, group: _SparseGroup, out_event: np.ndarray | None
    ) -> dict[str, pa.Array | pa.ChunkedArray]:
        """Every member's column: output row i holds event ``out_event[i]`` (None: event i)."""
        if out_event is None:
            out_offsets, index = self.offsets, None
        else:
            out_offsets, index = _ragged_index(self.offsets[out_event], self.lengths[out_event])
        sampler = group.samplers[0]
        lead_ids = sampler.to_ids(self.ranks)
        columns: dict[str, pa.Array | pa.ChunkedArray] = {}
        for f, s in zip(group.members, group.samplers, strict=True):
            ids = lead_ids if s is sampler else s.to_ids(s.derive_ranks(lead_ids))
            columns[f.name] = _list_array(out_offsets, ids if index is None else ids[index])
        return columns

    def first_rank(self, group: _SparseGroup) -> np.ndarray:
        """(E,) each list's first rank; the cardinality for an empty list (least popular)."""
        ranks, cardinality = self.ranks, group.samplers[0].cardinality
        safe = np.minimum(self.offsets[:-1], max(0, len(ranks) - 1))
        return np.where(self.lengths > 0, ranks[safe] if len(ranks) else 0, cardinality)


def _draw_lengths(rng: np.random.Generator, mean: float, n: int) -> np.ndarray:
    if mean >= 1.0:
        return 1 + rng.poisson(mean - 1.0, size=n).astype(np.int64)
    return (rng.random(n) < mean).astype(np.int64)


def _make_events_distinct(
    ranks: np.ndarray,
    offsets: np.ndarray,
    lengths: np.ndarray,
    session_first: np.ndarray,
    cardinality: int,
) -> None:
    """Bump the first rank of an event that would repeat its session's previous event.

    Two non-empty lists with different first ids differ, so after this every change row
    really changes the value (measured d == configured d). In place; a few vectorised passes.
    """
    if cardinality < 2 or len(lengths) < 2 or len(ranks) == 0:
        return
    cur, prev = offsets[1:-1], offsets[:-2]
    candidates = ~session_first[1:] & (lengths[1:] > 0) & (lengths[:-1] > 0)
    while True:
        clash = candidates & (
            ranks[np.minimum(cur, len(ranks) - 1)] == ranks[np.minimum(prev, len(ranks) - 1)]
        )
        if not clash.any():
            return
        at = cur[clash]
        ranks[at] = (ranks[at] + 1) % cardinality


def _history_lists(
    group: _SparseGroup, rows: _Rows, rep: np.ndarray, rng: np.random.Generator
) -> tuple[_LazyLists, np.ndarray]:
    """History features: per-session id streams; a row sees the last max_length ids so far.

    Returns the (unexpanded) lists of the output rows (row i: session-major row ``rep[i]``'s
    list) and the per-row list length in session-major order.
    """
    lead, sampler = group.leader, group.samplers[0]
    n_sessions = len(rows.sizes)
    added = _history_appends(rows, lead.unchanged_prob, rng)
    factor = rng.gamma(HISTORY_START_SHAPE, 1.0 / HISTORY_START_SHAPE, n_sessions)
    warm = np.floor(group.history_start * factor + rng.random(n_sessions))
    warm = np.minimum(warm, lead.max_length).astype(np.int64)
    seen = warm[rows.sess] + rows.segmented_cumsum(added)  # (R,) stream length at each row
    stream_len = seen[rows.offsets[1:] - 1]
    stream_offsets = np.zeros(n_sessions + 1, dtype=np.int64)
    np.cumsum(stream_len, out=stream_offsets[1:])
    lead_ids = sampler.to_ids(sampler.draw_ranks(rng, int(stream_offsets[-1])))
    streams = [
        lead_ids if s is sampler else s.to_ids(s.derive_ranks(lead_ids)) for s in group.samplers
    ]
    row_len = np.minimum(seen, lead.max_length)
    starts = stream_offsets[rows.sess] + seen - row_len
    names = [f.name for f in group.members]
    return _LazyLists(names, streams, starts[rep], row_len[rep]), row_len


def _ragged_index(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Offsets of the concatenated ranges [starts[i], starts[i] + lengths[i]), and its indices."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
    return offsets, index


def _list_array(offsets: np.ndarray, values: np.ndarray) -> pa.Array | pa.ChunkedArray:
    """``list<int64>`` from int64 offsets + values; split into chunks past int32 offsets."""
    if offsets[-1] <= _INT32_MAX:
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
    pieces = []
    start = 0
    n = len(offsets) - 1
    while start < n:
        stop = int(np.searchsorted(offsets, offsets[start] + _INT32_MAX, side="right")) - 1
        stop = min(n, max(stop, start + 1))
        local = offsets[start : stop + 1] - offsets[start]
        piece_values = values[offsets[start] : offsets[stop]]
        pieces.append(
            pa.ListArray.from_arrays(pa.array(local.astype(np.int32)), pa.array(piece_values))
        )
        start = stop
    return pa.chunked_array(pieces, type=pa.list_(pa.int64()))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _solve_intercept(logit: np.ndarray, rate: float) -> float:
    """b such that mean(sigmoid(logit + b)) == rate (bisection; the mean is increasing in b)."""
    lo, hi = -40.0, 40.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if float(_sigmoid(logit + mid).mean()) < rate else (lo, mid)
    return 0.5 * (lo + hi)


def _click_labels(
    logit: np.ndarray, counts: np.ndarray, rate: float, n_labels: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Impression labels: at most one click per request, as a choice among its candidates.

    ``logit`` (R,) per candidate row, each request's ``counts`` (Q,) rows consecutive. Per
    label column the click is the argmax of logit + Gumbel noise over the request's
    candidates and a "no click" option of logit b, so candidate i is clicked with probability
    ``exp(l_i) / (exp(b) + sum_j exp(l_j))``. b is solved (bisection) so that the expected
    clicks per row equal ``rate``; past one click per request it saturates (b -> -40). Every
    column is drawn independently from the same probabilities. Returns float32 arrays (R,).
    """
    starts = np.cumsum(counts) - counts
    log_weight = np.log(np.add.reduceat(np.exp(logit), starts))  # (Q,) log sum_j exp(l_j)
    per_request = min(1.0, rate * len(logit) / len(counts))
    null_logit = -_solve_intercept(log_weight, per_request)
    request_of = np.repeat(np.arange(len(counts)), counts)
    labels = []
    for _ in range(n_labels):
        score = logit + rng.gumbel(size=len(logit))
        best = np.maximum.reduceat(score, starts)
        clicked = best > null_logit + rng.gumbel(size=len(counts))
        winners = np.flatnonzero((score == best[request_of]) & clicked[request_of])
        _, first = np.unique(request_of[winners], return_index=True)  # a tie: the first
        label = np.zeros(len(logit), dtype=np.float32)
        label[winners[first]] = 1.0
        labels.append(label)
    return labels
