"""Configuration and report of one clustering-ETL run (shared by the local and Spark engines)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec

from recd.config_types import OneOf, PositiveInt, check_fields
from recd.errors import ConfigError
from recd.schema import Catalogue
from recd.table.layout import LAYOUTS
from recd.table.partitions import MS_PER_HOUR, PARTITION_BY, format_time_ms, parse_time_ms

ENGINES = ("local", "spark")
TABLE_FORMATS = ("iceberg", "hive")
DICTIONARY_MODES = ("auto", "all", "none")
ON_BAD_ROWS = ("fail", "quarantine")
ZstdLevel = Annotated[int, msgspec.Meta(ge=1, le=22)]
"""A zstd level of the Parquet column chunks."""
DEFAULT_TARGET_FILE_BYTES = 256 << 20
DEFAULT_ROW_GROUP_ROWS = 8192
DEFAULT_ZSTD_LEVEL = 3


@dataclass(kw_only=True, slots=True)
class EtlConfig:
    """What to read, where to write and how: one ``recd etl`` run."""

    shard_dir: Path
    """Log-bus shard directory (``_catalogue.json`` + ``shard-*.zst``, see recd.logs.rawlog)."""
    table_dir: Path
    """Table root; partitions land in ``TABLE/ds=YYYY-MM-DD/hour=HH/`` (``partition_by = "day"``:
    ``TABLE/ds=YYYY-MM-DD/``)."""
    start: str | None = None
    """Window start (inclusive, UTC): ISO 8601 or ``YYYY-MM-DD/HH``; must be on an hour (a
    day-partitioned table: at midnight). None: from the first row."""
    end: str | None = None
    """Window end (exclusive, UTC), same formats as ``start``. None: through the last row."""
    row_group_rows: PositiveInt = DEFAULT_ROW_GROUP_ROWS
    """Rows per Parquet row group (every row group of a file has exactly this many, except the
    file's last one and ones written early because the write buffers were full)."""
    target_file_bytes: PositiveInt = DEFAULT_TARGET_FILE_BYTES
    """Roll a partition's file once it holds this many bytes (closed at the next session
    boundary; a file may exceed it by about a row group and a session). The local engine keeps
    one open file per partition across all shards; the Spark engine sizes its default number of
    output partitions from it."""
    zstd_level: ZstdLevel = DEFAULT_ZSTD_LEVEL
    """zstd compression level of the Parquet column chunks."""
    baseline: bool = False
    """Write rows in arrival order (the unclustered baseline) instead of clustered by session;
    refused into an Iceberg table that records the clustered order (docs/tables.md)."""
    memory_budget_bytes: PositiveInt | None = None
    """Bound on the rows held in memory at once (local engine): a quarter goes to the partition
    writers' row buffers, the rest to a pass over a shard; a shard whose decoded size exceeds
    that is processed in several passes, each keeping the sessions of one hash bucket. None:
    one pass per shard (memory bounded by the largest shard, or two with ``workers`` >= 2:
    one read ahead) and 256 MiB of write buffers."""
    dictionary: Annotated[str, OneOf(DICTIONARY_MODES)] = "auto"
    """Parquet dictionary encoding: ``auto`` (per column, where it pays on measured
    statistics), ``all`` or ``none``; see recd.etl.encodings."""
    on_bad_rows: Annotated[str, OneOf(ON_BAD_ROWS)] = "fail"
    """A row with a null key, bad ts, null feature or null id: ``fail`` raises on the first,
    naming file, block, row and field; ``quarantine`` writes bad rows to
    ``TABLE/_quarantine/<run>/`` with the reason, counts them and goes on."""
    engine: Annotated[str, OneOf(ENGINES)] = "local"
    """``local`` (embedded, one process) or ``spark`` (needs the ``recd[spark]`` extra)."""
    show_progress: bool = True
    """Show a progress bar per shard (also silenced by ``RECD_PROGRESS=0``)."""
    spark_master: str | None = None
    """Spark master URL for ``engine="spark"`` (None: ``$SPARK_MASTER``, spark-submit's, or
    ``local[*]``); shards and table must be on a filesystem every executor sees."""
    layout: Annotated[str, OneOf(LAYOUTS)] = "plain"
    """``plain``: every row's lists stored in full. ``dedup``: each session's repeated and
    sliding sparse values stored once (``recd.table.layout``; docs/layout.md); recd's readers build
    IKJTs from it without hashing."""
    dedup_features: list[str] | None = None
    """Sparse features the ``dedup`` layout encodes. None: those storing at most
    ``recd.table.layout.MAX_STORED_FRACTION`` of their ids on the ETL's sample whose encoded columns
    take at most ``MAX_SIZE_RATIO`` times the plain column's bytes there (features changing
    on the same rows decided together; see docs/layout.md)."""
    table_format: Annotated[str, OneOf(TABLE_FORMATS)] | None = None
    """``iceberg`` (one Iceberg snapshot per run: the run becomes visible all at once or not
    at all; recd.table.iceberg) or ``hive`` (each hour's directory commits on its own). None: the
    table's own format, ``iceberg`` for a new table. See docs/tables.md."""
    catalog: str | None = None
    """Iceberg: the pyiceberg catalog to register a new table in (a name configured in
    ``~/.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__<NAME>__*``). None: an embedded SQLite catalog
    in ``TABLE/_iceberg/``. An existing table keeps the catalog it was created in."""
    table_identifier: str | None = None
    """Iceberg: ``namespace.name`` of a new table in its catalog (default ``recd.table``)."""
    partition_by: Annotated[str, OneOf(tuple(PARTITION_BY))] | None = None
    """Partition granularity: ``hour`` (``ds=D/hour=HH``) or ``day`` (``ds=D``; for sparse logs,
    whose hours would hold a few dozen rows each; needs the iceberg format). None: the table's
    own, ``hour`` for a new table."""
    workers: PositiveInt | None = None
    """Threads of the local engine (pyarrow's kernels release the GIL). 1: serial. 2 or more:
    a reader thread prepares (decodes, validates, sorts) the next shard-pass while this thread
    writes the current one; two passes in memory, so only without a budget (peak: about two
    shards) or when every shard fits in half of it; else the extra threads decode blocks
    ahead. The files' last row groups are written by ``workers`` threads. The output is
    byte-identical for every value. None: ``min(2, os.cpu_count())``. Spark ignores it."""

    def __post_init__(self) -> None:
        self.shard_dir = Path(self.shard_dir)
        self.table_dir = Path(self.table_dir)
        check_fields(self, wording="must")
        if self.table_format == "hive" and (self.catalog or self.table_identifier):
            raise ConfigError("catalog and table_identifier are Iceberg options")
        if self.dedup_features is not None and self.layout != "dedup":
            raise ConfigError("dedup_features is only used with layout 'dedup'")
        start_ms, end_ms = self.start_ms, self.end_ms
        if start_ms is not None and end_ms is not None and end_ms <= start_ms:
            raise ConfigError(f"end ({self.end}) must be after start ({self.start})")
        if self.shard_dir.resolve() == self.table_dir.resolve():
            raise ConfigError(f"table_dir must differ from shard_dir ({self.shard_dir})")

    @property
    def start_ms(self) -> int | None:
        return None if self.start is None else _hour_aligned_ms(self.start, "start")

    @property
    def end_ms(self) -> int | None:
        return None if self.end is None else _hour_aligned_ms(self.end, "end")

    def dedup_candidates(self, catalogue: Catalogue) -> list[str]:
        """The sparse features the layout may encode, in column order ([] for ``plain``);
        ConfigError naming a listed feature the catalogue does not have."""
        if self.layout != "dedup":
            return []
        if self.dedup_features is None:
            return catalogue.sparse_names
        unknown = [f for f in self.dedup_features if f not in catalogue.sparse_names]
        if unknown:
            raise ConfigError(
                f"dedup_features: {unknown[0]!r} is not a sparse feature of the catalogue "
                f"({', '.join(catalogue.sparse_names)})"
            )
        return [f for f in catalogue.sparse_names if f in self.dedup_features]

    @property
    def worker_threads(self) -> int:
        """``workers``, with None resolved to ``min(2, os.cpu_count())``."""
        if self.workers is not None:
            return self.workers
        return max(1, min(2, os.cpu_count() or 1))


@dataclass(kw_only=True, slots=True)
class EtlReport:
    """What one ETL run read, wrote and dropped (nothing is dropped silently)."""

    run_id: str
    """Unique id of the run (names the staging and quarantine directories)."""
    engine: str
    """Engine that ran: ``local`` or ``spark``."""
    clustered: bool
    """True: rows clustered by session, ts-sorted; False: baseline arrival order."""
    layout: str = "plain"
    """The table layout written (``plain`` or ``dedup``)."""
    encoded_features: list[str] = field(default_factory=list)
    """Sparse features stored in the dedup layout's encoded form."""
    encoded_groups: list[list[str]] = field(default_factory=list)
    """Of ``encoded_features``, those stored together (they change on the same rows)."""
    stored_id_fraction: dict[str, float] = field(default_factory=dict)
    """Dedup layout: stored ids / ids of each candidate feature, measured on the encoding
    sample (the default encodes those at or below ``recd.table.layout.MAX_STORED_FRACTION``)."""
    rows_read: int = 0
    """Rows decoded from the shards (every row of every readable block)."""
    rows_outside_window: int = 0
    """Valid rows whose ts lies outside [start, end): not part of this run."""
    rows_in: int = 0
    """Rows this run is responsible for: rows_read - rows_outside_window."""
    rows_out: int = 0
    """Rows written to committed partitions."""
    rows_quarantined: int = 0
    """Bad rows (and rows of schema-mismatched blocks) written to the quarantine."""
    blocks_quarantined: int = 0
    """Shard blocks whose schema did not match the catalogue (quarantined whole)."""
    frames_quarantined: int = 0
    """Corrupt or truncated zstd frames (their rows cannot be counted; bytes are kept)."""
    rows_quarantined_by_field: dict[str, int] = field(default_factory=dict)
    """Bad rows per field named in their reason (``ts``, ``user_history``, ...); rows of
    quarantined blocks are not in it."""
    quarantine_dir: str | None = None
    """Where quarantined rows, blocks and frames went (None: nothing quarantined)."""
    partitions: int = 0
    """Partitions committed."""
    files: int = 0
    """Parquet files committed."""
    bytes_out: int = 0
    """Bytes of the committed Parquet files."""
    table_format: str = "iceberg"
    """The table's format: ``iceberg`` or ``hive``."""
    partition_by: str = "hour"
    """The table's partition granularity: ``hour`` or ``day``."""
    snapshot_id: int | None = None
    """The Iceberg snapshot this run committed (None for a Hive-layout table)."""
    row_groups_flushed_early: int = 0
    """Row groups written with fewer than ``row_group_rows`` rows before their file's end
    because the write buffers reached their memory cap (local engine)."""
    seconds: float = 0.0
    """Wall time of the run."""
    rows_per_s: float = 0.0
    """rows_in / seconds."""
    peak_rss_bytes: int = 0
    """Peak resident memory of the process that ran the ETL."""
    workers: int = 1
    """Threads the local engine ran with (``EtlConfig.workers`` resolved)."""
    passes_per_shard: dict[str, int] = field(default_factory=dict)
    """Shard file name -> passes it took (> 1 when the memory budget split it)."""
    rows_per_partition: dict[str, int] = field(default_factory=dict)
    """``ds=.../hour=..`` (or ``ds=...``) -> rows committed there."""
    encodings: dict[str, str] = field(default_factory=dict)
    """Column -> Parquet encoding chosen (``dictionary``, ``plain``, ``delta``, ...)."""
    window: dict[str, str | None] = field(default_factory=dict)
    """The window read: ``{"start": ISO | None, "end": ISO | None}``."""

    def check_row_accounting(self) -> None:
        """Internal invariant: every row read is written, quarantined or outside the window."""
        assert self.rows_in == self.rows_read - self.rows_outside_window, self
        assert self.rows_in == self.rows_out + self.rows_quarantined, (
            f"rows_in {self.rows_in} != rows_out {self.rows_out} + rows_quarantined "
            f"{self.rows_quarantined}"
        )
        assert self.rows_out == sum(self.rows_per_partition.values()), self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")

    def summary(self) -> str:
        """Human-readable lines for the CLI."""
        lines = [
            f"rows in {self.rows_in:,}  out {self.rows_out:,}  quarantined {self.rows_quarantined:,}"
            + (
                f"  outside window {self.rows_outside_window:,}" if self.rows_outside_window else ""
            ),
            f"partitions {self.partitions}  files {self.files}  bytes {self.bytes_out:,}"
            + (f"  ({self.bytes_out / self.rows_out:.1f} B/row)" if self.rows_out else ""),
            f"{self.seconds:.2f} s  {self.rows_per_s:,.0f} rows/s  "
            f"peak RSS {self.peak_rss_bytes / 2**20:.0f} MiB  "
            f"({'clustered by session' if self.clustered else 'baseline arrival order'}"
            f"{', dedup layout' if self.layout == 'dedup' else ''})",
            f"committed: {self.table_format} table, partitioned by {self.partition_by}"
            + (f", snapshot {self.snapshot_id}" if self.snapshot_id is not None else ""),
        ]
        if self.blocks_quarantined or self.frames_quarantined:
            lines.append(
                f"quarantined blocks {self.blocks_quarantined}  frames {self.frames_quarantined}"
            )
        if self.rows_quarantined_by_field:
            by_field = sorted(self.rows_quarantined_by_field.items(), key=lambda kv: -kv[1])
            lines.append(
                "quarantined rows by field: " + ", ".join(f"{k} {v:,}" for k, v in by_field)
            )
        if self.quarantine_dir:
            lines.append(f"quarantine: {self.quarantine_dir}")
        return "\n".join(lines)


def window_of(config: EtlConfig) -> dict[str, str | None]:
    start_ms, end_ms = config.start_ms, config.end_ms
    return {
        "start": None if start_ms is None else format_time_ms(start_ms),
        "end": None if end_ms is None else format_time_ms(end_ms),
    }


def _hour_aligned_ms(text: str, name: str) -> int:
    ms = parse_time_ms(text, field=name)
    if ms % MS_PER_HOUR:
        raise ConfigError(
            f"{name} must be on a whole hour (partitions are hourly; a partial hour would "
            f"replace a partition with part of its rows), got {text!r}"
        )
    return ms
