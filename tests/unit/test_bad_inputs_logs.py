"""`recd logs ingest` on the inputs real logs bring: timestamps in another unit than the one
asked for, or in two units; tab-separated files; negative session ids; a directory instead of
a file. Real files through the real CLI (``recd.cli.main``); a refusal is exit 2 with one
line naming the file, the line and the field, no traceback, and nothing written."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recd.cli import main
from recd.logs import rawlog
from recd.logs.ingest import QUARANTINE_FILE, ingest_events
from recd.logs.ingest_mapping import IngestMapping
from recd.pipeline import IngestStage, ingest_stage

HEADER = "session_id,ts,item_id,event_type\n"


def _ingest(src: Path, out: Path, *options: str) -> int:
    return main(["logs", "ingest", str(src), "--out", str(out), *options])


def _csv(path: Path, rows: list[tuple[object, ...]], sep: str = ",") -> Path:
    lines = [HEADER.replace(",", sep)] + [sep.join(map(str, row)) + "\n" for row in rows]
    path.write_text("".join(lines))
    return path


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line the CLI printed on stderr (and it printed nothing on stdout)."""
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err[:2000]
    assert "Traceback" not in captured.err
    return captured.err


def _rows(out: Path) -> list[dict]:
    batches = [b for _, _, b in rawlog.iter_raw_log(out)]
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def _quarantine(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / QUARANTINE_FILE).read_text().splitlines()]


# ----------------------------------------------------------------------------- ts out of range


def test_milliseconds_read_as_seconds_fail_naming_line_field_range_and_the_unit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _csv(tmp_path / "events.csv", [(1, 1_700_000_000_000, 3, "view")] * 3)
    assert _ingest(src, tmp_path / "out", "--ts-unit", "s") == 2
    error = _error_line(capsys)
    assert error.startswith(
        f"recd logs: error: {src}: line 2: field 'ts': timestamp '1700000000000' is out of "
        "range as epoch seconds (--ts-unit s): that is the year 55,8"
    )
    assert "dates must fall in the years 1 to 9999" in error
    assert error.endswith("use --ts-unit ms (or auto)\n")
    assert not (tmp_path / "out").exists()
    assert _ingest(src, tmp_path / "out", "--ts-unit", "ms") == 0  # as the message says


@pytest.mark.parametrize("unit", ["ms", "auto"])
def test_microseconds_are_out_of_range_in_either_unit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], unit: str
) -> None:
    src = _csv(tmp_path / "events.csv", [(1, 1_700_000_000_000_000, 3, "view")])
    assert _ingest(src, tmp_path / "out", "--ts-unit", unit) == 2
    error = _error_line(capsys)
    how = "--ts-unit ms" if unit == "ms" else "--ts-unit auto read the log as ms"
    assert f"{src}: line 2: field 'ts': timestamp '1700000000000000' is out of range as " in error
    assert f"epoch milliseconds ({how})" in error and "epoch microseconds or nano" in error
    assert not (tmp_path / "out").exists()


def test_out_of_range_lines_are_quarantined_with_the_rest_ingested(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [(1, 1_700_000_000, 3, "view"), (1, 1_700_000_000_000, 4, "view")]
    src = _csv(tmp_path / "events.csv", [*rows, (2, 1_700_000_005, 5, "view")])
    out = tmp_path / "out"
    assert _ingest(src, out, "--ts-unit", "s", "--on-bad-rows", "quarantine") == 0
    assert "rows in 3  out 2  quarantined 1" in capsys.readouterr().out
    [record] = _quarantine(out)
    assert (record["line"], record["field"]) == (3, "ts") and "out of range" in record["reason"]
    assert [r["ts"] for r in _rows(out)] == [1_700_000_000_000, 1_700_000_005_000]


# ----------------------------------------------------------------------------- mixed units


def test_auto_refuses_a_log_mixing_seconds_and_milliseconds_naming_the_first_odd_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Most timestamps are ms: line 4 (seconds) is the first of the other unit."""
    rows = [(1, 1_700_000_000_000 + i, i, "view") for i in range(2)]
    rows += [(2, 1_700_000_100, 7, "view"), (2, 1_700_000_200_000, 8, "view")]
    rows += [(3, 1_700_000_300, 9, "view")]
    src = _csv(tmp_path / "events.csv", rows)
    assert _ingest(src, tmp_path / "out") == 2
    error = _error_line(capsys)
    assert error.startswith(
        f"recd logs: error: {src}: line 4: field 'ts': timestamp '1700000100' looks like epoch "
        "seconds (below 1e11), but 3 of the log's 5 numeric timestamps look like epoch "
        "milliseconds: the log mixes units"
    )
    assert "--ts-unit auto reads a whole log in one unit (ms)" in error
    assert not (tmp_path / "out").exists()


def test_a_seconds_log_with_one_millisecond_line_names_that_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [(1, 1_700_000_000 + i, i, "view") for i in range(4)]
    rows.insert(2, (1, 1_700_000_001_500, 9, "view"))  # line 4
    src = _csv(tmp_path / "events.csv", rows)
    assert _ingest(src, tmp_path / "out") == 2
    error = _error_line(capsys)
    assert f"{src}: line 4: field 'ts': timestamp '1700000001500' looks like epoch milli" in error
    assert "4 of the log's 5 numeric timestamps look like epoch seconds" in error
    out = tmp_path / "out"
    assert _ingest(src, out, "--on-bad-rows", "quarantine") == 0
    assert "rows in 5  out 4  quarantined 1\n" in capsys.readouterr().out
    assert [r["line"] for r in _quarantine(out)] == [4]
    assert {r["ts"] // 1000 for r in _rows(out)} == {1_700_000_000 + i for i in range(4)}


# ----------------------------------------------------------------------------- dated before 1990


def test_epoch_seconds_given_as_milliseconds_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _csv(tmp_path / "events.csv", [(1, 1_700_000_000 + i, i, "view") for i in range(3)])
    assert _ingest(src, tmp_path / "out", "--ts-unit", "ms") == 2
    assert _error_line(capsys) == (
        f"recd logs: error: {src}: field 'ts': every timestamp falls before 1990 read as epoch "
        "milliseconds (1970-01-20 16:13:20 to 1970-01-20 16:13:20), and from 1990 on read as "
        "epoch seconds (2023-11-14 22:13:20 to 2023-11-14 22:13:22): these are epoch seconds; "
        "use --ts-unit s (or auto)\n"
    )
    assert not (tmp_path / "out").exists()


def test_relative_times_before_1990_are_ingested_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Milliseconds since a session's start are no epoch times, but not certainly wrong."""
    src = _csv(tmp_path / "events.csv", [(1, 0, 3, "view"), (1, 5_000, 4, "cart")])
    out = tmp_path / "out"
    assert _ingest(src, out, "--ts-unit", "ms") == 0
    printed = capsys.readouterr().out
    assert (
        "  warning: every timestamp (column 'ts', read as epoch milliseconds) falls before 1990 "
        "(1970-01-01 00:00:00 to 1970-01-01 00:00:05): relative times rather than epoch times?"
    ) in printed
    assert [r["ts"] for r in _rows(out)] == [0, 5_000]


# ----------------------------------------------------------------------------- session ids


def test_negative_integer_session_ids_round_trip_through_shard_and_etl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Negative ids are legal int64 ids: sharding and the ETL's passes mix their two's
    complement bits, sorting is signed. Each session stays whole, with its own history."""
    low = -(2**63)
    rows = [
        (-5, "2024-05-01T00:10:00Z", 3, "view"),
        (5, "2024-05-01T00:11:00Z", 4, "view"),
        (-5, "2024-05-01T00:12:00Z", 5, "cart"),
        (low, "2024-05-01T00:13:00Z", 6, "view"),
        (5, "2024-05-01T00:14:00Z", 7, "view"),
        (low, "2024-05-01T00:15:00Z", 8, "view"),
    ]
    src = _csv(tmp_path / "events.csv", rows)
    raw, shards, table = tmp_path / "raw", tmp_path / "shards", tmp_path / "table"
    assert _ingest(src, raw, "--session-ids", "int") == 0
    assert "sessions 3 (distinct ids)" in capsys.readouterr().out
    written = {(r["session_id"], r["item_id"][0]): r["hist_item_ids"] for r in _rows(raw)}
    assert written == {
        (-5, 3): [],
        (5, 4): [],
        (-5, 5): [3],
        (low, 6): [],
        (5, 7): [4],
        (low, 8): [6],
    }
    assert main(["logs", "shard", str(raw), "--out", str(shards), "--shards", "3"]) == 0
    assert main(["etl", str(shards), "--table", str(table), "--no-progress"]) == 0
    files = sorted(table.glob("ds=*/hour=*/*.parquet"))
    stored = pa.concat_tables(pq.read_table(f) for f in files).to_pylist()
    assert sorted((r["session_id"], r["item_id"][0]) for r in stored) == sorted(written)
    order = [r["session_id"] for r in stored]  # clustered: each session's rows together
    assert all(s not in order[i + 1 :] or order[i + 1] == s for i, s in enumerate(order[:-1]))


# ----------------------------------------------------------------------------- delimiters


@pytest.mark.parametrize("spelling", ["\\t", "tab", "TAB", "\t"])
def test_tab_separated_logs_are_read_with_the_usual_spellings_of_a_tab(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spelling: str
) -> None:
    rows = [
        (1, 1_700_000_000, 3, "view"),
        (1, 1_700_000_001, 4, "cart"),
        (2, 1_700_000_002, 5, "view"),
    ]
    _csv(tmp_path / "events.csv", rows)
    src = _csv(tmp_path / "events.tsv", rows, sep="\t")
    assert _ingest(tmp_path / "events.csv", tmp_path / "comma") == 0
    assert _ingest(src, tmp_path / "tab", "--format", "csv", "--delimiter", spelling) == 0
    assert "rows in 3  out 3  quarantined 0" in capsys.readouterr().out
    assert _rows(tmp_path / "tab") == _rows(tmp_path / "comma")


@pytest.mark.parametrize("delimiter", ["ab", "\\n", '"', ""])
def test_a_delimiter_of_several_characters_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], delimiter: str
) -> None:
    src = _csv(tmp_path / "events.csv", [(1, 1_700_000_000, 3, "view")])
    assert _ingest(src, tmp_path / "out", "--delimiter", delimiter) == 2
    error = _error_line(capsys)
    assert error == (
        "recd logs: error: delimiter must be one single-byte character other than a quote or "
        f"line break (or \\t / tab for a tab), got {delimiter!r}\n"
    )
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- not a file


@pytest.mark.parametrize("name", ["logs", "logs.csv"])
def test_a_directory_is_refused_as_one_not_as_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    directory = tmp_path / name
    directory.mkdir()
    _csv(directory / "part-0.csv", [(1, 1_700_000_000, 3, "view")])
    assert _ingest(directory, tmp_path / "out") == 2
    error = _error_line(capsys)
    assert error.startswith(f"recd logs: error: {directory}: is a directory; recd logs ingest ")
    assert "reads one event log file (.csv, .json, .jsonl, .ndjson, .parquet, .pq)" in error
    assert "does not exist" not in error
    assert not (tmp_path / "out").exists()


def test_a_missing_log_without_a_known_suffix_is_said_to_be_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _ingest(tmp_path / "events", tmp_path / "out") == 2
    assert _error_line(capsys) == (
        f"recd logs: error: event log {tmp_path / 'events'} does not exist\n"
    )


# ----------------------------------------------------------------------------- the day hint


def _sparse_log(path: Path) -> Path:
    """3 events a day over 10 days: far fewer than 1,000 samples an hour."""
    rows = [(i % 4, 1_700_000_000 + 8 * 3600 * i, i, "view") for i in range(30)]
    return _csv(path, rows)


def test_the_day_partition_hint_is_left_out_when_the_table_is_partitioned_by_day(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = _sparse_log(tmp_path / "events.csv")
    with caplog.at_level(logging.WARNING, logger="recd.logs.ingest"):
        hour = ingest_events(src, tmp_path / "a", mapping=IngestMapping(), show_progress=False)
        day = ingest_events(
            src, tmp_path / "b", mapping=IngestMapping(), show_progress=False, partition_by="day"
        )
    hints = [w for w in hour.warnings if "--partition-by day" in w]
    assert len(hints) == 1 and hints[0].startswith("30 samples over 233 hours")
    assert not [w for w in day.warnings if "partition" in w]
    logged = [r.getMessage() for r in caplog.records if "partition" in r.getMessage()]
    assert logged == hints


@pytest.mark.parametrize(("partition_by", "hinted"), [("hour", True), ("day", False)])
def test_recd_run_ingest_stage_hints_only_for_an_hourly_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], partition_by: str, hinted: bool
) -> None:
    _sparse_log(tmp_path / "events.csv")
    ingest_stage(
        IngestStage(input="events.csv"),
        tmp_path,
        tmp_path / "work",
        False,
        partition_by=partition_by,
    )
    printed = capsys.readouterr().out
    assert "[1/5 ingest]  30 events of events.csv -> 30 samples in 4 sessions (distinct ids;" in (
        printed
    )
    assert ("partition the table by day" in printed) is hinted


# ----------------------------------------------------------------------------- session counts


def test_ingest_and_analyze_say_what_their_session_counts_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Session 1 crosses an hour boundary: 2 distinct ids, 3 session-partitions."""
    rows = [
        (1, "2024-05-01T00:50:00Z", 3, "view"),
        (1, "2024-05-01T00:55:00Z", 4, "view"),
        (1, "2024-05-01T01:05:00Z", 5, "view"),
        (2, "2024-05-01T01:10:00Z", 6, "view"),
    ]
    src = _csv(tmp_path / "events.csv", rows)
    raw, shards, table = tmp_path / "raw", tmp_path / "shards", tmp_path / "table"
    assert _ingest(src, raw) == 0
    assert "  sessions 2 (distinct ids)  " in capsys.readouterr().out
    assert main(["logs", "shard", str(raw), "--out", str(shards), "--shards", "2"]) == 0
    assert main(["etl", str(shards), "--table", str(table), "--no-progress"]) == 0
    capsys.readouterr()
    argv = ["analyze", str(table), "--factor-only", "--batch-size", "2"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert (
        f"table {table}: 4 rows, 3 session-partitions (a session counted once per partition it "
        "spans), S = 1.33"
    ) in printed
