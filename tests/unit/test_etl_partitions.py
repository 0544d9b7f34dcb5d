"""Hourly partitions: ts -> ds/hour, window bounds, partition directory names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from recd.errors import ConfigError
from recd.table.partitions import (
    MS_PER_HOUR,
    TS_MAX_MS,
    Partition,
    format_time_ms,
    hour_ids,
    iter_partition_dirs,
    parse_partition_dir,
    parse_time_ms,
    window_mask,
)

NOV1 = 1_793_491_200_000  # 2026-11-01T00:00:00Z


def test_parse_time_accepts_iso_dates_and_partitions() -> None:
    assert parse_time_ms("2026-11-01T00:00:00", field="start") == NOV1
    assert parse_time_ms("2026-11-01T00:00:00Z", field="start") == NOV1
    assert parse_time_ms("2026-11-01T01:00:00+01:00", field="start") == NOV1
    assert parse_time_ms("2026-11-01", field="start") == NOV1
    assert parse_time_ms("2026-11-01/03", field="start") == NOV1 + 3 * MS_PER_HOUR
    assert parse_time_ms("ds=2026-11-01/hour=03", field="start") == NOV1 + 3 * MS_PER_HOUR
    with pytest.raises(ConfigError, match="end"):
        parse_time_ms("2026-11-01/24", field="end")
    with pytest.raises(ConfigError, match="start"):
        parse_time_ms("soon", field="start")


def test_hour_ids_and_partitions_at_boundaries() -> None:
    ts = pa.array(
        [NOV1 - 1, NOV1, NOV1 + MS_PER_HOUR - 1, NOV1 + MS_PER_HOUR, NOV1 + 24 * MS_PER_HOUR]
    )
    parts = [Partition.from_hour_id(int(h)) for h in hour_ids(ts)]
    assert [p.relpath for p in parts] == [
        "ds=2026-10-31/hour=23",
        "ds=2026-11-01/hour=00",
        "ds=2026-11-01/hour=00",
        "ds=2026-11-01/hour=01",
        "ds=2026-11-02/hour=00",
    ]
    assert all(Partition.from_hour_id(p.hour_id) == p for p in parts)
    assert Partition(ds="2026-11-01", hour=5).start_ms == NOV1 + 5 * MS_PER_HOUR
    assert format_time_ms(NOV1) == "2026-11-01T00:00:00Z"
    assert Partition.from_hour_id((TS_MAX_MS - 1) // MS_PER_HOUR).ds == "2099-12-31"


def test_partition_rejects_bad_values_and_parses_dirs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="hour"):
        Partition(ds="2026-11-01", hour=24)
    with pytest.raises(ConfigError, match="ds"):
        Partition(ds="2026-13-01", hour=0)
    assert parse_partition_dir("ds=2026-11-01", "hour=07") == Partition(ds="2026-11-01", hour=7)
    assert parse_partition_dir("ds=2026-11-01", "_trash-x--hour=07") is None
    assert parse_partition_dir("_tmp-x", "hour=07") is None
    for name in ("ds=2026-11-01/hour=01", "ds=2026-11-01/hour=00", "_tmp-r/ds=2026-11-01/hour=02"):
        (tmp_path / name).mkdir(parents=True)
    assert [p.relpath for p, _ in iter_partition_dirs(tmp_path)] == [
        "ds=2026-11-01/hour=00",
        "ds=2026-11-01/hour=01",
    ]


def test_window_mask_is_half_open() -> None:
    ts = np.array([0, 9, 10, 19, 20])
    assert window_mask(ts, start_ms=10, end_ms=20).tolist() == [False, False, True, True, False]
    assert window_mask(ts, start_ms=None, end_ms=None).all()
