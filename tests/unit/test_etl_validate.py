"""Bad input: each kind gets a clear error (file, block, row, field) or is quarantined and counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from recd.errors import BadRowError, SchemaError
from recd.etl.config import EtlConfig, EtlReport
from recd.etl.local import run_etl
from recd.etl.validate import iter_frames
from recd.logs.rawlog import shard_path, write_catalogue
from recd.schema import REQUEST_ID, SESSION_ID, TS, Catalogue
from recd.table.hive import list_committed_partitions

from .etl_shards import MS_PER_HOUR, all_rows, make_rows, write_blocks

BLOCK_ROWS = 10


@pytest.fixture()
def rows(tiny_catalogue: Catalogue) -> pa.Table:
    return make_rows(tiny_catalogue, num_sessions=30, mean_samples=5.0, seed=3)


def blocks_of(table: pa.Table) -> list[pa.RecordBatch]:
    return table.combine_chunks().to_batches(max_chunksize=BLOCK_ROWS)


def with_value(batch: pa.RecordBatch, column: str, row: int, value: Any) -> pa.RecordBatch:
    array = batch.column(column).to_pylist()
    array[row] = value
    idx = batch.schema.get_field_index(column)
    return batch.set_column(
        idx, batch.schema.field(idx), pa.array(array, batch.schema.field(idx).type)
    )


def write_shard(directory: Path, catalogue: Catalogue, batches: list[pa.RecordBatch]) -> Path:
    write_catalogue(directory, catalogue)
    path = shard_path(directory, 0)
    write_blocks(path, batches)
    return path


def etl(shard_dir: Path, table_dir: Path, **kwargs: Any) -> EtlReport:
    return run_etl(
        EtlConfig(shard_dir=shard_dir, table_dir=table_dir, show_progress=False, **kwargs)
    )


BAD_ROWS = [
    # (column, value, field in the error, words of the problem)
    (SESSION_ID, None, SESSION_ID, "session_id is null"),
    (REQUEST_ID, None, REQUEST_ID, "request_id is null"),
    (TS, None, TS, "ts is null"),
    (TS, -5, TS, "got -5"),
    (TS, 1_793_491_200_000_000, TS, "wrong unit"),  # microseconds: year ~58800
    ("label", None, "label", "label is null"),
    ("item_price", None, "item_price", "item_price is null"),
    ("user_history", None, "user_history", "user_history is null"),
    ("user_history", [4, None, 6], "user_history", "user_history holds a null id"),
]


@pytest.mark.parametrize(("column", "value", "field", "words"), BAD_ROWS)
def test_bad_row_fails_naming_file_block_row_field_and_request_id(
    tmp_path: Path,
    tiny_catalogue: Catalogue,
    rows: pa.Table,
    column: str,
    value: Any,
    field: str,
    words: str,
) -> None:
    batches = blocks_of(rows)
    batches[2] = with_value(batches[2], column, 7, value)
    path = write_shard(tmp_path / "shards", tiny_catalogue, batches)
    with pytest.raises(BadRowError) as info:
        etl(tmp_path / "shards", tmp_path / "table")
    message = str(info.value)
    assert str(path) in message and "block 2" in message and "row 7" in message
    assert info.value.field == field and info.value.row == 7
    assert words in message
    request_id = batches[2].column(REQUEST_ID)[7].as_py()
    assert (
        f"request_id {request_id}" if request_id is not None else "request_id unknown"
    ) in message
    assert list_committed_partitions(tmp_path / "table") == []  # nothing half-written is visible
    assert not list((tmp_path / "table").glob("_tmp-*"))


def test_quarantine_counts_and_keeps_every_bad_row(
    tmp_path: Path, tiny_catalogue: Catalogue, rows: pa.Table
) -> None:
    batches = blocks_of(rows)
    for i, (column, value, _, _) in enumerate(BAD_ROWS):
        batches[1 + i] = with_value(batches[1 + i], column, i, value)
    write_shard(tmp_path / "shards", tiny_catalogue, batches)
    report = etl(tmp_path / "shards", tmp_path / "table", on_bad_rows="quarantine")
    assert report.rows_quarantined == len(BAD_ROWS)
    assert report.rows_out == rows.num_rows - len(BAD_ROWS)
    assert report.rows_in == report.rows_out + report.rows_quarantined == rows.num_rows
    assert report.quarantine_dir is not None
    bad = pq.read_table(Path(report.quarantine_dir) / "rows.parquet")
    assert bad.num_rows == len(BAD_ROWS)
    assert bad.column("_block").to_pylist() == list(range(1, len(BAD_ROWS) + 1))
    assert bad.column("_row").to_pylist() == list(range(len(BAD_ROWS)))
    assert bad.column("_field").to_pylist() == [f for _, _, f, _ in BAD_ROWS]
    assert [r.split(" (")[0] for r in bad.column("_reason").to_pylist()][5:] == [
        w for _, _, _, w in BAD_ROWS[5:]
    ]
    # Nothing dropped: good rows + quarantined rows == input (by request_id where known).
    good_ids = all_rows(tmp_path / "table").column(REQUEST_ID).to_pylist()
    bad_ids = [i for i in bad.column(REQUEST_ID).to_pylist() if i is not None]
    nulled_id = blocks_of(rows)[2].column(REQUEST_ID)[1].as_py()  # its request_id was nulled
    assert sorted([*good_ids, *bad_ids, nulled_id]) == rows.column(REQUEST_ID).to_pylist()
    summary = json.loads((Path(report.quarantine_dir) / "_summary.json").read_text())
    assert summary["rows"] == len(BAD_ROWS)
    by_field = {SESSION_ID: 1, REQUEST_ID: 1, TS: 3, "label": 1, "item_price": 1}
    by_field["user_history"] = 2
    assert report.rows_quarantined_by_field == summary["rows_by_field"] == by_field
    assert "quarantined rows by field: ts 3, user_history 2, " in report.summary()


def mismatched_blocks(batch: pa.RecordBatch) -> list[tuple[pa.RecordBatch, str, str]]:
    """(bad block, column named in the error, what the error says)."""
    label = batch.schema.get_field_index("label")
    return [
        (
            batch.set_column(
                2, pa.field(TS, pa.int32()), pc.cast(batch.column(TS), pa.int32(), safe=False)
            ),
            TS,
            "int32",
        ),
        (batch.remove_column(label), "label", "missing"),
        (
            batch.append_column("surprise", pa.array(np.zeros(batch.num_rows))),
            "surprise",
            "unexpected",
        ),
        (
            batch.set_column(
                label, pa.field("label", pa.float64()), pc.cast(batch.column("label"), pa.float64())
            ),
            "label",
            "double",
        ),
    ]


@pytest.mark.parametrize("case", range(4))
def test_block_with_wrong_schema_fails_naming_file_block_and_column(
    tmp_path: Path, tiny_catalogue: Catalogue, rows: pa.Table, case: int
) -> None:
    batches = blocks_of(rows)
    bad, column, words = mismatched_blocks(batches[1])[case]
    batches[1] = bad
    path = write_shard(tmp_path / "shards", tiny_catalogue, batches)
    with pytest.raises(SchemaError) as info:
        etl(tmp_path / "shards", tmp_path / "table")
    message = str(info.value)
    assert (
        str(path) in message
        and "block 1" in message
        and repr(column) in message
        and words in message
    )


def test_block_with_wrong_schema_is_quarantined_whole(
    tmp_path: Path, tiny_catalogue: Catalogue, rows: pa.Table
) -> None:
    batches = blocks_of(rows)
    batches[3] = mismatched_blocks(batches[3])[1][0]
    write_shard(tmp_path / "shards", tiny_catalogue, batches)
    report = etl(tmp_path / "shards", tmp_path / "table", on_bad_rows="quarantine")
    assert report.blocks_quarantined == 1
    assert report.rows_quarantined == batches[3].num_rows
    assert report.rows_out == rows.num_rows - batches[3].num_rows
    assert report.quarantine_dir is not None
    saved = list(Path(report.quarantine_dir).glob("block-shard-0000-000003.arrow"))
    assert len(saved) == 1
    with pa.memory_map(str(saved[0])) as source:
        assert ipc.open_file(source).read_all().equals(pa.Table.from_batches([batches[3]]))


def test_truncated_shard_fails_or_quarantines_the_frame(
    tmp_path: Path, tiny_catalogue: Catalogue, rows: pa.Table
) -> None:
    batches = blocks_of(rows)
    path = write_shard(tmp_path / "shards", tiny_catalogue, batches)
    path.write_bytes(path.read_bytes()[:-20])
    last = len(batches) - 1
    with pytest.raises(SchemaError, match=rf"{path}: block {last} .*truncated frame"):
        etl(tmp_path / "shards", tmp_path / "table")
    report = etl(tmp_path / "shards", tmp_path / "table", on_bad_rows="quarantine")
    assert report.frames_quarantined == 1
    assert report.rows_out == rows.num_rows - batches[-1].num_rows == report.rows_in


def test_corrupt_frame_mid_file_fails_or_is_skipped_and_kept(
    tmp_path: Path, tiny_catalogue: Catalogue, rows: pa.Table
) -> None:
    batches = blocks_of(rows)
    path = write_shard(tmp_path / "shards", tiny_catalogue, batches)
    frames = list(iter_frames(path))
    data = bytearray(path.read_bytes())
    victim = frames[2]
    middle = victim.offset + 8 + len(victim.data) // 2
    data[middle : middle + 16] = bytes(16)
    path.write_bytes(bytes(data))
    with pytest.raises(SchemaError, match=rf"{path}: block 2 \(byte offset {victim.offset}\)"):
        etl(tmp_path / "shards", tmp_path / "table")
    report = etl(tmp_path / "shards", tmp_path / "table", on_bad_rows="quarantine")
    assert report.frames_quarantined == 1
    assert report.rows_out == rows.num_rows - batches[2].num_rows  # later blocks still read
    assert report.quarantine_dir is not None
    kept = Path(report.quarantine_dir) / "frame-shard-0000-000002.zst"
    assert kept.read_bytes() == bytes(
        data[victim.offset + 8 : victim.offset + 8 + len(victim.data)]
    )


def test_rows_outside_the_window_are_not_checked_for_missing_ids(
    tmp_path: Path, tiny_catalogue: Catalogue, rows: pa.Table
) -> None:
    batches = blocks_of(rows)
    early = batches[0].column(TS)[0].as_py()
    batches[0] = with_value(batches[0], SESSION_ID, 0, None)
    write_shard(tmp_path / "shards", tiny_catalogue, batches)
    start_hour = (early // MS_PER_HOUR + 1) * MS_PER_HOUR
    from recd.table.partitions import format_time_ms

    report = etl(tmp_path / "shards", tmp_path / "table", start=format_time_ms(start_hour))
    assert report.rows_quarantined == 0 and report.rows_outside_window > 0


def test_feature_checks_flag_the_right_rows_of_a_sliced_block(rows: pa.Table) -> None:
    """Empty lists are fine; a null id is pinned to its own row even in a sliced block."""
    from recd.etl.validate import OK, bad_row_codes, reason_of

    batch = blocks_of(rows)[0]
    batch = with_value(batch, "user_history", 2, [])
    batch = with_value(batch, "user_history", 6, [None])
    batch = with_value(batch, "item_price", 8, None)
    sliced = batch.slice(1)  # row r of the block is row r - 1 here
    codes = bad_row_codes(sliced)
    assert np.flatnonzero(codes).tolist() == [5, 7]
    assert reason_of(int(codes[5]), sliced.schema.names)[0] == "user_history"
    assert reason_of(int(codes[7]), sliced.schema.names) == ("item_price", "item_price is null")
    assert codes[1] == OK  # the empty list
