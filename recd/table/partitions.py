"""Partitions: log timestamp (ms, UTC) -> ``ds``/``hour`` (or ``ds``), run windows, paths.

A table is laid out Hive-style, one directory per hour of log time (``partition_by = "hour"``,
the default)::

    TABLE/ds=2026-11-01/hour=00/part-00000.parquet
    TABLE/ds=2026-11-01/hour=01/part-00000.parquet

or one per day (``partition_by = "day"``, for logs too sparse to fill hours: seven months of a
100k-event log are ~5,000 hours of ~20 rows but ~200 days)::

    TABLE/ds=2026-11-01/part-00000.parquet

A partition is identified by its unit id (hours or days since the Unix epoch: ``unit_id``), so
mapping millions of timestamps to partitions is one integer division.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

from recd.errors import ConfigError

MS_PER_HOUR = 3_600_000
MS_PER_DAY = 24 * MS_PER_HOUR
PARTITION_BY: dict[str, int] = {"hour": MS_PER_HOUR, "day": MS_PER_DAY}
"""Partition granularities and their length in ms."""
# Valid log timestamps: [1970-01-01, 2100-01-01) UTC. Anything else is a corrupt clock or a
# value in the wrong unit (seconds, microseconds) and is rejected as a bad row.
TS_MIN_MS = 0
TS_MAX_MS = int(datetime(2100, 1, 1, tzinfo=UTC).timestamp() * 1000)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DS_HOUR = re.compile(r"^(?:ds=)?(\d{4}-\d{2}-\d{2})/(?:hour=)?(\d{1,2})$")
_PARTITION_DIR = re.compile(r"^ds=(\d{4}-\d{2}-\d{2})$")
_HOUR_DIR = re.compile(r"^hour=(\d{2})$")


@functools.total_ordering
@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of a table: an hour, ``ds=<ds>/hour=<hour>``, or a day, ``ds=<ds>``.

    Partitions sort by start time (an hour sorts after the day holding it; one table never
    mixes the two).
    """

    ds: str
    """Day, ``YYYY-MM-DD`` (UTC)."""
    hour: int | None = None
    """Hour of the day, 0..23 (UTC); None for a day partition."""

    def __post_init__(self) -> None:
        try:
            date.fromisoformat(self.ds)
        except ValueError as exc:
            raise ConfigError(f"partition ds must be YYYY-MM-DD, got {self.ds!r}") from exc
        if self.hour is not None and not 0 <= self.hour <= 23:
            raise ConfigError(f"partition hour must be in 0..23, got {self.hour}")

    @classmethod
    def from_hour_id(cls, hour_id: int) -> Partition:
        """The partition of hour ``hour_id`` (hours since the Unix epoch)."""
        moment = _EPOCH + timedelta(hours=int(hour_id))
        return cls(ds=moment.date().isoformat(), hour=moment.hour)

    @classmethod
    def from_unit_id(cls, unit_id: int, partition_by: str) -> Partition:
        """The partition of unit ``unit_id``: hours (``partition_by="hour"``) or days since the
        Unix epoch."""
        if partition_by == "hour":
            return cls.from_hour_id(unit_id)
        return cls(ds=(_EPOCH + timedelta(days=int(unit_id))).date().isoformat())

    @property
    def partition_by(self) -> str:
        """``hour`` or ``day``."""
        return "day" if self.hour is None else "hour"

    @property
    def unit_id(self) -> int:
        """Hours (days, for a day partition) since the Unix epoch of its first millisecond."""
        return self.start_ms // PARTITION_BY[self.partition_by]

    @property
    def hour_id(self) -> int:
        """Hours since the Unix epoch of this partition's first millisecond."""
        return self.start_ms // MS_PER_HOUR

    @property
    def start_ms(self) -> int:
        moment = datetime.fromisoformat(self.ds).replace(tzinfo=UTC)
        return (int(moment.timestamp()) + 3600 * (self.hour or 0)) * 1000

    @property
    def end_ms(self) -> int:
        """First millisecond after the partition."""
        return self.start_ms + PARTITION_BY[self.partition_by]

    @property
    def relpath(self) -> str:
        """``ds=YYYY-MM-DD/hour=HH`` (a day: ``ds=YYYY-MM-DD``): the partition's path relative
        to the table root."""
        if self.hour is None:
            return f"ds={self.ds}"
        return f"ds={self.ds}/hour={self.hour:02d}"

    def path(self, root: Path) -> Path:
        return root / self.relpath

    def __lt__(self, other: Partition) -> bool:
        return (self.ds, -1 if self.hour is None else self.hour) < (
            other.ds,
            -1 if other.hour is None else other.hour,
        )

    def __str__(self) -> str:
        return self.relpath


def parse_partition_dir(ds_name: str, hour_name: str | None = None) -> Partition | None:
    """The partition a ``ds=...``/``hour=..`` directory pair (or a ``ds=...`` directory alone:
    a day) names, or None if it names none."""
    ds_match = _PARTITION_DIR.match(ds_name)
    hour_match = None if hour_name is None else _HOUR_DIR.match(hour_name)
    if ds_match is None or (hour_name is not None and hour_match is None):
        return None
    try:
        hour = None if hour_match is None else int(hour_match.group(1))
        return Partition(ds=ds_match.group(1), hour=hour)
    except ConfigError:
        return None


def parse_partition_relpath(relpath: str) -> Partition | None:
    """The partition ``Partition.relpath`` gave ``relpath``, or None."""
    parts = relpath.split("/")
    if len(parts) == 1:
        return parse_partition_dir(parts[0])
    if len(parts) == 2:
        return parse_partition_dir(parts[0], parts[1])
    return None


def iter_partition_dirs(root: Path) -> list[tuple[Partition, Path]]:
    """Every visible partition directory under ``root``, sorted by partition: each
    ``ds=*/hour=*``, and each ``ds=*`` directory holding files but no ``hour=*`` directory
    (a day partition)."""
    found: list[tuple[Partition, Path]] = []
    if not root.is_dir():
        return found
    for ds_dir in root.iterdir():
        if not ds_dir.is_dir() or _PARTITION_DIR.match(ds_dir.name) is None:
            continue
        hours: list[tuple[Partition, Path]] = []
        holds_files = False
        for child in ds_dir.iterdir():
            if child.is_dir():
                partition = parse_partition_dir(ds_dir.name, child.name)
                if partition is not None:
                    hours.append((partition, child))
            elif not child.name.startswith((".", "_")) or child.name == "_SUCCESS":
                holds_files = True
        if hours:
            found.extend(hours)
        elif holds_files:
            day = parse_partition_dir(ds_dir.name)
            if day is not None:
                found.append((day, ds_dir))
    return sorted(found)


def check_partition_by(value: str, *, field: str) -> str:
    """``value`` if it is a granularity (``hour``/``day``), else ConfigError naming ``field``."""
    if value not in PARTITION_BY:
        raise ConfigError(f"{field} must be one of {', '.join(PARTITION_BY)}, got {value!r}")
    return value


def parse_time_ms(text: str, *, field: str) -> int:
    """Parse a window bound into ms since the epoch (UTC).

    Accepts ISO 8601 datetimes (``2026-11-01T03:00:00``, naive means UTC, offsets honoured),
    ISO dates (``2026-11-01`` = midnight) and partitions (``2026-11-01/03``,
    ``ds=2026-11-01/hour=03``). ``field`` names the option in the error message.
    """
    text = text.strip()
    match = _DS_HOUR.match(text)
    try:
        if match is not None:
            return Partition(ds=match.group(1), hour=int(match.group(2))).start_ms
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, ConfigError) as exc:
        raise ConfigError(
            f"{field}: cannot parse {text!r} as a time "
            "(expected ISO 8601 like 2026-11-01T03:00:00, a date, or ds/hour like 2026-11-01/03)"
        ) from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def format_time_ms(ts_ms: int) -> str:
    """ISO 8601 (UTC) of a timestamp in ms, for messages and reports."""
    return (_EPOCH + timedelta(milliseconds=int(ts_ms))).isoformat().replace("+00:00", "Z")


def hour_ids(ts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Hours since the epoch of every timestamp (int64 ms, no nulls, >= 0): shape (N,)."""
    return unit_ids(ts, "hour")


def unit_ids(ts: pa.Array | pa.ChunkedArray, partition_by: str) -> np.ndarray:
    """Partition unit (hours or days since the epoch) of every timestamp (int64 ms, no nulls,
    >= 0): shape (N,)."""
    values = ts.to_numpy() if isinstance(ts, pa.ChunkedArray) else ts.to_numpy(zero_copy_only=False)
    return np.floor_divide(values.astype(np.int64, copy=False), PARTITION_BY[partition_by])


def window_mask(ts: np.ndarray, *, start_ms: int | None, end_ms: int | None) -> np.ndarray:
    """Boolean mask of the timestamps inside ``[start_ms, end_ms)`` (None: unbounded)."""
    mask = np.ones(ts.shape, dtype=bool)
    if start_ms is not None:
        mask &= ts >= start_ms
    if end_ms is not None:
        mask &= ts < end_ms
    return mask
