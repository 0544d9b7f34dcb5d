"""Log sharding (O1): consistent hashing, routing, block bounds, round trip, compression."""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from recd.cli import logs_shard
from recd.errors import ConfigError
from recd.logs import rawlog
from recd.logs.hashing import (
    MASK64,
    hash_strings,
    jump_hash,
    jump_hash_scalar,
    shard_of,
    splitmix64,
    splitmix64_scalar,
)
from recd.logs.shard import compare_sharding, read_manifest, row_nbytes, shard_logs
from recd.schema import Catalogue

# ---------------------------------------------------------------- hashing


@settings(max_examples=50, deadline=None)
@given(
    keys=st.lists(st.integers(min_value=0, max_value=MASK64), min_size=1, max_size=50),
    num_buckets=st.integers(min_value=1, max_value=5000),
)
def test_jump_hash_matches_scalar_reference(keys: list[int], num_buckets: int) -> None:
    arr = np.array(keys, dtype=np.uint64)
    got = jump_hash(arr, num_buckets)
    assert got.tolist() == [jump_hash_scalar(k, num_buckets) for k in keys]
    assert ((got >= 0) & (got < num_buckets)).all()


def test_splitmix64_matches_scalar_reference() -> None:
    keys = np.array([0, 1, 2, 3, 2**40, -1, -(2**63)], dtype=np.int64)
    want = [splitmix64_scalar(int(k) & MASK64) for k in keys]
    assert splitmix64(keys).tolist() == want


def test_sequential_keys_spread_evenly() -> None:
    counts = np.bincount(shard_of(np.arange(200_000, dtype=np.int64), 10), minlength=10)
    assert counts.sum() == 200_000
    assert counts.min() > 0.95 * 20_000 and counts.max() < 1.05 * 20_000


@pytest.mark.parametrize("k", [1, 4, 9, 31])
def test_growing_k_moves_about_one_over_k_plus_one(k: int) -> None:
    mixed = splitmix64(np.arange(100_000, dtype=np.int64))
    before, after = jump_hash(mixed, k), jump_hash(mixed, k + 1)
    moved = before != after
    assert (after[moved] == k).all()  # keys only ever move to the new bucket
    expected = 1 / (k + 1)
    assert 0.9 * expected < moved.mean() < 1.1 * expected


def _fnv1a_splitmix_reference(text: str) -> int:
    h = 0xCBF29CE484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001B3) & MASK64
    return splitmix64_scalar(h) & ((1 << 63) - 1)


def test_hash_strings_is_stable_fnv1a_splitmix() -> None:
    words = ["u-1", "u-2", "", "ü-ñ", "u-1", "a much longer session identifier 0123456789"]
    got = hash_strings(pa.array(words))
    assert got.dtype == np.int64 and (got >= 0).all()
    assert got.tolist() == [_fnv1a_splitmix_reference(w) for w in words]
    assert got[0] == got[4] and len(set(got.tolist())) == 5


# ---------------------------------------------------------------- raw logs for the tests


def _catalogue() -> Catalogue:
    return Catalogue.from_dict(
        {
            "name": "shardtest",
            "dense": [{"name": "price"}],
            "sparse": [
                {"name": "user_history", "kind": "history", "mean_length": 24},
                {"name": "item_id"},
            ],
        }
    )


def _write_raw_log(directory: Path, *, sessions: int = 120, rows_per_session: int = 30) -> None:
    """Interleaved sessions whose ``user_history`` repeats on every row of a session."""
    rng = np.random.default_rng(7)
    n = sessions * rows_per_session
    session = np.repeat(np.arange(sessions, dtype=np.int64) * 1_000 + 5, rows_per_session)
    order = rng.permutation(n)  # arrival order interleaves the sessions
    session = session[order]
    history = rng.integers(0, 2**40, size=(sessions, 24), dtype=np.int64)
    values = history[(session - 5) // 1_000].reshape(-1)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(session),
            pa.array(np.arange(n, dtype=np.int64) + 10_000),
            pa.array(np.sort(rng.integers(0, 3_600_000, n)) + 1_700_000_000_000),
            pa.array(rng.random(n).astype(np.float32) < 0.1, pa.bool_()).cast(pa.float32()),
            pa.array(rng.random(n).astype(np.float32)),
            pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * 24), values),
            pa.ListArray.from_arrays(
                pa.array(np.arange(n + 1, dtype=np.int32)), rng.integers(0, 10**6, n)
            ),
        ],
        schema=_catalogue().arrow_schema().remove_metadata(),
    )
    with rawlog.RawLogWriter(directory, _catalogue(), segment_rows=1_000) as writer:
        for offset in range(0, n, 700):  # several input batches and segments
            writer.write(batch.slice(offset, 700))


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("raw")
    _write_raw_log(directory)
    return directory


def _read_raw(directory: Path) -> pa.Table:
    return pa.Table.from_batches([b for _, _, b in rawlog.iter_raw_log(directory)])


def _read_shards(directory: Path) -> dict[int, pa.Table]:
    out = {}
    for path in sorted(directory.glob(rawlog.SHARD_GLOB)):
        batches = [block.batch for block in rawlog.iter_shard(path)]
        schema = _catalogue().arrow_schema().remove_metadata()
        out[int(path.stem.split("-")[1])] = pa.Table.from_batches(batches, schema=schema)
    return out


def _decompressed_nbytes(path: Path) -> int:
    """Sum of the decompressed sizes of a shard's length-prefixed zstd frames."""
    data, total, pos = path.read_bytes(), 0, 0
    while pos < len(data):
        (size,) = struct.unpack("<Q", data[pos : pos + 8])
        total += len(zstandard.ZstdDecompressor().decompress(data[pos + 8 : pos + 8 + size]))
        pos += 8 + size
    return total


# ---------------------------------------------------------------- sharding


@pytest.mark.parametrize("key", ["session", "random"])
def test_round_trip_keeps_every_row_once(raw_dir: Path, tmp_path: Path, key: str) -> None:
    report = shard_logs(raw_dir, tmp_path / "out", key=key, num_shards=5, block_bytes=32 << 10)
    shards = _read_shards(tmp_path / "out")
    assert sorted(shards) == [0, 1, 2, 3, 4]
    raw = _read_raw(raw_dir)
    combined = pa.concat_tables(shards.values())
    assert report.rows_in == report.rows_out == raw.num_rows == combined.num_rows
    assert combined.sort_by("request_id").equals(raw.sort_by("request_id"))
    for shard, table in shards.items():  # arrival order is kept inside a shard
        assert table.num_rows == report.shards[shard].rows
        request_ids = table["request_id"].to_numpy()
        assert (np.diff(request_ids) > 0).all()


def test_session_key_puts_each_session_in_one_shard(raw_dir: Path, tmp_path: Path) -> None:
    shard_logs(raw_dir, tmp_path / "s", key="session", num_shards=6, block_bytes=16 << 10)
    seen: dict[int, int] = {}
    for shard, table in _read_shards(tmp_path / "s").items():
        for session in pc.unique(table["session_id"]).to_pylist():
            assert seen.setdefault(session, shard) == shard
    assert len(seen) == 120
    shard_logs(raw_dir, tmp_path / "r", key="random", num_shards=6, block_bytes=16 << 10)
    spread: dict[int, set[int]] = {}
    for shard, table in _read_shards(tmp_path / "r").items():
        for session in pc.unique(table["session_id"]).to_pylist():
            spread.setdefault(session, set()).add(shard)
    assert np.mean([len(v) for v in spread.values()]) > 4  # random spreads sessions


def test_blocks_respect_block_bytes(raw_dir: Path, tmp_path: Path) -> None:
    block_bytes = 8 << 10
    report = shard_logs(
        raw_dir, tmp_path / "out", key="session", num_shards=3, block_bytes=block_bytes
    )
    for path in sorted((tmp_path / "out").glob(rawlog.SHARD_GLOB)):
        blocks = list(rawlog.iter_shard(path))
        assert len(blocks) > 5
        for block in blocks:
            batch = block.batch
            assert int(row_nbytes(batch).sum()) <= block_bytes or batch.num_rows == 1
            # Arrow's own measure: row data plus one offset and a validity bitmap per column.
            slack = batch.num_columns * (8 + batch.num_rows // 8 + 64)
            assert batch.nbytes <= block_bytes + slack
        # every block but the last was flushed because it was full (the next row did not fit)
        sizes = [int(row_nbytes(b.batch).sum()) for b in blocks[:-1]]
        assert min(sizes) > block_bytes - int(row_nbytes(blocks[0].batch).max())
    assert report.blocks == sum(s.blocks for s in report.shards)


def test_row_nbytes_counts_widths_and_list_values() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "a": pa.array([1, 2], pa.int64()),
            "b": pa.array([0.5, 1.5], pa.float32()),
            "c": pa.array([[1, 2, 3], []], pa.list_(pa.int64())),
        }
    )
    assert row_nbytes(batch).tolist() == [8 + 4 + 4 + 24, 8 + 4 + 4]


def test_manifest_catalogue_and_atomic_rerun(raw_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shard_logs(raw_dir, out, key="session", num_shards=8, zstd_level=1)
    report = shard_logs(raw_dir, out, key="random", num_shards=3, zstd_level=5)
    assert sorted(p.name for p in out.glob(rawlog.SHARD_GLOB)) == [
        "shard-0000.zst",
        "shard-0001.zst",
        "shard-0002.zst",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temp dirs left behind
    manifest = read_manifest(out)
    assert manifest["key"] == "random" and manifest["num_shards"] == 3
    assert manifest["zstd_level"] == 5 and manifest["block_bytes"] == 1 << 20
    assert manifest["totals"]["rows"] == 3600
    for entry in manifest["shards"]:
        path = rawlog.shard_path(out, entry["shard"])
        assert entry["compressed_bytes"] == path.stat().st_size
        assert entry["rows"] == sum(b.batch.num_rows for b in rawlog.iter_shard(path))
        assert entry["uncompressed_bytes"] == _decompressed_nbytes(path)
    assert manifest["totals"]["compressed_bytes"] == report.compressed_bytes
    assert rawlog.read_catalogue(out).sparse_names == ["user_history", "item_id"]


def test_failed_run_leaves_previous_output(raw_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shard_logs(raw_dir, out, key="session", num_shards=2)
    before = sorted(p.name for p in out.iterdir())
    bad_raw = tmp_path / "bad"
    bad_raw.mkdir()
    rawlog.write_catalogue(bad_raw, _catalogue())
    (bad_raw / "segment-000000.arrow").write_bytes(b"not arrow")
    with pytest.raises(pa.ArrowInvalid):
        shard_logs(bad_raw, out, key="session", num_shards=4)
    assert sorted(p.name for p in out.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "out"]


def test_invalid_options_are_config_errors(raw_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="key"):
        shard_logs(raw_dir, tmp_path / "o", key="user", num_shards=2)
    with pytest.raises(ConfigError, match="num_shards"):
        shard_logs(raw_dir, tmp_path / "o", key="session", num_shards=0)
    with pytest.raises(ConfigError, match="zstd_level"):
        shard_logs(raw_dir, tmp_path / "o", key="session", num_shards=2, zstd_level=99)


def test_session_sharding_compresses_better_than_random(raw_dir: Path, tmp_path: Path) -> None:
    report = compare_sharding(raw_dir, tmp_path / "cmp", num_shards=8, block_bytes=64 << 10)
    assert report.session.rows_out == report.random.rows_out == 3600
    assert report.session.uncompressed_bytes == pytest.approx(
        report.random.uncompressed_bytes, rel=0.05
    )
    assert report.ratio > 1.3  # repeated per-session histories compress only when together
    assert report.session.compression_ratio > report.random.compression_ratio
    assert (tmp_path / "cmp" / "session" / rawlog.MANIFEST_FILE).is_file()
    assert (tmp_path / "cmp" / "random" / rawlog.MANIFEST_FILE).is_file()


# ---------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recd logs")
    logs_shard.register(parser.add_subparsers(dest="verb", required=True))
    return parser


def test_cli_both_keys_prints_table_and_writes_json(
    raw_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parser().parse_args(
        [
            "shard",
            str(raw_dir),
            "--out",
            str(tmp_path / "out"),
            "--shards",
            "20",
            "--key",
            "both",
            "--block-bytes",
            "64KiB",
            "--zstd-level",
            "3",
            "--json",
            str(tmp_path / "report.json"),
        ]
    )
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "median" in printed and "random/session bytes" in printed
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["session"]["block_bytes"] == 64 << 10
    assert len(report["session"]["shards"]) == 20
    assert report["random_over_session_bytes"] > 1.0


def test_cli_parse_size() -> None:
    assert logs_shard.parse_size("65536") == 65536
    assert logs_shard.parse_size("1MiB") == 1 << 20
    assert logs_shard.parse_size("2mb") == 2_000_000
    with pytest.raises(argparse.ArgumentTypeError):
        logs_shard.parse_size("lots")
