"""Ingest of impression logs: a request scores several candidates, one sample each.

Both shapes a user has (one row per request with a candidate list and parallel lists; one row
per candidate with a request key), histories built from interaction events and declared by
the user, the catalogue they produce, and the bad inputs of each shape. Real files, the real
CLI where the exit code matters.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recd.cli import main
from recd.errors import BadLineError, ConfigError
from recd.logs import rawlog
from recd.logs.hashing import hash_strings
from recd.logs.ingest import QUARANTINE_FILE, ingest_events
from recd.logs.ingest_mapping import IngestMapping
from recd.models import dlrm_config, rm1_config
from recd.schema import DenseKind, SparseKind

# Two sessions; rows without candidates are interactions (b's search has no item).
REQUEST_ROWS = """\
session_id,timestamp,action_type,reference,platform,impressions,prices,filters
a,100,image,11,3,,,
a,110,info,12,3,,,
a,120,clickout,12,3,11|12|13,100|120|90,7|8
b,105,clickout,21,4,21|22,50|60,
a,130,image,13,3,,,
a,140,clickout,13,3,13|11,90|100,
b,150,search,,4,,,
b,160,clickout,,4,22|23|24,60|70|80,9
"""
REQUEST_MAPPING = {
    "session": "session_id",
    "ts": "timestamp",
    "item": "reference",
    "event": "action_type",
    "candidates": "impressions",
    "candidate_dense": ["prices"],
    "clicked": "reference",
    "sparse": ["platform"],
    "sparse_lists": ["filters"],
    "history": 3,
    "keep_itemless": True,
}
# event types by sorted name: clickout=1, image=2, info=3, search=4
# (session, line = request_id, ts, [(item, label, price)], hist items, hist types, secs since
# the session's previous event, platform, filters), in arrival (ts, request_id) order
GOLDEN = [
    ("b", 5, 105, [(21, 1, 50), (22, 0, 60)], [], [], 0.0, 4, []),
    ("a", 4, 120, [(11, 0, 100), (12, 1, 120), (13, 0, 90)], [11, 12], [2, 3], 10.0, 3, [7, 8]),
    ("a", 7, 140, [(13, 1, 90), (11, 0, 100)], [12, 12, 13], [3, 1, 2], 10.0, 3, []),
    ("b", 9, 160, [(22, 0, 60), (23, 0, 70), (24, 0, 80)], [21, 0], [1, 4], 10.0, 4, [9]),
]


def _rows(out: Path) -> list[dict]:
    batches = [b for _, _, b in rawlog.iter_raw_log(out)]
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def _session(name: str) -> int:
    return int(hash_strings(pa.array([name]))[0])


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _expected(golden: list[tuple]) -> list[dict]:
    """The hand-built candidate rows of ``golden``'s requests."""
    out = []
    for session, line, ts, candidates, items, types, secs, platform, filters in golden:
        for place, (item, label, price) in enumerate(candidates):
            out.append(
                {
                    "session_id": _session(session),
                    "request_id": line,
                    "ts": ts * 1000,
                    "label": float(label),
                    "hist_len": float(len(items)),
                    "secs_since_prev_event": secs,
                    "prices": float(price),
                    "position": float(place),
                    "item_id": [item],
                    "hist_item_ids": items,
                    "hist_event_types": types,
                    "platform": [platform],
                    "filters": filters,
                }
            )
    return out


def test_request_rows_explode_into_hand_built_candidate_rows(tmp_path: Path) -> None:
    src = _write(tmp_path, "requests.csv", REQUEST_ROWS)
    mapping = IngestMapping.from_dict(REQUEST_MAPPING)
    report = ingest_events(src, tmp_path / "out", mapping=mapping, show_progress=False)
    assert _rows(tmp_path / "out") == _expected(GOLDEN)
    assert (report.rows_in, report.rows_out, report.requests) == (8, 10, 4)
    assert (report.sample_rows, report.history_only, report.quarantined) == (4, 4, 0)
    assert report.positives == 3 and report.sessions == 2
    assert report.event_vocabulary == {"clickout": 1, "image": 2, "info": 3, "search": 4}
    assert "clicked item" in report.to_dict()["label"]


def test_the_catalogue_of_an_impression_log(tmp_path: Path) -> None:
    src = _write(tmp_path, "requests.csv", REQUEST_ROWS)
    mapping = IngestMapping.from_dict(REQUEST_MAPPING)
    ingest_events(src, tmp_path / "out", mapping=mapping, show_progress=False)
    catalogue = rawlog.read_catalogue(tmp_path / "out")
    kinds = {f.name: (f.kind, f.group) for f in catalogue.sparse}
    assert kinds == {
        "item_id": (SparseKind.ITEM, None),
        "hist_item_ids": (SparseKind.HISTORY, "history"),
        "hist_event_types": (SparseKind.HISTORY, "history"),
        "platform": (SparseKind.STATIC, None),
        "filters": (SparseKind.STATIC, None),
    }
    dense = {f.name: f.kind for f in catalogue.dense}
    assert dense == {
        "hist_len": DenseKind.REQUEST,
        "secs_since_prev_event": DenseKind.REQUEST,
        "prices": DenseKind.CANDIDATE,
        "position": DenseKind.POSITION,
    }
    sessions = catalogue.sessions
    assert sessions.candidates_per_request == pytest.approx(10 / 4)
    assert sessions.max_candidates == 3 and sessions.max_samples == 5
    # 8 adjacent sample pairs of a session, 6 of them inside a request, where the history is
    # the same (a: 11,12,13 | 13,11; b: 21,22 | 22,23,24)
    history = catalogue.sparse_feature("hist_item_ids")
    assert history.unchanged_prob == pytest.approx(6 / 8)
    assert sessions.mean_gap_s == pytest.approx((20 + 55) / 2)  # a: 120 -> 140, b: 105 -> 160
    assert sessions.repeat_list_prob == 0.0  # no session shows one list twice


def test_both_shapes_of_one_log_write_the_same_samples(tmp_path: Path) -> None:
    """The log of ``REQUEST_ROWS`` with one row per candidate: the clickouts' own events are
    interaction rows after their requests' candidate rows (so that they feed later histories
    only), the labels a column."""
    candidate_rows = """\
session_id,timestamp,action_type,reference,platform,request,prices,label,filters
a,100,image,11,3,,,,
a,110,info,12,3,,,,
a,120,clickout,11,3,q1,100,0,7|8
a,120,clickout,12,3,q1,120,1,7|8
a,120,clickout,13,3,q1,90,0,7|8
a,120,clickout,12,3,,,,
b,105,clickout,21,4,q2,50,1,
b,105,clickout,22,4,q2,60,0,
b,105,clickout,21,4,,,,
a,130,image,13,3,,,,
a,140,clickout,13,3,q3,90,1,
a,140,clickout,11,3,q3,100,0,
a,140,clickout,13,3,,,,
b,150,search,,4,,,,
b,160,clickout,22,4,q4,60,0,9
b,160,clickout,23,4,q4,70,0,9
b,160,clickout,24,4,q4,80,0,9
"""
    src = _write(tmp_path, "candidates.csv", candidate_rows)
    mapping = IngestMapping.from_dict(
        {
            **{k: REQUEST_MAPPING[k] for k in ("session", "ts", "item", "event", "history")},
            "request": "request",
            "labels": ["label"],
            "dense": ["prices"],
            "sparse": ["platform"],
            "sparse_lists": ["filters"],
            "keep_itemless": True,
        }
    )
    report = ingest_events(src, tmp_path / "out", mapping=mapping, show_progress=False)
    assert (report.rows_in, report.rows_out, report.requests, report.history_only) == (
        17,
        10,
        4,
        7,
    )
    rows = _rows(tmp_path / "out")
    by_request: dict[int, set[int]] = {}
    for row in rows:
        by_request.setdefault(row.pop("request_id"), set()).add(row["ts"])
    assert len(by_request) == 4 and all(len(ts) == 1 for ts in by_request.values())
    keys = {int(k) for k in hash_strings(pa.array(["q1", "q2", "q3", "q4"]))}
    assert set(by_request) == keys  # string keys: their stable hashes
    expected = _expected(GOLDEN)
    for row in expected:
        del row["request_id"]
    assert rows == expected


def test_json_lines_and_parquet_lists_are_lists(tmp_path: Path) -> None:
    """Candidates and parallel lists as real JSON / Parquet lists give what CSV gives."""
    csv_out = tmp_path / "csv"
    mapping = IngestMapping.from_dict(REQUEST_MAPPING)
    ingest_events(
        _write(tmp_path, "r.csv", REQUEST_ROWS), csv_out, mapping=mapping, show_progress=False
    )
    records = []
    for text in REQUEST_ROWS.splitlines()[1:]:
        s, ts, event, ref, platform, imps, prices, filters = text.split(",")
        records.append(
            {
                "session_id": s,
                "timestamp": int(ts),
                "action_type": event,
                "reference": int(ref) if ref else None,
                "platform": int(platform),
                "impressions": [int(x) for x in imps.split("|")] if imps else [],
                "prices": [float(x) for x in prices.split("|")] if prices else None,
                "filters": [int(x) for x in filters.split("|")] if filters else [],
            }
        )
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    ingest_events(jsonl, tmp_path / "jsonl", mapping=mapping, show_progress=False)
    # JSON line n is CSV line n + 1 (the header): the request ids differ by one
    want = _rows(csv_out)
    for row in want:
        row["request_id"] -= 1
    assert _rows(tmp_path / "jsonl") == want
    parquet = tmp_path / "r.parquet"
    pq.write_table(pa.Table.from_pylist(records), parquet)
    ingest_events(parquet, tmp_path / "parquet", mapping=mapping, show_progress=False)
    assert _rows(tmp_path / "parquet") == want


def test_declared_histories_are_history_groups_the_models_read(tmp_path: Path) -> None:
    """History columns the log already has (``histories``) are catalogued as histories of
    their group: ``rm1`` pools each group with one transformer, ``dlrm`` sum-pools them."""
    text = """\
sid,ts,request,item,click,past_items,past_types,tags
1,10,7,5,1,1|2|3,4|4|5,9
1,10,7,6,0,1|2|3,4|4|5,9
1,20,8,5,0,1|2|3|6,4|4|5|6,9
2,15,9,8,1,,,1|2
"""
    src = _write(tmp_path, "c.csv", text)
    mapping = IngestMapping.from_dict(
        {
            "session": "sid",
            "item": "item",
            "event": "",
            "request": "request",
            "labels": ["click"],
            "histories": {"past": ["past_items", "past_types"]},
            "sparse_lists": ["tags"],
            "history": 0,
        }
    )
    ingest_events(src, tmp_path / "out", mapping=mapping, show_progress=False)
    catalogue = rawlog.read_catalogue(tmp_path / "out")
    past = [f for f in catalogue.sparse if f.group == "past"]
    assert [f.name for f in past] == ["past_items", "past_types"]
    assert all(f.kind is SparseKind.HISTORY and f.max_length == 4 for f in past)
    assert "hist_item_ids" not in catalogue.sparse_names
    assert rm1_config(catalogue).sequence_groups == [["past_items", "past_types"]]
    pooled = dlrm_config(catalogue)
    assert pooled.sequence_groups == [] and {"past_items", "past_types"} <= set(
        pooled.num_embeddings
    )
    rows = _rows(tmp_path / "out")
    assert [r["request_id"] for r in rows] == [7, 7, 9, 8]  # integer keys as they are
    assert [r["past_items"] for r in rows] == [[1, 2, 3], [1, 2, 3], [], [1, 2, 3, 6]]
    assert [r["position"] for r in rows] == [0.0, 1.0, 0.0, 0.0]


def test_streaming_by_buckets_writes_what_one_bucket_writes(tmp_path: Path) -> None:
    lines = [REQUEST_ROWS.splitlines()[0]]
    for s in range(30_000):  # requests of 3 and 2 candidates after an interaction
        base = 1_700_000_000 + s
        lines.append(f"s{s},{base},image,{s % 97},1,,,")
        lines.append(f"s{s},{base + 5},clickout,{s % 89},2,{s % 89}|5|6,1|2|3,{s % 7}")
        lines.append(f"s{s},{base + 9},clickout,,2,7|8,4|5,")
    src = _write(tmp_path, "big.csv", "\n".join(lines) + "\n")
    assert src.stat().st_size > 2 << 20  # several buckets at a 16 MiB budget
    mapping = IngestMapping.from_dict(REQUEST_MAPPING)
    small = ingest_events(
        src, tmp_path / "small", mapping=mapping, memory_budget_bytes=16 << 20, show_progress=False
    )
    large = ingest_events(src, tmp_path / "large", mapping=mapping, show_progress=False)
    assert small.buckets > 1 and large.buckets == 1
    assert small.rows_out == large.rows_out == 30_000 * 5
    assert _rows(tmp_path / "small") == _rows(tmp_path / "large")


def test_the_event_column_is_optional_with_label_columns(tmp_path: Path) -> None:
    text = "sid,ts,item,clicked\n1,10,5,1\n1,20,6,0\n2,15,7,0\n"
    src = _write(tmp_path, "e.csv", text)
    report = ingest_events(
        src,
        tmp_path / "out",
        mapping=IngestMapping(session="sid", item="item", event="", labels=["clicked"]),
        show_progress=False,
    )
    assert report.event_vocabulary == {} and report.rows_out == 3
    catalogue = rawlog.read_catalogue(tmp_path / "out")
    assert "hist_event_types" not in catalogue.sparse_names
    rows = _rows(tmp_path / "out")
    assert [r["hist_item_ids"] for r in rows] == [[], [], [5]]
    with pytest.raises(ConfigError, match=r"mapping\.event"):
        IngestMapping(event="")  # labels from event types need the event column


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"clicked": "x"}, "need mapping.candidates"),
        ({"candidates": "c"}, "candidate_labels .* or clicked"),
        ({"candidates": "c", "clicked": "x", "candidate_labels": ["y"]}, "not both"),
        ({"candidates": "c", "clicked": "x", "positive_events": ["buy"]}, "request-level"),
        ({"candidates": "c", "clicked": "x", "item": ""}, "mapping.history: histories"),
        ({"request": "r", "dense": ["position"]}, "mapping.position"),
        ({"histories": {"history": ["h"]}}, "group of the history"),
        ({"histories": {"g": ["item_id"]}}, "ingest writes itself"),
    ],
)
def test_bad_impression_mappings_are_one_line_config_errors(keys: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        IngestMapping.from_dict(keys)


BAD_REQUEST_ROWS = [
    # (a data line of REQUEST_ROWS' columns, field named, words of the problem)
    ("a,120,clickout,12,3,11|12|13,100|120,", "prices", "2 values for 3 candidates"),
    ("a,120,clickout,14,3,11|12|13,100|120|90,", "reference", "clicked item 14 is not among"),
    ("a,120,clickout,,3,,,", "impressions", "empty candidate list and no reference"),
    ("a,120,clickout,12,3,11|x|13,100|120|90,", "impressions", "list of integer ids"),
    ("a,120,clickout,12,3,11|12,100|cheap,", "prices", "list of numbers"),
]


@pytest.mark.parametrize(("line", "field", "problem"), BAD_REQUEST_ROWS)
def test_bad_request_rows_exit_2_naming_file_line_and_column(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    line: str,
    field: str,
    problem: str,
) -> None:
    header, first = REQUEST_ROWS.splitlines()[:2]
    src = _write(tmp_path, "bad.csv", f"{header}\n{first}\n{line}\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("the user's")
    mapping = tmp_path / "m.toml"
    mapping.write_text(
        "\n".join(
            f"{k} = {json.dumps(v)}" for k, v in {**REQUEST_MAPPING, "keep_itemless": False}.items()
        )
    )
    code = main(["logs", "ingest", str(src), "--out", str(out), "--mapping", str(mapping)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{src}: line 3: field '{field}'" in err and problem in err, err
    assert [p.name for p in out.iterdir()] == ["keep"]  # the output is untouched
    with pytest.raises(BadLineError):
        ingest_events(
            src,
            tmp_path / "other",
            mapping=IngestMapping.from_toml(mapping),
            show_progress=False,
        )


def test_empty_candidate_list_without_an_item_column_is_a_bad_row(tmp_path: Path) -> None:
    src = _write(tmp_path, "r.csv", "sid,ts,c,clicked\n1,10,5|6,6\n1,20,,\n")
    mapping = IngestMapping(
        session="sid", item="", event="", candidates="c", clicked="clicked", history=0
    )
    with pytest.raises(BadLineError, match="line 3: field 'c': empty candidate list"):
        ingest_events(src, tmp_path / "out", mapping=mapping, show_progress=False)


def test_a_request_key_of_two_sessions_is_quarantined(tmp_path: Path) -> None:
    text = "sid,ts,request,item,click\n1,10,r1,5,1\n1,10,r1,6,0\n2,11,r1,7,1\n2,12,r2,8,0\n"
    src = _write(tmp_path, "c.csv", text)
    mapping = IngestMapping(
        session="sid", item="item", event="", request="request", labels=["click"], history=0
    )
    report = ingest_events(
        src, tmp_path / "out", mapping=mapping, on_bad_rows="quarantine", show_progress=False
    )
    assert (report.rows_in, report.rows_out, report.quarantined) == (4, 3, 1)
    (bad,) = [json.loads(x) for x in (tmp_path / "out" / QUARANTINE_FILE).read_text().splitlines()]
    assert bad["line"] == 4 and bad["field"] == "request"
    assert "used by another session" in bad["reason"]


def test_the_catalogue_measures_how_often_a_session_repeats_a_list(tmp_path: Path) -> None:
    text = "sid,ts,c,clicked\n1,10,5|6,5\n1,20,5|6,6\n1,30,7|5,\n2,15,5|6,\n2,25,5|6,5\n"
    src = _write(tmp_path, "r.csv", text)
    mapping = IngestMapping(
        session="sid", item="", event="", candidates="c", clicked="clicked", history=0
    )
    ingest_events(src, tmp_path / "out", mapping=mapping, show_progress=False)
    sessions = rawlog.read_catalogue(tmp_path / "out").sessions
    assert sessions.repeat_list_prob == pytest.approx(2 / 3)  # 1: same, other; 2: same
