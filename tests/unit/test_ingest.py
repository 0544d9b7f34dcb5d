"""Ingest of real event logs: histories, labels, timestamps, ids and bad lines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from recd.cli import logs_ingest
from recd.errors import BadLineError, BadRowError, ConfigError, SchemaError
from recd.logs import rawlog
from recd.logs.hashing import hash_strings
from recd.logs.ingest import QUARANTINE_FILE, ingest_events, read_ingest_info
from recd.schema import check_schema

# 3 sessions, 10 events, interleaved; line 11 arrives late but has an early ts.
GOLDEN_CSV = """\
session_id,ts,item_id,event_type
a,1000,1,view
b,2000,2,view
a,3000,3,cart
c,4000,4,view
b,5000,5,purchase
a,6000,6,view
c,7000,7,view
a,8000,8,purchase
b,9000,9,view
c,3500,10,view
"""
# vocabulary by sorted name: cart=1, purchase=2, view=3
# (line, session, ts, label, item, hist items, hist types, secs since prev), history N = 2,
# in arrival (ts) order.
GOLDEN_N2 = [
    (2, "a", 1000, 0, 1, [], [], 0.0),
    (3, "b", 2000, 0, 2, [], [], 0.0),
    (4, "a", 3000, 1, 3, [1], [3], 2.0),
    (11, "c", 3500, 0, 10, [], [], 0.0),
    (5, "c", 4000, 0, 4, [10], [3], 0.5),
    (6, "b", 5000, 1, 5, [2], [3], 3.0),
    (7, "a", 6000, 0, 6, [1, 3], [3, 1], 3.0),
    (8, "c", 7000, 0, 7, [10, 4], [3, 3], 3.0),
    (9, "a", 8000, 1, 8, [3, 6], [1, 3], 2.0),
    (10, "b", 9000, 0, 9, [2, 5], [3, 2], 4.0),
]


def _read_rows(out: Path) -> list[dict]:
    batches = [b for _, _, b in rawlog.iter_raw_log(out)]
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def _session_id(name: str) -> int:
    return int(hash_strings(pa.array([name]))[0])


def test_golden_histories_labels_and_order(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    src.write_text(GOLDEN_CSV)
    report = ingest_events(src, tmp_path / "out", history=2, show_progress=False)
    assert (report.rows_in, report.rows_out, report.quarantined) == (10, 10, 0)
    assert report.sessions == 3 and report.positives == 3
    assert report.ts_unit == "s" and report.session_ids == "hash"
    assert report.event_vocabulary == {"cart": 1, "purchase": 2, "view": 3}
    rows = _read_rows(tmp_path / "out")
    want = [
        {
            "session_id": _session_id(s),
            "request_id": line,
            "ts": ts * 1000,  # small numbers: auto reads them as epoch seconds
            "label": float(label),
            "hist_len": float(len(items)),
            "secs_since_prev_event": secs * 1000,
            "item_id": [item],
            "hist_item_ids": items,
            "hist_event_types": types,
        }
        for line, s, ts, label, item, items, types, secs in GOLDEN_N2
    ]
    assert rows == want


def test_golden_with_epoch_ms_and_long_history(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    src.write_text(GOLDEN_CSV)
    ingest_events(src, tmp_path / "out", ts_unit="ms", history=20, show_progress=False)
    rows = _read_rows(tmp_path / "out")
    assert [r["ts"] for r in rows] == [g[2] for g in GOLDEN_N2]
    by_line = {r["request_id"]: r for r in rows}
    assert by_line[9]["hist_item_ids"] == [1, 3, 6]  # a's whole history fits
    assert by_line[9]["hist_event_types"] == [3, 1, 3]
    assert by_line[9]["secs_since_prev_event"] == 2.0
    catalogue = rawlog.read_catalogue(tmp_path / "out")
    assert catalogue.name == "ingest"
    assert catalogue.groups() == {"history": ["hist_item_ids", "hist_event_types"]}
    assert "event_type" not in catalogue.sparse_names + catalogue.dense_names  # no leakage
    batch = next(rawlog.iter_raw_log(tmp_path / "out"))[2]
    check_schema(batch.schema, catalogue, source="ingest output")
    info = read_ingest_info(tmp_path / "out")
    assert info["event_vocabulary"] == {"cart": 1, "purchase": 2, "view": 3}
    assert "positive_events" in info["label"]


def test_jsonl_iso_timestamps_int_sessions_and_mixed_json_types(tmp_path: Path) -> None:
    events = [
        {"user": 7, "time": "2024-05-01T00:00:01Z", "item": 5, "kind": "View"},
        {"user": "8", "time": "2024-05-01T02:00:00.250+02:00", "item": "6", "kind": "view"},
        {"user": 7, "time": "2024-05-01 00:00:03", "item": 7, "kind": "addtocart"},
        {"user": 7, "time": "2024-05-01T00:00:02.5", "item": 8, "kind": "view", "x": [1]},
    ]
    src = tmp_path / "events.jsonl"
    src.write_text("\n".join(json.dumps(e) for e in events) + "\n\n")
    report = ingest_events(
        src,
        tmp_path / "out",
        session_col="user",
        ts_col="time",
        item_col="item",
        event_col="kind",
        show_progress=False,
    )
    assert report.ts_unit == "iso" and report.session_ids == "int"
    assert (report.rows_in, report.rows_out) == (4, 4)
    rows = _read_rows(tmp_path / "out")
    base = 1714521600000  # 2024-05-01T00:00:00Z
    assert [(r["request_id"], r["session_id"], r["ts"]) for r in rows] == [
        (2, 8, base + 250),
        (1, 7, base + 1000),
        (4, 7, base + 2500),
        (3, 7, base + 3000),
    ]
    assert [r["hist_item_ids"] for r in rows] == [[], [], [5], [5, 8]]
    assert [r["label"] for r in rows] == [0.0, 0.0, 0.0, 1.0]
    assert report.event_vocabulary == {"addtocart": 1, "view": 2}


def test_csv_quotes_crlf_bom_and_blank_lines_before_the_header(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    src.write_bytes(
        b"\xef\xbb\xbf\r\n\r\n"  # BOM, then two empty lines: the header is line 3
        b"ts;note;session_id;item_id;event_type\r\n"
        b'1700000000;"a;b";s1;4;view\r\n'
        b"\r\n"
        b'1700000001;"x ""y""";s1;5;cart\r\n'
        b"1700000002;z;s1;six;view\r\n"
    )
    with pytest.raises(BadLineError, match=r"line 7: field 'item_id': cannot parse 'six'"):
        ingest_events(src, tmp_path / "out", delimiter=";", show_progress=False)
    report = ingest_events(
        src, tmp_path / "out", delimiter=";", on_bad_rows="quarantine", show_progress=False
    )
    assert (report.rows_in, report.rows_out, report.quarantined) == (3, 2, 1)
    rows = _read_rows(tmp_path / "out")
    assert [(r["request_id"], r["ts"], r["hist_item_ids"]) for r in rows] == [
        (4, 1_700_000_000_000, []),
        (6, 1_700_000_001_000, [4]),
    ]


def test_histories_match_a_plain_python_reference(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n, history = 3000, 5
    sessions = rng.integers(0, 60, n)
    ts = rng.integers(0, 500, n) + 1_700_000_000_000  # many ties: file order breaks them
    items = rng.integers(0, 1000, n)
    kinds = rng.choice(["view", "cart", "click", "purchase"], n)
    lines = ["sid,t,item,ev"] + [
        f"{s},{t},{i},{k}" for s, t, i, k in zip(sessions, ts, items, kinds, strict=True)
    ]
    src = tmp_path / "big.csv"
    src.write_text("\n".join(lines) + "\n")
    report = ingest_events(
        src,
        tmp_path / "out",
        session_col="sid",
        ts_col="t",
        item_col="item",
        event_col="ev",
        history=history,
        show_progress=False,
    )
    vocab = report.event_vocabulary
    # reference: walk events in (ts, line) order, keeping a per-session list
    order = sorted(range(n), key=lambda i: (ts[i], i))
    seen: dict[int, list[tuple[int, int, int]]] = {}
    want = []
    for i in order:
        past = seen.setdefault(int(sessions[i]), [])
        last = past[-history:]
        secs = (int(ts[i]) - past[-1][2]) / 1000 if past else 0.0
        items_then = [p[0] for p in last]
        hist_types = [p[1] for p in last]
        want.append(
            (i + 2, int(sessions[i]), items_then, hist_types, len(last), float(np.float32(secs)))
        )
        past.append((int(items[i]), vocab[str(kinds[i])], int(ts[i])))
    rows = _read_rows(tmp_path / "out")
    got = [
        (
            r["request_id"],
            r["session_id"],
            r["hist_item_ids"],
            r["hist_event_types"],
            r["hist_len"],
            r["secs_since_prev_event"],
        )
        for r in rows
    ]
    assert got == want
    positive = {"cart", "purchase"}  # of the default positive events
    assert [r["label"] for r in rows] == [float(kinds[w[0] - 2] in positive) for w in want]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "a,1700000000000,1,view\nb,yesterday,2,view\n",
            r"events.csv: line 3: field 'ts': cannot parse 'yesterday' as a timestamp "
            r"\(expected epoch ms, epoch s or ISO 8601\)",
        ),
        (
            "a,1700000000000,1,view\nb,1700000000001,2\n",
            r"line 3: malformed line: expected 4 fields, found 3",
        ),
        (
            "a,1700000000000,1,view\n\n,1700000000001,2,view\n",
            r"line 4: field 'session_id': missing value",
        ),
        ("a,1700000000000,1,view\nb,,2,view\n", r"line 3: field 'ts': missing value"),
        (
            "a,1700000000000,x9,view\n",
            r"line 2: field 'item_id': cannot parse 'x9' as an integer item id",
        ),
        ("a,1700000000000,99999999999999999999,view\n", r"line 2: field 'item_id': cannot parse"),
        ("a,1700000000000,-4,view\n", r"line 2: field 'item_id': item id -4 is negative"),
        ("a,1700000000000,4, \n", r"line 2: field 'event_type': missing value"),
    ],
)
def test_csv_bad_lines_fail_with_file_line_and_field(
    tmp_path: Path, body: str, message: str
) -> None:
    src = tmp_path / "events.csv"
    src.write_text("session_id,ts,item_id,event_type\n" + body)
    with pytest.raises(BadLineError, match=message) as info:
        ingest_events(src, tmp_path / "out", show_progress=False)
    assert isinstance(info.value, BadRowError)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"session_id": 1, "ts": 5, "item_id": 3, ', r"line 2: invalid JSON"),
        ("[1, 2, 3]", r"line 2: not a JSON object \(got list\)"),
        (
            '{"session_id": 1, "ts": {"s": 5}, "item_id": 3, "event_type": "v"}',
            r"line 2: field 'ts': expected a string or number, got an object",
        ),
        (
            '{"session_id": 1, "item_id": 3, "event_type": "v"}',
            r"line 2: field 'ts': missing value",
        ),
        (
            '{"session_id": 1, "ts": 6, "item_id": 3.5, "event_type": "v"}',
            r"line 2: field 'item_id': cannot parse '3.5'",
        ),
    ],
)
def test_jsonl_bad_lines_fail_with_file_line_and_field(
    tmp_path: Path, line: str, message: str
) -> None:
    good = '{"session_id": 1, "ts": 5, "item_id": 3, "event_type": "view"}'
    src = tmp_path / "events.jsonl"
    src.write_text("\n".join([good, line, good]) + "\n")
    with pytest.raises(BadLineError, match=r"events.jsonl: " + message):
        ingest_events(src, tmp_path / "out", show_progress=False)


def test_quarantine_counts_every_bad_line_and_keeps_the_rest(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    src.write_text(
        "session_id,ts,item_id,event_type\n"
        "a,1700000000000,1,view\n"  # 2 good
        "a,1700000001000,2\n"  # 3 malformed
        "b,soon,3,view\n"  # 4 bad ts
        "\n"  # 5 empty: not a row
        "b,1700000002000,4,cart\n"  # 6 good
        ",1700000003000,5,view\n"  # 7 missing session
        "c,1700000004000,abc,view\n"  # 8 bad item
        "c,1700000005000,6,purchase,extra\n"  # 9 malformed
        "a,1700000006000,7,view\n"  # 10 good
    )
    report = ingest_events(src, tmp_path / "out", on_bad_rows="quarantine", show_progress=False)
    assert (report.rows_in, report.rows_out, report.quarantined) == (8, 3, 5)
    records = [json.loads(x) for x in (tmp_path / "out" / QUARANTINE_FILE).read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in records] == [
        (3, None),
        (4, "ts"),
        (7, "session_id"),
        (8, "item_id"),
        (9, None),
    ]
    assert records[1]["text"] == "b,soon,3,view" and records[1]["file"] == str(src)
    assert "expected 4 fields, found 5" in records[4]["reason"]
    rows = _read_rows(tmp_path / "out")
    assert [r["request_id"] for r in rows] == [2, 6, 10]
    assert rows[2]["hist_item_ids"] == [1]  # the quarantined line 3 is not in a's history
    assert report.quarantine_path == str(tmp_path / "out" / QUARANTINE_FILE)


def test_quarantine_jsonl_bisects_to_each_bad_line(tmp_path: Path) -> None:
    lines = [
        json.dumps({"session_id": i % 7, "ts": 1_700_000_000 + i, "item_id": i, "event_type": "v"})
        for i in range(200)
    ]
    lines[17] = "{oops"
    lines[120] = json.dumps({"session_id": "s", "ts": "later", "item_id": 1, "event_type": "v"})
    lines[121] = "   "  # blank: not a row
    lines[150] = "42"
    lines[160] = json.dumps({"session_id": 1, "ts": {"a": 1}, "item_id": [2], "event_type": "v"})
    src = tmp_path / "events.jsonl"
    src.write_text("\n".join(lines) + "\n")
    report = ingest_events(src, tmp_path / "out", on_bad_rows="quarantine", show_progress=False)
    assert (report.rows_in, report.rows_out, report.quarantined) == (199, 195, 4)
    records = [json.loads(x) for x in (tmp_path / "out" / QUARANTINE_FILE).read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in records] == [
        (18, None),
        (121, "ts"),
        (151, None),
        (161, "ts"),  # one record per line: its first bad field
    ]
    assert report.session_ids == "hash"  # "s" is not an integer: every id is hashed
    assert report.ts_unit == "s"


def test_missing_column_and_bad_options(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    src.write_text("user,ts,item_id,event_type\nu,1,2,view\n")
    with pytest.raises(SchemaError, match=r"no column 'session_id'.*columns: user, ts"):
        ingest_events(src, tmp_path / "out", show_progress=False)
    with pytest.raises(ConfigError, match="ts_unit"):
        ingest_events(src, tmp_path / "out", ts_unit="days", show_progress=False)
    (tmp_path / "events.txt").write_text(src.read_text())  # exists: then its suffix counts
    with pytest.raises(ConfigError, match="suffix"):
        ingest_events(tmp_path / "events.txt", tmp_path / "out", show_progress=False)
    with pytest.raises(BadLineError, match="integer session id"):
        ingest_events(
            src, tmp_path / "o", session_col="user", session_ids="int", show_progress=False
        )


def test_event_vocabulary_is_reused_and_extended(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    src.write_text(GOLDEN_CSV.replace("a,8000,8,purchase", "a,8000,8,click"))
    report = ingest_events(
        src,
        tmp_path / "out",
        event_vocabulary={"view": 1, "purchase": 2, "cart": 3},
        show_progress=False,
    )
    assert report.event_vocabulary == {"view": 1, "purchase": 2, "cart": 3, "click": 4}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recd logs")
    logs_ingest.register(parser.add_subparsers(dest="verb", required=True))
    return parser


def test_cli_ingest_prints_summary_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "events.csv"
    src.write_text(GOLDEN_CSV + "c,never,1,view\n")
    first = tmp_path / "first.json"
    first.write_text(json.dumps({"event_vocabulary": {"view": 5}}))
    args = _parser().parse_args(
        [
            "ingest",
            str(src),
            "--out",
            str(tmp_path / "out"),
            "--on-bad-rows",
            "quarantine",
            "--history",
            "3",
            "--positive-events",
            "purchase",
            "--event-vocab",
            str(first),
            "--json",
            str(tmp_path / "report.json"),
        ]
    )
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "rows in 11  out 10  quarantined 1" in printed
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["positives"] == 2 and report["history"] == 3
    assert report["event_vocabulary"]["view"] == 5


def test_cli_bad_line_is_an_error_the_cli_maps_to_exit_2(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    src.write_text("session_id,ts,item_id,event_type\na,yesterday,1,view\n")
    args = _parser().parse_args(["ingest", str(src), "--out", str(tmp_path / "out")])
    with pytest.raises(BadLineError, match="line 2: field 'ts'"):
        args.func(args)


def test_recd_main_maps_a_bad_line_to_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from recd.cli import main

    src = tmp_path / "events.csv"
    src.write_text("session_id,ts,item_id,event_type\na,1700000000000,1,view\na,soon,2,view\n")
    assert main(["logs", "ingest", str(src), "--out", str(tmp_path / "out")]) == 2
    assert "events.csv: line 3: field 'ts': cannot parse 'soon'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert (
        main(
            [
                "logs",
                "ingest",
                str(src),
                "--out",
                str(tmp_path / "out"),
                "--on-bad-rows",
                "quarantine",
            ]
        )
        == 0
    )
    assert (tmp_path / "out" / QUARANTINE_FILE).read_text().count("\n") == 1
