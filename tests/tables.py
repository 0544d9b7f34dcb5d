"""Small real tables for tests: the real generate -> shard -> ETL path at toy size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recd.etl.config import EtlConfig
from recd.etl.local import run_etl
from recd.logs.generate import generate_logs
from recd.logs.shard import shard_logs
from recd.schema import Catalogue


def build_table(
    root: Path, catalogue: Catalogue, *, seed: int, num_sessions: int, **shard_options: Any
) -> Path:
    """``catalogue``'s logs (``num_sessions`` sessions) sharded by session into 2 shards and
    clustered into ``root/table`` with row groups of 256 rows; returns the table directory."""
    generate_logs(
        catalogue, root / "raw", seed=seed, num_sessions=num_sessions, show_progress=False
    )
    shard_logs(
        root / "raw",
        root / "shards",
        key="session",
        num_shards=2,
        show_progress=False,
        **shard_options,
    )
    run_etl(
        EtlConfig(
            shard_dir=root / "shards",
            table_dir=root / "table",
            row_group_rows=256,
            show_progress=False,
        )
    )
    return root / "table"
