"""ReaderConfig: what a reader reads (table, partitions, features) and how (batching, order).

Loaded from a TOML table such as::

    [reader]
    table = "out/table"
    start = "2026-11-01/00"          # partitions ds/hour >= start (inclusive)
    end = "2026-11-01T02:00"         # ... and < end (exclusive)
    sparse = ["user_history", "cart_item_ids", "cart_seller_ids", "item_id"]
    dedup_sparse_features = [["user_history"], ["cart_item_ids", "cart_seller_ids"]]
    batch_size = 512
    shuffle = "session"              # whole sessions mixed across a window of rows
    preprocessing = [
        { kind = "hash_modulo", features = ["item_id"], modulo = 100000 },
        { kind = "truncate_last", features = ["user_history"], n = 50 },
        { kind = "log1p", features = ["item_price"] },
    ]

Every check names the field and the offending value; the table-dependent checks (features
present, schema identical across partitions) run when the read plan is built
(``recd.reader.plan.build_plan``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, get_args

from recd.config_types import (
    NonNegativeInt,
    PositiveInt,
    check_fields,
    check_keys,
    check_value,
    load_toml,
    typed_values,
)
from recd.errors import ConfigError
from recd.table.partitions import parse_time_ms

# Preprocessing kinds a spec may name, and the keys each one requires besides "kind".
PREPROCESS_KINDS: dict[str, tuple[str, ...]] = {
    "hash_modulo": ("features", "modulo"),
    "truncate_last": ("features", "n"),
    "log1p": ("features",),
    "clamp": ("features",),
    "normalize": ("features", "mean", "std"),
}
# Optional numeric keys per kind (a number, or for normalize one number per feature).
_NUMERIC_KEYS: dict[str, tuple[str, ...]] = {"clamp": ("min", "max"), "normalize": ("mean", "std")}
SPARSE_PREPROCESS_KINDS = ("hash_modulo", "truncate_last")
# Fields that do not change which batches come out (nor their order), hence not fingerprinted.
# ``snapshot`` is left out because the plan's fingerprint covers the files it selects.
_NOT_FINGERPRINTED = (
    "num_epochs",
    "prefetch_factor",
    "pin_memory",
    "snapshot",
    "num_workers",
    "engine",
    "ray_address",
    "ray_chunk_batches",
    "ray_memory_mb",
)
"""Fields that do not change which batches come out: a saved position stays valid."""
Engine = Literal["local", "ray"]
ENGINES: tuple[str, ...] = get_args(Engine)
DEFAULT_SESSION_COLUMN = "session_id"
"""``reader.session_column``'s default: the session ids of a table written by ``recd etl``."""


class Shuffle(StrEnum):
    """Order in which an epoch's rows are read (``recd.reader.order``). ``rows`` and
    ``session`` also permute rows inside windows of ``shuffle_window`` rows: ``rows`` one by
    one (the plain KJT job's shuffle: it scatters a session's duplicates over many batches),
    ``session`` whole sessions (a session's rows stay adjacent, so IKJT groups keep their
    duplicates in one batch)."""

    NONE = "none"  # table order: partitions, files, row groups sorted
    FILE = "file"  # files permuted per epoch; row groups of a file stay in order
    ROW_GROUP = "row_group"  # (file, row group) units permuted per epoch
    SESSION = "session"  # units permuted, then whole sessions permuted inside each window
    ROWS = "rows"  # units permuted, then rows permuted inside each window

    @property
    def windowed(self) -> bool:
        """Whether rows are permuted inside windows (``rows``, ``session``)."""
        return self in (Shuffle.ROWS, Shuffle.SESSION)


@dataclass(kw_only=True, slots=True)
class ReaderConfig:
    """What one reader (one trainer rank and its worker processes) reads, and in which order."""

    table: str
    """Table directory written by ``recd etl``: only committed files are read (an Iceberg
    table's snapshot, or a Hive-layout table's partitions holding ``_SUCCESS``). Or a
    directory of Parquet files from another tool, read whole (list its features in
    ``labels``, ``dense``, ``sparse`` and ``history_features``; docs/own-data.md)."""
    snapshot: int | None = None
    """Iceberg table: the snapshot to read (None: the current one when the plan is built; a
    training run records the one it read and a resume reads that one again)."""
    start: str | None = None
    """Read partitions whose hour starts at or after this time (inclusive): ISO 8601
    (``2026-11-01T03:00``, naive = UTC), a date, or ``YYYY-MM-DD/HH``; None: unbounded."""
    end: str | None = None
    """Partition hour to stop before (exclusive), same formats; None: no upper bound."""
    labels: list[str] | None = None
    """Label columns (float32), B x L in the batch; None: all labels of the catalogue."""
    dense: list[str] | None = None
    """Dense feature columns, B x D in the batch in this order; None: all of the catalogue."""
    sparse: list[str] | None = None
    """Sparse feature columns (``list<int64>``, or any integer list; a plain integer column is
    a list of one id); None: all sparse features of the catalogue."""
    history_features: list[list[str]] = field(default_factory=list)
    """The sparse features that are histories (sequences the ``rm1`` model pools with a
    transformer), in groups that change together; the others are not. A table without a recd
    catalogue needs it to have histories at all; for a table written by ``recd etl`` it
    replaces the catalogue's history groups (empty: the catalogue's)."""
    dedup_sparse_features: list[list[str]] = field(default_factory=list)
    """Groups of sparse features converted to IKJTs (one inverse lookup per group, O3); the
    others stay in the plain KJT. Each feature may appear in at most one group."""
    batch_size: PositiveInt = 512
    """Rows per batch. Batches fill across row-group boundaries inside one worker."""
    preprocessing: list[dict[str, Any]] = field(default_factory=list)
    """Preprocessing module specs, applied in order, e.g. ``{kind="hash_modulo",
    features=["item_id"], modulo=100000}``; kinds: hash_modulo, truncate_last (n), log1p,
    clamp (min and/or max), normalize (mean, std: a number or one per feature). Sparse kinds
    run over IKJT distinct values only, and over the stored ids of features a dedup-layout
    table encodes (once per row group); dense kinds touch only the listed dense columns."""
    shuffle: Shuffle = Shuffle.NONE
    """Order of an epoch: none (table order), file, row_group (units permuted), session
    (units permuted, then whole sessions mixed inside windows of ``shuffle_window`` rows:
    for IKJT groups) or rows (units permuted, then rows mixed inside the windows: for plain
    KJT jobs). docs/accuracy.md says which to use when."""
    shuffle_window: PositiveInt = 16384
    """``rows`` / ``session``: rows mixed together, rounded up to a multiple of
    ``batch_size``. Each stream holds one window (plus the row group it ends in) in memory, so
    a reading process holds at most its streams x (window + one row group) rows."""
    session_column: str = DEFAULT_SESSION_COLUMN
    """``session``: the column of each row's session (or user) id; the runs of equal ids in a
    window are the sessions kept together. Integer ids are used as they are, string ids hashed
    to int64 as ``recd logs ingest`` hashes string session ids; a null id is a bad row. A
    table written by ``recd etl`` has ``session_id``; a table from another tool may name
    another column (docs/own-data.md)."""
    streams: PositiveInt = 4
    """Streams each rank's units are dealt to; consecutive batches come from consecutive
    streams. The batch sequence depends on ``streams``, never on ``num_workers`` or
    ``engine`` (which must divide it, or be 0)."""
    seed: NonNegativeInt = 0
    """Seed of the per-epoch permutations (with the epoch number)."""
    drop_last: bool = False
    """Drop the final partial batch of each worker in each epoch."""
    num_epochs: PositiveInt = 1
    """Passes over the selected partitions."""
    rank: NonNegativeInt = 0
    """This trainer's rank in [0, world_size)."""
    world_size: PositiveInt = 1
    """Number of trainer ranks; the units are split over world_size x max(num_workers, 1)."""
    num_workers: NonNegativeInt = 0
    """DataLoader worker processes of this rank (0: read in the main process); each reads
    ``streams / num_workers`` streams, so it must divide ``streams``. It does not change the
    batches: a run may resume with another worker count."""
    prefetch_factor: PositiveInt = 2
    """Batches each worker process keeps in flight (DataLoader prefetch_factor)."""
    pin_memory: bool = False
    """Let the DataLoader pin batch memory (only useful with a GPU)."""
    engine: Engine = "local"
    """Where batches are built: ``local`` (this process, or ``num_workers`` DataLoader worker
    processes) or ``ray`` (Ray Data tasks, at most ``num_workers`` at once, on the Ray cluster
    at ``ray_address``; recd.reader.ray_tier). The batches are the same."""
    ray_address: str | None = None
    """``engine = "ray"``: address of an existing Ray cluster (``ray://host:10001`` or
    ``host:6379``); None: the cluster this process already joined, else one ``ray start``
    left running on this machine, else a local one started for the job (its start and
    teardown add seconds to the job: start a cluster once with ``ray start --head`` to reuse
    it)."""
    ray_chunk_batches: PositiveInt = 4
    """``engine = "ray"``: batches one Ray task builds (its unit of work and of retry)."""
    ray_memory_mb: PositiveInt = 512
    """``engine = "ray"``: Ray object store memory the reader's tasks may fill before Ray's
    backpressure holds new tasks back."""

    def __post_init__(self) -> None:
        if not self.table:
            raise ConfigError("reader.table: a table directory is required")
        self.table = str(self.table)
        check_fields(self, "reader.")
        self.shuffle = Shuffle(self.shuffle)
        lo, hi = self.start_ms, self.end_ms
        if lo is not None and hi is not None and hi <= lo:
            raise ConfigError(f"reader.end: {self.end!r} must be after reader.start {self.start!r}")
        if not isinstance(self.session_column, str) or not self.session_column:
            raise ConfigError(
                f"reader.session_column: expected a column name, got {self.session_column!r}"
            )
        if self.engine == "local" and self.num_workers and self.streams % self.num_workers:
            raise ConfigError(
                f"reader.num_workers: {self.num_workers} does not divide reader.streams = "
                f"{self.streams}: each worker reads an equal share of the streams (the batch "
                "order is set by the streams, not the workers); use a divisor of streams, or "
                "change streams (which changes the order)"
            )
        if self.engine == "ray" and self.world_size > 1 and self.ray_address is None:
            raise ConfigError(
                f"reader.engine = 'ray' with {self.world_size} ranks needs reader.ray_address: "
                "the ranks must share one Ray cluster (start one with `ray start --head` and "
                'set ray_address = "auto", or give its address)'
            )
        if self.rank >= self.world_size:
            raise ConfigError(f"reader.rank: {self.rank} must be < world_size {self.world_size}")
        for name in ("labels", "dense", "sparse"):
            _check_names(name, getattr(self, name))
        self._check_dedup_groups()
        self._check_preprocessing()

    def _check_dedup_groups(self) -> None:
        seen: dict[str, int] = {}
        groups = [list(g) for g in self.dedup_sparse_features]
        for i, group in enumerate(groups):
            if not group:
                raise ConfigError(f"reader.dedup_sparse_features[{i}]: a group cannot be empty")
            for name in group:
                if not isinstance(name, str):
                    raise ConfigError(
                        f"reader.dedup_sparse_features[{i}]: {name!r} is not a feature name"
                    )
                if name in seen:
                    raise ConfigError(
                        f"reader.dedup_sparse_features: feature {name!r} is in groups "
                        f"{seen[name]} and {i}; a feature may be in one group only"
                    )
                seen[name] = i
                if self.sparse is not None and name not in self.sparse:
                    raise ConfigError(
                        f"reader.dedup_sparse_features[{i}]: {name!r} is not in reader.sparse"
                    )
        self.dedup_sparse_features = groups

    def _check_preprocessing(self) -> None:
        specs = []
        for i, spec in enumerate(self.preprocessing):
            if not isinstance(spec, dict):
                raise ConfigError(f"reader.preprocessing[{i}]: expected a table, got {spec!r}")
            kind = spec.get("kind")
            if kind not in PREPROCESS_KINDS:
                raise ConfigError(
                    f"reader.preprocessing[{i}].kind: {kind!r} is not one of "
                    f"{', '.join(PREPROCESS_KINDS)}"
                )
            for key in PREPROCESS_KINDS[kind]:
                if key not in spec:
                    raise ConfigError(f"reader.preprocessing[{i}] ({kind}): missing key {key!r}")
            features = spec["features"]
            if not isinstance(features, list) or not features:
                raise ConfigError(
                    f"reader.preprocessing[{i}].features: expected a non-empty list of "
                    f"feature names, got {features!r}"
                )
            for key, hint in (("modulo", PositiveInt), ("n", NonNegativeInt)):
                if key in PREPROCESS_KINDS[kind]:
                    check_value(f"reader.preprocessing[{i}].{key}", spec[key], hint)
            for key in _NUMERIC_KEYS.get(kind, ()):
                if key in spec and not _is_numbers(spec[key], len(features)):
                    raise ConfigError(
                        f"reader.preprocessing[{i}].{key}: expected a number or "
                        f"{len(features)} numbers, got {spec[key]!r}"
                    )
                values = spec.get(key, [])
                if not all(
                    math.isfinite(v) for v in (values if isinstance(values, list) else [values])
                ):
                    raise ConfigError(  # NaN / infinity would make every feature value NaN
                        f"reader.preprocessing[{i}].{key}: expected finite numbers, got {values!r}"
                    )
            if kind == "clamp" and "min" not in spec and "max" not in spec:
                raise ConfigError(f"reader.preprocessing[{i}] (clamp): give 'min' and/or 'max'")
            specs.append(dict(spec))
        self.preprocessing = specs

    @property
    def start_ms(self) -> int | None:
        """The start bound in ms since the epoch, UTC (None: unbounded)."""
        return parse_time_ms(self.start, field="reader.start") if self.start else None

    @property
    def end_ms(self) -> int | None:
        """The end bound in ms since the epoch, UTC (None: unbounded)."""
        return parse_time_ms(self.end, field="reader.end") if self.end else None

    @property
    def workers_per_rank(self) -> int:
        """Reading processes of one rank: the DataLoader workers, or 1 (the main process)."""
        return max(self.num_workers, 1)

    @property
    def num_global_streams(self) -> int:
        """All streams of the job: world_size x streams."""
        return self.world_size * self.streams

    def global_stream_id(self, stream: int) -> int:
        """Global id of stream ``stream`` of this rank: rank * streams + stream."""
        return self.rank * self.streams + stream

    def worker_streams(self, worker: int) -> list[int]:
        """The streams local reading process ``worker`` reads: worker, worker + W, ..."""
        return list(range(worker, self.streams, self.workers_per_rank))

    @property
    def window_rows(self) -> int:
        """Rows of one shuffle window: ``shuffle_window`` rounded up to whole batches."""
        return -(-self.shuffle_window // self.batch_size) * self.batch_size

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["shuffle"] = self.shuffle.value
        return out

    def position_fields(self) -> dict[str, Any]:
        """The fields that decide which batches come out, in which order (for resume checks)."""
        out = self.to_dict()
        for name in _NOT_FINGERPRINTED:
            out.pop(name)
        if not self.shuffle.windowed:
            out.pop("shuffle_window")  # no window: its size changes nothing
        if self.shuffle != Shuffle.SESSION or self.session_column == DEFAULT_SESSION_COLUMN:
            # unread by the other shuffles; at its default, a config keeps the fingerprint it
            # had before the key existed (its saved positions stay valid)
            out.pop("session_column")
        return out

    def fingerprint(self) -> str:
        """Short hash of ``position_fields()``: a saved reader position is valid only for it."""
        blob = json.dumps(self.position_fields(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> ReaderConfig:
        """Build from a TOML table (unknown keys are errors naming ``source``)."""
        check_keys(data, cls, f"{source}: ", what="reader option")
        try:
            return cls(**typed_values(cls, data, "reader"))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from exc


def load_reader_config(path: str | Path, *, section: str | None = "reader") -> ReaderConfig:
    """Load a ReaderConfig from a TOML file, from table ``[section]`` (None: the top level).

    A relative ``table`` path is resolved against the TOML file's directory.
    """
    path = Path(path)
    data = load_toml(path, "reader config")
    if section is not None:
        if section not in data or not isinstance(data[section], dict):
            raise ConfigError(f"{path}: no [{section}] table")
        data = data[section]
    data = dict(data)
    if isinstance(data.get("table"), str) and not Path(data["table"]).is_absolute():
        data["table"] = str(path.parent / data["table"])
    return ReaderConfig.from_dict(data, source=f"{path}[{section}]" if section else str(path))


def _is_numbers(value: object, n: int) -> bool:
    def number(x: object) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool)

    if isinstance(value, list):
        return len(value) == n and all(number(x) for x in value)
    return number(value)


def _check_names(name: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"reader.{name}: expected a list of column names, got {value!r}")
    duplicates = sorted({v for v in value if value.count(v) > 1})
    if duplicates:
        raise ConfigError(f"reader.{name}: column(s) listed twice: {', '.join(duplicates)}")
