"""What both ETL engines read and how they order rows: the shard files of a shard directory
and the output order (by hour, then clustered by session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recd.errors import ConfigError, SchemaError
from recd.logs.rawlog import SHARD_GLOB
from recd.schema import REQUEST_ID, SESSION_ID, TS

CLUSTER_KEYS = (SESSION_ID, TS, REQUEST_ID)


def list_shards(shard_dir: Path) -> list[Path]:
    """The shard files of a shard directory, in shard order."""
    if not shard_dir.is_dir():
        raise ConfigError(f"shard_dir {shard_dir} is not a directory")
    shards = sorted(shard_dir.glob(SHARD_GLOB))
    if not shards:
        raise SchemaError(f"{shard_dir}: no {SHARD_GLOB} files: not a recd shard directory")
    return shards


def output_order(table: pa.Table, hours: np.ndarray, *, clustered: bool) -> pa.Array:
    """Row order of the output: by hour, then (session_id, ts, request_id) if clustered.

    Baseline keeps arrival order inside each hour (pyarrow's sort is stable).
    """
    keys: dict[str, Any] = {"_hour": pa.array(hours)}
    if clustered:
        keys.update({name: table.column(name) for name in CLUSTER_KEYS})
    key_table = pa.table(keys)
    return pc.sort_indices(key_table, sort_keys=[(name, "ascending") for name in keys])
