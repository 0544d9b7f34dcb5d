"""What deduplicating a group costs the reader on this machine, and what it saves.

A dedup group turns K sparse columns of a batch of B rows from part of the plain KJT into an
IKJT. The reader then pays the dedup conversion (stacking, run check, hash table, inverse,
gathering the distinct rows) and saves the work it would have spent on the duplicate rows
(copying their ids into the KJT, running the preprocessing modules on them). Whether that pays
depends on the machine and on the group's shape: a length-1 feature saves one id per
duplicate row while its dedup costs a hash-table probe per row, so a high DedupeFactor alone
does not make a group worth deduplicating (a real clickstream's item id: factor 5, slower).

The model is linear in the group's per-batch shape (:class:`GroupShape`)::

    seconds per batch = c0 + c1 * K + c2 * K*B + c3 * ids + c4 * K*D + c5 * distinct_ids

fitted by least squares, separately for the plain path and the dedup path, for short rows
(fewer than ``RUN_CHECK_MAX_IDS_PER_ROW`` ids per row and key, where dedup compares adjacent
rows first) and long rows, each with and without preprocessing (``hash_modulo`` of every id).
The points come from timing the reader's own code (:func:`recd.convert.convert_sparse` and the
TorchScript preprocessing, exactly as :class:`recd.reader.transform.BatchTransform` runs them)
on synthetic batches of clustered sessions over a grid of keys, lengths and repeat rates,
each point the best of several interleaved repetitions. Calibration takes a few seconds and
is cached per machine (CPU model, core count, library versions) in
``$RECD_COST_CACHE`` or ``~/.cache/recd/dedup_costs.json``.

What it leaves out: the trainer-side savings (lookups and transformers run once per distinct
row), which only add to a group's gain; so a group the model accepts pays in the reader alone,
and one it rejects may still pay in the trainer (say so in the reader config by hand).

Written here, not taken from a library: no library models the cost of torchrec/recd IKJT
conversion; the fit is a 6-term ``numpy.linalg.lstsq``.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from recd.checkpoint.atomic import write_json_atomic
from recd.convert import FeatureSpec, convert_sparse
from recd.errors import ConfigError
from recd.jagged import RUN_CHECK_MAX_IDS_PER_ROW
from recd.preprocess import HashModulo, preprocess_sparse

COST_MODEL_VERSION = 1
"""Bumped when the calibration or the model changes (older caches are recalibrated)."""
CACHE_ENV = "RECD_COST_CACHE"
TERMS = ("batch", "keys", "row_keys", "ids", "distinct_row_keys", "distinct_ids")
"""The model's terms, per batch: 1, K, K*B, ids, K*D, distinct ids."""
REGIMES = ("short", "long")
CALIBRATION_SESSION_ROWS = 11
"""Rows per synthetic session (a session's rows are contiguous, as in a clustered table)."""
OTHER_PLAIN_KEYS = 2
"""Length-1 plain features present in every calibration batch (a KJT exists either way)."""
HASH_MODULO = 1_000_003
PAY_MARGIN = 0.1
"""A group is proposed only if it saves at least this share of its plain cost: the margin
covers the model's error (about 5% on the calibration points) so the reader never slows."""


@dataclass(kw_only=True, slots=True)
class GroupShape:
    """A dedup group's work over some batches, as the reader's batching sees it."""

    batches: int
    rows: int
    """Rows over all batches (B per batch)."""
    keys: int
    """K: features in the group."""
    ids: int
    """Ids of the group's features over all rows."""
    distinct_rows: int
    """Rows left after exact dedup inside each batch (D per batch)."""
    distinct_ids: int
    """Ids in those rows (the IKJT's values)."""

    @property
    def ids_per_row_key(self) -> float:
        return self.ids / max(1, self.rows * self.keys)

    @property
    def regime(self) -> str:
        return "short" if self.ids_per_row_key < RUN_CHECK_MAX_IDS_PER_ROW else "long"

    def terms(self) -> np.ndarray:
        """The model's terms summed over the batches."""
        k = self.keys
        return np.array(
            [
                self.batches,
                k * self.batches,
                k * self.rows,
                self.ids,
                k * self.distinct_rows,
                self.distinct_ids,
            ],
            dtype=np.float64,
        )


@dataclass(kw_only=True, slots=True)
class GroupCost:
    """The model's verdict on one group (seconds over the table, and per 1k samples)."""

    plain_s: float
    """Predicted reader time of the group's columns in the plain KJT."""
    dedup_s: float
    """Predicted reader time of the group as an IKJT."""
    rows: int

    @property
    def saving_s(self) -> float:
        return self.plain_s - self.dedup_s

    @property
    def saving_ms_per_1k(self) -> float:
        return self.saving_s * 1e6 / max(1, self.rows)

    @property
    def pays(self) -> bool:
        return self.saving_s > PAY_MARGIN * self.plain_s


@dataclass(kw_only=True, slots=True)
class CostModel:
    """Fitted coefficients (seconds per term unit) per (preprocessing, regime, path)."""

    coefficients: dict[str, dict[str, dict[str, list[float]]]]
    """``coefficients[preprocessing][regime][path]``: one value per :data:`TERMS` entry;
    preprocessing is "none" or "hash_modulo", path "plain" or "dedup"."""
    machine: dict[str, Any] = field(default_factory=dict)
    fit_error: dict[str, float] = field(default_factory=dict)
    """Median absolute error of each fit on its calibration points, over their median time."""
    calibration_s: float = 0.0
    version: int = COST_MODEL_VERSION

    def cost(self, shape: GroupShape, *, preprocessed: bool) -> GroupCost:
        """Predicted plain and dedup reader time of ``shape``."""
        fits = self.coefficients["hash_modulo" if preprocessed else "none"][shape.regime]
        terms = shape.terms()
        plain = float(terms @ np.asarray(fits["plain"]))
        dedup = float(terms @ np.asarray(fits["dedup"]))
        return GroupCost(plain_s=max(plain, 0.0), dedup_s=max(dedup, 0.0), rows=shape.rows)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        return cls(**data)


# ---------------------------------------------------------------------- machine + cache
def machine_fingerprint() -> dict[str, Any]:
    """What the costs depend on: CPU model, cores, library versions."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
        "version": COST_MODEL_VERSION,
    }


def default_cache_path() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "recd" / "dedup_costs.json"


def machine_cost_model(
    *, cache: Path | None = None, recalibrate: bool = False, quiet: bool = False
) -> CostModel:
    """The cached model of this machine, calibrated (and cached) when missing or stale."""
    path = cache or default_cache_path()
    fingerprint = machine_fingerprint()
    if not recalibrate and path.exists():
        try:
            model = CostModel.from_dict(json.loads(path.read_text()))
        except (ValueError, TypeError, KeyError):
            model = None  # unreadable or older layout: recalibrate
        if model is not None and model.machine == fingerprint:
            return model
    if not quiet:
        print(f"calibrating the dedup cost model for this machine (cached in {path}) ...")
    model = calibrate()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, model.to_dict())
    return model


# ---------------------------------------------------------------------- calibration
def synthetic_batch(
    *, keys: int, length: int, unchanged: float, batch_size: int, seed: int
) -> pa.Table:
    """``keys`` group columns + :data:`OTHER_PLAIN_KEYS` plain ones, sessions of clustered rows.

    Within a session a row repeats its predecessor (every key) with probability ``unchanged``;
    otherwise it draws fresh ids (never equal to another row's).
    """
    rng = np.random.default_rng(seed)
    b = batch_size
    changed = rng.random(b) >= unchanged
    changed[::CALIBRATION_SESSION_ROWS] = True  # a session's first row is always new
    content = np.cumsum(changed) - 1  # row -> index of its distinct content
    columns: dict[str, pa.Array] = {}
    offsets = pa.array(np.arange(b + 1, dtype=np.int32) * length)
    for k in range(keys):
        fresh = rng.integers(0, 1 << 40, size=(int(changed.sum()), length), dtype=np.int64)
        values = pa.array(fresh[content].reshape(-1))
        columns[f"g{k}"] = pa.ListArray.from_arrays(offsets, values)
    ones = pa.array(np.arange(b + 1, dtype=np.int32))
    for k in range(OTHER_PLAIN_KEYS):
        ids = pa.array(rng.integers(0, 1 << 40, size=b, dtype=np.int64))
        columns[f"p{k}"] = pa.ListArray.from_arrays(ones, ids)
    return pa.table(columns)


def _time_path(
    table: pa.Table, spec: FeatureSpec, module: torch.nn.Module | None, reps: int
) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        sparse = convert_sparse(table, spec, source="<calibration>")
        if module is not None:
            preprocess_sparse(sparse, module)
        best = min(best, time.perf_counter() - t0)
    return best


def _calibration_grid(quick: bool) -> list[tuple[str, int, int, float, int]]:
    """(regime, keys, ids per row and key, repeat rate, batch size) of every point."""
    short = [1, 2, 4, 6] if RUN_CHECK_MAX_IDS_PER_ROW > 6 else [1, 2]
    long = [RUN_CHECK_MAX_IDS_PER_ROW, 16, 32, 64]
    ks: tuple[int, ...] = (1, 2, 8)
    ds: tuple[float, ...] = (0.0, 0.5, 0.9)
    bs: tuple[int, ...] = (512, 4096)
    if quick:
        short, long, ks, ds, bs = short[::3], long[::3], (1, 8), (0.0, 0.9), (512,)
    return [
        (regime, k, n, d, b)
        for regime, lengths in (("short", short), ("long", long))
        for k in ks
        for n in lengths
        for d in ds
        for b in bs
    ]


def calibrate(*, reps: int = 5, quick: bool = False) -> CostModel:
    """Time the plain and dedup paths on the calibration grid and fit the model.

    ``quick``: a coarse grid and fewer repetitions (tests); the fit is rougher, not biased.
    """
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one reader = one core
    try:
        points = _measure_grid(reps=2 if quick else reps, quick=quick)
    finally:
        torch.set_num_threads(threads)
    coefficients: dict[str, dict[str, dict[str, list[float]]]] = {}
    errors: dict[str, float] = {}
    for (pre, regime, path), (xs, ys) in points.items():
        x, y = np.asarray(xs), np.asarray(ys)
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        coefficients.setdefault(pre, {}).setdefault(regime, {})[path] = coef.tolist()
        # median absolute error, relative to the median time of the fit's points
        errors[f"{pre}/{regime}/{path}"] = float(
            np.median(np.abs(x @ coef - y)) / max(float(np.median(np.abs(y))), 1e-9)
        )
    return CostModel(
        coefficients=coefficients,
        machine=machine_fingerprint(),
        fit_error=errors,
        calibration_s=time.perf_counter() - t0,
    )


def _measure_grid(
    *, reps: int, quick: bool
) -> dict[tuple[str, str, str], tuple[list[np.ndarray], list[float]]]:
    """Seconds per path and point, minus the same batch without the group (the plain keys
    that every batch has): the group's own cost in the plain KJT and as an IKJT."""
    grid = _calibration_grid(quick)
    every_key = [f"g{k}" for k in range(max(g[1] for g in grid))]
    every_key += [f"p{k}" for k in range(OTHER_PLAIN_KEYS)]
    modules: dict[str, torch.nn.Module | None] = {
        "none": None,  # keys a HashModulo does not list pass through unchanged
        "hash_modulo": torch.jit.script(HashModulo({n: HASH_MODULO for n in every_key})),
    }
    points: dict[tuple[str, str, str], tuple[list[np.ndarray], list[float]]] = {}
    for seed, (regime, keys, length, unchanged, b) in enumerate(grid):
        table = synthetic_batch(
            keys=keys, length=length, unchanged=unchanged, batch_size=b, seed=seed
        )
        group = [f"g{k}" for k in range(keys)]
        plain = [f"p{k}" for k in range(OTHER_PLAIN_KEYS)]
        names = [*group, *plain]
        specs = {
            "base": FeatureSpec(sparse=plain, labels=[]),
            "plain": FeatureSpec(sparse=names, labels=[]),
            "dedup": FeatureSpec(sparse=names, labels=[], dedup_sparse_features=[group]),
        }
        dedup = convert_sparse(table, specs["dedup"], source="<calibration>").ikjts[0]
        distinct_rows = int(dedup.num_distinct())
        shape = GroupShape(
            batches=1,
            rows=b,
            keys=keys,
            ids=keys * length * b,
            distinct_rows=distinct_rows,
            distinct_ids=keys * length * distinct_rows,
        )
        for pre, module in modules.items():
            for spec in specs.values():
                _time_path(table, spec, module, 2)  # warm-up (TorchScript profiling runs)
            best = {path: float("inf") for path in specs}
            for _ in range(reps):  # interleaved: drift in load hits every path alike
                for path, spec in specs.items():
                    best[path] = min(best[path], _time_path(table, spec, module, 1))
            for path in ("plain", "dedup"):
                xs, ys = points.setdefault((pre, regime, path), ([], []))
                xs.append(shape.terms())
                ys.append(best[path] - best["base"])
    return points


def check_cost_model(model: CostModel) -> None:
    """Raise ConfigError when a model (e.g. a hand-edited cache) lacks a fit."""
    for pre in ("none", "hash_modulo"):
        for regime in REGIMES:
            for path in ("plain", "dedup"):
                coef = model.coefficients.get(pre, {}).get(regime, {}).get(path)
                if coef is None or len(coef) != len(TERMS):
                    raise ConfigError(f"dedup cost model: no {pre}/{regime}/{path} fit")
