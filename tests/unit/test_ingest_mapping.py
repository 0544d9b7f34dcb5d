"""Ingest with a column mapping: CSV, JSON Lines and Parquet with custom column names, label
columns, dense and sparse features, item-less events in the history, streaming by buckets,
the constant-label warning and one-line errors for a bad mapping."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recd.cli import main
from recd.errors import BadLineError
from recd.logs import rawlog
from recd.logs.hashing import hash_strings
from recd.logs.ingest import QUARANTINE_FILE, ingest_events
from recd.logs.ingest_mapping import IngestMapping

CSV = """\
sid,when,product,kind,clicked,bought,price,cat,tags
u1,1000,10,view,0,false,1.5,7,1|2
u2,1500,20,view,1,true,2.5,8,
u1,2000,,search,,,,,
u1,3000,11,view,1,false,3.0,7,[3]
u2,4000,21,cart,0,FALSE,4.0,,2|5
"""
MAPPING = IngestMapping(
    session="sid",
    ts="when",
    ts_unit="ms",
    item="product",
    event="kind",
    labels=["clicked", "bought"],
    dense=["price"],
    sparse=["cat"],
    sparse_lists=["tags"],
    history=3,
    keep_itemless=True,
    itemless_item_id=0,
)
# vocabulary by sorted name: cart=1, search=2, view=3. The search (line 4) is history only.
# (line, session, ts, clicked, bought, hist_len, secs, price, item, hist items, hist types,
#  cat, tags), in arrival order
GOLDEN = [
    (2, "u1", 1000, 0, 0, 0, 0.0, 1.5, 10, [], [], [7], [1, 2]),
    (3, "u2", 1500, 1, 1, 0, 0.0, 2.5, 20, [], [], [8], []),
    (5, "u1", 3000, 1, 0, 2, 1.0, 3.0, 11, [10, 0], [3, 2], [7], [3]),
    (6, "u2", 4000, 0, 0, 1, 2.5, 4.0, 21, [20], [3], [], [2, 5]),
]
JSONL = [
    {"sid": "u1", "when": 1000, "product": 10, "kind": "view", "clicked": 0, "bought": False,
     "price": 1.5, "cat": 7, "tags": [1, 2]},
    {"sid": "u2", "when": 1500, "product": 20, "kind": "view", "clicked": 1, "bought": True,
     "price": 2.5, "cat": 8, "tags": []},
    {"sid": "u1", "when": 2000, "product": None, "kind": "search"},
    {"sid": "u1", "when": 3000, "product": 11, "kind": "view", "clicked": 1, "bought": False,
     "price": 3.0, "cat": 7, "tags": [3]},
    {"sid": "u2", "when": 4000, "product": 21, "kind": "cart", "clicked": 0, "bought": False,
     "price": 4.0, "cat": None, "tags": [2, 5]},
]  # fmt: skip


def _rows(out: Path) -> list[dict]:
    batches = [b for _, _, b in rawlog.iter_raw_log(out)]
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def _want(line_offset: int = 0) -> list[dict]:
    def sid(name: str) -> int:
        return int(hash_strings(pa.array([name]))[0])

    return [
        {
            "session_id": sid(s),
            "request_id": line + line_offset,
            "ts": ts,
            "clicked": float(clicked),
            "bought": float(bought),
            "hist_len": float(hist_len),
            "secs_since_prev_event": secs,
            "price": price,
            "item_id": [item],
            "hist_item_ids": items,
            "hist_event_types": types,
            "cat": cat,
            "tags": tags,
        }
        for line, s, ts, clicked, bought, hist_len, secs, price, item, items, types, cat, tags in (
            GOLDEN
        )
    ]


def test_csv_with_a_mapping_golden(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    src.write_text(CSV)
    report = ingest_events(src, tmp_path / "out", mapping=MAPPING, show_progress=False)
    assert (report.rows_in, report.rows_out, report.history_only) == (5, 4, 1)
    assert report.event_vocabulary == {"cart": 1, "search": 2, "view": 3}
    assert report.labels == ["clicked", "bought"] and report.positive_events == []
    assert _rows(tmp_path / "out") == _want()
    catalogue = rawlog.read_catalogue(tmp_path / "out")
    assert catalogue.labels == ["clicked", "bought"]
    assert catalogue.dense_names == ["hist_len", "secs_since_prev_event", "price"]
    assert catalogue.sparse_names == [
        "item_id",
        "hist_item_ids",
        "hist_event_types",
        "cat",
        "tags",
    ]
    # measured, not generator constants
    assert catalogue.sparse_feature("item_id").cardinality == 22
    assert catalogue.sparse_feature("tags").cardinality == 6
    assert catalogue.sparse_feature("tags").max_length == 2
    assert catalogue.sparse_feature("hist_event_types").cardinality == 4
    assert catalogue.sessions.num_sessions == 2 and catalogue.sessions.max_samples == 2
    assert catalogue.sessions.mean_gap_s == pytest.approx((2.0 + 2.5) / 2)
    assert catalogue.sessions.servers == 1 and catalogue.sessions.duration_s == 3
    assert catalogue.sessions.label_rate == pytest.approx(0.5)


def test_jsonl_and_parquet_give_the_csv_rows(tmp_path: Path) -> None:
    jsonl = tmp_path / "events.jsonl"
    jsonl.write_text("".join(json.dumps(e) + "\n" for e in JSONL))
    ingest_events(jsonl, tmp_path / "j", mapping=MAPPING, show_progress=False)
    assert _rows(tmp_path / "j") == _want(line_offset=-1)  # no header line

    table = pa.Table.from_pylist(
        JSONL,
        schema=pa.schema(
            [
                ("sid", pa.string()),
                ("when", pa.int64()),
                ("product", pa.int64()),
                ("kind", pa.string()),
                ("clicked", pa.int8()),
                ("bought", pa.bool_()),
                ("price", pa.float64()),
                ("cat", pa.int32()),
                ("tags", pa.list_(pa.int64())),
            ]
        ),
    )
    pq.write_table(table, tmp_path / "events.parquet", row_group_size=2)
    report = ingest_events(
        tmp_path / "events.parquet", tmp_path / "p", mapping=MAPPING, show_progress=False
    )
    assert report.format == "parquet"
    assert _rows(tmp_path / "p") == _want(line_offset=-1)  # "line" = row number


def test_itemless_events_are_bad_lines_unless_kept(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    src.write_text(CSV)
    plain = IngestMapping(**{**MAPPING.to_dict(), "keep_itemless": False})
    report = ingest_events(
        src, tmp_path / "out", mapping=plain, on_bad_rows="quarantine", show_progress=False
    )
    assert (report.rows_out, report.history_only, report.quarantined) == (4, 0, 1)
    bad = json.loads((tmp_path / "out" / QUARANTINE_FILE).read_text())
    assert (bad["line"], bad["field"], bad["reason"]) == (4, "product", "missing value")
    assert bad["text"] == "u1,2000,,search,,,,,"
    rows = {r["request_id"]: r for r in _rows(tmp_path / "out")}
    assert rows[5]["hist_item_ids"] == [10] and rows[5]["hist_len"] == 1.0


def test_bad_feature_values_name_line_and_column(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    src.write_text(CSV.replace("u1,3000,11,view,1,false,3.0,7,[3]", "u1,3000,11,view,1,no,x,7,a"))
    with pytest.raises(BadLineError) as info:
        ingest_events(src, tmp_path / "out", mapping=MAPPING, show_progress=False)
    assert "line 5: field 'bought': cannot parse 'no' as a number or true/false" in str(info.value)
    report = ingest_events(
        src, tmp_path / "out", mapping=MAPPING, on_bad_rows="quarantine", show_progress=False
    )
    assert report.quarantined == 1 and report.rows_out == 3  # one record per line


def test_constant_label_is_one_logged_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = tmp_path / "events.csv"
    src.write_text(CSV)
    with caplog.at_level(logging.WARNING, logger="recd.logs.ingest"):
        report = ingest_events(
            src,
            tmp_path / "out",
            mapping=IngestMapping(
                session="sid", ts="when", item="product", event="kind", positive_events=["buy"]
            ),
            on_bad_rows="quarantine",
            show_progress=False,
        )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert report.warnings == warnings
    warnings = _not_dated(warnings)
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith("label 'label' is 0 on all 4 samples")
    assert "--positive-events (buy)" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="recd.logs.ingest"):
        ingest_events(src, tmp_path / "out", mapping=MAPPING, show_progress=False)
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert not _not_dated(logged)  # both labels vary


def _not_dated(warnings: list[str]) -> list[str]:
    """The warnings other than the one of a log dated before 1990 (CSV's times are small
    numbers: January 1970)."""
    return [w for w in warnings if not w.startswith("every timestamp")]


def _big_csv(path: Path, rows: int, *, seed: int = 0) -> None:
    """~30 bytes per line, 4,000 interleaved sessions, a few bad and item-less lines."""
    rng = np.random.default_rng(seed)
    session = rng.integers(0, 4000, size=rows)
    ts = 1_700_000_000_000 + np.sort(rng.integers(0, 3_600_000, size=rows))
    item = rng.integers(0, 50_000, size=rows).astype(str).astype(object)
    item[rng.random(rows) < 0.05] = ""  # searches
    kind = np.array(["view", "cart", "search"], dtype=object)[rng.integers(0, 3, size=rows)]
    lines = [f"s{s},{t},{i},{k}" for s, t, i, k in zip(session, ts, item, kind, strict=True)]
    for bad in rng.choice(rows, size=20, replace=False):
        lines[bad] = f"s1,{ts[bad]},oops,view"
    path.write_text("session_id,ts,item_id,event_type\n" + "\n".join(lines) + "\n")


def test_streaming_by_buckets_writes_what_one_bucket_writes(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    _big_csv(src, 110_000)
    assert src.stat().st_size > 3 << 20
    mapping = IngestMapping(keep_itemless=True, itemless_item_id=0, history=5)
    small, large = (
        ingest_events(
            src,
            tmp_path / name,
            mapping=mapping,
            on_bad_rows="quarantine",
            memory_budget_bytes=budget << 20,
            show_progress=False,
        )
        for name, budget in (("small", 16), ("large", 512))
    )
    assert small.buckets > 1 and large.buckets == 1
    assert (small.rows_out, small.history_only, small.quarantined) == (
        large.rows_out,
        large.history_only,
        large.quarantined,
    )
    assert small.quarantined == 20 and small.event_vocabulary == large.event_vocabulary
    rows_small = pa.Table.from_batches([b for _, _, b in rawlog.iter_raw_log(tmp_path / "small")])
    rows_large = pa.Table.from_batches([b for _, _, b in rawlog.iter_raw_log(tmp_path / "large")])
    assert rows_small.equals(rows_large)
    assert (tmp_path / "small" / QUARANTINE_FILE).read_text() == (
        tmp_path / "large" / QUARANTINE_FILE
    ).read_text()


def _ingest_main(*args: str) -> int:
    return main(["logs", "ingest", *args])


def test_cli_mapping_file_and_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "events.csv"
    src.write_text(CSV)
    mapping = tmp_path / "mapping.toml"
    mapping.write_text(
        'session = "sid"\nts = "when"\nts_unit = "ms"\nitem = "product"\nevent = "kind"\n'
        'labels = ["clicked", "bought"]\ndense = ["price"]\nsparse = ["cat"]\n'
        'sparse_lists = ["tags"]\nhistory = 5\nkeep_itemless = true\n'
    )
    out = tmp_path / "out"
    assert (
        _ingest_main(str(src), "--out", str(out), "--mapping", str(mapping), "--history", "3") == 0
    )
    assert "history-only 1" in capsys.readouterr().out
    assert _rows(out) == _want()  # --history 3 overrides the file's 5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('sesion = "sid"\n', "[mapping] unknown key(s) sesion; expected session,"),
        ('history = "ten"\n', "[mapping] history = 'ten': expected `int`, got `str`"),
        ('dense = ["a b"]\n', "mapping.dense: column 'a b' cannot be a feature name"),
        (
            'labels = ["c"]\npositive_events = ["cart"]\n',
            "give either labels (label columns) or positive_events",
        ),
    ],
)
def test_bad_mapping_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    src = tmp_path / "events.csv"
    src.write_text(CSV)
    mapping = tmp_path / "mapping.toml"
    mapping.write_text(text)
    assert _ingest_main(str(src), "--out", str(tmp_path / "out"), "--mapping", str(mapping)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert str(mapping) in err or "mapping." in err
    assert not (tmp_path / "out").exists()


def test_a_log_sparse_in_time_gets_one_line_suggesting_day_partitions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Months of a small log (MovieLens-like) would make thousands of tiny hourly
    partitions: ingest says so once and names the day granularity; a dense hour does not."""
    rng = np.random.default_rng(3)
    n = 2000
    ts = np.sort(rng.integers(0, 90 * 86_400, size=n)) + 1_700_000_000  # 90 days, seconds
    src = tmp_path / "ratings.csv"
    lines = ["user,ts,movie,kind"]
    lines += [f"{i % 97},{t},{i % 500},{'view' if i % 3 else 'cart'}" for i, t in enumerate(ts)]
    src.write_text("\n".join(lines) + "\n")
    mapping = IngestMapping(session="user", ts="ts", ts_unit="s", item="movie", event="kind")
    with caplog.at_level(logging.WARNING, logger="recd.logs.ingest"):
        report = ingest_events(src, tmp_path / "out", mapping=mapping, show_progress=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings == report.warnings
    assert warnings[0].startswith("2,000 samples over 2,1")
    assert "--partition-by day" in warnings[0] and "\n" not in warnings[0]
    caplog.clear()
    src.write_text(CSV)
    with caplog.at_level(logging.WARNING, logger="recd.logs.ingest"):
        ingest_events(src, tmp_path / "out2", mapping=MAPPING, show_progress=False)
    assert not _not_dated([r.getMessage() for r in caplog.records if r.levelno == logging.WARNING])
