"""Training on a plain Parquet table written by another tool (no recd catalogue, no commits):
the table's files as they are, features listed in the config, the catalogue measured from the
files, a held-out table of its own, `recd predict` on it; and the table rules around it
(partition directories, windows, hidden files, an ETL refused into such a directory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recd.errors import BadRowError, ConfigError, SchemaError
from recd.etl.config import EtlConfig
from recd.etl.local import run_etl
from recd.reader.config import ReaderConfig
from recd.reader.dataset import ResumableLoader
from recd.reader.plan import build_plan
from recd.reader.transform import build_preprocessing
from recd.schema import Catalogue, SparseKind
from recd.table.snapshot import committed_files, table_format
from tests.unit.etl_shards import make_rows, write_shards

ENV = {**os.environ, "RECD_PROGRESS": "0"}


def other_tool_rows(n: int, seed: int) -> pa.Table:
    """What pandas or DuckDB would write: int64 labels, float64 dense, a scalar item id,
    a list<int32> history, a user column recd has no name for."""
    rng = np.random.default_rng(seed)
    item = rng.integers(0, 500, n)
    hist = [rng.integers(0, 300, rng.integers(0, 9)).astype(np.int32) for _ in range(n)]
    clicked = ((item % 7 == 0) | (rng.random(n) < 0.1)).astype(np.int64)
    return pa.table(
        {
            "user": rng.integers(0, 50, n),
            "clicked": clicked,
            "price": rng.lognormal(0, 1, n),
            "item": item,
            "hist": pa.array(hist, type=pa.list_(pa.int32())),
        }
    )


def write_plain(root: Path, parts: list[pa.Table], **kwargs: object) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(parts):
        pq.write_table(part, root / f"part-{i}.parquet", row_group_size=1000, **kwargs)  # type: ignore[arg-type]
    (root / "_SUCCESS").touch()  # what Spark leaves at the root: not a partition marker
    (root / "_temporary").mkdir(exist_ok=True)  # an aborted writer's leftovers: hidden
    pq.write_table(parts[0].slice(0, 5), root / "_temporary" / "part-9.parquet")


def reader(table: Path, **kwargs: object) -> ReaderConfig:
    options: dict[str, object] = {
        "labels": ["clicked"],
        "dense": ["price"],
        "sparse": ["item", "hist"],
        "history_features": [["hist"]],
        "batch_size": 256,
        "streams": 1,  # table order: the checks compare with the files row by row
        **kwargs,
    }
    return ReaderConfig(table=str(table), **options)  # type: ignore[arg-type]


def test_train_and_predict_on_plain_parquet_tables(tmp_path: Path) -> None:
    train_rows = [other_tool_rows(3000, 1), other_tool_rows(2000, 2)]
    write_plain(tmp_path / "train", train_rows)
    write_plain(tmp_path / "held_out", [other_tool_rows(1000, 3)])
    (tmp_path / "train.toml").write_text(
        """
[reader]
table = "train"
labels = ["clicked"]
dense = ["price"]
sparse = ["item", "hist"]
history_features = [["hist"]]
batch_size = 128
num_epochs = 3

[eval]
table = "held_out"

[model]
kind = "rm1"
embedding_dim = 8

[train]
steps = 30
eval_every = 15
run_dir = "run"
"""
    )
    done = subprocess.run(
        [sys.executable, "-m", "recd", "train", "--config", "train.toml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Warning" not in done.stderr and "runs eagerly" not in done.stderr
    result = json.loads((tmp_path / "run" / "train.json").read_text())
    held_out = result["result"]["evals"][-1]
    assert held_out["step"] == 30 and held_out["rows"] == 1000
    scored = subprocess.run(
        [sys.executable, "-m", "recd", "predict", "--config", "train.toml", "--checkpoint",
         "run", "--eval-range", "--out", "preds.parquet", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr[-3000:]
    report = json.loads(scored.stdout)
    assert report["rows"] == 1000 and report["step"] == 30
    assert report["loss"] == pytest.approx(held_out["loss"], rel=1e-5)
    preds = pq.read_table(tmp_path / "preds.parquet")
    assert preds.column_names == ["clicked", "logit_clicked", "prediction_clicked"]
    assert preds.column("clicked").to_pylist() == [
        float(v) for v in other_tool_rows(1000, 3).column("clicked").to_pylist()
    ]


def test_plain_table_reads_every_row_with_a_measured_catalogue(tmp_path: Path) -> None:
    parts = [other_tool_rows(1500, 1), other_tool_rows(700, 2)]
    write_plain(tmp_path / "t", parts)
    assert table_format(tmp_path / "t") == "parquet"
    view = committed_files(tmp_path / "t")
    assert [p.name for p in view.files] == ["part-0.parquet", "part-1.parquet"]  # not _temporary
    plan = build_plan(reader(tmp_path / "t"))
    assert plan.catalogue_inferred and plan.catalogue is not None
    rows = pa.concat_tables(parts)
    item, hist = plan.catalogue.sparse
    assert item.kind is SparseKind.STATIC and item.cardinality == max(rows["item"].to_pylist()) + 1
    assert hist.kind is SparseKind.HISTORY
    assert hist.max_length == max(len(h) for h in rows["hist"].to_pylist())
    assert hist.cardinality == max(v for h in rows["hist"].to_pylist() for v in h) + 1
    batches = list(ResumableLoader(reader(tmp_path / "t")))
    assert sum(b.batch_size for b in batches) == rows.num_rows
    ids = np.concatenate([b.sparse.kjt["item"].values().numpy() for b in batches])
    assert ids.tolist() == rows["item"].to_pylist()  # a scalar column: one id per row
    lengths = np.concatenate([b.sparse.kjt["hist"].lengths().numpy() for b in batches])
    assert lengths.tolist() == [len(h) for h in rows["hist"].to_pylist()]
    labels = np.concatenate([b.labels.numpy()[:, 0] for b in batches])
    assert labels.tolist() == [float(v) for v in rows["clicked"].to_pylist()]
    # No statistics in the footers: the cardinality comes from a scan, the same.
    write_plain(tmp_path / "nostats", parts, write_statistics=False)
    scanned = build_plan(reader(tmp_path / "nostats")).catalogue
    assert scanned is not None and scanned.sparse == plan.catalogue.sparse


def test_plain_table_rules(tmp_path: Path, tiny_catalogue: Catalogue) -> None:
    rows = other_tool_rows(400, 1)
    # Hive-style partition directories from another tool: windows select them.
    for ds in ("2026-11-01", "2026-11-02"):
        (tmp_path / "hive" / f"ds={ds}").mkdir(parents=True)
        pq.write_table(rows, tmp_path / "hive" / f"ds={ds}" / "part-0.parquet")
    view = committed_files(tmp_path / "hive", start_ms=1_793_577_600_000)  # 2026-11-02
    assert view.table_format == "parquet"
    assert [str(p) for p, _ in view.partitions] == ["ds=2026-11-02"]
    assert len(build_plan(reader(tmp_path / "hive", start="2026-11-02")).units) == 1
    # Loose files cannot be windowed; the message says what to do.
    write_plain(tmp_path / "loose", [rows])
    with pytest.raises(ConfigError, match=r"not in ds=YYYY-MM-DD\[/hour=HH\] directories"):
        build_plan(reader(tmp_path / "loose", end="2026-11-02"))
    with pytest.raises(ConfigError, match="plain Parquet table has no snapshots"):
        build_plan(reader(tmp_path / "loose", snapshot=1))
    # Features must be listed; a listed history must be a listed sparse feature.
    with pytest.raises(SchemaError, match="no recd catalogue"):
        build_plan(ReaderConfig(table=str(tmp_path / "loose")))
    with pytest.raises(SchemaError, match=r"history_features\[0\] names 'user'"):
        build_plan(reader(tmp_path / "loose", history_features=[["user"]]))
    with pytest.raises(SchemaError, match="column 'price' has type double, expected list"):
        build_plan(
            ReaderConfig(table=str(tmp_path / "loose"), labels=["clicked"], dense=[],
                         sparse=["price"])
        )  # fmt: skip
    # A null id in a scalar sparse column names the file, row and column.
    nulls = rows.set_column(3, "item", pa.array([None, *rows["item"].to_pylist()[1:]]))
    write_plain(tmp_path / "nulls", [nulls])
    with pytest.raises(BadRowError, match=r"row 0: field .item.: null id"):
        list(ResumableLoader(reader(tmp_path / "nulls")))
    # recd etl never writes into another tool's table.
    shard_rows = make_rows(tiny_catalogue, num_sessions=5)
    write_shards(tmp_path / "shards", tiny_catalogue, shard_rows, num_shards=1, block_rows=32)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "loose").rglob("*"))
    with pytest.raises(ConfigError, match="holds Parquet files that recd did not write"):
        run_etl(EtlConfig(shard_dir=tmp_path / "shards", table_dir=tmp_path / "loose"))
    after = sorted(p.relative_to(tmp_path) for p in (tmp_path / "loose").rglob("*"))
    assert after == before  # not even a lock file


def test_consecutive_hash_specs_compile_as_one_module() -> None:
    sparse, _ = build_preprocessing(
        [
            {"kind": "hash_modulo", "features": ["a"], "modulo": 10},
            {"kind": "hash_modulo", "features": ["b"], "modulo": 20},
        ],
        dense=[],
    )
    assert sparse is not None and "RecursiveScriptModule" in type(sparse).__name__
