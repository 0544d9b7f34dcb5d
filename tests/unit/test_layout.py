"""The dedup table layout's encoding (recd.table.layout): exact round trips, the documented example,
corrupt files, plain readers not misled."""

from __future__ import annotations

import doctest
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recd.errors import BadRowError, SchemaError
from recd.table.layout import (
    LAYOUT_METADATA_KEY,
    choose_encoded,
    dedup_schema,
    encode_row_group,
    layout_of,
    stored_fractions,
)
from recd.tensors.stacked import decode_table, read_plain, stack_unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "layout.md"
LIST = pa.list_(pa.int64())


def test_the_worked_example_in_the_docs_runs() -> None:
    text = DOC.read_text()
    test = doctest.DocTestParser().get_doctest(text, {}, str(DOC), str(DOC), 0)
    assert len(test.examples) >= 6, "the worked example lost its checks"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0 and result.attempted == len(test.examples)


def random_sessions(rng: np.random.Generator, rows: int) -> pa.Table:
    """Sessions mixing every case: repeats, sliding and growing histories, fresh values,
    empty lists, A-B-A, shrinking lists, two ids appended at once, long jumps."""
    session, history, static = [], [], []
    s = 0
    while len(session) < rows:
        s += int(rng.integers(1, 5))
        n = int(rng.integers(1, 12))
        hist = list(rng.integers(0, 50, size=int(rng.integers(0, 4))))
        value = list(rng.integers(0, 5, size=int(rng.integers(0, 3))))
        previous = value
        for _ in range(n):
            event = rng.random()
            if event < 0.3:
                pass  # repeat
            elif event < 0.6:
                hist = (hist + list(rng.integers(0, 50, size=int(rng.integers(1, 3)))))[-6:]
            elif event < 0.7:
                hist = hist[1:]  # shrink
            elif event < 0.8:
                hist = list(rng.integers(0, 50, size=int(rng.integers(0, 7))))
            elif event < 0.9:
                hist = (hist + list(rng.integers(0, 50, size=9)))[-6:]  # a shift beyond MAX_SHIFT
            if rng.random() < 0.2:
                value, previous = previous, value  # A-B-A
            elif rng.random() < 0.2:
                previous, value = value, list(rng.integers(0, 5, size=int(rng.integers(0, 3))))
            session.append(s)
            history.append([int(x) for x in hist])
            static.append([int(x) for x in value])
    return pa.table(
        {
            "session_id": pa.array(session, pa.int64()),
            "history": pa.array(history, LIST),
            "static": pa.array(static, LIST),
        }
    )


@pytest.mark.parametrize("seed", range(5))
def test_every_row_group_round_trips_exactly(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = random_sessions(rng, 400)
    cuts = np.sort(rng.choice(np.arange(1, rows.num_rows), size=6, replace=False))
    for lo, hi in zip([0, *cuts], [*cuts, rows.num_rows], strict=True):
        group = rows.slice(lo, hi - lo)  # row groups cut sessions anywhere
        stored = encode_row_group(group, ["history", "static"])
        assert decode_table(stored, ["history", "static"]).equals(group)
        # whatever the cut, the first row of the group is stored whole
        for name in ("history", "static"):
            assert stored.column(f"{name}__new_ids")[0].as_py() == group.column(name)[0].as_py()
    fractions = stored_fractions(rows, ["history", "static"])
    assert 0 < fractions["history"] < 0.8 and 0 < fractions["static"] < 1


def test_a_fresh_list_on_every_row_is_not_chosen_by_default() -> None:
    n = 200
    rows = pa.table(
        {
            "session_id": pa.array(np.repeat(np.arange(20), 10), pa.int64()),
            "item": pa.array([[i] for i in range(n)], LIST),
            "user": pa.array([[s] for s in np.repeat(np.arange(20), 10)], LIST),
        }
    )
    layout, fractions = choose_encoded(rows, ["item", "user"], listed=False)
    assert layout.encoded == ("user",) and fractions["item"] == 1.0 and fractions["user"] == 0.1
    assert layout.groups == ()  # a group needs two features changing on the same rows
    assert choose_encoded(rows, ["item"], listed=True)[0].encoded == ("item",)


def write_dedup_file(path: Path, rows: pa.Table, features: list[str]) -> None:
    schema = dedup_schema(rows.schema, features)
    with pq.ParquetWriter(path, schema) as writer:
        for lo in range(0, rows.num_rows, 64):
            group = rows.slice(lo, 64)
            writer.write_table(encode_row_group(group, features, schema=schema))


def test_plain_readers_do_not_see_references_as_data(tmp_path: Path) -> None:
    rows = random_sessions(np.random.default_rng(7), 300)
    path = tmp_path / "part-00000.parquet"
    write_dedup_file(path, rows, ["history"])
    schema = pq.read_schema(path)
    assert LAYOUT_METADATA_KEY in schema.metadata
    assert layout_of(schema, source=str(path)).encoded == ("history",)
    with pytest.raises((KeyError, pa.ArrowInvalid)):
        pq.read_table(path, columns=["history"])  # no column holds references under f's name
    assert read_plain(str(path)).equals(rows)
    assert read_plain(str(path), ["history"]).equals(rows.select(["history"]))


def test_a_corrupt_start_fails_naming_file_row_and_column(tmp_path: Path) -> None:
    rows = random_sessions(np.random.default_rng(3), 64)
    stored = encode_row_group(rows, ["history"])
    starts = stored.column("history__start").to_numpy().copy()
    starts[5] += 1000  # past the end of its own ids
    i = stored.schema.get_field_index("history__start")
    bad = stored.set_column(i, "history__start", pa.array(starts, pa.int32()))
    with pytest.raises(BadRowError, match=r"f\.parquet: row 15: field 'history__start'"):
        stack_unit(bad, ["history"], ["history"], path="f.parquet", first_row=10)


def test_a_newer_layout_version_is_refused_with_an_upgrade_hint() -> None:
    schema = pa.schema(
        [pa.field("x", pa.int64())],
        metadata={LAYOUT_METADATA_KEY: b'{"layout": "dedup", "version": 99, "encoded": []}'},
    )
    with pytest.raises(SchemaError, match="upgrade recd"):
        layout_of(schema, source="f.parquet")


@pytest.mark.parametrize(("group_bytes", "chosen"), [(204, ["a", "b", "hist"]), (220, ["hist"])])
def test_synchronised_features_are_chosen_by_their_bytes_together(
    group_bytes: int, chosen: list[str]
) -> None:
    # a and b are session-constant (they change on the same rows): one group, decided as one
    # block by the group's bytes (at most 1.05 x their plain 200).
    sessions = np.repeat(np.arange(30), 8)
    rows = pa.table(
        {
            "session_id": pa.array(sessions, pa.int64()),
            "a": pa.array([[int(s)] for s in sessions], LIST),
            "b": pa.array([[int(s) + 1000] for s in sessions], LIST),
            "hist": pa.array([list(range(i % 8 + 1)) for i in range(240)], LIST),
        }
    )

    def sizes(table: pa.Table) -> dict[str, int]:
        if "a" in table.column_names:  # plain
            return {"a": 100, "b": 100, "hist": 1000}
        encoded = {"a__group_ids": group_bytes, "hist__new_ids": 100}
        return {
            c: encoded.get(c, 1000 if c.endswith("__new_ids") else 0) for c in table.column_names
        }

    layout, fractions = choose_encoded(rows, ["a", "b", "hist"], listed=False, sizes=sizes)
    assert list(layout.encoded) == chosen and set(fractions) == {"a", "b", "hist"}
    assert layout.groups == ((("a", "b"),) if "a" in chosen else ())


def test_groups_round_trip_exactly_and_store_repeats_as_empty_lists() -> None:
    rng = np.random.default_rng(11)
    rows = random_sessions(rng, 400)
    sessions = rows.column("session_id").to_numpy()
    user = pa.array([[int(s), int(s) * 3] for s in sessions], LIST)  # session-constant
    rows = rows.append_column("user", user)
    # any grouping is exact, also of features that change on different rows or slide
    for groups in ([["static", "user"]], [["history", "static", "user"]], [["user", "history"]]):
        features = ["history", "static", "user"]
        for lo, hi in ((0, 400), (37, 200), (5, 6)):
            group = rows.slice(lo, hi - lo)
            stored = encode_row_group(group, features, groups=groups)
            back = decode_table(stored, features, groups=groups)
            assert back.select(group.column_names).equals(group)
    stored = encode_row_group(rows, ["user", "static"], groups=[["user", "static"]])
    assert "user__group_ids" in stored.column_names and "static__start" not in stored.column_names
    lengths = stored.column("user__group_lengths").to_pylist()
    ids = stored.column("user__group_ids").to_pylist()
    static = rows.column("static").to_pylist()
    for i, (n, values) in enumerate(zip(lengths, ids, strict=True)):
        new_session = i == 0 or sessions[i] != sessions[i - 1]
        repeat = not new_session and static[i] == static[i - 1]
        assert (n == [] and values == []) == repeat, i  # a repeat stores nothing
        if not repeat:
            assert n == [2, len(static[i])] and values == [sessions[i], sessions[i] * 3, *static[i]]


def test_the_etl_groups_features_that_change_together_and_never_slide() -> None:
    sessions = np.repeat(np.arange(40), 6)
    rows = pa.table(
        {
            "session_id": pa.array(sessions, pa.int64()),
            "a": pa.array([[int(s)] for s in sessions], LIST),
            "b": pa.array([[int(s) % 7, 1] for s in sessions], LIST),
            "hist": pa.array([list(range(i % 6, i % 6 + 3)) for i in range(240)], LIST),
            "hist2": pa.array([list(range(i % 6 + 9, i % 6 + 12)) for i in range(240)], LIST),
        }
    )
    layout, _ = choose_encoded(rows, ["a", "b", "hist", "hist2"], listed=True)
    # hist and hist2 slide on the same rows: each stays alone (a sliding row stores one id)
    assert layout.encoded == ("a", "b", "hist", "hist2") and layout.groups == (("a", "b"),)
    schema = dedup_schema(rows.schema, layout.encoded, layout.groups)
    assert schema.names == [
        "session_id",
        "a__group_ids",
        "a__group_lengths",
        "hist__new_ids",
        "hist__start",
        "hist2__new_ids",
        "hist2__start",
    ]
    assert layout_of(schema, source="f") == layout
    assert b'"version": 2' in schema.metadata[LAYOUT_METADATA_KEY]
    # a file without groups is version 1: older readers read it
    assert b'"version": 1' in dedup_schema(rows.schema, ["hist"]).metadata[LAYOUT_METADATA_KEY]


def test_a_grouped_file_reads_plain_in_the_requested_order(tmp_path: Path) -> None:
    rows = random_sessions(np.random.default_rng(5), 300)
    rows = rows.append_column("user", rows.column("static"))
    path = tmp_path / "part-00000.parquet"
    features, groups = ["static", "user", "history"], [["static", "user"]]
    schema = dedup_schema(rows.schema, features, groups)
    with pq.ParquetWriter(path, schema) as writer:
        for lo in range(0, rows.num_rows, 64):
            writer.write_table(
                encode_row_group(rows.slice(lo, 64), features, groups=groups, schema=schema)
            )
    assert read_plain(str(path)).equals(rows)
    assert read_plain(str(path), ["user", "session_id"]).equals(rows.select(["user", "session_id"]))
    with pytest.raises((KeyError, pa.ArrowInvalid)):
        pq.read_table(path, columns=["user"])


@pytest.mark.parametrize(
    ("row", "lengths", "ids", "why"),
    [
        (4, [1], [7], "one length for a group of two"),
        (0, [], [], "a row group starting with a repeat"),
        (4, [1, 1], [7], "lengths adding up to more than the ids"),
        (4, [], [7], "a repeat with ids"),
    ],
)
def test_a_corrupt_group_row_fails_naming_file_row_and_column(
    row: int, lengths: list[int], ids: list[int], why: str
) -> None:
    rows = random_sessions(np.random.default_rng(3), 64)
    groups = [["history", "static"]]
    stored = encode_row_group(rows, ["history", "static"], groups=groups)
    for name, value in (("history__group_lengths", lengths), ("history__group_ids", ids)):
        column = stored.column(name).to_pylist()
        column[row] = value
        i = stored.schema.get_field_index(name)
        stored = stored.set_column(
            i, stored.schema.field(i), pa.array(column, stored.schema.field(i).type)
        )
    with pytest.raises(
        BadRowError, match=rf"f\.parquet: row {row + 10}: field 'history__group_lengths'"
    ):
        stack_unit(stored, ["static"], [], groups=groups, path="f.parquet", first_row=10)


def test_the_fbgemm_and_numpy_range_indices_agree() -> None:
    import fbgemm_gpu  # noqa: F401  (the reader's processes have it loaded)

    from recd.table.layout import range_index, range_index_numpy

    rng = np.random.default_rng(3)
    for n in (1, 7, 5000):
        starts = rng.integers(0, 10_000, n).astype(np.int32)
        lengths = rng.integers(0, 4, n).astype(np.int32)
        lengths[: n // 3] = 0  # empty rows, first ones included
        expected = range_index_numpy(starts, lengths)
        got = range_index(starts, lengths)
        assert got.dtype == np.int64 and np.array_equal(got, expected)
        assert expected.size == int(lengths.sum())
    starts = np.array([2**31 - 2, 5], dtype=np.int64)  # positions past int32
    lengths = np.array([3, 2], dtype=np.int64)
    got = range_index(starts, lengths)
    assert got.dtype == np.int64 and got.tolist() == [2**31 - 2, 2**31 - 1, 2**31, 5, 6]
