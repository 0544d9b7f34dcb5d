"""What ``recd logs ingest`` warns about in the samples it wrote (a constant label, a log too
sparse in time for hourly partitions), or refuses (epoch seconds read as milliseconds)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from recd.errors import ConfigError
from recd.logs.ingest_mapping import IngestMapping
from recd.logs.ingest_read import Modes
from recd.logs.ingest_samples import SampleStats
from recd.logs.ingest_values import UNIT_NAMES

SPARSE_SAMPLES_PER_HOUR = 1000  # below this (over > 2 days), ingest suggests day partitions
EPOCH_1990_MS = 631_152_000_000  # 1990-01-01T00:00:00Z
EPOCH_2100_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z


def constant_label_warnings(stats: SampleStats, mapping: IngestMapping) -> list[str]:
    """One line per label with a single value on every sample (a typo in positive_events, or
    the wrong label column)."""
    out = []
    for name, value in stats.constant_labels().items():
        hint = (
            f"the label column {name!r} is right"
            if mapping.labels
            else f"--positive-events ({','.join(mapping.positives) or 'none'}) names event "
            "types of this log (see event_vocabulary in _ingest.json)"
        )
        out.append(
            f"label {name!r} is {value:g} on all {stats.samples:,} samples: a model cannot "
            f"learn from it; check that {hint}"
        )
    return out


def partition_hint(stats: SampleStats) -> list[str]:
    """One line when the samples are too sparse in time for hourly partitions (fewer than
    ``SPARSE_SAMPLES_PER_HOUR`` per hour over more than two days): day partitions then."""
    if stats.samples == 0 or stats.ts_min is None or stats.ts_max is None:
        return []
    hours = (stats.ts_max - stats.ts_min) // 3_600_000 + 1
    per_hour = stats.samples / hours
    if hours <= 48 or per_hour >= SPARSE_SAMPLES_PER_HOUR:
        return []
    return [
        f"{stats.samples:,} samples over {hours:,} hours ({per_hour:,.0f} per hour): hourly "
        "partitions would be small; partition the table by day (recd etl --partition-by day, "
        'or [etl] partition_by = "day" in a recd run pipeline)'
    ]


def early_dates(path: Path, mapping: IngestMapping, modes: Modes, stats: SampleStats) -> list[str]:
    """The check of a log whose every sample's timestamp falls before 1990.

    Read as epoch ms while every value, read as epoch seconds, falls in 1990..2099: epoch
    seconds given ``--ts-unit ms``, certainly (the dates would all be in January 1970):
    ``ConfigError``. Any other log dated before 1990 (relative times? ms read as ms that start
    near 0): one warning line, as its partitions will be dated 1970.
    """
    if stats.samples == 0 or stats.ts_min is None or stats.ts_max is None:
        return []
    if stats.ts_max >= EPOCH_1990_MS:
        return []
    span = f"{_date(stats.ts_min)} to {_date(stats.ts_max)}"
    if (
        modes.ts_unit == "ms"
        and stats.ts_min * 1000 >= EPOCH_1990_MS
        and stats.ts_max * 1000 < EPOCH_2100_MS
    ):
        raise ConfigError(
            f"{path}: field {mapping.ts!r}: every timestamp falls before 1990 read as epoch "
            f"milliseconds ({span}), and from 1990 on read as epoch seconds "
            f"({_date(stats.ts_min * 1000)} to {_date(stats.ts_max * 1000)}): these are epoch "
            "seconds; use --ts-unit s (or auto)"
        )
    unit = UNIT_NAMES.get(modes.ts_unit, "ISO 8601")
    return [
        f"every timestamp (column {mapping.ts!r}, read as {unit}) falls before 1990 ({span}): "
        "relative times rather than epoch times? the table's partitions will carry these dates"
    ]


def _date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
