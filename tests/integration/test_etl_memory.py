"""Peak memory of a real ETL process follows the memory budget, not the table size.

A child process runs the ETL on a table ~8x the budget; it reports its peak RSS (``VmHWM``,
which starts afresh at exec, unlike ``ru_maxrss`` which includes the parent's RSS at fork)
after imports (the baseline: those of the Iceberg commit included, which the ETL makes
lazily) and at the end. The bounded run must stay under
baseline + FIXED_OVERHEAD + BUDGET_MULTIPLE x budget; a control run of the same data with no
budget (one pass per shard) must use clearly more. The partition writers' row buffers are
inside the budget (a quarter of it; passes get the rest), so the bound is the same as when
every shard-pass wrote its own files; the open writers themselves (~0.5 MB each, one per
partition) are part of the fixed overhead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

try:  # tests/ is a package (tests/__init__.py) or pytest put tests/ itself on sys.path
    from tests.unit.etl_shards import all_rows, make_rows, write_shards
except ModuleNotFoundError:
    from unit.etl_shards import all_rows, make_rows, write_shards  # type: ignore[no-redef]

from recd.etl.validate import frame_content_sizes
from recd.schema import REQUEST_ID, Catalogue, DenseFeature, SparseFeature, SparseKind

MIB = 1 << 20
BUDGET_BYTES = 8 * MIB
# Not budget-proportional: Parquet writer and zstd contexts, the encoding trial, allocator
# (mimalloc) slack, numpy/pyarrow scratch. Measured ~50-60 MiB on the default pool.
FIXED_OVERHEAD_BYTES = 64 * MIB
BUDGET_MULTIPLE = 4

CHILD = """
import json, sys
from pathlib import Path
import pyarrow.parquet
import pyiceberg.catalog.sql, pyiceberg.io.pyarrow, pyiceberg.table  # the commit's imports
from recd.etl.config import EtlConfig
from recd.etl.local import peak_rss_bytes, run_etl
baseline = peak_rss_bytes()
budget = None if sys.argv[3] == "none" else int(sys.argv[3])
report = run_etl(EtlConfig(shard_dir=Path(sys.argv[1]), table_dir=Path(sys.argv[2]),
                           memory_budget_bytes=budget, show_progress=False))
peak = peak_rss_bytes()
print(json.dumps({"baseline": baseline, "peak": peak, "passes": report.passes_per_shard,
                  "rows_out": report.rows_out}))
"""


@dataclass
class ChildRun:
    growth_bytes: int
    """Peak RSS at the end minus peak RSS after imports."""
    passes: dict[str, int]
    rows_out: int
    peak_bytes: int


def run_child(shard_dir: Path, table: Path, budget: int | None) -> ChildRun:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(shard_dir), str(table), str(budget or "none")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "RECD_PROGRESS": "0"},
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return ChildRun(
        growth_bytes=result["peak"] - result["baseline"],
        passes=result["passes"],
        rows_out=result["rows_out"],
        peak_bytes=result["peak"],
    )


@pytest.mark.slow
def test_peak_rss_is_bounded_by_the_budget_not_the_table(tmp_path: Path) -> None:
    catalogue = Catalogue(
        name="memory",
        dense=[DenseFeature(name="price")],
        sparse=[
            SparseFeature(
                name="history",
                kind=SparseKind.HISTORY,
                mean_length=64,
                unchanged_prob=0.8,
                cardinality=1 << 20,
            )
        ],
    )
    rows = make_rows(catalogue, num_sessions=13_000, mean_samples=10.0, seed=5)
    shards = tmp_path / "shards"
    paths = write_shards(shards, catalogue, rows, num_shards=2, block_rows=1024)
    decoded = [sum(frame_content_sizes(p)) for p in paths]
    assert sum(decoded) >= 8 * BUDGET_BYTES, "the table must be several times the budget"

    bounded = run_child(shards, tmp_path / "bounded", BUDGET_BYTES)
    control = run_child(shards, tmp_path / "control", None)
    assert bounded.rows_out == control.rows_out == rows.num_rows
    assert all_rows(tmp_path / "bounded").equals(rows.sort_by(REQUEST_ID))
    assert min(bounded.passes.values()) > 1 and max(control.passes.values()) == 1

    bounded_growth, control_growth = bounded.growth_bytes, control.growth_bytes
    limit = FIXED_OVERHEAD_BYTES + BUDGET_MULTIPLE * BUDGET_BYTES
    assert bounded_growth <= limit, (
        f"bounded run grew {bounded_growth / MIB:.0f} MiB > {limit / MIB:.0f}"
    )
    assert control_growth >= max(decoded), "control must hold a whole shard"
    print(
        f"bounded: +{bounded_growth / MIB:.0f} MiB (peak {bounded.peak_bytes / MIB:.0f} MiB), control: +{control_growth / MIB:.0f} MiB"
    )
    assert control_growth > 1.5 * bounded_growth, (
        f"control {control_growth / MIB:.0f} MiB vs bounded {bounded_growth / MIB:.0f} MiB"
    )
