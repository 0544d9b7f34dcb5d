"""`recd logs ingest` on hostile input: bytes that are not UTF-8, oversized lines, unmatched
quotes and inputs with no events. Real files, the real CLI (``recd.cli.main``, or a child
process where only one shows the failure: an abort or a hang at exit)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from recd.cli import main
from recd.logs import rawlog
from recd.logs.ingest import MAX_LINE_BYTES, QUARANTINE_FILE

HEADER = b"session_id,ts,item_id,event_type\n"
BIG = MAX_LINE_BYTES + (1 << 20)  # a value twice the default line limit


def _jsonl(**fields: object) -> bytes:
    event = {"session_id": 1, "ts": 1_700_000_000, "item_id": 3, "event_type": "view"}
    return json.dumps({**event, **fields}).encode() + b"\n"


def _ingest(src: Path, out: Path, *options: str) -> int:
    return main(["logs", "ingest", str(src), "--out", str(out), *options])


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line the CLI printed on stderr (and it printed nothing on stdout)."""
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err[:2000]
    assert "Traceback" not in captured.err
    return captured.err


def _quarantine(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / QUARANTINE_FILE).read_text().splitlines()]


def _rows(out: Path) -> list[dict]:
    batches = [b for _, _, b in rawlog.iter_raw_log(out)]
    return pa.Table.from_batches(batches).to_pylist() if batches else []


# ----------------------------------------------------------------------------- not UTF-8


JSONL_NOT_UTF8 = [
    # (line 2, field named in the message or None)
    (_jsonl(ts=1_700_000_001).replace(b'"view"', b'"vi\xffew"'), "event_type"),
    (_jsonl(ts=1_700_000_001).replace(b'"item_id"', b'"item_\xe9"'), None),  # in a key
    (_jsonl(ts=1_700_000_001).replace(b"1700000001", b"1700000001\xc3"), None),  # a bare byte
]


@pytest.mark.parametrize(("bad", "field"), JSONL_NOT_UTF8)
def test_jsonl_not_utf8_fails_with_one_line_naming_file_line_and_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: bytes, field: str | None
) -> None:
    src = tmp_path / "events.jsonl"
    src.write_bytes(_jsonl() + bad + _jsonl(ts=1_700_000_002, event_type="cart"))
    assert _ingest(src, tmp_path / "out") == 2
    where = f"field {field!r}: " if field else ""
    assert f"events.jsonl: line 2: {where}not valid UTF-8: byte 0x" in _error_line(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("bad", "field"), JSONL_NOT_UTF8)
def test_jsonl_not_utf8_line_is_quarantined_and_the_rest_ingested(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: bytes, field: str | None
) -> None:
    src = tmp_path / "events.jsonl"
    src.write_bytes(_jsonl() + bad + _jsonl(ts=1_700_000_002, event_type="cart"))
    out = tmp_path / "out"
    assert _ingest(src, out, "--on-bad-rows", "quarantine") == 0
    assert "rows in 3  out 2  quarantined 1" in capsys.readouterr().out
    [record] = _quarantine(out)
    assert (record["line"], record["field"]) == (2, field)
    assert "not valid UTF-8" in record["reason"] and "\ufffd" in record["text"]
    assert [r["request_id"] for r in _rows(out)] == [1, 3]


def test_csv_not_utf8_fails_with_one_line_naming_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "events.csv"
    src.write_bytes(HEADER + b"a,1700000000000,1,view\nb,1700000000001,2,vi\xffew\n")
    assert _ingest(src, tmp_path / "out") == 2
    assert _error_line(capsys) == (
        f"recd logs: error: {src}: line 3: field 'event_type': not valid UTF-8: byte 0xff at "
        "byte 21 of the line (the input must be UTF-8 text)\n"
    )
    assert not (tmp_path / "out").exists()


def test_csv_not_utf8_lines_are_quarantined_with_their_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "events.csv"
    src.write_bytes(
        b"session_id,note,ts,item_id,event_type\n"
        b"a,ok,1700000000000,1,view\n"
        b'b,"x,caf\xe9",1700000000001,2,view\n'  # 3: a quoted delimiter before the bad byte
        b"c,ok,1700000000002,3,cart\n"
        b"d,ok,1700000000003,4,vi\xc3\n"  # 5: a truncated character ends the line
        b"e,ok,1700000000004,5,view\n"
    )
    out = tmp_path / "out"
    assert _ingest(src, out, "--on-bad-rows", "quarantine") == 0
    assert "rows in 5  out 3  quarantined 2" in capsys.readouterr().out
    records = _quarantine(out)
    assert [(r["line"], r["field"]) for r in records] == [(3, "note"), (5, "event_type")]
    assert all("not valid UTF-8" in r["reason"] for r in records)
    assert [r["request_id"] for r in _rows(out)] == [2, 4, 6]


def test_csv_header_not_utf8_fails_even_when_quarantining(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "events.csv"
    src.write_bytes(b"session_id,ts,item_id,event_type,n\xf6te\na,1700000000000,1,view,x\n")
    assert _ingest(src, tmp_path / "out", "--on-bad-rows", "quarantine") == 2
    assert "events.csv: line 1: header: not valid UTF-8: byte 0xf6" in _error_line(capsys)


# ----------------------------------------------------------------------------- oversized


def test_oversized_csv_field_fails_with_line_field_size_and_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "events.csv"
    src.write_bytes(HEADER + b"a,1700000000000,1,view\nb,1700000000001,2," + b"x" * BIG + b"\n")
    assert _ingest(src, tmp_path / "out") == 2
    size = len(b"b,1700000000001,2,") + BIG
    assert _error_line(capsys) == (
        f"recd logs: error: {src}: line 3: field 'event_type': line of {size:,} bytes is over "
        f"the limit of {MAX_LINE_BYTES:,} bytes per line (--max-line-bytes)\n"
    )
    assert not (tmp_path / "out").exists()


def test_oversized_csv_line_is_quarantined_in_a_child_process(tmp_path: Path) -> None:
    """Before lines were bounded, the reader's error left worker threads calling back into
    Python, and the process could abort (SIGABRT) or hang at exit: run it as a real process."""
    rows = [b"a,%d,1,view\n" % (1_700_000_000_000 + i) for i in range(60_000)]
    for i in range(0, len(rows), 1000):
        rows[i] = b"a,1,2\n"  # malformed lines in every block of the reader
    rows[30_500] = b'b,1700000000001,2,"' + b"x" * BIG + b'"\n'
    src = tmp_path / "events.csv"
    src.write_bytes(HEADER + b"".join(rows))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "recd", "logs", "ingest", str(src), "--out", str(out)]
    done = subprocess.run(
        [*cmd, "--on-bad-rows", "quarantine"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rows in 60,000  out 59,939  quarantined 61" in done.stdout
    assert len(done.stdout) + len(done.stderr) < 5000  # the value is never echoed
    big = [r for r in _quarantine(out) if r["line"] == 30_502]
    assert big[0]["field"] == "event_type" and "over the limit" in big[0]["reason"]
    assert len(big[0]["text"]) == MAX_LINE_BYTES + 1  # cut at the limit, then "…"


def test_oversized_jsonl_value_is_refused_or_quarantined_never_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "events.jsonl"
    src.write_bytes(_jsonl() + _jsonl(ts=1_700_000_001, event_type="y" * BIG))
    assert _ingest(src, tmp_path / "out") == 2
    line = _error_line(capsys)
    assert "events.jsonl: line 2: field 'event_type': line of " in line
    assert f"over the limit of {MAX_LINE_BYTES:,} bytes" in line and "yyy" not in line
    out = tmp_path / "out"
    assert _ingest(src, out, "--on-bad-rows", "quarantine") == 0
    captured = capsys.readouterr()
    assert "rows in 2  out 1  quarantined 1" in captured.out
    assert len(captured.out) + len(captured.err) < 5000
    assert json.loads((out / "_ingest.json").read_text())["event_vocabulary"] == {"view": 1}


def test_max_line_bytes_sets_the_limit_and_messages_cut_long_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "events.csv"
    src.write_bytes(HEADER + b"a,1700000000000,1," + b"v" * 200 + b"\n")
    assert _ingest(src, tmp_path / "out", "--max-line-bytes", "100") == 2
    assert "line 2: field 'event_type': line of 218 bytes is over the limit of 100" in (
        _error_line(capsys)
    )
    # under the limit, a bad value is quoted cut to 40 characters
    src.write_bytes(HEADER + b"a,1700000000000,1,view\na," + b"9" * 5000 + b"x,2,view\n")
    assert _ingest(src, tmp_path / "out") == 2
    line = _error_line(capsys)
    assert f"line 3: field 'ts': cannot parse '{'9' * 40}…' as a timestamp" in line
    assert len(line) < 300
    assert _ingest(src, tmp_path / "out", "--max-line-bytes", "0") == 2
    assert "max_line_bytes must be >= 1" in _error_line(capsys)


def test_summary_cuts_long_event_types(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "events.csv"
    long_type = "w" * 100_000  # under the line limit: a valid, if odd, event type
    src.write_text(HEADER.decode() + f"a,1700000000000,1,{long_type}\n")
    assert _ingest(src, tmp_path / "out") == 0
    printed = capsys.readouterr().out
    assert f"event types: {'w' * 40}…=1" in printed and len(printed) < 1000


# ----------------------------------------------------------------------------- unmatched quote


def test_unmatched_quote_is_a_bad_line_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "events.csv"
    src.write_bytes(
        HEADER
        + b"a,1700000000000,1,view\n"
        + b'b,1700000000001,2,"view\n'  # 3: the quote never closes: the reader runs on
        + b"c,1700000000002,3,cart\n"
    )
    assert _ingest(src, tmp_path / "out") == 2
    assert "line 3: field 'event_type': an unmatched \" on this line" in _error_line(capsys)
    out = tmp_path / "out"
    assert _ingest(src, out, "--on-bad-rows", "quarantine") == 0
    assert "rows in 3  out 1  quarantined 2" in capsys.readouterr().out
    assert [(r["line"], r["field"]) for r in _quarantine(out)] == [(3, "event_type"), (4, None)]


# ----------------------------------------------------------------------------- no events


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("events.csv", b"", "the file is empty"),
        ("events.csv", b"\xef\xbb\xbf", "the file is empty"),
        ("events.csv", HEADER, "only a header line"),
        ("events.csv", HEADER + b"\n\r\n", "only a header line"),
        ("events.csv", b"\n\n", "only blank lines"),
        ("events.jsonl", b"", "the file is empty"),
        ("events.jsonl", b"\n  \n\t\r\n", "only blank lines"),
    ],
)
def test_no_events_is_refused_and_leaves_the_output_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, data: bytes, reason: str
) -> None:
    src = tmp_path / name
    src.write_bytes(data)
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier.txt").write_text("an earlier run")
    for mode in ("fail", "quarantine"):
        assert _ingest(src, out, "--on-bad-rows", mode) == 2
        assert _error_line(capsys) == (
            f"recd logs: error: {src}: no events ({reason}); "
            "--allow-empty writes an empty output instead\n"
        )
        assert [p.name for p in out.iterdir()] == ["earlier.txt"]
    assert _ingest(src, out, "--allow-empty") == 0
    assert "rows in 0  out 0  quarantined 0" in capsys.readouterr().out
    assert _rows(out) == [] and not (out / "earlier.txt").exists()
    assert json.loads((out / "_ingest.json").read_text())["rows_out"] == 0


def test_all_rows_quarantined_is_refused_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "events.csv"
    src.write_bytes(HEADER + b"a,soon,1,view\nb,1700000000001,-2,view\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier.txt").write_text("an earlier run")
    assert _ingest(src, out, "--on-bad-rows", "quarantine") == 2
    assert _error_line(capsys) == (
        f"recd logs: error: {src}: no events (all 2 data lines are bad, the first: line 2: "
        "field 'ts': cannot parse 'soon' as a timestamp (expected epoch ms, epoch s or ISO "
        "8601)); --allow-empty writes an empty output instead\n"
    )
    assert [p.name for p in out.iterdir()] == ["earlier.txt"]
    assert _ingest(src, out, "--on-bad-rows", "quarantine", "--allow-empty") == 0
    assert "rows in 2  out 0  quarantined 2" in capsys.readouterr().out
    assert [(r["line"], r["field"]) for r in _quarantine(out)] == [(2, "ts"), (3, "item_id")]
    assert _rows(out) == []
