"""The local engine's threads (``workers``): same bytes as the serial run, same errors, same
accounting; a failure on either thread stops both and leaves nothing visible."""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import recd.etl.local as local
from recd.cli.etl import register
from recd.errors import BadRowError, ConfigError
from recd.etl.config import EtlConfig, EtlReport
from recd.etl.local import run_etl
from recd.logs.rawlog import shard_path, write_catalogue
from recd.schema import REQUEST_ID, TS, Catalogue
from recd.table.hive import list_committed_partitions

from .etl_shards import (
    all_rows,
    committed_bytes,
    make_rows,
    read_committed,
    sessions_clustered,
    write_blocks,
)

NUM_SHARDS = 4
BLOCK_ROWS = 16
# Fields of a report that may differ between runs of the same input.
RUN_FIELDS = (
    "run_id",
    "seconds",
    "rows_per_s",
    "peak_rss_bytes",
    "workers",
    "quarantine_dir",
    "snapshot_id",
)


@pytest.fixture()
def rows(tiny_catalogue: Catalogue) -> pa.Table:
    return make_rows(tiny_catalogue, num_sessions=80, mean_samples=6.0, seed=11)


@pytest.fixture()
def shard_dir(tmp_path: Path, tiny_catalogue: Catalogue, rows: pa.Table) -> Path:
    from .etl_shards import write_shards

    directory = tmp_path / "shards"
    write_shards(directory, tiny_catalogue, rows, num_shards=NUM_SHARDS, block_rows=BLOCK_ROWS)
    return directory


def etl(shard_dir: Path, table_dir: Path, **kwargs: Any) -> EtlReport:
    return run_etl(
        EtlConfig(shard_dir=shard_dir, table_dir=table_dir, show_progress=False, **kwargs)
    )


def snapshot(table_dir: Path) -> dict[str, bytes]:
    """Every committed file by path relative to the table (run tags removed)."""
    return committed_bytes(table_dir)


def comparable(report: EtlReport) -> dict[str, Any]:
    data = report.to_dict()
    for name in RUN_FIELDS:
        data.pop(name)
    return data


def reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("recd-etl-")]


SETTINGS = [
    pytest.param({}, id="defaults"),
    pytest.param({"row_group_rows": 50, "target_file_bytes": 4_000}, id="rolled-files"),
    pytest.param({"baseline": True, "row_group_rows": 70}, id="baseline"),
    pytest.param({"start": "2026-11-01T01:00:00", "dictionary": "none"}, id="window"),
]


@pytest.mark.parametrize("settings", SETTINGS)
def test_workers_write_the_same_bytes_as_the_serial_run(
    tmp_path: Path, shard_dir: Path, rows: pa.Table, settings: dict[str, Any]
) -> None:
    serial = etl(shard_dir, tmp_path / "w1", workers=1, **settings)
    expected = snapshot(tmp_path / "w1")
    assert serial.workers == 1 and serial.rows_out > 0 and expected
    for workers in (2, 3):
        report = etl(shard_dir, tmp_path / f"w{workers}", workers=workers, **settings)
        assert report.workers == workers
        assert snapshot(tmp_path / f"w{workers}") == expected, f"workers={workers}"
        assert comparable(report) == comparable(serial)
    assert reader_threads() == []


def run_local(shard_dir: Path, table_dir: Path, **kwargs: Any) -> local.LocalEtl:
    engine = local.LocalEtl(
        EtlConfig(shard_dir=shard_dir, table_dir=table_dir, show_progress=False, **kwargs)
    )
    engine.run()
    return engine


def test_under_a_tight_budget_workers_decode_blocks_same_passes_same_bytes(
    tmp_path: Path, shard_dir: Path, rows: pa.Table
) -> None:
    tight = {"memory_budget_bytes": 24_000, "row_group_rows": 60, "target_file_bytes": 4_000}
    serial = etl(shard_dir, tmp_path / "w1", workers=1, **tight)
    assert min(serial.passes_per_shard.values()) > 1 and serial.row_groups_flushed_early > 0
    assert serial.files > serial.partitions
    for workers in (2, 3):
        engine = run_local(shard_dir, tmp_path / f"w{workers}", workers=workers, **tight)
        # Reading ahead would hold two passes: more, smaller passes, each decoding every block.
        assert not engine.read_ahead
        assert comparable(engine.report) == comparable(serial)
        assert snapshot(tmp_path / f"w{workers}") == snapshot(tmp_path / "w1")
    assert all_rows(tmp_path / "w2").equals(rows.sort_by(REQUEST_ID))
    for _, path, table in read_committed(tmp_path / "w2"):
        assert sessions_clustered(table), path
    assert reader_threads() == []


def test_under_a_roomy_budget_workers_read_ahead_same_bytes(
    tmp_path: Path, shard_dir: Path
) -> None:
    roomy = {"memory_budget_bytes": 4 << 20, "row_group_rows": 60}  # shards of ~30 kB
    serial = run_local(shard_dir, tmp_path / "w1", workers=1, **roomy)
    parallel = run_local(shard_dir, tmp_path / "w2", workers=2, **roomy)
    assert not serial.read_ahead and parallel.read_ahead
    assert set(parallel.report.passes_per_shard.values()) == {1}
    assert comparable(parallel.report) == comparable(serial.report)
    assert snapshot(tmp_path / "w2") == snapshot(tmp_path / "w1")


def write_shard_dir(
    directory: Path, catalogue: Catalogue, rows: pa.Table, bad: dict[tuple[int, int], int]
) -> list[Path]:
    """``NUM_SHARDS`` shards of consecutive row ranges, in blocks of BLOCK_ROWS; ``bad`` maps
    (shard, block) -> a row whose ts is set to -1."""
    write_catalogue(directory, catalogue)
    per_shard = -(-rows.num_rows // NUM_SHARDS)
    paths = []
    for k in range(NUM_SHARDS):
        batches = rows.slice(k * per_shard, per_shard).combine_chunks().to_batches(BLOCK_ROWS)
        for (shard, block), row in bad.items():
            if shard == k:
                ts = batches[block].column(TS).to_pylist()
                ts[row] = -1
                index = batches[block].schema.get_field_index(TS)
                batches[block] = batches[block].set_column(
                    index, batches[block].schema.field(index), pa.array(ts, pa.int64())
                )
        paths.append(shard_path(directory, k))
        write_blocks(paths[-1], batches)
    return paths


def test_a_bad_row_read_ahead_fails_the_run_like_the_serial_run(
    tmp_path: Path, tiny_catalogue: Catalogue, rows: pa.Table
) -> None:
    paths = write_shard_dir(tmp_path / "shards", tiny_catalogue, rows, {(2, 1): 3})
    errors = []
    for workers in (1, 2):
        table = tmp_path / f"w{workers}"
        with pytest.raises(BadRowError) as info:
            etl(tmp_path / "shards", table, workers=workers)
        errors.append(str(info.value))
        assert info.value.field == TS and info.value.row == 3
        assert list_committed_partitions(table) == []
        assert not list(table.glob("_tmp-*"))
    assert errors[0] == errors[1]
    assert str(paths[2]) in errors[0] and "block 1" in errors[0] and "row 3" in errors[0]
    assert reader_threads() == []


@pytest.mark.parametrize("budget", [None, 24_000], ids=["read-ahead", "decode-pool"])
def test_quarantine_is_the_same_with_workers(
    tmp_path: Path, tiny_catalogue: Catalogue, rows: pa.Table, budget: int | None
) -> None:
    bad = {(0, 2): 1, (1, 0): 5, (3, 1): 0}
    paths = write_shard_dir(tmp_path / "shards", tiny_catalogue, rows, bad)
    with paths[1].open("ab") as f:
        f.write(b"\x05\x00")  # a truncated length prefix: an unreadable last frame
    reports = {}
    for workers in (1, 2):
        reports[workers] = etl(
            tmp_path / "shards",
            tmp_path / f"w{workers}",
            workers=workers,
            on_bad_rows="quarantine",
            memory_budget_bytes=budget,
        )
    serial, parallel = reports[1], reports[2]
    assert parallel.rows_quarantined == serial.rows_quarantined == len(bad)
    assert parallel.frames_quarantined == serial.frames_quarantined == 1
    assert parallel.rows_in == parallel.rows_out + parallel.rows_quarantined == rows.num_rows
    assert comparable(parallel) == comparable(serial)
    assert snapshot(tmp_path / "w2") == snapshot(tmp_path / "w1")
    directories = [Path(str(r.quarantine_dir)) for r in (serial, parallel)]
    quarantined = [pq.read_table(d / "rows.parquet") for d in directories]
    assert quarantined[0].equals(quarantined[1])
    assert quarantined[1].column("_field").to_pylist() == [TS] * len(bad)
    summaries = [json.loads((d / "_summary.json").read_text()) for d in directories]
    assert summaries[0] == summaries[1] and summaries[1]["frames"] == 1


def test_a_writer_failure_stops_the_reader_and_leaves_nothing_visible(
    tmp_path: Path, shard_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    append = local.PartitionWriters.append
    calls = {"n": 0}

    def failing_append(self: local.PartitionWriters, *args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full (injected)")
        append(self, *args, **kwargs)

    monkeypatch.setattr(local.PartitionWriters, "append", failing_append)
    with pytest.raises(OSError, match="injected"):
        etl(shard_dir, tmp_path / "table", workers=2)
    assert list_committed_partitions(tmp_path / "table") == []
    assert not list((tmp_path / "table").glob("_tmp-*"))
    assert reader_threads() == []


def test_progress_bars_with_a_reader_thread(
    tmp_path: Path,
    shard_dir: Path,
    rows: pa.Table,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("RECD_PROGRESS", "1")
    report = run_etl(EtlConfig(shard_dir=shard_dir, table_dir=tmp_path / "t", workers=2))
    assert report.rows_out == rows.num_rows
    assert all_rows(tmp_path / "t").equals(rows.sort_by(REQUEST_ID))
    err = capsys.readouterr().err
    for k in range(NUM_SHARDS):  # one bar per shard, each shown (tqdm writes to stderr)
        assert f"etl shard-{k:04d}.zst" in err


def test_workers_option_checks_and_cli(
    tmp_path: Path, shard_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="workers"):
        EtlConfig(shard_dir=tmp_path / "s", table_dir=tmp_path / "t", workers=0)
    auto = EtlConfig(shard_dir=tmp_path / "s", table_dir=tmp_path / "t")
    assert auto.workers is None and 1 <= auto.worker_threads <= 2
    parser = argparse.ArgumentParser(prog="recd")
    register(parser.add_subparsers(dest="command"))
    base = ["etl", str(shard_dir), "--table", str(tmp_path / "table")]
    assert parser.parse_args([*base, "--workers", "auto"]).workers is None
    assert parser.parse_args(base).workers is None
    for bad in ("0", "two"):
        with pytest.raises(SystemExit):
            parser.parse_args([*base, "--workers", bad])
        assert "--workers" in capsys.readouterr().err
    args = parser.parse_args([*base, "--workers", "2", "--json", str(tmp_path / "r.json")])
    assert args.func(args) == 0
    assert json.loads((tmp_path / "r.json").read_text())["workers"] == 2
