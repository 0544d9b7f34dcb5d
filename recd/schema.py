"""The one schema of a sample row, and the feature catalogue that defines it.

A sample row (one impression) is, in column order::

    session_id  int64            the user session the request belongs to
    request_id  int64            unique per logged request
    ts          int64            log timestamp, milliseconds since the Unix epoch (UTC)
    <label>     float32          one column per label in ``catalogue.labels``
    <dense key> float32          one column per dense feature (the flattened dense map)
    <sparse key> list<int64>     one column per sparse feature (the flattened id-list map)

The catalogue (a TOML file, see ``recd/profiles/*.toml``) lists the labels, dense and sparse
features, and for the synthetic generator the statistics each feature follows. Everything that
reads or writes rows (generator, ingest, sharding, ETL, readers) derives its Arrow schema from
here: this module is the single source of truth.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow as pa

from recd.config_types import parse_toml
from recd.errors import ConfigError, SchemaError

SESSION_ID = "session_id"
REQUEST_ID = "request_id"
TS = "ts"
RESERVED_COLUMNS = (SESSION_ID, REQUEST_ID, TS)
# Key under which a table's catalogue is stored in Parquet / Arrow schema metadata.
CATALOGUE_METADATA_KEY = b"recd.catalogue"
PROFILE_NAMES = ("tiny", "small", "rm1-like", "clickstream", "impressions")


class SparseKind(StrEnum):
    """How a sparse feature evolves along a session (drives the generator and the analysis)."""

    STATIC = "static"  # per-user value, constant within a session (d ~ 1)
    HISTORY = "history"  # sequence that grows by appending new ids (d = P(no new event))
    ITEM = "item"  # per-item: differs on every row (d ~ 0); per candidate in impression logs


class DenseKind(StrEnum):
    """What a dense feature belongs to. In a log of one row per request the three coincide
    but for ``position``; in an impression log (``SessionModel.candidates_per_request`` > 1)
    a request's candidate rows share its ``request`` values."""

    REQUEST = "request"  # per request (user / context): unchanged_prob from its previous one
    CANDIDATE = "candidate"  # per candidate row: a fresh value on every row (price)
    POSITION = "position"  # the candidate's 0-based place in its request's list


@dataclass(kw_only=True, slots=True)
class SparseFeature:
    """One sparse feature: a variable-length list of int64 ids per row."""

    name: str
    """Column name and feature key."""
    kind: SparseKind = SparseKind.ITEM
    """Evolution along a session: static, history (append-only sequence) or item."""
    mean_length: float = 1.0
    """l(f): mean number of ids per row (for history: the mean length once warmed up)."""
    unchanged_prob: float = 0.0
    """d(f): probability that the value is unchanged from the session's previous row."""
    cardinality: int = 1_000_000
    """Ids are drawn from [0, cardinality)."""
    zipf_exponent: float = 1.1
    """Exponent of the Zipf distribution of ids (> 1); larger means more skew."""
    max_length: int = 0
    """History features keep at most this many most recent ids (0: 4 x mean_length)."""
    group: str | None = None
    """Synchronised group name: features of a group change on the same rows (e.g. cart)."""

    def __post_init__(self) -> None:
        self.kind = SparseKind(self.kind)
        if self.mean_length <= 0:
            raise ConfigError(
                f"sparse feature {self.name!r}: mean_length must be > 0, got {self.mean_length}"
            )
        if not 0.0 <= self.unchanged_prob <= 1.0:
            raise ConfigError(
                f"sparse feature {self.name!r}: unchanged_prob must be in [0, 1], got {self.unchanged_prob}"
            )
        if self.cardinality < 1:
            raise ConfigError(
                f"sparse feature {self.name!r}: cardinality must be >= 1, got {self.cardinality}"
            )
        if self.zipf_exponent <= 1.0:
            raise ConfigError(
                f"sparse feature {self.name!r}: zipf_exponent must be > 1, got {self.zipf_exponent}"
            )
        if self.max_length == 0:
            self.max_length = max(1, round(4 * self.mean_length))


@dataclass(kw_only=True, slots=True)
class DenseFeature:
    """One dense feature: a float32 per row (one key of the flattened dense map)."""

    name: str
    """Column name and feature key."""
    unchanged_prob: float = 0.0
    """Probability that the value is unchanged from the session's previous row."""
    scale: float = 1.0
    """Generated values are log-normal with this scale (counts, durations, prices...)."""
    kind: DenseKind = DenseKind.REQUEST
    """``request``, ``candidate`` or ``position`` (see :class:`DenseKind`)."""

    def __post_init__(self) -> None:
        try:
            self.kind = DenseKind(self.kind)
        except ValueError as exc:
            choices = ", ".join(k.value for k in DenseKind)
            raise ConfigError(
                f"dense feature {self.name!r}: kind must be one of {choices}, got {self.kind!r}"
            ) from exc
        if not 0.0 <= self.unchanged_prob <= 1.0:
            raise ConfigError(
                f"dense feature {self.name!r}: unchanged_prob must be in [0, 1], got {self.unchanged_prob}"
            )


@dataclass(kw_only=True, slots=True)
class SessionModel:
    """How the synthetic generator lays sessions out in time (ignored by everything else)."""

    num_sessions: int = 1000
    """Number of user sessions to generate."""
    mean_samples: float = 8.0
    """S: mean samples (rows) per session; the distribution is heavy-tailed. In an impression
    log a session holds ``mean_samples / candidates_per_request`` requests on average."""
    tail_shape: float = 1.8
    """Pareto shape of requests per session (smaller: heavier tail; must be > 1)."""
    max_samples: int = 2000
    """Cap on samples of one session (impression logs: on its requests x max_candidates)."""
    candidates_per_request: float = 1.0
    """Impression logs: mean candidate rows per request. One request scores several candidate
    items; its rows share ``request_id``, ``ts`` and every request-level feature (static and
    history sparse features, ``request`` dense features) and differ in the candidate-level
    ones (``item`` sparse features, ``candidate`` and ``position`` dense features). 1: one
    row per request."""
    max_candidates: int = 1
    """Impression logs: the longest candidate list (most requests show a full list)."""
    repeat_list_prob: float = 0.0
    """Impression logs: probability that a request shows the same candidate list as the
    session's previous request (same items in the same order, same candidate-level values:
    a second click-out from one result page, a reload); the first request of a session always
    shows a fresh list."""
    servers: int = 8
    """Inference servers that log requests; their buffers interleave sessions in time."""
    start: str = "2026-11-01T00:00:00"
    """Start of the logged window (UTC, ISO 8601)."""
    duration_s: int = 3600
    """Length of the logged window; sessions start uniformly inside it."""
    mean_gap_s: float = 20.0
    """Mean time between two requests of one session."""
    label_rate: float = 0.1
    """Base probability of a positive label."""

    def __post_init__(self) -> None:
        if self.num_sessions < 1:
            raise ConfigError(f"sessions.num_sessions must be >= 1, got {self.num_sessions}")
        if self.mean_samples < 1:
            raise ConfigError(f"sessions.mean_samples must be >= 1, got {self.mean_samples}")
        if self.tail_shape <= 1.0:
            raise ConfigError(f"sessions.tail_shape must be > 1, got {self.tail_shape}")
        if self.duration_s < 1:
            raise ConfigError(f"sessions.duration_s must be >= 1, got {self.duration_s}")
        if not 0.0 < self.label_rate < 1.0:
            raise ConfigError(f"sessions.label_rate must be in (0, 1), got {self.label_rate}")
        if self.max_candidates < 1:
            raise ConfigError(f"sessions.max_candidates must be >= 1, got {self.max_candidates}")
        if not 1.0 <= self.candidates_per_request <= self.max_candidates:
            raise ConfigError(
                f"sessions.candidates_per_request must be in [1, max_candidates = "
                f"{self.max_candidates}], got {self.candidates_per_request}"
            )
        if not 0.0 <= self.repeat_list_prob <= 1.0:
            raise ConfigError(
                f"sessions.repeat_list_prob must be in [0, 1], got {self.repeat_list_prob}"
            )
        if self.mean_samples < self.candidates_per_request:
            raise ConfigError(
                f"sessions.mean_samples ({self.mean_samples}) must be >= "
                f"candidates_per_request ({self.candidates_per_request}): at least one "
                "request per session"
            )


@dataclass(kw_only=True, slots=True)
class Catalogue:
    """The feature catalogue: labels, dense and sparse features (and generator statistics)."""

    name: str
    """Profile name, for reports."""
    labels: list[str] = field(default_factory=lambda: ["label"])
    """Label columns (float32)."""
    dense: list[DenseFeature] = field(default_factory=list)
    """Dense features, in column order."""
    sparse: list[SparseFeature] = field(default_factory=list)
    """Sparse features, in column order."""
    sessions: SessionModel = field(default_factory=SessionModel)
    """Generator session model."""

    def __post_init__(self) -> None:
        names = [*RESERVED_COLUMNS, *self.labels, *self.dense_names, *self.sparse_names]
        seen: set[str] = set()
        for name in names:
            if not name or not name.replace("_", "").replace("-", "").isalnum():
                raise ConfigError(f"catalogue {self.name!r}: invalid column name {name!r}")
            if name in seen:
                raise ConfigError(f"catalogue {self.name!r}: column name {name!r} is used twice")
            seen.add(name)
        if not self.labels:
            raise ConfigError(f"catalogue {self.name!r}: at least one label is required")

    @property
    def dense_names(self) -> list[str]:
        return [f.name for f in self.dense]

    @property
    def sparse_names(self) -> list[str]:
        return [f.name for f in self.sparse]

    def sparse_feature(self, name: str) -> SparseFeature:
        for f in self.sparse:
            if f.name == name:
                return f
        raise SchemaError(f"catalogue {self.name!r} has no sparse feature {name!r}")

    def groups(self) -> dict[str, list[str]]:
        """Synchronised groups: group name -> its sparse features, in column order."""
        out: dict[str, list[str]] = {}
        for f in self.sparse:
            if f.group is not None:
                out.setdefault(f.group, []).append(f.name)
        return out

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of a sample row, with this catalogue in the schema metadata.

        Every field is nullable so that bad input can be represented and reported; the ETL
        rejects (or quarantines) rows with a null session_id, request_id or ts.
        """
        fields = [
            pa.field(SESSION_ID, pa.int64()),
            pa.field(REQUEST_ID, pa.int64()),
            pa.field(TS, pa.int64()),
            *(pa.field(name, pa.float32()) for name in self.labels),
            *(pa.field(name, pa.float32()) for name in self.dense_names),
            *(pa.field(name, pa.list_(pa.int64())) for name in self.sparse_names),
        ]
        return pa.schema(fields, metadata={CATALOGUE_METADATA_KEY: self.to_json().encode()})

    def table_schema(self) -> pa.Schema:
        """:meth:`arrow_schema` with nothing nullable, as the ETL writes tables (it refuses nulls,
        so Parquet stores no definition levels and readers decode faster)."""
        return strict_schema(self.arrow_schema())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> Catalogue:
        try:
            return cls(
                name=str(data.get("name", Path(source).stem)),
                labels=list(data.get("labels", ["label"])),
                dense=[DenseFeature(**d) for d in data.get("dense", [])],
                sparse=[SparseFeature(**s) for s in data.get("sparse", [])],
                sessions=SessionModel(**data.get("sessions", {})),
            )
        except TypeError as exc:  # unknown or missing keys in a table
            raise ConfigError(f"{source}: {exc}") from exc
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from exc


def load_catalogue(name_or_path: str | Path) -> Catalogue:
    """Load a catalogue from a TOML file, or a built-in profile by name (``PROFILE_NAMES``)."""
    text: str
    source = str(name_or_path)
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ConfigError(f"catalogue file {path} does not exist")
        text = path.read_text()
    elif source in PROFILE_NAMES:
        text = resources.files("recd.profiles").joinpath(f"{source}.toml").read_text()
    else:
        raise ConfigError(
            f"unknown catalogue {source!r}: give a TOML file or one of {', '.join(PROFILE_NAMES)}"
        )
    return Catalogue.from_dict(_expand_repeats(parse_toml(text, source)), source=source)


def _expand_repeats(data: dict[str, Any]) -> dict[str, Any]:
    """Expand ``repeat = N`` entries (``name`` gets a ``_i`` suffix) so profiles stay short."""
    out = dict(data)
    for section in ("dense", "sparse"):
        expanded: list[dict[str, Any]] = []
        for entry in data.get(section, []):
            entry = dict(entry)
            repeat = int(entry.pop("repeat", 1))
            if repeat == 1:
                expanded.append(entry)
                continue
            for i in range(repeat):
                copy = dict(entry)
                copy["name"] = f"{entry['name']}_{i}"
                expanded.append(copy)
        out[section] = expanded
    return out


def strict_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with no nullable field and no nullable list item (metadata kept)."""
    return pa.schema(
        [pa.field(f.name, strict_type(f.type), nullable=False) for f in schema],
        metadata=schema.metadata,
    )


def strict_type(typ: pa.DataType) -> pa.DataType:
    """``typ`` with its list items not nullable, as the ETL writes it (:func:`strict_schema`)."""
    if pa.types.is_list(typ):
        return pa.list_(pa.field("item", strict_type(typ.value_type), nullable=False))
    return typ


def nullable_type(typ: pa.DataType) -> pa.DataType:
    """``typ`` with its list items nullable: ``list<item: int64 not null>`` (how a table of
    :meth:`Catalogue.table_schema` reads back) -> ``list<item: int64>`` (the catalogue's form).
    Other types unchanged."""
    if pa.types.is_list(typ):
        return pa.list_(nullable_type(typ.value_type))
    if pa.types.is_large_list(typ):
        return pa.large_list(nullable_type(typ.value_type))
    return typ


def as_table_schema(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` (the catalogue's nullable types, same column order) viewed as ``schema``
    (:meth:`Catalogue.table_schema`) without a copy; ArrowInvalid if a column holds a null."""
    columns = [
        pa.chunked_array([chunk.view(f.type) for chunk in column.chunks], type=f.type)
        for column, f in zip(rows.columns, schema, strict=True)
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def catalogue_from_schema(schema: pa.Schema, *, source: str = "<schema>") -> Catalogue:
    """Recover the catalogue a table was written with (from its schema metadata)."""
    meta = schema.metadata or {}
    raw = meta.get(CATALOGUE_METADATA_KEY)
    if raw is None:
        raise SchemaError(
            f"{source}: no recd catalogue in the schema metadata (not written by recd?)"
        )
    return Catalogue.from_dict(json.loads(raw), source=source)


def check_schema(actual: pa.Schema, catalogue: Catalogue, *, source: str) -> None:
    """Raise SchemaError naming the first missing or mistyped column of ``actual``."""
    expected = catalogue.arrow_schema()
    for fld in expected:
        idx = actual.get_field_index(fld.name)
        if idx < 0:
            raise SchemaError(f"{source}: missing column {fld.name!r} (expected {fld.type})")
        got = actual.field(idx).type
        if not nullable_type(got).equals(fld.type):
            raise SchemaError(f"{source}: column {fld.name!r} has type {got}, expected {fld.type}")
