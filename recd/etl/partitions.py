"""Hourly partitions: log timestamp (ms, UTC) -> ``ds``/``hour``, run windows, Hive paths.

A table is laid out Hive-style, one directory per hour of log time::

    TABLE/ds=2026-11-01/hour=00/part-00000.parquet
    TABLE/ds=2026-11-01/hour=01/part-00000.parquet

Everything here works on whole hours: a partition is identified by its ``hour_id`` (hours since
the Unix epoch), so mapping millions of timestamps to partitions is one integer division.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

from recd.errors import ConfigError

MS_PER_HOUR = 3_600_000
# Valid log timestamps: [1970-01-01, 2100-01-01) UTC. Anything else is a corrupt clock or a
# value in the wrong unit (seconds, microseconds) and is rejected as a bad row.
TS_MIN_MS = 0
TS_MAX_MS = int(datetime(2100, 1, 1, tzinfo=UTC).timestamp() * 1000)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DS_HOUR = re.compile(r"^(?:ds=)?(\d{4}-\d{2}-\d{2})/(?:hour=)?(\d{1,2})$")
_PARTITION_DIR = re.compile(r"^ds=(\d{4}-\d{2}-\d{2})$")
_HOUR_DIR = re.compile(r"^hour=(\d{2})$")


@dataclass(frozen=True, slots=True, order=True)
class Partition:
    """One hourly partition of a table: ``ds=<ds>/hour=<hour>``."""

    ds: str
    """Day, ``YYYY-MM-DD`` (UTC)."""
    hour: int
    """Hour of the day, 0..23 (UTC)."""

    def __post_init__(self) -> None:
        try:
            date.fromisoformat(self.ds)
        except ValueError as exc:
            raise ConfigError(f"partition ds must be YYYY-MM-DD, got {self.ds!r}") from exc
        if not 0 <= self.hour <= 23:
            raise ConfigError(f"partition hour must be in 0..23, got {self.hour}")

    @classmethod
    def from_hour_id(cls, hour_id: int) -> Partition:
        """The partition of hour ``hour_id`` (hours since the Unix epoch)."""
        moment = _EPOCH + timedelta(hours=int(hour_id))
        return cls(ds=moment.date().isoformat(), hour=moment.hour)

    @property
    def hour_id(self) -> int:
        """Hours since the Unix epoch of this partition's first millisecond."""
        return self.start_ms // MS_PER_HOUR

    @property
    def start_ms(self) -> int:
        moment = datetime.fromisoformat(self.ds).replace(tzinfo=UTC) + timedelta(hours=self.hour)
        return int(moment.timestamp()) * 1000

    @property
    def relpath(self) -> str:
        """``ds=YYYY-MM-DD/hour=HH``: the partition's path relative to the table root."""
        return f"ds={self.ds}/hour={self.hour:02d}"

    def path(self, root: Path) -> Path:
        return root / f"ds={self.ds}" / f"hour={self.hour:02d}"

    def __str__(self) -> str:
        return self.relpath


def parse_partition_dir(ds_name: str, hour_name: str) -> Partition | None:
    """The partition a ``ds=...``/``hour=..`` directory pair names, or None if it names none."""
    ds_match = _PARTITION_DIR.match(ds_name)
    hour_match = _HOUR_DIR.match(hour_name)
    if ds_match is None or hour_match is None:
        return None
    try:
        return Partition(ds=ds_match.group(1), hour=int(hour_match.group(1)))
    except ConfigError:
        return None


def iter_partition_dirs(root: Path) -> list[tuple[Partition, Path]]:
    """Every visible ``ds=*/hour=*`` directory under ``root``, sorted by partition."""
    found: list[tuple[Partition, Path]] = []
    if not root.is_dir():
        return found
    for ds_dir in root.iterdir():
        if not ds_dir.is_dir() or _PARTITION_DIR.match(ds_dir.name) is None:
            continue
        for hour_dir in ds_dir.iterdir():
            partition = parse_partition_dir(ds_dir.name, hour_dir.name)
            if partition is not None and hour_dir.is_dir():
                found.append((partition, hour_dir))
    return sorted(found)


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
    values = ts.to_numpy() if isinstance(ts, pa.ChunkedArray) else ts.to_numpy(zero_copy_only=False)
    return np.floor_divide(values.astype(np.int64, copy=False), MS_PER_HOUR)


def window_mask(ts: np.ndarray, *, start_ms: int | None, end_ms: int | None) -> np.ndarray:
    """Boolean mask of the timestamps inside ``[start_ms, end_ms)`` (None: unbounded)."""
    mask = np.ones(ts.shape, dtype=bool)
    if start_ms is not None:
        mask &= ts >= start_ms
    if end_ms is not None:
        mask &= ts < end_ms
    return mask
