"""Per-column encodings: the rule on measured statistics, and the measurement itself."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recd.etl.encodings import (
    BYTE_STREAM_SPLIT,
    DELTA,
    DICTIONARY,
    PLAIN,
    column_statistics,
    leaf_path,
    measure_encodings,
    plan_encodings,
)
from recd.schema import REQUEST_ID, SESSION_ID, TS, Catalogue

from .etl_shards import make_rows


def clustered(table: pa.Table) -> pa.Table:
    return table.sort_by([(SESSION_ID, "ascending"), (TS, "ascending"), (REQUEST_ID, "ascending")])


def test_statistics_and_leaf_paths(tiny_catalogue: Catalogue) -> None:
    table = make_rows(tiny_catalogue, num_sessions=50, seed=2)
    stats = {s.column: s for s in column_statistics(table)}
    assert stats[REQUEST_ID].distinct_ratio == 1.0
    assert stats[SESSION_ID].distinct == 50
    assert stats["user_country"].leaf_path == "user_country.list.element"
    assert stats["user_country"].kind == "list" and stats["label"].kind == "float"
    assert leaf_path(table.schema.field(TS)) == TS


def test_rule_dictionary_for_small_scattered_alphabets_never_for_unique_values() -> None:
    rng = np.random.default_rng(0)
    n = 20_000
    table = pa.table(
        {
            "unique_id": pa.array(rng.permutation(n).astype(np.int64) * 7919),
            "category": pa.array(rng.integers(0, 30, n) * 1_000_003),  # 30 values, scattered
            "sorted_ts": pa.array(np.cumsum(rng.integers(1, 50, n))),
            "price": pa.array(rng.lognormal(0, 1, n).astype(np.float32)),
        }
    )
    auto = plan_encodings(table).describe()
    assert auto["category"] == DICTIONARY
    assert auto["unique_id"] != DICTIONARY
    assert auto["sorted_ts"] == DELTA
    assert auto["price"] in (PLAIN, BYTE_STREAM_SPLIT)
    assert set(plan_encodings(table, mode="all").describe().values()) == {DICTIONARY}
    assert DICTIONARY not in plan_encodings(table, mode="none").describe().values()


def test_plan_is_applied_by_the_writer(tiny_catalogue: Catalogue) -> None:
    table = clustered(make_rows(tiny_catalogue, num_sessions=80, seed=4))
    plan = plan_encodings(table)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", **plan.writer_options())
    meta = pq.read_metadata(pa.py_buffer(sink.getvalue())).row_group(0)
    chosen = plan.describe()
    for i in range(meta.num_columns):
        chunk = meta.column(i)
        name = chunk.path_in_schema.split(".")[0]
        assert chunk.has_dictionary_page == (chosen[name] == DICTIONARY), name
        assert chosen[name] in chunk.encodings or chosen[name] == DICTIONARY


def test_measure_encodings_reports_every_column_and_auto_beats_none_and_all(
    tiny_catalogue: Catalogue,
) -> None:
    table = clustered(make_rows(tiny_catalogue, num_sessions=120, seed=5))
    measured = measure_encodings(table, row_group_rows=1024)
    totals = measured.pop("_total")
    assert set(measured) == set(table.column_names)
    for column, row in measured.items():
        assert row[DICTIONARY] > 0 and row[PLAIN] > 0, column
        assert row["auto"] in row and row["best"] in row
    # auto chooses per column among none's candidates (+ dictionary), on the same bytes.
    assert totals["best_per_column"] <= totals["auto"] <= totals["none"]
    assert totals["auto"] < totals["all"]
